package stacktest

import (
	"context"
	"testing"
	"time"

	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
)

// BenchUnicastSIM measures unicasts of payload from one member to another
// on a fresh SIM network; above returns the layers to put above SIM (called
// once per member). A window of 1024 messages in flight stands in for flow
// control.
func BenchUnicastSIM(b *testing.B, payload []byte, above func() []stack.Protocol) {
	b.Helper()
	net := NewNetwork(b, 1)
	w := NewWindow(1024)
	var chs []*stack.Channel
	for i := range 2 {
		cfg := sim.DefaultConfig()
		cfg.Network = net.Name()
		ps := append([]stack.Protocol{sim.New(cfg)}, above()...)
		var r stack.Receiver = WindowReceiver{W: NewWindow(0)}
		if i == 1 {
			r = WindowReceiver{W: w}
		}
		ch, err := stack.New(stack.FromProtocols(ps...), stack.WithReceiver(r))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = ch.Close() })
		if err := ch.Connect(context.Background(), "bench"); err != nil {
			b.Fatal(err)
		}
		chs = append(chs, ch)
	}
	dest := chs[1].Address()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	var sent int64
	for b.Loop() {
		w.Await(sent)
		if err := chs[0].Send(context.Background(), stack.NewMessage(dest, payload)); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	if got := w.Settle(int64(b.N), time.Second); got != int64(b.N) {
		b.Fatalf("got %d of %d", got, b.N)
	}
}
