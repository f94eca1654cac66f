package nakack_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/protocols/stable"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
	"github.com/strata-go/strata/stack/wire"
)

func nakCfg() nakack.Config {
	c := nakack.DefaultConfig()
	c.XmitInterval = 100 * time.Millisecond
	return c
}

func stableCfg() stable.Config {
	c := stable.DefaultConfig()
	c.Interval = time.Second
	return c
}

type group struct {
	t   testing.TB
	c   *stacktest.Cluster
	nak []*nakack.NAKACK
	d   []*discard.Discard
}

func newGroup(t *testing.T, n int, seed uint64) *group {
	g := &group{t: t, nak: make([]*nakack.NAKACK, n), d: make([]*discard.Discard, n)}
	g.c = stacktest.StartSIM(t, n, seed, func(i int) []stack.Protocol {
		g.nak[i] = nakack.New(nakCfg())
		g.d[i] = discard.New(discard.DefaultConfig())
		return []stack.Protocol{g.d[i], g.nak[i], stable.New(stableCfg())}
	})
	return g
}

func (g *group) allStable() bool {
	for _, n := range g.nak {
		if stacktest.Stat(g.t, n, "msgs_held") != 0 {
			return false
		}
	}
	return true
}

// TestEveryMemberDeliversEveryMulticastOnceInOrderUnderFaults: 4 members
// each multicast 10,000 messages over 20% drop, duplication and
// reordering; 20 seeds (more with STRATA_SEEDS).
func TestEveryMemberDeliversEveryMulticastOnceInOrderUnderFaults(t *testing.T) {
	const members, per = 4, 10000
	for seed := uint64(1); seed <= stacktest.Seeds(20); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newGroup(t, members, seed)
				g.c.Net.SetDefault(sim.Rule{Drop: 0.2, Duplicate: 0.2, Reorder: 0.2, ReorderWindow: 5 * time.Millisecond})
				var wg sync.WaitGroup
				for i, ch := range g.c.Channels {
					wg.Go(func() {
						for s := range per {
							if !assert.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, s, 16)))) {
								return
							}
							if s%100 == 99 {
								time.Sleep(time.Millisecond) // paced, as flow control would
							}
						}
					})
				}
				wg.Wait()
				addrs := g.c.Addresses()
				stacktest.WaitFor(t, 30*time.Minute, func() bool {
					for _, r := range g.c.Recv {
						if r.Len() < members*per {
							return false
						}
					}
					return g.allStable()
				}, "all delivered and stable")
				for i, r := range g.c.Recv {
					require.Empty(t, r.CheckExactlyOnce(addrs, per, true), "member %d", i)
				}
			})
		})
	}
}

func TestLostLastMulticastIsRecovered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(t, 3, 1)
		var dropped atomic.Int64
		g.d[2].DropUpIf(func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDNAKACK).(*nakack.Header)
			if ok && h.Seqno == 3 && m.IsMulticast() && dropped.Load() == 0 {
				dropped.Add(1)
				return true
			}
			return false
		})
		for s := range 3 {
			require.NoError(t, g.c.Channels[0].Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 8))))
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[2].Len() == 3 }, "last message recovered")
		require.EqualValues(t, 1, dropped.Load())
		require.Empty(t, g.c.Recv[2].CheckExactlyOnce(g.c.Addresses()[:1], 3, true))
		stacktest.WaitFor(t, time.Minute, g.allStable, "STABLE purges every table to zero")
	})
}

func TestOOBNotHeldBackByGapAndDeliveredOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(t, 2, 1)
		var lose atomic.Bool
		lose.Store(true)
		g.d[1].DropUpIf(func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDNAKACK).(*nakack.Header)
			return lose.Load() && ok && h.Seqno == 1
		})
		g.c.Net.SetDefault(sim.Rule{Duplicate: 1})
		a := g.c.Channels[0]
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, 0, 8))))
		for s := 1; s <= 3; s++ {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 8)).Set(stack.OOB)))
		}
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, 4, 8))))
		synctest.Wait()
		require.ElementsMatch(t, []int{1, 2, 3}, g.c.Recv[1].Seqs(a.Address()), "OOB delivered despite the gap; regular held")
		lose.Store(false)
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[1].Len() == 5 }, "gap filled")
		got := g.c.Recv[1].Seqs(a.Address())
		require.Equal(t, []int{0, 4}, []int{got[3], got[4]}, "regular messages in order after the OOB ones")
		require.Equal(t, []int{0, 1, 2, 3, 4}, sortedCopy(g.c.Recv[0].Seqs(a.Address())), "own multicasts delivered once each")
		stacktest.WaitFor(t, time.Minute, g.allStable, "stable")
	})
}

