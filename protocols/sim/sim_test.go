package sim_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	_ "github.com/strata-go/strata/protocols/delay"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// dropPattern sends n unicasts from A to B over a lossy link and returns the
// seqnos that arrived.
func dropPattern(t *testing.T, seed uint64, n int) []int {
	var got []int
	synctest.Test(t, func(t *testing.T) {
		c := stacktest.StartSIM(t, 2, seed, nil)
		c.Net.SetDefault(sim.Rule{Drop: 0.3})
		a, b := c.Channels[0], c.Channels[1]
		for i := range n {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), stacktest.Payload(0, i, 8))))
		}
		synctest.Wait()
		got = c.Recv[1].Seqs(a.Address())
	})
	return got
}

func TestSameSeedGivesSameDropPattern(t *testing.T) {
	const n = 500
	p1 := dropPattern(t, 42, n)
	p2 := dropPattern(t, 42, n)
	p3 := dropPattern(t, 43, n)
	require.Equal(t, p1, p2, "same seed, same drops")
	require.NotEqual(t, p1, p3, "another seed, other drops")
	require.InDelta(t, 0.7*n, len(p1), 0.1*n, "about 30%% dropped")
	require.True(t, slices.IsSorted(p1), "no reordering without a reorder rule")
}

func TestDelayDuplicateAndReorderInVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		seed := stacktest.Seed(t)
		c := stacktest.StartSIM(t, 2, seed, nil)
		a, b := c.Channels[0], c.Channels[1]
		c.Net.SetLink(a.Address(), b.Address(), sim.Rule{Delay: 30 * time.Second})
		start := time.Now()
		require.NoError(t, a.SendTo(t.Context(), b.Address(), stacktest.Payload(0, 0, 8)))
		stacktest.WaitFor(t, time.Minute, func() bool { return c.Recv[1].Len() == 1 }, "delayed message arrives")
		require.GreaterOrEqual(t, time.Since(start), 30*time.Second)

		c.Recv[1].Reset()
		c.Net.SetLink(a.Address(), b.Address(), sim.Rule{Duplicate: 1})
		require.NoError(t, a.SendTo(t.Context(), b.Address(), stacktest.Payload(0, 1, 8)))
		synctest.Wait()
		require.Equal(t, []int{1, 1}, c.Recv[1].Seqs(a.Address()))

		c.Recv[1].Reset()
		c.Net.SetLink(a.Address(), b.Address(), sim.Rule{Reorder: 0.5, ReorderWindow: 10 * time.Millisecond})
		for i := range 200 {
			require.NoError(t, a.SendTo(t.Context(), b.Address(), stacktest.Payload(0, i, 8)))
		}
		stacktest.WaitFor(t, time.Second, func() bool { return c.Recv[1].Len() == 200 }, "all reordered messages arrive")
		seqs := c.Recv[1].Seqs(a.Address())
		require.False(t, slices.IsSorted(seqs), "reorder rule reorders")
		slices.Sort(seqs)
		for i, s := range seqs {
			require.Equal(t, i, s)
		}
	})
}

func TestPartitionAndHeal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := stacktest.StartSIM(t, 4, 1, nil)
		addrs := c.Addresses()
		c.Net.Partition(addrs[:2], addrs[2:])
		require.NoError(t, c.Channels[0].SendTo(t.Context(), stack.Address{}, []byte("split")))
		synctest.Wait()
		require.Equal(t, []int{1, 1, 0, 0}, lens(c))
		c.Net.Heal()
		require.NoError(t, c.Channels[0].SendTo(t.Context(), stack.Address{}, []byte("healed")))
		synctest.Wait()
		require.Equal(t, []int{2, 2, 1, 1}, lens(c))
		require.EqualValues(t, 2, c.Net.Partitioned.Load())
	})
}

// TestTapSeesEachPacketOnceWithItsSize: a multicast to three others is one
// packet on the network, as one datagram with IP multicast; the tap sees
// it once with its encoded size and its three receivers, and SentBytes
// adds the same sizes.
func TestTapSeesEachPacketOnceWithItsSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := stacktest.StartSIM(t, 4, 1, nil)
		var payloads []string
		var receivers []int
		var bytes int64
		c.Net.SetTap(func(m *stack.Message, size, r int) {
			payloads = append(payloads, string(m.Payload))
			receivers = append(receivers, r)
			bytes += int64(size)
		})
		sent, sentBytes := c.Net.Sent.Load(), c.Net.SentBytes.Load()
		require.NoError(t, c.Channels[0].SendTo(t.Context(), stack.Address{}, []byte("to all")))
		require.NoError(t, c.Channels[0].SendTo(t.Context(), c.Channels[1].Address(), []byte("to one")))
		synctest.Wait()
		require.Equal(t, []string{"to all", "to one"}, payloads)
		require.Equal(t, []int{3, 1}, receivers)
		require.EqualValues(t, 2, c.Net.Sent.Load()-sent)
		require.Equal(t, bytes, c.Net.SentBytes.Load()-sentBytes)
		require.Greater(t, bytes, int64(len("to all")+len("to one")), "sizes are of the encoded packets")
		c.Net.SetTap(nil)
		require.NoError(t, c.Channels[0].SendTo(t.Context(), stack.Address{}, []byte("untapped")))
		synctest.Wait()
		require.Len(t, payloads, 2)
	})
}

