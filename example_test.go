package strata_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/strata-go/strata"
	_ "github.com/strata-go/strata/protocols/all" // registers every protocol
)

// printer prints what it receives; Receive may run concurrently.
type printer struct {
	mu   sync.Mutex
	wg   *sync.WaitGroup
	name string
}

func (p *printer) Receive(m *strata.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Printf("%s got %q from %s\n", p.name, m.Payload, m.Src)
	p.wg.Done()
}

func (p *printer) ViewAccepted(v *strata.View) {}

// Example embeds a channel built from a shipped config and sends one
// message to the group.
func Example() {
	var wg sync.WaitGroup
	wg.Add(1)
	ch, err := strata.New(strata.Shipped("sim.toml"), strata.WithName("A"), strata.WithReceiver(&printer{wg: &wg, name: "A"}))
	if err != nil {
		panic(err)
	}
	defer ch.Close()
	ctx := context.Background()
	if err := ch.Connect(ctx, "demo"); err != nil {
		panic(err)
	}
	fmt.Println("view:", ch.View())
	if err := ch.Send(ctx, strata.NewMessage(strata.Address{}, []byte("hello"))); err != nil {
		panic(err)
	}
	wg.Wait()
	// Output:
	// view: [A|1] (1) [A]
	// A got "hello" from A
}
