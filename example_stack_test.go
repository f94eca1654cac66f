package strata_test

import (
	"context"
	"fmt"
	"time"

	"github.com/strata-go/strata"
	"github.com/strata-go/strata/protocols/gms"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/ping"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/protocols/stable"
	"github.com/strata-go/strata/protocols/unicast2"
)

// Example_stackInGo builds a stack in code, with no config file: each
// protocol from its package's constructor and config, transport first.
// Two members on one in-memory network form a group and multicast.
func Example_stackInGo() {
	build := func() strata.Option {
		sc := sim.DefaultConfig()
		sc.Network = "stack-in-go"
		pc := ping.DefaultConfig()
		pc.Timeout = time.Second // the first member waits this long for others
		gc := gms.DefaultConfig()
		gc.PrintLocalAddr = false
		return strata.FromProtocols(sim.New(sc), ping.New(pc), nakack.New(nakack.DefaultConfig()),
			unicast2.New(unicast2.DefaultConfig()), stable.New(stable.DefaultConfig()), gms.New(gc))
	}
	ctx := context.Background()
	got := make(chan string, 4)
	var members []*strata.Channel
	for _, name := range []string{"A", "B"} {
		ch, err := strata.New(build(), strata.WithName(name), strata.WithReceiver(strata.ReceiverFuncs{
			OnReceive: func(m *strata.Message) { got <- fmt.Sprintf("%s got %q", name, m.Payload) },
		}))
		if err != nil {
			panic(err)
		}
		defer ch.Close()
		if err := ch.Connect(ctx, "demo"); err != nil {
			panic(err)
		}
		members = append(members, ch)
	}
	fmt.Println("B's first view:", members[1].View())
	if err := members[1].Send(ctx, strata.NewMessage(strata.Address{}, []byte("hi"))); err != nil {
		panic(err)
	}
	first, second := <-got, <-got
	if first > second {
		first, second = second, first
	}
	fmt.Println(first)
	fmt.Println(second)
	// Output:
	// B's first view: [A|2] (2) [A, B]
	// A got "hi"
	// B got "hi"
}