func sortedCopy(s []int) []int {
	out := append([]int(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestRetransmissionFromAnotherMemberWhenSenderIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(t, 3, 1)
		a, b, c := g.c.Channels[0], g.c.Channels[1], g.c.Channels[2]
		g.d[2].DropUpIf(func(m *stack.Message) bool { return m.Src == a.Address() && m.IsMulticast() })
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, 0, 8))))
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, 1, 8))))
		stacktest.WaitFor(t, time.Second, func() bool { return g.c.Recv[1].Len() == 2 }, "B has both")
		// A is gone before C got anything; C's view no longer has A, and C
		// knows from a digest (as a flush would give it) that A sent 2.
		require.NoError(t, a.Close())
		stacktest.InjectView(t, stack.NewView(b.Address(), 9, b.Address(), c.Address()), c)
		g.d[2].DropUpIf(nil)
		g.nak[2].SetDigest(stack.Digest{{Member: a.Address(), HighestDelivered: 0, HighestReceived: 2}})
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[2].Len() == 2 }, "C got A's messages from B")
	})
}

func TestNoReliabilityAndUnicastsPassUntouched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(t, 2, 1)
		a, b := g.c.Channels[0], g.c.Channels[1]
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, []byte("raw")).Set(stack.NoReliability)))
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(b.Address(), []byte("uni"))))
		synctest.Wait()
		require.Zero(t, stacktest.Stat(t, g.nak[0], "msgs_sent"))
		require.Equal(t, 2, g.c.Recv[1].Len())
	})
}

func TestDigestGetAndSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(t, 2, 1)
		a := g.c.Channels[0]
		for s := range 5 {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 8))))
		}
		stacktest.WaitFor(t, time.Second, func() bool { return g.c.Recv[1].Len() == 5 }, "delivered")
		d, err := stack.Ask(t.Context(), stack.Of(g.c.Channels[1]), stack.EvGetDigest{})
		require.NoError(t, err)
		e, ok := d.Get(a.Address())
		require.True(t, ok)
		require.Equal(t, uint64(5), e.HighestDelivered)
		r := wire.NewReader(stack.AppendDigest(nil, d))
		require.Equal(t, d, stack.ReadDigest(r))
		require.NoError(t, r.Err())
	})
}

// TestOwnMulticastLostBelowIsStillDeliveredToSelf: a lossy layer between
// NAKACK and the transport drops a multicast on its way down, so its
// loopback never comes; the sender still delivers it (and the others get it
// by retransmission), and later ones are not held up.
func TestOwnMulticastLostBelowIsStillDeliveredToSelf(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(t, 2, 1)
		var once atomic.Bool
		g.d[0].DropDownIf(func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDNAKACK).(*nakack.Header)
			return ok && h.Seqno == 2 && m.IsMulticast() && once.CompareAndSwap(false, true)
		})
		a := g.c.Channels[0]
		for s := range 4 {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 8))))
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[0].Len() == 4 && g.c.Recv[1].Len() == 4 }, "all delivered on both")
		for _, r := range g.c.Recv {
			require.Empty(t, r.CheckExactlyOnce([]stack.Address{a.Address()}, 4, true))
		}
		require.True(t, once.Load())
	})
}

// TestImpossibleSeqnosAreDroppedAndCounted: a multicast whose seqno is
// forged to 2^40 ahead, and a HIGHEST_SEQNO claiming as much, are dropped
// and counted: the real messages are all delivered once, in order, nothing
// is held for ever, and no retransmission is asked for seqnos nobody sent.
func TestImpossibleSeqnosAreDroppedAndCounted(t *testing.T) {
	for _, kind := range []string{"MSG", "HIGHEST_SEQNO"} {
		t.Run(kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &stacktest.Forger{Forge: func(m *stack.Message) bool {
					h, ok := m.Header(stack.IDNAKACK).(*nakack.Header)
					if !ok || h.Type.String() != kind || h.Seqno != 2 {
						return false
					}
					nh := *h
					nh.Seqno += 1 << 40
					m.PutHeader(stack.IDNAKACK, &nh)
					return true
				}}
				g := &group{t: t, nak: make([]*nakack.NAKACK, 2), d: make([]*discard.Discard, 2)}
				g.c = stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol {
					g.nak[i] = nakack.New(nakCfg())
					ps := []stack.Protocol{g.nak[i], stable.New(stableCfg())}
					if i == 1 {
						return append([]stack.Protocol{f}, ps...)
					}
					return ps
				})
				for s := range 2 {
					require.NoError(t, g.c.Channels[0].Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 8))))
				}
				stacktest.WaitFor(t, time.Minute, func() bool { return stacktest.Stat(t, g.nak[1], "dropped_too_far_ahead") == 1 }, "the forgery dropped and counted")
				require.NoError(t, g.c.Channels[0].Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, 2, 8))))
				stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[1].Len() == 3 }, "every real message delivered")
				require.Empty(t, g.c.Recv[1].CheckExactlyOnce(g.c.Addresses()[:1], 3, true))
				stacktest.WaitFor(t, time.Minute, g.allStable, "nothing held")
				asked := stacktest.Stat(t, g.nak[1], "xmit_reqs_sent")
				time.Sleep(time.Minute) // virtual: a minute in which nothing is missing
				require.Equal(t, asked, stacktest.Stat(t, g.nak[1], "xmit_reqs_sent"), "no request for seqnos nobody sent")
			})
		})
	}
}

