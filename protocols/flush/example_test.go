package flush_test

import (
	"context"
	"fmt"
	"io"
	"sync"

	_ "github.com/strata-go/strata/protocols/all" // registers every protocol
	"github.com/strata-go/strata/stack"
)

// flushStack is flush.toml's stack over the in-memory network: FLUSH on
// top, STATE_TRANSFER below it.
const flushStack = `
[[protocol]]
type = "SIM"
network = "flush-example"
[[protocol]]
type = "PING"
timeout = "1s" # the first member waits this long for others
[[protocol]]
type = "NAKACK"
[[protocol]]
type = "UNICAST2"
[[protocol]]
type = "STABLE"
[[protocol]]
type = "GMS"
print_local_addr = false
[[protocol]]
type = "STATE_TRANSFER"
[[protocol]]
type = "FLUSH"
`

// replica is an application whose state is a log of lines; it says on
// flushes when a flush blocks and unblocks it.
type replica struct {
	mu      sync.Mutex
	lines   []string
	flushes chan string
}

func (r *replica) Receive(m *stack.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, string(m.Payload))
}
func (r *replica) ViewAccepted(*stack.View) {}
func (r *replica) Block()                   { r.flushes <- "block" }
func (r *replica) Unblock()                 { r.flushes <- "unblock" }

// GetState writes the log (on the member asked for the state).
func (r *replica) GetState(w io.Writer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.lines {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	return nil
}

// SetState reads the log (on the joiner, before its first message).
func (r *replica) SetState(rd io.Reader) error {
	b, err := io.ReadAll(rd)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, "state: "+string(b))
	return err
}

// Example: B joins A's group and gets A's state in the flush that installs
// its view, so no message falls between the state and B's first delivery;
// then the application flushes the group by hand (StartFlush blocks every
// member's multicasts; StopFlush returns when every member is unblocked).
func Example() {
	ctx := context.Background()
	sc, err := stack.ParseConfig("flush-example.toml", []byte(flushStack))
	if err != nil {
		panic(err)
	}
	ra, rb := &replica{flushes: make(chan string, 8)}, &replica{flushes: make(chan string, 8)}
	a, err := stack.New(stack.FromConfig(sc), stack.WithName("A"), stack.WithReceiver(ra))
	if err != nil {
		panic(err)
	}
	defer a.Close()
	if err := a.Connect(ctx, "example"); err != nil {
		panic(err)
	}
	for _, l := range []string{"x=1", "y=2"} {
		if err := a.Send(ctx, stack.NewMessage(stack.Address{}, []byte(l))); err != nil {
			panic(err)
		}
	}

	b, err := stack.New(stack.FromConfig(sc), stack.WithName("B"), stack.WithReceiver(rb))
	if err != nil {
		panic(err)
	}
	defer b.Close()
	if err := b.ConnectWithState(ctx, "example", stack.Address{}); err != nil {
		panic(err)
	}
	rb.mu.Lock()
	fmt.Printf("B's log: %q\n", rb.lines)
	rb.mu.Unlock()

	if err := a.StartFlush(ctx); err != nil {
		panic(err)
	}
	fmt.Println("flushed: every member is blocked")
	if err := a.StopFlush(ctx); err != nil {
		panic(err)
	}
	fmt.Println("stopped: every member is unblocked")
	// Each member is blocked from the moment it asks to join until the
	// flush that installs its view ends (Connect returns unblocked). A was
	// blocked three times: joining, while B joined, and by this flush; B
	// twice: joining, and by this flush.
	for _, m := range []struct {
		name   string
		r      *replica
		rounds int
	}{{"A", ra, 3}, {"B", rb, 2}} {
		var seq []string
		for range 2 * m.rounds {
			seq = append(seq, <-m.r.flushes)
		}
		fmt.Println(m.name+":", seq)
	}
	// Output:
	// B's log: ["state: x=1\ny=2\n"]
	// flushed: every member is blocked
	// stopped: every member is unblocked
	// A: [block unblock block unblock block unblock]
	// B: [block unblock block unblock]
}
