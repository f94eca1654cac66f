package tcp_test

import (
	"context"
	"testing"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// BenchmarkTransport1KB sends 1 KB unicasts from one member to another
// through the TCP transport (bundling on, a window standing in for flow
// control), and reports received msgs/s; udp.BenchmarkTransport1KB is the
// same over UDP.
func BenchmarkTransport1KB(b *testing.B) {
	ms := startMembers(b, 2, "bench", testConfig(), nil)
	w := stacktest.NewWindow(2048)
	ms[1].ch.SetReceiver(stacktest.WindowReceiver{W: w})
	dest := ms[1].ch.Address()
	ctx := context.Background()
	payload := make([]byte, 1000)
	b.SetBytes(1000)
	b.ReportAllocs()
	start := time.Now()
	var sent int64
	for b.Loop() {
		w.Await(sent)
		if err := ms[0].ch.Send(ctx, stack.NewMessage(dest, payload)); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	got := w.Settle(int64(b.N), 500*time.Millisecond)
	b.ReportMetric(float64(got)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(100*float64(int64(b.N)-got)/float64(b.N), "%lost")
}