func TestDropByPredicateOnHeaderOrFlags(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := stacktest.StartSIM(t, 2, 1, nil)
		c.Net.SetDefault(sim.Rule{DropIf: func(m *stack.Message) bool { return m.Has(stack.OOB) }})
		a, b := c.Channels[0], c.Channels[1]
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), []byte("oob")).Set(stack.OOB)))
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), []byte("reg"))))
		synctest.Wait()
		msgs := c.Recv[1].Messages()
		require.Len(t, msgs, 1)
		require.Equal(t, "reg", string(msgs[0].Payload))
	})
}

func TestMalformedAndForeignInputIsCountedAndDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := stacktest.StartSIM(t, 1, 1, nil)
		ch := c.Channels[0]
		s, ok := stack.Find[*sim.SIM](stack.Of(ch))
		require.True(t, ok)
		other := stack.NewAddress()
		good := stack.EncodeBundle(nil, "test", other, true, stack.NewMessage(stack.Address{}, []byte("hi")))
		foreign := stack.EncodeBundle(nil, "another-cluster", other, true, stack.NewMessage(stack.Address{}, []byte("hi")))
		wrongVersion := append([]byte(nil), good...)
		wrongVersion[3] = 9
		notForUs := stack.EncodeBundle(nil, "test", other, false, stack.NewMessage(stack.NewAddress(), []byte("hi")))
		s.Inject(good)
		s.Inject(foreign)
		s.Inject(wrongVersion)
		s.Inject(good[:len(good)-1])
		s.Inject([]byte{})
		s.Inject(notForUs)
		synctest.Wait()
		require.Equal(t, 1, c.Recv[0].Len())
		stats := map[string]int64{}
		for _, st := range s.Stats() {
			stats[st.Name] = st.Value
		}
		require.EqualValues(t, 1, stats["dropped_wrong_cluster"])
		require.EqualValues(t, 1, stats["dropped_wrong_version"])
		require.EqualValues(t, 2, stats["dropped_malformed"])
		require.EqualValues(t, 1, stats["dropped_not_for_us"])
	})
}

func TestChannelFromConfigOnSIM(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := []byte("[[protocol]]\ntype = \"SIM\"\nnetwork = \"from-config\"\n[[protocol]]\ntype = \"DELAY\"\nup = \"1s\"\n")
		var chs []*stack.Channel
		var cols []*stacktest.Collector
		for _, name := range []string{"X", "Y"} {
			sc, err := stack.ParseConfig("inline.toml", src)
			require.NoError(t, err)
			col := stacktest.NewCollector()
			ch, err := stack.New(stack.FromConfig(sc), stack.WithName(name), stack.WithReceiver(col))
			require.NoError(t, err)
			require.NoError(t, ch.Connect(context.Background(), "cfg"))
			defer ch.Close()
			chs = append(chs, ch)
			cols = append(cols, col)
		}
		start := time.Now()
		require.NoError(t, chs[0].SendTo(t.Context(), chs[1].Address(), []byte("hello")))
		col := cols[1]
		stacktest.WaitFor(t, 2*time.Second, func() bool { return col.Len() == 1 }, "message delivered")
		require.GreaterOrEqual(t, time.Since(start), time.Second, "DELAY from the config holds the message for 1s of virtual time")
		stats := chs[1].Stats()
		require.Equal(t, "SIM", stats[0].Protocol)
		require.Equal(t, "DELAY", stats[1].Protocol)
		require.Equal(t, stack.Stat{Name: "delayed", Value: 1, Counter: true}, stats[1].Stats[0])
	})
}

