package udp_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-go/strata/stack"
)

const benchSize = 1000

// settle waits until got stops growing (UDP without reliability may lose
// datagrams, so the benchmark cannot wait for all of them) and returns it.
func settle(got func() int64, want int64) int64 {
	last, since := got(), time.Now()
	for last < want && time.Since(since) < 500*time.Millisecond {
		time.Sleep(time.Millisecond)
		if n := got(); n != last {
			last, since = n, time.Now()
		}
	}
	return last
}

// window bounds the messages in flight, as flow control does in a full
// stack: without it the sender outruns the receiver on a 2-core machine and
// the kernel drops what its socket buffer cannot hold.
const window = 2048

// flow is the receiver's count and a wake-up for a sender waiting on the
// window.
type flow struct {
	n    atomic.Int64
	wake chan struct{}
}

func newFlow() *flow { return &flow{wake: make(chan struct{}, 1)} }

func (f *flow) got() {
	if f.n.Add(1)%256 == 0 {
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
}

// await blocks while more than window messages are in flight.
func (f *flow) await(sent int64) {
	for sent-f.n.Load() > window {
		select {
		case <-f.wake:
		case <-time.After(10 * time.Millisecond): // lost datagrams never wake us
		}
	}
}

type countRecv struct{ *flow }

func (c countRecv) Receive(*stack.Message)   { c.got() }
func (c countRecv) ViewAccepted(*stack.View) {}

// BenchmarkTransport1KB sends 1 KB unicasts from one member to another
// through the UDP transport (bundling on), and reports received msgs/s.
func BenchmarkTransport1KB(b *testing.B) {
	cfg := testConfig(b)
	ms := startMembers(b, 2, "bench", cfg, nil)
	recv := newFlow()
	ms[1].ch.SetReceiver(countRecv{recv})
	dest := ms[1].ch.Address()
	ctx := context.Background()
	payload := make([]byte, benchSize)
	b.SetBytes(benchSize)
	b.ReportAllocs()
	start := time.Now()
	var sent int64
	for b.Loop() {
		recv.await(sent)
		if err := ms[0].ch.Send(ctx, stack.NewMessage(dest, payload)); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	got := settle(recv.n.Load, int64(b.N))
	el := time.Since(start)
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
	recv := newFlow()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			if _, _, err := rc.ReadFromUDP(buf); err != nil {
				return
			}
			recv.got()
		}
	}()
	to := rc.LocalAddr().(*net.UDPAddr).AddrPort()
	payload := make([]byte, benchSize)
	b.SetBytes(benchSize)
	b.ReportAllocs()
	start := time.Now()
	var sent int64
	for b.Loop() {
		recv.await(sent)
		if _, err := sc.WriteToUDPAddrPort(payload, to); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	got := settle(recv.n.Load, int64(b.N))
	el := time.Since(start)
	b.ReportMetric(float64(got)/el.Seconds(), "msgs/s")
	b.ReportMetric(100*float64(int64(b.N)-got)/float64(b.N), "%lost")
	rc.Close()
	<-done
}
