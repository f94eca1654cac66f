package rpc_test

import (
	"context"
	"fmt"

	_ "github.com/strata-go/strata/protocols/all"
	"github.com/strata-go/strata/rpc"
	"github.com/strata-go/strata/stack"
)

// Three members on the in-memory stack (sim.toml); each answers requests
// with its name. A calls B, then casts to the whole group and waits for
// every answer (its own included).
func Example() {
	ctx := context.Background()
	vars := stack.WithVars(map[string]string{"STRATA_SIM_NETWORK": "rpc-example"})
	var chs []*stack.Channel
	var ds []*rpc.Dispatcher
	for _, name := range []string{"A", "B", "C"} {
		ch, err := stack.New(stack.Shipped("sim.toml"), vars, stack.WithName(name))
		if err != nil {
			panic(err)
		}
		defer ch.Close()
		d, err := rpc.New(ch, func(ctx context.Context, req *stack.Message) ([]byte, error) {
			return fmt.Appendf(nil, "%s got %q from %s", name, req.Payload, req.Src), nil
		})
		if err != nil {
			panic(err)
		}
		defer d.Close()
		if err := ch.Connect(ctx, "example"); err != nil {
			panic(err)
		}
		chs, ds = append(chs, ch), append(ds, d)
	}
	// sim.toml has no membership protocol: give the three one view.
	v := stack.NewView(chs[0].Address(), 2, chs[0].Address(), chs[1].Address(), chs[2].Address())
	for _, ch := range chs {
		if err := stack.Of(ch).InstallView(ctx, v); err != nil {
			panic(err)
		}
	}

	rsp, err := ds[0].Call(ctx, chs[1].Address(), []byte("hello"))
	fmt.Printf("call: %s, %v\n", rsp, err)

	rsps, err := ds[0].Cast(ctx, nil, []byte("hi all"), rpc.WithMode(rpc.ModeAll))
	fmt.Println("cast:", err)
	for _, r := range rsps {
		fmt.Printf("  %s: %s: %s\n", r.Member, r.Status, r.Value)
	}
	// Output:
	// call: B got "hello" from A, <nil>
	// cast: <nil>
	//   A: received: A got "hi all" from A
	//   B: received: B got "hi all" from A
	//   C: received: C got "hi all" from A
}
