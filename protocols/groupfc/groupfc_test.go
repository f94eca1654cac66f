package groupfc_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/grouptest"
	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// cluster starts n members over SIM with NAKACK, UNICAST2 and GROUPFC
// (cfg(i) configures member i's GROUPFC) and one injected view.
func cluster(t *testing.T, n int, seed uint64, cfg func(i int) groupfc.Config) (*stacktest.Cluster, []*groupfc.GROUPFC) {
	t.Helper()
	gs := make([]*groupfc.GROUPFC, n)
	c := stacktest.StartSIM(t, n, seed, func(i int) []stack.Protocol {
		nc := nakack.DefaultConfig()
		nc.XmitInterval = 100 * time.Millisecond
		uc := unicast2.DefaultConfig()
		uc.XmitInterval = 100 * time.Millisecond
		gs[i] = groupfc.New(cfg(i))
		return []stack.Protocol{nakack.New(nc), unicast2.New(uc), gs[i]}
	})
	// Joined: every member knows every other and may send to it. (The
	// JOINs and ADVs are INTERNAL, handled on parallel workers; one that
	// overtakes a connection's first message waits for UNICAST2 to fetch
	// it, so this can take a retransmission interval.)
	stacktest.WaitFor(t, time.Minute, func() bool {
		for _, g := range gs {
			if stacktest.Stat(t, g, "members") < int64(n-1) || stacktest.Stat(t, g, "small_window_receivers") > 0 {
				return false
			}
		}
		return true
	}, "the %d members joined each other", n)
	return c, gs
}

// withEvents is the default config with member events on.
func withEvents(int) groupfc.Config {
	cfg := groupfc.DefaultConfig()
	cfg.MemberEvents = true
	return cfg
}

// events returns the membership events c was given.
func events(c *stacktest.Collector) []groupfc.Event {
	var out []groupfc.Event
	for _, m := range c.Messages() {
		if ev, ok := groupfc.EventOf(m); ok {
			out = append(out, ev)
		}
	}
	return out
}

// downAt waits until col has a DOWN event for member and returns it.
func downAt(t *testing.T, col *stacktest.Collector, member stack.Address) groupfc.Event {
	t.Helper()
	var down groupfc.Event
	stacktest.WaitFor(t, time.Minute, func() bool {
		for _, ev := range events(col) {
			if !ev.Up && ev.Member == member {
				down = ev
				return true
			}
		}
		return false
	}, "%s is DOWN", member)
	return down
}

func payloads(c *stacktest.Collector) []string {
	var out []string
	for _, m := range c.Messages() {
		if _, ok := groupfc.EventOf(m); !ok {
			out = append(out, string(m.Payload))
		}
	}
	return out
}

func TestSendModesReachTheRightMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		insts := []uint64{1, 1, 2, 3}
		c, gs := cluster(t, 4, 1, func(i int) groupfc.Config {
			cfg := groupfc.DefaultConfig()
			cfg.Instance, cfg.MemberEvents = insts[i], true
			cfg.Loopback = i == 0
			return cfg
		})
		ctx := t.Context()
		addrs := c.Addresses()
		synctest.Wait()
		for i, r := range c.Recv {
			require.Len(t, events(r), 3, "member %d: UP of every other member", i)
		}
		require.NoError(t, gs[1].Broadcast(ctx, []byte("bcast")))
		require.NoError(t, gs[2].Multicast(ctx, 1, []byte("to-1")))
		require.NoError(t, gs[3].Multicast(ctx, 2, []byte("to-2")))
		first, err := gs[3].Anycast(ctx, 1, []byte("any-1"))
		require.NoError(t, err)
		second, err := gs[3].Anycast(ctx, 1, []byte("any-2"))
		require.NoError(t, err)
		require.NotEqual(t, first, second, "anycast goes round robin over the instance's members")
		require.ElementsMatch(t, []stack.Address{addrs[0], addrs[1]}, []stack.Address{first, second})
		require.NoError(t, gs[2].Unicast(ctx, addrs[3], []byte("uni")))
		synctest.Wait()
		require.Subset(t, payloads(c.Recv[0]), []string{"bcast", "to-1"}, "A: the broadcast and the multicast to its instance")
		require.Contains(t, payloads(c.Recv[1]), "to-1")
		require.NotContains(t, payloads(c.Recv[1]), "bcast", "no loopback: B does not get its own broadcast")
		require.ElementsMatch(t, []string{"bcast", "to-2"}, payloads(c.Recv[2]), "C: the broadcast and the multicast to instance 2 (a unicast)")
		require.ElementsMatch(t, []string{"bcast", "uni"}, payloads(c.Recv[3]), "D: the broadcast and the unicast")
		require.NotContains(t, payloads(c.Recv[3]), "to-1")

		// Loopback: A is a candidate for its own multicast and broadcast.
		require.NoError(t, gs[0].Broadcast(ctx, []byte("own")))
		synctest.Wait()
		require.Contains(t, payloads(c.Recv[0]), "own")
		for _, m := range c.Recv[2].Messages() {
			if string(m.Payload) == "bcast" {
				inst, ok := groupfc.SenderInstance(m)
				require.True(t, ok)
				require.EqualValues(t, 1, inst, "the sender's instance comes with the message")
			}
		}

		require.ErrorIs(t, gs[0].Multicast(ctx, 9, []byte("x")), groupfc.ErrHostUnreachable)
		_, err = gs[0].Anycast(ctx, 9, []byte("x"))
		require.ErrorIs(t, err, groupfc.ErrHostUnreachable)
		require.ErrorIs(t, gs[0].Unicast(ctx, stack.NewAddress(), []byte("x")), groupfc.ErrHostUnreachable)
		require.ErrorIs(t, gs[0].Broadcast(ctx, make([]byte, groupfc.MaxMessageSize+1)), groupfc.ErrTooLarge)
		require.NoError(t, gs[0].Broadcast(ctx, make([]byte, groupfc.MaxMessageSize)), "the largest message fits an idle window")
	})
}

// slowReceiver reads one message per delay (virtual time), and counts.
type slowReceiver struct {
	*stacktest.Collector
	delay  time.Duration
	n      atomic.Int64
	onRead func()
}

func (s *slowReceiver) Receive(m *stack.Message) {
	if _, ok := groupfc.EventOf(m); !ok {
		if s.onRead != nil {
			s.onRead()
		}
		time.Sleep(s.delay)
		// Count only once the collector has the message: a test that waits
		// for the count then reads the collector.
		defer s.n.Add(1)
	}
	s.Collector.Receive(m)
}

