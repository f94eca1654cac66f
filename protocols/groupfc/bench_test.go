package groupfc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/protocols/stable"
	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

const benchSize = 1000

// benchStack is NAKACK, UNICAST2 and STABLE, with GROUPFC on top if fc.
func benchStack(fc bool) []stack.Protocol {
	sc := stable.DefaultConfig()
	sc.MaxBytes = 1 << 20
	ps := []stack.Protocol{nakack.New(nakack.DefaultConfig()), unicast2.New(unicast2.DefaultConfig()), stable.New(sc)}
	if fc {
		ps = append(ps, groupfc.New(groupfc.DefaultConfig()))
	}
	return ps
}

// runBroadcasts has member 0 multicast b.N 1 KB messages with Channel.Send
// to the others and reports what every receiver got per second. A window of
// 2048 messages in flight stands in for flow control without GROUPFC (and
// is never the limit with it).
func runBroadcasts(b *testing.B, chs []*stack.Channel, ws []*stacktest.Window) {
	payload := make([]byte, benchSize)
	ctx := context.Background()
	b.SetBytes(benchSize)
	b.ReportAllocs()
	start := time.Now()
	var sent int64
	for b.Loop() {
		ws[1].Await(sent)
		if err := chs[0].Send(ctx, stack.NewMessage(stack.Address{}, payload)); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	for i, w := range ws[1:] {
		if got := w.Settle(int64(b.N), 5*time.Second); got != int64(b.N) {
			b.Fatalf("member %d got %d of %d", i+1, got, b.N)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

func newWindows(n int) []*stacktest.Window {
	ws := make([]*stacktest.Window, n)
	for i := range ws {
		ws[i] = stacktest.NewWindow(2048)
	}
	return ws
}

// BenchmarkBroadcastSIM4 is 1 KB broadcasts among 4 members on SIM, with
// and without GROUPFC: the difference is the layer's cost.
func BenchmarkBroadcastSIM4(b *testing.B) {
	for _, fc := range []bool{false, true} {
		b.Run(fmt.Sprint("groupfc=", fc), func(b *testing.B) {
			net := stacktest.NewNetwork(b, 1)
			ws := newWindows(4)
			var chs []*stack.Channel
			for i := range 4 {
				cfg := sim.DefaultConfig()
				cfg.Network = net.Name()
				ch, err := stack.New(stack.FromProtocols(append([]stack.Protocol{sim.New(cfg)}, benchStack(fc)...)...), stack.WithReceiver(stacktest.WindowReceiver{W: ws[i]}))
				if err != nil {
					b.Fatal(err)
				}
				defer ch.Close()
				if err := ch.Connect(context.Background(), "bench"); err != nil {
					b.Fatal(err)
				}
				chs = append(chs, ch)
			}
			inject(b, chs)
			runBroadcasts(b, chs, ws)
		})
	}
}

// BenchmarkBroadcastUDP4 is the same over UDP on 127.0.0.1 with IP
// multicast (interface pinned to loopback, TTL 0).
func BenchmarkBroadcastUDP4(b *testing.B) {
	for _, fc := range []bool{false, true} {
		b.Run(fmt.Sprint("groupfc=", fc), func(b *testing.B) {
			cfg := udp.DefaultConfig()
			cfg.BindAddr, cfg.BindPort, cfg.IPTTL = "127.0.0.1", 0, 0
			cfg.McastAddr = fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254))
			cfg.McastPort = freePort(b)
			cluster := fmt.Sprint("gfc-bench-", rand.Uint32())
			ws := newWindows(4)
			var chs []*stack.Channel
			for i := range 4 {
				ch, err := stack.New(stack.FromProtocols(append([]stack.Protocol{udp.New(cfg)}, benchStack(fc)...)...), stack.WithReceiver(stacktest.WindowReceiver{W: ws[i]}))
				if err != nil {
					b.Fatal(err)
				}
				defer ch.Close()
				if err := ch.Connect(context.Background(), cluster); err != nil {
					b.Fatal(err)
				}
				chs = append(chs, ch)
			}
			for _, x := range chs {
				for _, y := range chs {
					if x != y {
						pa, _ := stack.Ask(context.Background(), stack.Of(y), stack.EvGetLocalPhysicalAddress{})
						_ = stack.Of(x).DownEvent(context.Background(), stack.EvAddPhysicalAddress{Logical: y.Address(), Physical: pa})
					}
				}
			}
			inject(b, chs)
			runBroadcasts(b, chs, ws)
		})
	}
}

func inject(b *testing.B, chs []*stack.Channel) {
	addrs := make([]stack.Address, len(chs))
	for i, ch := range chs {
		addrs[i] = ch.Address()
	}
	stacktest.InjectView(b, stack.NewView(addrs[0], 2, addrs...), chs...)
	// GROUPFC's JOIN exchange: wait until every member sees every other.
	for _, ch := range chs {
		if g, err := groupfc.Of(ch); err == nil {
			if !stacktest.Eventually(5*time.Second, func() bool {
				n := 0
				for _, m := range g.Members() {
					if m.State == groupfc.Joined || m.State == groupfc.Active {
						n++
					}
				}
				return n == len(chs)-1
			}) {
				b.Fatal("GROUPFC members did not join")
			}
		}
	}
}

func freePort(b testing.TB) int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}
