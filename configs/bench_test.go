package configs_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-go/strata/internal/cpustat"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// benchPair connects two members of udp.toml on loopback (their own port
// and multicast group); done is closed when B has received want messages.
func benchPair(b *testing.B, want int64) (a, r *stack.Channel, done chan struct{}) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	port := c.LocalAddr().(*net.UDPAddr).Port
	_ = c.Close()
	group := fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254))
	return shippedPair(b, "udp.toml", want, func(int) map[string]string {
		return map[string]string{"STRATA_BIND_PORT": strconv.Itoa(port), "STRATA_MCAST_ADDR": group, "STRATA_MCAST_PORT": strconv.Itoa(port + 100)}
	})
}

// shippedPair connects two members of the shipped config file, member i
// with the variables vars(i); done is closed when B has received want
// messages.
func shippedPair(b *testing.B, file string, want int64, vars func(i int) map[string]string) (a, r *stack.Channel, done chan struct{}) {
	var got atomic.Int64
	done = make(chan struct{})
	count := func(*stack.Message) {
		if got.Add(1) == want {
			close(done)
		}
	}
	var chs []*stack.Channel
	for i, rcv := range []stack.Receiver{stack.ReceiverFuncs{}, stack.ReceiverFuncs{OnReceive: count}} {
		ch, err := stack.New(stack.Shipped(file), stack.WithVars(vars(i)), stack.WithName(stacktest.Names[i]), stack.WithReceiver(rcv))
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

// BenchmarkUDPStack1KB sends 1 KB messages from A to B on udp.toml over
// loopback UDP, multicast and unicast: the whole stack, both ends, UFC
// and MFC as the only brake. Allocations are per message sent and
// received (both members are in this process).
func BenchmarkUDPStack1KB(b *testing.B) { benchStack1KB(b, benchPair) }

// benchStack1KB sends 1 KB messages from A to B of pair, multicast and
// unicast. allocs/msg and B/msg are per message sent (and received: both
// members are in this process), with the fraction that ReportAllocs
// rounds away.
func benchStack1KB(b *testing.B, pair func(b *testing.B, want int64) (a, r *stack.Channel, done chan struct{})) {
	for _, kind := range []string{"multicast", "unicast"} {
		b.Run(kind, func(b *testing.B) {
			a, r, done := pair(b, int64(b.N))
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
			cpu0 := cpustat.Process()
			start := time.Now()
			for range b.N {
				if err := a.Send(ctx, stack.NewMessage(dest, payload)); err != nil {
					b.Fatal(err)
				}
			}
			<-done
			el, cpu := time.Since(start), cpustat.Process()-cpu0
			b.StopTimer()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N), "allocs/msg")
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N), "B/msg")
		})
	}
}
