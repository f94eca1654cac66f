package stack_test

import (
	"fmt"

	"github.com/strata-go/strata/stack"
)

// A sender that makes many small messages carves them from a Slab: one
// allocation per 64 messages and per 64 KB of payload instead of two per
// message. Each payload's capacity is its length, so an append to one
// never writes into the next.
func ExampleSlab() {
	var slab stack.Slab
	var sent []*stack.Message
	for i := range 3 {
		p := slab.Bytes(4)
		p[0] = byte('a' + i)
		sent = append(sent, slab.NewMessage(stack.Address{}, p))
	}
	for _, m := range sent {
		fmt.Printf("%c len=%d cap=%d multicast=%v\n", m.Payload[0], len(m.Payload), cap(m.Payload), m.IsMulticast())
	}
	// Output:
	// a len=4 cap=4 multicast=true
	// b len=4 cap=4 multicast=true
	// c len=4 cap=4 multicast=true
}