// TestNetworkAddressesAreFreePortsAndReceiveSendToPhysical: with bind_port
// each member holds the first port no one on its network holds (none left:
// Connect fails), reports it as its physical address, receives what is
// sent to it with the sender's address as From, and frees it when it
// stops.
func TestNetworkAddressesAreFreePortsAndReceiveSendToPhysical(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := stacktest.NewNetwork(t, 1)
		cfg := sim.DefaultConfig()
		cfg.Network, cfg.BindPort, cfg.PortRange = net.Name(), 7800, 1
		member := func(name string) (*stack.Channel, *sim.SIM, *stacktest.Collector, error) {
			s, col := sim.New(cfg), stacktest.NewCollector()
			ch, err := stack.New(stack.FromProtocols(s), stack.WithName(name), stack.WithReceiver(col))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ch.Close() })
			return ch, s, col, ch.Connect(context.Background(), "test")
		}
		port := func(p uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), p) }
		_, a, _, err := member("A")
		require.NoError(t, err)
		chB, b, colB, err := member("B")
		require.NoError(t, err)
		require.Equal(t, port(7800), a.PhysicalAddress())
		require.Equal(t, port(7801), b.PhysicalAddress())
		_, _, _, err = member("C")
		require.ErrorContains(t, err, "no free port")

		phys, err := stack.Ask(t.Context(), stack.Of(chB), stack.EvGetLocalPhysicalAddress{})
		require.NoError(t, err)
		require.Equal(t, port(7801), phys)
		for _, to := range []netip.AddrPort{port(7801), port(7802)} {
			_, err := a.DownEvent(t.Context(), stack.EvSendToPhysical{To: to, Msg: stack.NewMessage(stack.Address{}, []byte("probe"))})
			require.NoError(t, err)
		}
		synctest.Wait()
		msgs := colB.Messages()
		require.Len(t, msgs, 1)
		require.Equal(t, a.LocalAddress(), msgs[0].Src)
		require.Equal(t, port(7800), msgs[0].From)
		require.EqualValues(t, 1, net.Unreachable.Load(), "nobody holds 127.0.0.1:7802")

		require.NoError(t, chB.Close())
		_, c, _, err := member("C")
		require.NoError(t, err)
		require.Equal(t, port(7801), c.PhysicalAddress(), "B's port is free again")
	})
}

func TestWithoutBindPortThereIsNoNetworkAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := stacktest.StartSIM(t, 1, 1, nil)
		s, _ := stack.Find[*sim.SIM](stack.Of(c.Channels[0]))
		require.False(t, s.PhysicalAddress().IsValid())
		phys, _ := stack.Ask(t.Context(), stack.Of(c.Channels[0]), stack.EvGetLocalPhysicalAddress{})
		require.False(t, phys.IsValid())
		_, err := s.DownEvent(t.Context(), stack.EvSendToPhysical{To: netip.MustParseAddrPort("127.0.0.1:7800"), Msg: stack.NewMessage(stack.Address{}, nil)})
		require.ErrorIs(t, err, stack.ErrNotSupported)
	})
}

func lens(c *stacktest.Cluster) []int {
	out := make([]int, len(c.Recv))
	for i, r := range c.Recv {
		out[i] = r.Len()
	}
	return out
}

// TestTransportTotalsAreTheSumsOfItsLanes: a transport's msgs_sent and
// msgs_received count every lane (they are reported as the sums of the
// per-lane counters: 5 regular multicasts, 3 OOB unicasts and an internal
// one here), looped-back multicasts included on the sender.
func TestTransportTotalsAreTheSumsOfItsLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := stacktest.StartSIM(t, 2, stacktest.Seed(t), nil)
		a, b := c.Channels[0], c.Channels[1]
		for i := range 5 {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, i, 8))))
		}
		for i := range 3 {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), stacktest.Payload(0, 5+i, 8)).Set(stack.OOB)))
		}
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), stacktest.Payload(0, 8, 8)).Set(stack.Internal)))
		stacktest.WaitFor(t, time.Minute, func() bool { return c.Recv[1].Len() == 9 }, "B received all 9")
		sim := func(ch *stack.Channel) map[string]int64 {
			for _, ps := range ch.Stats() {
				if ps.Protocol == "SIM" {
					m := map[string]int64{}
					for _, s := range ps.Stats {
						m[s.Name] = s.Value
					}
					return m
				}
			}
			t.Fatal("no SIM layer")
			return nil
		}
		sa, sb := sim(a), sim(b)
		require.EqualValues(t, 5, sa["msgs_sent_regular"])
		require.EqualValues(t, 3, sa["msgs_sent_oob"])
		require.Positive(t, sa["msgs_sent_internal"])
		require.EqualValues(t, 8+sa["msgs_sent_internal"], sa["msgs_sent"])
		require.EqualValues(t, 5, sa["msgs_received_regular"], "A's own multicasts, looped back")
		require.EqualValues(t, 5+sa["msgs_received_oob"]+sa["msgs_received_internal"], sa["msgs_received"])
		require.EqualValues(t, 5, sb["msgs_received_regular"])
		require.EqualValues(t, 3, sb["msgs_received_oob"])
		require.Positive(t, sb["msgs_received_internal"])
		require.EqualValues(t, 8+sb["msgs_received_internal"], sb["msgs_received"])
	})
}