// TestPurgedMessagesOfAnotherViewAreSkipped: A's first five multicasts were
// sent in a view without C ([A,B]) and became stable there, so A purged
// them. C then joins a view with A carrying a digest that is older than
// that purge (as a merge view's digest can be: the other subgroup's STABLE
// went on after the digest was taken). A answers C's requests with
// PURGED, C skips those seqnos, and delivers A's later multicasts in
// order; without the answer C would ask for ever and deliver nothing more
// from A.
func TestPurgedMessagesOfAnotherViewAreSkipped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(t, 3, 1)
		a, b, c := g.c.Channels[0], g.c.Channels[1], g.c.Channels[2]
		g.d[2].DropUpIf(func(m *stack.Message) bool { return m.Src == a.Address() })
		stacktest.InjectView(t, stack.NewView(a.Address(), 5, a.Address(), b.Address()), a, b)
		for s := range 5 {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 8))))
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return stacktest.Stat(t, g.nak[0], "msgs_purged") >= 5 }, "A purged its five multicasts")
		stacktest.InjectView(t, stack.NewView(a.Address(), 6, a.Address(), b.Address(), c.Address()), a, b, c)
		g.nak[2].SetDigest(stack.Digest{{Member: a.Address(), HighestDelivered: 2, HighestReceived: 5}})
		g.d[2].DropUpIf(nil)
		for s := 5; s < 8; s++ {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 8))))
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[2].Len() == 3 }, "C delivered A's multicasts of the new view")
		require.Equal(t, []int{5, 6, 7}, g.c.Recv[2].Seqs(a.Address()))
		require.Equal(t, int64(3), stacktest.Stat(t, g.nak[2], "msgs_skipped_purged"))
		require.Positive(t, stacktest.Stat(t, g.nak[0], "purged_answers_sent"))
	})
}

// TestHoldLeavesTheMembersOwnMulticastsAlone: a view-change flush holds
// every other sender at what was delivered from it, but a member's own
// multicasts (sent before it blocked) are delivered to it at once, in the
// view they were sent in: held, they would reach it only after the next
// view (or never in the view of a member the flush went on without).
func TestHoldLeavesTheMembersOwnMulticastsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(t, 2, 1)
		a, b := g.c.Channels[0], g.c.Channels[1]
		_, err := stack.Ask(t.Context(), stack.Of(a), stack.EvHold{})
		require.NoError(t, err)
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, 0, 8))))
		require.NoError(t, b.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(1, 0, 8))))
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[0].Len() == 1 && g.c.Recv[1].Len() == 2 }, "A delivered its own multicast, B both")
		synctest.Wait()
		require.Empty(t, g.c.Recv[0].Seqs(b.Address()), "B's multicast is held at A")
		err = stack.Of(a).DownEvent(t.Context(), stack.EvReleaseHold{})
		require.NoError(t, err)
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[0].Len() == 2 }, "released")
	})
}

// TestGapIsRepairedLongBeforeXmitInterval: C loses A's multicast 3 of 10.
// It asks for it once the gap has stayed xmit_interval/50, not at the next
// xmit_interval: on a LAN a datagram lost in a full socket buffer
// holds up delivery from its sender (and so the sender's flow-control
// credits) for tens of milliseconds, not half a second. Virtual time.
func TestGapIsRepairedLongBeforeXmitInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(t, 3, 1)
		synctest.Wait()
		var dropped atomic.Bool
		g.d[2].DropUpIf(func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDNAKACK).(*nakack.Header)
			return ok && h.Type.String() == "MSG" && h.Seqno == 3 && dropped.CompareAndSwap(false, true)
		})
		start := time.Now()
		for s := range 10 {
			require.NoError(t, g.c.Channels[0].Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 8))))
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[2].Len() == 10 }, "C has every message")
		require.True(t, dropped.Load())
		require.LessOrEqual(t, time.Since(start), nakCfg().XmitInterval/10, "repaired within a tenth of xmit_interval")
		require.Empty(t, g.c.Recv[2].CheckExactlyOnce(g.c.Addresses()[:1], 10, true))
		require.EqualValues(t, 1, stacktest.Stat(t, g.nak[2], "xmit_reqs_sent"), "one request")
	})
}

