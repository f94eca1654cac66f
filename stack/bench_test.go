package stack_test

import (
	"context"
	"testing"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// loopTransport turns every message sent down straight back up, on the
// caller's goroutine, so a benchmark measures only the layers.
type loopTransport struct{ stack.TransportBase }

func (l *loopTransport) Name() string { return "LOOP" }
func (l *loopTransport) Down(_ context.Context, m *stack.Message) error {
	l.PassUp(m)
	return nil
}

type passThrough struct{ stack.Base }

func (p *passThrough) Name() string { return "PASS" }

type countingReceiver struct{ n int }

func (r *countingReceiver) Receive(*stack.Message)   { r.n++ }
func (r *countingReceiver) ViewAccepted(*stack.View) {}

func BenchmarkTraversal10Layers(b *testing.B) {
	protos := []stack.Protocol{&loopTransport{}}
	for range 10 {
		protos = append(protos, &passThrough{})
	}
	recv := &countingReceiver{}
	ch, err := stack.New(stack.FromProtocols(protos...), stack.WithReceiver(recv))
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Connect(context.Background(), "bench"); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	m := stack.NewMessage(stack.Address{}, make([]byte, 64))
	b.ReportAllocs()
	for b.Loop() {
		if err := ch.Send(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	if recv.n != b.N {
		b.Fatalf("received %d of %d", recv.n, b.N)
	}
}

func BenchmarkEncodeMessage3Headers1KB(b *testing.B) {
	m := sampleMessage(1024)
	src := stack.NewAddress()
	buf := make([]byte, 0, 2048)
	b.SetBytes(int64(m.EncodedSize(src)))
	b.ReportAllocs()
	for b.Loop() {
		buf = stack.AppendMessage(buf[:0], m, src)
	}
}

func BenchmarkDecodeMessage3Headers1KB(b *testing.B) {
	m := sampleMessage(1024)
	src := stack.NewAddress()
	enc := stack.AppendMessage(nil, m, src)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	var r wire.Reader
	for b.Loop() {
		r.Reset(enc)
		if _, err := stack.ReadMessage(&r, src); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBundle64x1KBRoundTrip(b *testing.B) {
	src := stack.NewAddress()
	msgs := make([]*stack.Message, 64)
	for i := range msgs {
		msgs[i] = sampleMessage(1024)
		msgs[i].Src = src
	}
	buf := stack.EncodeBundle(nil, "bench", src, true, msgs...)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = stack.EncodeBundle(buf[:0], "bench", src, true, msgs...)
		if _, _, err := stack.DecodeBundle(buf, "bench"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(64*b.N)/b.Elapsed().Seconds(), "msgs/s")
}
