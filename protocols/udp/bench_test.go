package udp_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

const (
	benchSize = 1000
	// window stands in for flow control: without it the sender outruns the
	// receiver on a 2-core machine and the kernel drops what its socket
	// buffer cannot hold.
	window = 2048
)

// BenchmarkTransport1KB sends 1 KB unicasts from one member to another
// through the UDP transport (bundling on), and reports received msgs/s.
func BenchmarkTransport1KB(b *testing.B) {
	ms := startMembers(b, 2, "bench", testConfig(b), nil)
	w := stacktest.NewWindow(window)
	ms[1].ch.SetReceiver(stacktest.WindowReceiver{W: w})
	dest := ms[1].ch.Address()
	ctx := context.Background()
	payload := make([]byte, benchSize)
	b.SetBytes(benchSize)
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
	report(b, w.Settle(int64(b.N), 500*time.Millisecond), time.Since(start))
}

func report(b *testing.B, got int64, el time.Duration) {
	b.ReportMetric(float64(got)/el.Seconds(), "msgs/s")
	b.ReportMetric(100*float64(int64(b.N)-got)/float64(b.N), "%lost")
}

// BenchmarkPlainUDPLoop1KB is the baseline: one datagram per 1 KB message
// with plain net.UDPConn writes and reads, in the same run.
func BenchmarkPlainUDPLoop1KB(b *testing.B) {
	rc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	_ = rc.SetReadBuffer(4 << 20)
	sc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	w := stacktest.NewWindow(window)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			if _, _, err := rc.ReadFromUDP(buf); err != nil {
				return
			}
			w.Got()
		}
	}()
	to := rc.LocalAddr().(*net.UDPAddr).AddrPort()
	payload := make([]byte, benchSize)
	b.SetBytes(benchSize)
	b.ReportAllocs()
	start := time.Now()
	var sent int64
	for b.Loop() {
		w.Await(sent)
		if _, err := sc.WriteToUDPAddrPort(payload, to); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	report(b, w.Settle(int64(b.N), 500*time.Millisecond), time.Since(start))
	rc.Close()
	<-done
}
