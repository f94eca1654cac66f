package groupfc_test

import (
	"context"
	"fmt"
	"strings"

	_ "github.com/strata-go/strata/protocols/all" // registers every protocol
	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/stack"
)

// exampleStack is groupfc.toml's stack over the in-memory network:
// discovery, membership, reliable multicast and unicast, and GROUPFC on
// top. ${INSTANCE} is each member's instance.
const exampleStack = `
[[protocol]]
type = "SIM"
network = "groupfc-example"
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
type = "GROUPFC"
instance = ${INSTANCE}
member_events = true
`

// Example shows GROUPFC's group communication: a member of instance 1
// learns that a member of instance 2 is up, in order with what that member
// sends (an anycast to "some member of instance 1", then a broadcast), and
// that it left after its last message.
func Example() {
	ctx := context.Background()
	got := make(chan string, 16)
	open := func(name, instance string, r stack.Receiver) (*stack.Channel, *groupfc.GROUPFC) {
		sc, err := stack.ParseConfigVars(name+".toml", []byte(exampleStack), map[string]string{"INSTANCE": instance})
		if err != nil {
			panic(err)
		}
		ch, err := stack.New(stack.FromConfig(sc), stack.WithName(name), stack.WithReceiver(r))
		if err != nil {
			panic(err)
		}
		if err := ch.Connect(ctx, "example"); err != nil {
			panic(err)
		}
		g, err := groupfc.Of(ch)
		if err != nil {
			panic(err)
		}
		return ch, g
	}
	a, _ := open("A", "1", stack.ReceiverFuncs{OnReceive: func(m *stack.Message) {
		if ev, ok := groupfc.EventOf(m); ok {
			got <- fmt.Sprintf("event: instance %d up=%v graceful=%v", ev.Instance, ev.Up, ev.Graceful)
			return
		}
		got <- fmt.Sprintf("message: %s", m.Payload)
	}})
	defer a.Close()
	b, gb := open("B", "2", stack.ReceiverFuncs{})

	fmt.Println(<-got) // B is up
	if _, err := gb.Anycast(ctx, 1, []byte("to one member of instance 1")); err != nil {
		panic(err)
	}
	if err := gb.Broadcast(ctx, []byte("to everyone")); err != nil {
		panic(err)
	}
	if err := b.Close(); err != nil { // leaves: LEAVE after its last message
		panic(err)
	}
	for range 3 {
		fmt.Println(strings.TrimSpace(<-got))
	}
	// Output:
	// event: instance 2 up=true graceful=false
	// message: to one member of instance 1
	// message: to everyone
	// event: instance 2 up=false graceful=true
}
