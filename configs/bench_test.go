package configs_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

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
	vars := map[string]string{
		"STRATA_BIND_PORT":  strconv.Itoa(port),
		"STRATA_MCAST_ADDR": fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254)),
		"STRATA_MCAST_PORT": strconv.Itoa(port + 100),
	}
	var got atomic.Int64
	done = make(chan struct{})
	count := func(*stack.Message) {
		if got.Add(1) == want {
			close(done)
		}
	}
	var chs []*stack.Channel
	for i, rcv := range []stack.Receiver{stack.ReceiverFuncs{}, stack.ReceiverFuncs{OnReceive: count}} {
		ch, err := stack.New(stack.Shipped("udp.toml"), stack.WithVars(vars), stack.WithName(stacktest.Names[i]), stack.WithReceiver(rcv))
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
func BenchmarkUDPStack1KB(b *testing.B) {
	for _, kind := range []string{"multicast", "unicast"} {
		b.Run(kind, func(b *testing.B) {
			a, r, done := benchPair(b, int64(b.N))
			dest := stack.Address{}
			if kind == "unicast" {
				dest = r.Address()
			}
			payload := make([]byte, 1024)
			ctx := context.Background()
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := a.Send(ctx, stack.NewMessage(dest, payload)); err != nil {
					b.Fatal(err)
				}
			}
			<-done
		})
	}
}
