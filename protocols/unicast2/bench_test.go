package unicast2_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// pipe is a transport that hands every message straight to the peer's
// stack on the caller's goroutine: the benchmark measures UNICAST2 alone.
type pipe struct {
	stack.TransportBase
	peer *pipe
}

func (p *pipe) Name() string { return "PIPE" }
func (p *pipe) Down(_ context.Context, m *stack.Message) error {
	if m.Src.IsZero() {
		m.Src = p.LocalAddress()
	}
	p.peer.PassUp(m)
	return nil
}

// BenchmarkPerMessage1KB: one 1 KB unicast through UNICAST2 down at the
// sender and up at the receiver, STABLEs included.
func BenchmarkPerMessage1KB(b *testing.B) {
	ta, tb := &pipe{}, &pipe{}
	ta.peer, tb.peer = tb, ta
	w := stacktest.NewWindow(1 << 62)
	mk := func(t *pipe, r stack.Receiver) *stack.Channel {
		cfg := unicast2.DefaultConfig()
		cfg.MaxBytes = 1 << 20
		ch, err := stack.New(stack.FromProtocols([]stack.Protocol{t, unicast2.New(cfg)}...), stack.WithReceiver(r))
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.Connect(context.Background(), "bench"); err != nil {
			b.Fatal(err)
		}
		return ch
	}
	a := mk(ta, stacktest.WindowReceiver{W: stacktest.NewWindow(0)})
	defer a.Close()
	bb := mk(tb, stacktest.WindowReceiver{W: w})
	defer bb.Close()
	dest := bb.Address()
	ctx := context.Background()
	payload := make([]byte, 1000)
	b.SetBytes(1000)
	b.ReportAllocs()
	for b.Loop() {
		if err := a.Send(ctx, stack.NewMessage(dest, payload)); err != nil {
			b.Fatal(err)
		}
	}
	if w.Received() != int64(b.N) {
		b.Fatalf("received %d of %d", w.Received(), b.N)
	}
}

// BenchmarkUDPLoopback1KB: 1 KB unicasts between two members over UDP on
// loopback with UNICAST2 (a window of 2048 in flight stands in for flow
// control).
func BenchmarkUDPLoopback1KB(b *testing.B) {
	cfg := udp.DefaultConfig()
	cfg.BindPort = 0
	cfg.IPMcast = false
	w := stacktest.NewWindow(2048)
	var chs []*stack.Channel
	cluster := fmt.Sprint("u2bench-", rand.Uint32())
	for i := range 2 {
		var r stack.Receiver = stacktest.WindowReceiver{W: stacktest.NewWindow(0)}
		if i == 1 {
			r = stacktest.WindowReceiver{W: w}
		}
		ch, err := stack.New(stack.FromProtocols([]stack.Protocol{udp.New(cfg), unicast2.New(unicast2.DefaultConfig())}...), stack.WithReceiver(r))
		if err != nil {
			b.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Connect(context.Background(), cluster); err != nil {
			b.Fatal(err)
		}
		chs = append(chs, ch)
	}
	for i, ch := range chs {
		pa, _ := stack.Ask(context.Background(), stack.Of(chs[1-i]), stack.EvGetLocalPhysicalAddress{})
		_ = stack.Of(ch).DownEvent(context.Background(), stack.EvAddPhysicalAddress{Logical: chs[1-i].Address(), Physical: pa})
	}
	dest := chs[1].Address()
	ctx := context.Background()
	payload := make([]byte, 1000)
	b.SetBytes(1000)
	b.ReportAllocs()
	start := time.Now()
	var sent int64
	for b.Loop() {
		w.Await(sent)
		if err := chs[0].Send(ctx, stack.NewMessage(dest, payload)); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	got := w.Settle(int64(b.N), 30*time.Second)
	el := time.Since(start)
	if got != int64(b.N) {
		b.Fatalf("reliable unicast lost messages: %d of %d", got, b.N)
	}
	b.ReportMetric(float64(got)/el.Seconds(), "msgs/s")
}