// TestManySendersOneReceiver: 100 members send to one receiver as fast as
// they can. Nothing is lost, no window is overrun, at most max_active+1
// senders are active at the receiver, and what it holds unread stays under
// what the windows allow: max_active large windows and idle ones for the
// rest.
func TestManySendersOneReceiver(t *testing.T) {
	const n, per, size = 100, 100, 4000
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, n, 1, func(int) groupfc.Config { return groupfc.DefaultConfig() })
		slow := &slowReceiver{Collector: c.Recv[0], delay: 200 * time.Microsecond}
		// Bytes sent and not yet read by the receiver's application: what
		// the receiver holds, wherever in its stack, plus what is on the
		// way. The windows bound it.
		var sent, peak atomic.Int64
		slow.onRead = func() {
			out := sent.Load() - slow.n.Load()*size
			for p := peak.Load(); out > p && !peak.CompareAndSwap(p, out); p = peak.Load() {
			}
		}
		c.Channels[0].SetReceiver(slow)
		synctest.Wait()
		dest := c.Addresses()[0]
		var wg sync.WaitGroup
		for i := 1; i < n; i++ {
			wg.Go(func() {
				for s := range per {
					if !assert.NoError(t, gs[i].Unicast(t.Context(), dest, stacktest.Payload(i, s, size))) {
						return
					}
					sent.Add(size)
				}
			})
		}
		wg.Wait()
		stacktest.WaitFor(t, time.Minute, func() bool { return slow.n.Load() == (n-1)*per }, "every message read")
		for i := 1; i < n; i++ {
			require.Equal(t, seq(per), c.Recv[0].Seqs(c.Addresses()[i]), "member %d: every message once, in order", i)
		}
		r := gs[0]
		maxActive := 16 // TIPC's formula for 101 members
		require.Zero(t, stacktest.Stat(t, r, "window_overruns"))
		require.LessOrEqual(t, stacktest.Stat(t, r, "active_senders_peak"), int64(maxActive+1))
		bound := int64((maxActive+1)*780+(n-1-maxActive-1)*65) * 1024
		t.Logf("receiver: peak sent-and-unread %d bytes (window bound %d), in GROUPFC's queues %d, active peak %d, reclaims %d",
			peak.Load(), bound, stacktest.Stat(t, r, "unread_bytes_peak"), stacktest.Stat(t, r, "active_senders_peak"), stacktest.Stat(t, r, "reclaims_sent"))
		require.Positive(t, peak.Load())
		require.LessOrEqual(t, peak.Load(), bound, "the windows bound what the receiver must buffer")
		require.Positive(t, stacktest.Stat(t, r, "reclaims_sent"), "with 99 senders the receiver reclaimed")
		blocked := int64(0)
		for _, g := range gs[1:] {
			blocked += stacktest.Stat(t, g, "blocked_sends")
		}
		require.Positive(t, blocked, "senders were held back by the windows")
	})
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestSlowReceiverThrottlesTheBroadcaster: one member broadcasts to three;
// one of them reads slowly. The sender runs at that receiver's pace, never
// more than a large window ahead of it, and nothing is lost.
func TestSlowReceiverThrottlesTheBroadcaster(t *testing.T) {
	const n, size = 2000, 1000
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, 4, 1, func(int) groupfc.Config { return groupfc.DefaultConfig() })
		slow := &slowReceiver{Collector: c.Recv[3], delay: 10 * time.Millisecond}
		c.Channels[3].SetReceiver(slow)
		synctest.Wait()
		perWindow := int64(780 / ((44+size)/1024 + 1))
		start := time.Now()
		for s := range n {
			require.NoError(t, gs[0].Broadcast(t.Context(), stacktest.Payload(0, s, size)))
			require.LessOrEqual(t, int64(s+1)-slow.n.Load(), perWindow+1, "the sender is never more than a window ahead of the slow receiver")
		}
		took := time.Since(start)
		stacktest.WaitFor(t, time.Minute, func() bool { return slow.n.Load() == n }, "the slow receiver reads everything")
		for i := 1; i < 4; i++ {
			require.Equal(t, seq(n), c.Recv[i].Seqs(c.Addresses()[0]), "member %d", i)
		}
		t.Logf("%d broadcasts took %s; the slow receiver needs %s", n, took, time.Duration(n)*slow.delay)
		require.GreaterOrEqual(t, took, time.Duration(n-int(perWindow)-1)*slow.delay, "throttled to the slow receiver's pace")
		require.Positive(t, stacktest.Stat(t, gs[0], "blocked_sends"))
	})
}

// TestBlockedSendToADepartedMember: a unicast waiting for a member's window
// ends with ErrHostUnreachable when the member leaves the view; a Try call
// says ErrWouldBlock while it waits.
func TestBlockedSendToADepartedMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, 3, 1, func(int) groupfc.Config { return groupfc.DefaultConfig() })
		stuck := make(chan struct{})
		c.Channels[1].SetReceiver(stack.ReceiverFuncs{OnReceive: func(*stack.Message) { <-stuck }})
		defer close(stuck)
		synctest.Wait()
		b := c.Addresses()[1]
		sent := 0
		for gs[0].TryUnicast(b, make([]byte, 1000)) == nil {
			sent++
		}
		require.Positive(t, sent)
		require.ErrorIs(t, gs[0].TryUnicast(b, make([]byte, 1000)), groupfc.ErrWouldBlock)
		done := make(chan error, 1)
		go func() { done <- gs[0].Unicast(context.Background(), b, make([]byte, 1000)) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("the send did not wait: %v", err)
		default:
		}
		// B's node goes down: suspected, then a view without it.
		_, _ = gs[0].UpEvent(stack.EvSuspect{Members: []stack.Address{b}})
		addrs := c.Addresses()
		stacktest.InjectView(t, stack.NewView(addrs[0], 10, addrs[0], addrs[2]), c.Channels[0], c.Channels[2])
		require.ErrorIs(t, <-done, groupfc.ErrHostUnreachable)
		require.ErrorIs(t, gs[0].Unicast(t.Context(), b, []byte("x")), groupfc.ErrHostUnreachable)
	})
}

