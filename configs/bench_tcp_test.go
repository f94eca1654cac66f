package configs_test

import (
	"context"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// tcpPair connects two members of tcp.toml on loopback (ports of their
// own, each in the other's initial_hosts); done is closed when B has
// received want messages.
func tcpPair(b *testing.B, want int64) (a, r *stack.Channel, done chan struct{}) {
	c, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := c.Addr().(*net.TCPAddr).Port
	_ = c.Close()
	hosts := "127.0.0.1:" + strconv.Itoa(port)
	var got atomic.Int64
	done = make(chan struct{})
	count := func(*stack.Message) {
		if got.Add(1) == want {
			close(done)
		}
	}
	var chs []*stack.Channel
	for i, rcv := range []stack.Receiver{stack.ReceiverFuncs{}, stack.ReceiverFuncs{OnReceive: count}} {
		vars := map[string]string{"STRATA_BIND_PORT": strconv.Itoa(port + i), "STRATA_INITIAL_HOSTS": hosts}
		ch, err := stack.New(stack.Shipped("tcp.toml"), stack.WithVars(vars), stack.WithName(stacktest.Names[i]), stack.WithReceiver(rcv))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = ch.Close() })
		if err := ch.Connect(context.Background(), "bench"); err != nil {
			b.Fatal(err)
		}
		chs = append(chs, ch)
	}
	stacktest.WaitForSameView(b, 30*time.Second, chs...)
	return chs[0], chs[1], done
}

// BenchmarkTCPStack1KB is BenchmarkUDPStack1KB on tcp.toml: 1 KB messages
// from A to B over loopback TCP, the whole stack at both ends, UFC and
// MFC as the only brake. allocs/msg and B/msg are per message sent (and
// received: both members are in this process), with the fraction that
// ReportAllocs rounds away.
func BenchmarkTCPStack1KB(b *testing.B) {
	for _, kind := range []string{"multicast", "unicast"} {
		b.Run(kind, func(b *testing.B) {
			a, r, done := tcpPair(b, int64(b.N))
			dest := stack.Address{}
			if kind == "unicast" {
				dest = r.Address()
			}
			payload := make([]byte, 1024)
			ctx := context.Background()
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if err := a.Send(ctx, stack.NewMessage(dest, payload)); err != nil {
					b.Fatal(err)
				}
			}
			<-done
			el := time.Since(start)
			b.StopTimer()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N), "allocs/msg")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N), "B/msg")
		})
	}
}
