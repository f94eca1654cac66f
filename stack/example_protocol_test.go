package stack_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/strata-go/strata/stack"
)

// Counter is a protocol of one's own: it counts the application messages
// passing down and up through it. It embeds stack.Base, which forwards
// everything, and overrides only what it handles.
type Counter struct {
	stack.Base
	down, up atomic.Int64
}

// Name is the protocol's name in configs, logs and stats.
func (c *Counter) Name() string { return "COUNTER" }

// Down counts a message on its way to the network and passes it on.
func (c *Counter) Down(ctx context.Context, m *stack.Message) error {
	c.down.Add(1)
	return c.PassDown(ctx, m)
}

// Up counts a message a layer below passed up on its own.
func (c *Counter) Up(m *stack.Message) {
	c.up.Add(1)
	c.PassUp(m)
}

// UpBatch counts a batch of messages from one sender on their way to the
// application. Base's UpBatch gives Up only the messages that carry this
// layer's own header (its protocol messages); a layer that looks at every
// message overrides UpBatch.
func (c *Counter) UpBatch(bt *stack.Batch) {
	c.up.Add(int64(len(bt.Msgs)))
	c.PassUpBatch(bt)
}

// Stats reports the counters (stackdemo and Channel.Stats show them).
func (c *Counter) Stats() []stack.Stat {
	return []stack.Stat{{Name: "down", Value: c.down.Load(), Counter: true}, {Name: "up", Value: c.up.Load(), Counter: true}}
}

// init registers COUNTER, so that configs can name it (a protocol's
// package does this in its init; its config struct, empty here, takes the
// config's keys).
func init() {
	stack.Register(stack.ProtocolSpec[struct{}]{
		Name: "COUNTER", ID: stack.IDUserMin, // ids from IDUserMin up are free
		Doc:      "counts the messages passing through",
		Defaults: func() struct{} { return struct{}{} },
		New:      func(struct{}) (stack.Protocol, error) { return &Counter{}, nil },
	})
}

// Example_protocol writes a protocol (Counter), registers it, and runs it
// in a stack from a config.
func Example_protocol() {
	sc, err := stack.ParseConfig("counter.toml", []byte(`
[[protocol]]
type = "SIM"
network = "counter-example"
[[protocol]]
type = "COUNTER"
`))
	if err != nil {
		panic(err)
	}
	got := make(chan struct{}, 3)
	ch, err := stack.New(stack.FromConfig(sc), stack.WithReceiver(stack.ReceiverFuncs{
		OnReceive: func(*stack.Message) { got <- struct{}{} },
	}))
	if err != nil {
		panic(err)
	}
	defer ch.Close()
	ctx := context.Background()
	if err := ch.Connect(ctx, "demo"); err != nil {
		panic(err)
	}
	for range 3 {
		if err := ch.Send(ctx, stack.NewMessage(stack.Address{}, []byte("x"))); err != nil {
			panic(err)
		}
		<-got
	}
	for _, ps := range ch.Stats() {
		if ps.Protocol == "COUNTER" {
			fmt.Println(ps.Stats)
		}
	}
	// Output:
	// [{down 3 true} {up 3 true}]
}