// TestMemberEventsComeInOrderWithMessages: UP before a member's first
// broadcast, DOWN after its last, graceful when it disconnects.
func TestMemberEventsComeInOrderWithMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, 3, 1, withEvents)
		synctest.Wait()
		for s := range 5 {
			require.NoError(t, gs[2].Broadcast(t.Context(), []byte(fmt.Sprint("m", s))))
		}
		require.NoError(t, c.Channels[2].Disconnect(t.Context()))
		synctest.Wait() // what C sent is in before the view without it
		addrs := c.Addresses()
		stacktest.InjectView(t, stack.NewView(addrs[0], 10, addrs[0], addrs[1]), c.Channels[0], c.Channels[1])
		synctest.Wait()
		for i := range 2 {
			var seen []string
			for _, m := range c.Recv[i].Messages() {
				if ev, ok := groupfc.EventOf(m); ok {
					if ev.Member == addrs[2] {
						seen = append(seen, map[bool]string{true: "UP", false: "DOWN"}[ev.Up])
						if !ev.Up {
							require.True(t, ev.Graceful, "a disconnect is a graceful leave")
						}
					}
					continue
				}
				if m.Src == addrs[2] {
					seen = append(seen, string(m.Payload))
				}
			}
			require.Equal(t, []string{"UP", "m0", "m1", "m2", "m3", "m4", "DOWN"}, seen, "member %d", i)
		}
	})
}

// TestBroadcastsUnderLossArriveOnceInOrder: 4 members broadcast over 10%
// loss with GROUPFC's windows; every member gets every broadcast once, in
// order, for every seed.
func TestBroadcastsUnderLossArriveOnceInOrder(t *testing.T) {
	const n, per = 4, 300
	for seed := uint64(1); seed <= stacktest.Seeds(5); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, gs := cluster(t, n, seed, func(int) groupfc.Config { return groupfc.DefaultConfig() })
				synctest.Wait()
				c.Net.SetDefault(sim.Rule{Drop: 0.1})
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						for s := range per {
							if !assert.NoError(t, gs[i].Broadcast(t.Context(), stacktest.Payload(i, s, 2000))) {
								return
							}
						}
					})
				}
				wg.Wait()
				addrs := c.Addresses()
				stacktest.WaitFor(t, 10*time.Minute, func() bool {
					for _, r := range c.Recv {
						if r.Len() < (n-1)*per {
							return false
						}
					}
					return true
				}, "every broadcast delivered")
				for i, r := range c.Recv {
					for j, a := range addrs {
						if i != j {
							require.Equal(t, seq(per), r.Seqs(a), "member %d from %d", i, j)
						}
					}
				}
			})
		})
	}
}

// TestGroupOverFullMembershipStack: members join one by one through GMS
// (a JOIN may reach a member before its own first view); then every member
// broadcasts and every other gets it, and a crashed member is DOWN (lost)
// at the others.
func TestGroupOverFullMembershipStack(t *testing.T) {
	grouptest.Seeds(t, func(t *testing.T, seed uint64) {
		l := grouptest.New(t, seed)
		gs := map[int]*groupfc.GROUPFC{}
		l.Top = func(i int) []stack.Protocol {
			cfg := groupfc.DefaultConfig()
			cfg.MemberEvents = true
			gs[i] = groupfc.New(cfg)
			return []stack.Protocol{gs[i]}
		}
		var ms []*grouptest.Member
		for range 4 {
			m := l.Add()
			l.ConnectAll(m)
			ms = append(ms, m)
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return grouptest.SameView(ms...) }, "one view")
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		for i := range ms {
			require.NoError(t, gs[i].Broadcast(ctx, stacktest.Payload(i, 0, 100)), "member %d broadcasts", i)
		}
		stacktest.WaitFor(t, time.Minute, func() bool {
			for i, m := range ms {
				for j, o := range ms {
					if i != j && len(m.Col.Seqs(o.Addr())) != 1 {
						return false
					}
				}
			}
			return true
		}, "every broadcast everywhere")
		l.Net.Cut(ms[3].Addr())
		stacktest.WaitFor(t, time.Minute, func() bool {
			for _, m := range ms[:3] {
				found := false
				for _, ev := range events(m.Col) {
					found = found || (!ev.Up && ev.Member == ms[3].Addr() && !ev.Graceful)
				}
				if !found {
					return false
				}
			}
			return true
		}, "the crashed member is DOWN (lost) everywhere")
	})
}

