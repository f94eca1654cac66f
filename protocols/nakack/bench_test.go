package nakack_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/stable"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// hub is a transport that hands a multicast to every member (a copy to the
// sender itself) on the caller's goroutine, so the benchmark measures
// NAKACK's send and receive paths alone.
type hub struct {
	stack.TransportBase
	all *[]*hub
}

func (h *hub) Name() string { return "HUB" }
func (h *hub) Down(_ context.Context, m *stack.Message) error {
	if m.Src.IsZero() {
		m.Src = h.LocalAddress()
	}
	for _, o := range *h.all {
		if o.LocalAddress() == m.Src || m.IsMulticast() || m.Dest == o.LocalAddress() {
			o.PassUp(m.Copy())
		}
	}
	return nil
}

// BenchmarkSendReceive1KB: one 1 KB multicast numbered by NAKACK at the
// sender and delivered through NAKACK at the sender and one receiver.
func BenchmarkSendReceive1KB(b *testing.B) {
	var hubs []*hub
	var chs []*stack.Channel
	ws := []*stacktest.Window{stacktest.NewWindow(0), stacktest.NewWindow(0)}
	for i := range 2 {
		h := &hub{all: &hubs}
		hubs = append(hubs, h)
		sc := stable.DefaultConfig()
		sc.MaxBytes = 1 << 20
		ch, err := stack.New(stack.FromProtocols([]stack.Protocol{h, nakack.New(nakack.DefaultConfig()), stable.New(sc)}...), stack.WithReceiver(stacktest.WindowReceiver{W: ws[i]}))
		if err != nil {
			b.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Connect(context.Background(), "bench"); err != nil {
			b.Fatal(err)
		}
		chs = append(chs, ch)
	}
	v := stack.NewView(chs[0].Address(), 2, chs[0].Address(), chs[1].Address())
	for _, ch := range chs {
		if err := stack.Of(ch).InstallView(context.Background(), v); err != nil {
			b.Fatal(err)
		}
	}
	payload := make([]byte, 1000)
	ctx := context.Background()
	b.SetBytes(1000)
	b.ReportAllocs()
	for b.Loop() {
		if err := chs[0].Send(ctx, stack.NewMessage(stack.Address{}, payload)); err != nil {
			b.Fatal(err)
		}
	}
	if ws[1].Settle(int64(b.N), time.Second) != int64(b.N) {
		b.Fatalf("receiver got %d of %d", ws[1].Received(), b.N)
	}
}

// BenchmarkSIM3Members1KB: every one of 3 members multicasts 1 KB messages
// over SIM (no faults) through NAKACK and STABLE; delivered_msgs/s counts
// deliveries at all members.
func BenchmarkSIM3Members1KB(b *testing.B) {
	const members = 3
	net := stacktest.NewNetwork(b, 1)
	var chs []*stack.Channel
	var ws []*stacktest.Window
	for range members {
		w := stacktest.NewWindow(0)
		ch, err := stack.New(stack.FromConfig(mustConfig(b, net.Name())), stack.WithReceiver(stacktest.WindowReceiver{W: w}))
		if err != nil {
			b.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Connect(context.Background(), "bench"); err != nil {
			b.Fatal(err)
		}
		chs, ws = append(chs, ch), append(ws, w)
	}
	addrs := []stack.Address{chs[0].Address(), chs[1].Address(), chs[2].Address()}
	stacktest.InjectView(b, stack.NewView(addrs[0], 2, addrs...), chs...)
	payload := make([]byte, 1000)
	ctx := context.Background()
	per := b.N/members + 1
	b.SetBytes(1000)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, ch := range chs {
		wg.Go(func() {
			for range per {
				if err := ch.Send(ctx, stack.NewMessage(stack.Address{}, payload)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	total := int64(per * members)
	for _, w := range ws {
		if w.Settle(total, 10*time.Second) != total {
			b.Fatalf("a member got %d of %d", w.Received(), total)
		}
	}
	el := time.Since(start)
	b.ReportMetric(float64(total)/el.Seconds(), "sent_msgs/s")
	b.ReportMetric(float64(total*members)/el.Seconds(), "delivered_msgs/s")
}

func mustConfig(b *testing.B, network string) *stack.StackConfig {
	sc, err := stack.ParseConfig("bench.toml", []byte(`
[[protocol]]
type = "SIM"
network = "`+network+`"
[[protocol]]
type = "NAKACK"
[[protocol]]
type = "STABLE"
desired_avg_gossip = "1s"
max_bytes = "1MB"
`))
	if err != nil {
		b.Fatal(err)
	}
	return sc
}
