package stack_test

// The README's embedding snippet, compiled and run
// (TestReadmeEmbeddingSnippetIsThisFile keeps the README's copy the same).

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	_ "github.com/strata-go/strata/protocols/all" // registers every protocol
	"github.com/strata-go/strata/stack"
)

func run(ctx context.Context, recv stack.Receiver) error {
	// stack.Shipped picks a stack from configs/ (embedded); FromFile("my.toml")
	// reads one; with neither, New runs the default stack, udp.toml.
	ch, err := stack.New(stack.Shipped("sim.toml"), stack.WithName("A"), stack.WithReceiver(recv))
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
	return ch.Send(ctx, stack.NewMessage(stack.Address{}, []byte("hello")))
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

func (quiet) Receive(*stack.Message)   {}
func (quiet) ViewAccepted(*stack.View) {}

// TestReadmeEmbeddingSnippetIsThisFile: the README's embedding snippet is
// the run above, word for word, so what the README shows compiles and runs.
func TestReadmeEmbeddingSnippetIsThisFile(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("example_embed_test.go")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i := strings.Index(s, "## Embedding")
	b := strings.Index(s[i:], "```go\n") + i + len("```go\n")
	e := strings.Index(s[b:], "```") + b
	snippet := s[b:e]
	run := snippet[strings.Index(snippet, "func run("):]
	if !strings.Contains(string(self), run) {
		t.Fatalf("README's embedding snippet is not example_embed_test.go's run:\n%s", run)
	}
}