// TestBlockedAnycastFindsAnotherMember: both members of an instance stop
// reading, so an anycast waits; the one it waits for leaves the view, the
// other reads again, and the anycast goes to it.
func TestBlockedAnycastFindsAnotherMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, 3, 1, func(i int) groupfc.Config {
			cfg := groupfc.DefaultConfig()
			cfg.Instance = map[bool]uint64{true: 0, false: 5}[i == 0]
			return cfg
		})
		stuck := []chan struct{}{nil, make(chan struct{}), make(chan struct{})}
		for i := 1; i < 3; i++ {
			c.Channels[i].SetReceiver(stack.ReceiverFuncs{OnReceive: func(*stack.Message) { <-stuck[i] }})
		}
		synctest.Wait()
		for {
			if _, err := gs[0].TryAnycast(5, make([]byte, 1000)); err != nil {
				require.ErrorIs(t, err, groupfc.ErrWouldBlock)
				break
			}
		}
		type result struct {
			to  stack.Address
			err error
		}
		done := make(chan result, 1)
		go func() {
			to, err := gs[0].Anycast(context.Background(), 5, make([]byte, 1000))
			done <- result{to, err}
		}()
		synctest.Wait()
		require.Empty(t, done, "the anycast waits")
		addrs := c.Addresses()
		_, _ = gs[0].UpEvent(stack.EvSuspect{Members: []stack.Address{addrs[1]}})
		stacktest.InjectView(t, stack.NewView(addrs[0], 10, addrs[0], addrs[2]), c.Channels[0], c.Channels[2])
		close(stuck[1])
		close(stuck[2])
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, addrs[2], r.to, "the anycast went to the member still there")
	})
}

// TestLostLeaveStillArrivesBeforeTheLeaverStops: C leaves and its LEAVE to
// A is lost. C's stack does not stop at once: it waits for A's LEAVE_ACK,
// sending LEAVE again, so A learns that C left (DOWN graceful, after C's
// broadcasts) rather than giving up on it after leave_timeout and calling
// it lost.
func TestLostLeaveStillArrivesBeforeTheLeaverStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, 3, 1, withEvents)
		synctest.Wait()
		addrs := c.Addresses()
		var lost atomic.Bool
		c.Net.SetLink(addrs[2], addrs[0], sim.Rule{DropIf: func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDGROUPFC).(*groupfc.Header)
			return ok && h.Kind() == "LEAVE" && lost.CompareAndSwap(false, true)
		}})
		require.NoError(t, gs[2].Broadcast(t.Context(), []byte("last")))
		require.NoError(t, c.Channels[2].Disconnect(t.Context()))
		require.True(t, lost.Load(), "the first LEAVE to A was lost")
		stacktest.InjectView(t, stack.NewView(addrs[0], 10, addrs[0], addrs[1]), c.Channels[0], c.Channels[1])
		downAt(t, c.Recv[0], addrs[2])
		require.True(t, downAt(t, c.Recv[0], addrs[2]).Graceful, "C left; it was not lost")
		require.Contains(t, payloads(c.Recv[0]), "last")
	})
}

// downBlocker is a receiver whose Receive blocks on a DOWN event until
// release is closed.
type downBlocker struct {
	*stacktest.Collector
	release chan struct{}
}

func (d downBlocker) Receive(m *stack.Message) {
	if ev, ok := groupfc.EventOf(m); ok && !ev.Up {
		<-d.release
	}
	d.Collector.Receive(m)
}