// TestBufferAboveAGapIsBoundedAndRefills: B never gets A's first multicast
// while A sends 300 KB more; what B holds above the gap stays within
// max_buffered_bytes (the rest is dropped and counted). Once the first
// comes, B fetches what it dropped and delivers all of it, once, in order.
func TestBufferAboveAGapIsBoundedAndRefills(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const bound, count, size = 64 << 10, 300, 1000
		g := &group{t: t, nak: make([]*nakack.NAKACK, 2), d: make([]*discard.Discard, 2)}
		g.c = stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol {
			cfg := nakCfg()
			cfg.MaxBuffered = bound
			g.nak[i] = nakack.New(cfg)
			g.d[i] = discard.New(discard.DefaultConfig())
			return []stack.Protocol{g.d[i], g.nak[i], stable.New(stableCfg())}
		})
		var lose atomic.Bool
		lose.Store(true)
		g.d[1].DropUpIf(func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDNAKACK).(*nakack.Header)
			return lose.Load() && ok && h.Seqno == 1
		})
		a := g.c.Channels[0]
		for s := range count {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, size))))
		}
		synctest.Wait()
		require.Zero(t, g.c.Recv[1].Len(), "nothing delivered above the gap")
		require.Positive(t, stacktest.Stat(t, g.nak[1], "dropped_buffer_full"), "what does not fit is dropped")
		require.LessOrEqual(t, stacktest.Stat(t, g.nak[1], "buffered_bytes_peak"), int64(bound), "B never holds more than max_buffered_bytes")
		lose.Store(false)
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[1].Len() == count }, "everything delivered once the gap is filled")
		require.Empty(t, g.c.Recv[1].CheckExactlyOnce(g.c.Addresses()[:1], count, true))
		stacktest.WaitFor(t, time.Minute, g.allStable, "nothing held")
	})
}

// TestLongRetransmissionRequestsGoInPartsThatFitADatagram: with 1.5 KB
// datagrams (a control budget of 512 bytes) and max_xmit_req 8192, B
// misses A's first 2,000 multicasts; one request for all of them would
// take about 2 KB and be refused by the transport, and the gap would
// never close. NAKACK sends it in several requests that each fit.
func TestLongRetransmissionRequestsGoInPartsThatFitADatagram(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 2000
		net := stacktest.NewNetwork(t, 1)
		var sims []*sim.SIM
		g := &group{t: t, nak: make([]*nakack.NAKACK, 2), d: make([]*discard.Discard, 2)}
		g.c = stacktest.Start(t, 2, func(i int) []stack.Protocol {
			scfg := sim.DefaultConfig()
			scfg.Network, scfg.BundleSize = net.Name(), 1536
			cfg := nakCfg()
			cfg.MaxXmitReq = wire.MaxSeqnoList
			s := sim.New(scfg)
			sims = append(sims, s)
			g.nak[i], g.d[i] = nakack.New(cfg), discard.New(discard.DefaultConfig())
			return []stack.Protocol{s, g.d[i], g.nak[i]}
		})
		g.c.Net = net
		g.c.InjectView(t)
		var lose atomic.Bool
		lose.Store(true)
		g.d[1].DropUpIf(func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDNAKACK).(*nakack.Header)
			return lose.Load() && ok && h.Type.String() == "MSG"
		})
		a := g.c.Channels[0]
		for s := range n {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 8))))
		}
		synctest.Wait()
		lose.Store(false)
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, n, 8))))
		stacktest.WaitFor(t, time.Minute, func() bool { return g.c.Recv[1].Len() == n+1 }, "B has every message")
		require.Empty(t, g.c.Recv[1].CheckExactlyOnce(g.c.Addresses()[:1], n+1, true))
		require.Greater(t, stacktest.Stat(t, g.nak[1], "xmit_reqs_sent"), int64(3), "the request went in parts")
		for i, s := range sims {
			require.Zero(t, stacktest.Stat(t, s, "msgs_too_big"), "member %d sent nothing larger than a datagram", i)
		}
	})
}
