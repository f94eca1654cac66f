package strata_test

// The README's embedding snippet, imports included, compiled and run
// (TestReadmeEmbeddingSnippetIsExampleEmbed keeps the README's copy the same).

import (
	"context"
	"fmt"

	"github.com/strata-go/strata"
	_ "github.com/strata-go/strata/protocols/all" // registers every protocol
)

func run(ctx context.Context, recv strata.Receiver) error {
	// strata.Shipped picks a stack from configs/ (embedded); FromFile("my.toml")
	// reads one; with neither, New runs the default stack, udp.toml.
	ch, err := strata.New(strata.Shipped("sim.toml"), strata.WithName("A"), strata.WithReceiver(recv))
	if err != nil {
		return err
	}
	defer ch.Close()                                // returns when every goroutine of the stack has exited
	if err := ch.Connect(ctx, "demo"); err != nil { // returns with the first view
		return err
	}
	fmt.Println("view:", ch.View())
	// Zero destination: the whole group. Send blocks while the stack makes it
	// wait (flow control, flush) and honours ctx.
	return ch.Send(ctx, strata.NewMessage(strata.Address{}, []byte("hello")))
}

// Example_embedding runs the README's run. (Its receiver prints nothing:
// run closes the channel as soon as it has sent.)
func Example_embedding() {
	if err := run(context.Background(), quiet{}); err != nil {
		panic(err)
	}
	// Output:
	// view: [A|1] (1) [A]
}

type quiet struct{}

func (quiet) Receive(*strata.Message)   {}
func (quiet) ViewAccepted(*strata.View) {}