// TestViewChangeDoesNotWaitForTheApplication: a view drops a crashed
// member, and the application's Receive blocks on that member's DOWN. The
// view's installation (GMS's path, which every later view waits for) must
// not run the application's callback: it returns at once, and DOWN is
// delivered on GROUPFC's own goroutine.
func TestViewChangeDoesNotWaitForTheApplication(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, 3, 1, withEvents)
		synctest.Wait()
		addrs := c.Addresses()
		release := make(chan struct{})
		c.Channels[0].SetReceiver(downBlocker{Collector: c.Recv[0], release: release})
		_, err := gs[0].UpEvent(stack.EvSuspect{Members: []stack.Address{addrs[2]}})
		require.NoError(t, err)
		installed := make(chan struct{})
		go func() {
			stacktest.InjectView(t, stack.NewView(addrs[0], 10, addrs[0], addrs[1]), c.Channels[0])
			close(installed)
		}()
		synctest.Wait()
		select {
		case <-installed:
		default:
			t.Error("the view's installation waits for the application's Receive")
		}
		close(release)
		synctest.Wait()
		<-installed
		require.Contains(t, events(c.Recv[0]), groupfc.Event{Member: addrs[2], Instance: 0, Up: false})
	})
}

// TestRepliesFromReceiveDoNotStall: B answers every request from A with a
// unicast sent inside its Receive (the seed-003 shape). The reply waits for
// B's window toward A, which A's ADVs refill. Delivering the requests on
// the lane that brings A's ADVs would make B's Receive wait for an ADV
// queued behind the request it is handling (ADVs are INTERNAL now, and
// GROUPFC delivers on goroutines of its own): all 2,000 exchanges must
// complete.
func TestRepliesFromReceiveDoNotStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, 2, 1, func(int) groupfc.Config { return groupfc.DefaultConfig() })
		synctest.Wait()
		addrs := c.Addresses()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		const n = 2000
		var replies atomic.Int64
		var replyErr atomic.Value
		c.Channels[0].SetReceiver(stack.ReceiverFuncs{OnReceive: func(*stack.Message) { replies.Add(1) }})
		c.Channels[1].SetReceiver(stack.ReceiverFuncs{OnReceive: func(m *stack.Message) {
			if err := gs[1].Unicast(ctx, addrs[0], make([]byte, 1000)); err != nil {
				replyErr.CompareAndSwap(nil, err)
			}
		}})
		for i := range n {
			require.NoError(t, gs[0].Unicast(ctx, addrs[1], make([]byte, 1000)), "request %d", i)
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return replies.Load() == n }, "every reply")
		require.Nil(t, replyErr.Load(), "a reply failed")
	})
}

// TestLeaverWaitsUntilEveryMemberHasWhatItSent: C's unicast to A and every
// resend of it are lost for three times leave_timeout, so A's LEAVE_ACK
// (sent once it has everything before the LEAVE) comes late. C's stack must
// stay up until it comes: A then has C's message and calls C's DOWN
// graceful. A leaver that stopped after leave_timeout left A with a gap it
// could never fill: the message lost, and C "crashed".
func TestLeaverWaitsUntilEveryMemberHasWhatItSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, 3, 1, withEvents)
		synctest.Wait()
		addrs := c.Addresses()
		var cut atomic.Bool
		cut.Store(true)
		c.Net.SetLink(addrs[2], addrs[0], sim.Rule{DropIf: func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDGROUPFC).(*groupfc.Header)
			return ok && h.Kind() == "UCAST" && cut.Load()
		}})
		require.NoError(t, gs[2].Unicast(t.Context(), addrs[0], []byte("last")))
		left := make(chan error, 1)
		go func() { left <- c.Channels[2].Disconnect(t.Context()) }()
		time.Sleep(3 * groupfc.DefaultConfig().LeaveTimeout) // the fault's length, in virtual time
		cut.Store(false)
		require.NoError(t, <-left)
		stacktest.InjectView(t, stack.NewView(addrs[0], 10, addrs[0], addrs[1]), c.Channels[0], c.Channels[1])
		downAt(t, c.Recv[0], addrs[2])
		require.Contains(t, payloads(c.Recv[0]), "last")
		require.True(t, downAt(t, c.Recv[0], addrs[2]).Graceful, "C left; it was not lost")
	})
}

// TestLeaverStopsWaitingAfterMaxLeaveWait: C's view has gone on without
// B, but B's still has C (no failure detection here, as in
// TestBlockedSendToADepartedMember). C closes and stops, and nothing of C's
// reaches B any more, so B cannot know. B's leave waits at most
// max_leave_wait for C's confirmation, even with a context that does not
// end sooner. (Without the bound it waited for ever: the CI hang in the
// cleanup of TestBlockedSendToADepartedMember, which closes C, then B.)
func TestLeaverStopsWaitingAfterMaxLeaveWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs := cluster(t, 3, 1, withEvents)
		synctest.Wait()
		addrs := c.Addresses()
		c.Net.SetLink(addrs[2], addrs[1], sim.Rule{Drop: 1})
		stacktest.InjectView(t, stack.NewView(addrs[0], 10, addrs[0], addrs[2]), c.Channels[0], c.Channels[2])
		require.NoError(t, c.Channels[2].Close())
		max := groupfc.DefaultConfig().MaxLeaveWait
		ctx, cancel := context.WithTimeout(context.Background(), 3*max)
		defer cancel()
		start := time.Now()
		require.NoError(t, c.Channels[1].Disconnect(ctx))
		require.NoError(t, ctx.Err(), "B waited for C until its context ended")
		require.LessOrEqual(t, time.Since(start), max)
		require.EqualValues(t, 1, stacktest.Stat(t, gs[1], "leaves_unacknowledged"))
	})
}

// lateAtA starts A and B, has B broadcast "b0" (the first broadcast after
// the JOINs, a replicast) and makes B's messages that match late at A,
// below NAKACK, until let is called.
func lateAtA(t *testing.T, match func(*stack.Message) bool) (c *stacktest.Cluster, gs []*groupfc.GROUPFC, let func()) {
	c, gs = cluster(t, 2, 1, func(int) groupfc.Config { return groupfc.DefaultConfig() })
	b := c.Addresses()[1]
	require.NoError(t, gs[1].Broadcast(t.Context(), []byte("b0")))
	synctest.Wait()
	var late atomic.Bool
	late.Store(true)
	release := make(chan struct{})
	var once sync.Once
	let = func() { once.Do(func() { late.Store(false); close(release) }) }
	d := discard.New(discard.DefaultConfig())
	d.DropUpIf(func(m *stack.Message) bool {
		if m.Src == b && late.Load() && match(m) {
			<-release
		}
		return false
	})
	require.NoError(t, stack.Of(c.Channels[0]).InsertBelow(d, "NAKACK"))
	return c, gs, let
}

// TestUnicastIsDeliveredAfterTheBroadcastsBeforeIt: B broadcasts (by
// multicast) and then unicasts to A; the multicast is late at A, so the
// unicast, on another path, arrives first. A holds the unicast until the
// broadcast is delivered (it carries B's next broadcast seqno, spec §5):
// A delivers in B's order.
func TestUnicastIsDeliveredAfterTheBroadcastsBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs, let := lateAtA(t, func(m *stack.Message) bool { return m.IsMulticast() })
		defer let()
		ctx, addrs := t.Context(), c.Addresses()
		require.NoError(t, gs[1].Broadcast(ctx, []byte("b1")))
		require.NoError(t, gs[1].Unicast(ctx, addrs[0], []byte("u1")))
		synctest.Wait()
		require.Equal(t, []string{"b0"}, payloads(c.Recv[0]), "the unicast waits for the broadcast before it")
		let()
		synctest.Wait()
		require.Equal(t, []string{"b0", "b1", "u1"}, payloads(c.Recv[0]))
	})
}

// TestBroadcastAfterAUnicastDoesNotOvertakeIt: B unicasts to A and then
// broadcasts; the unicast is late at A. The first broadcast after a
// unicast goes by the unicast path (a replicast), behind the unicast, so A
// delivers both in B's order. By multicast it would overtake.
func TestBroadcastAfterAUnicastDoesNotOvertakeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs, let := lateAtA(t, func(m *stack.Message) bool { return !m.IsMulticast() && string(m.Payload) == "u1" })
		defer let()
		ctx, addrs := t.Context(), c.Addresses()
		require.NoError(t, gs[1].Unicast(ctx, addrs[0], []byte("u1")))
		require.NoError(t, gs[1].Broadcast(ctx, []byte("b1")))
		synctest.Wait()
		require.Equal(t, []string{"b0"}, payloads(c.Recv[0]), "the broadcast waits behind the unicast")
		let()
		synctest.Wait()
		require.Equal(t, []string{"b0", "u1", "b1"}, payloads(c.Recv[0]))
	})
}
