package groupfc

// Tests for the TIPC group fixes that the other tests would not miss if
// they were removed (issue #27, class 5). Each says what breaking its fix
// does to it.

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestReadingAnActiveMemberMovesItToTheTailOfTheReclaimOrder: the active
// list is least recently read first, so a reclaim takes the large window
// from the sender read longest ago. R (max_active 4, reclaim limit 3) reads
// A1, A2 and A3 in that order, then A1 again: the order is A2, A3, A1. N's
// first message makes N active and R reclaim: from A2, not from A1, which
// R has just read.
//
// Without the fix (read leaving an ACTIVE member where it is), the order
// stays A1, A2, A3 and A1 is reclaimed.
func TestReadingAnActiveMemberMovesItToTheTailOfTheReclaimOrder(t *testing.T) {
	names := []string{"R", "A1", "A2", "A3", "N"}
	h := newHarness(t, 4, names...)
	joinAll(h, names...)
	r := h.n("R").g
	a1, a2, a3 := h.m("R", "A1"), h.m("R", "A2"), h.m("R", "A3")
	for _, s := range []string{"A1", "A2", "A3"} {
		require.True(t, h.ucast(s, "R", 1000))
		h.settle()
	}
	require.Equal(t, []string{"A1", "A2", "A3"}, memberNames(h, r.active), "active in the order R first read them")

	require.True(t, h.ucast("A1", "R", 1000))
	h.settle()
	require.Equal(t, []string{"A2", "A3", "A1"}, memberNames(h, r.active), "A1, read last, goes to the tail")

	require.True(t, h.ucast("N", "R", 1000))
	for h.step("N", "R", false) {
	}
	require.Equal(t, Active, h.m("R", "N").state)
	require.Equal(t, Reclaiming, a2.state, "the least recently read member is reclaimed (A1 %s, A2 %s, A3 %s)", a1.state, a2.state, a3.state)
	require.Equal(t, Active, a1.state, "A1, read last, keeps its large window")
	require.Equal(t, Active, a3.state)
	require.Equal(t, []string{"A3", "A1", "N"}, memberNames(h, r.active))
	h.settle()
}

func memberNames(h *harness, ms []*member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, h.name(m.addr))
	}
	return out
}

// TestLostMembersQueuedDataIsDeliveredBeforeItsDown: A holds B's
// broadcasts 2 and 3 and a unicast B sent after them, all waiting for
// broadcast 1, which was lost. Then B's node goes down: broadcast 1 will
// never come. A delivers what it holds, in order, and then DOWN (spec §8,
// "DOWN stuck on link loss": flush, skip the gap, then DOWN).
//
// Without the fix (lost dropping the member's queue, or not moving past
// the gap), A delivers only DOWN, or nothing at all and never DOWN.
func TestLostMembersQueuedDataIsDeliveredBeforeItsDown(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	b := h.n("B").g
	b.mandatory = false // broadcasts go on the multicast path
	s := b.bcSndNxt
	for range 3 {
		require.True(t, h.bcast("B", 100))
	}
	require.True(t, h.ucast("B", "A", 100)) // tagged s+3: after the three broadcasts
	k := [2]stack.Address{h.a("B"), h.a("A")}
	require.Len(t, h.mc[k], 3)
	h.mc[k] = h.mc[k][1:] // broadcast s is lost
	h.settle()
	require.Empty(t, h.n("A").got, "everything waits for broadcast %d", s)
	require.Len(t, h.m("A", "B").deferred, 3)

	h.n("A").g.withdrawn(h.a("B"), true) // B's node is down
	h.after("A")
	want := []string{
		fmt.Sprintf("B:bcast%d", s+1), fmt.Sprintf("B:bcast%d", s+2), fmt.Sprintf("B:ucast%d", s+3), "DOWN(B,lost)",
	}
	require.Equal(t, want, h.n("A").got, "what A held from B, in order, then DOWN")
	require.Nil(t, h.m("A", "B"), "B is deleted")
	require.Zero(t, h.n("A").g.unreadBytes, "everything taken in was read")
}

// TestNothingQueuedBehindADownIsDeliveredAfterTheMemberIsDeleted: B
// leaves (LEAVE with sync point s+1) while its broadcast s is late, so A
// holds B's DOWN. A unicast from B then comes after the LEAVE (data from a
// LEAVING member is taken: it may still be owed broadcasts) and queues
// behind the DOWN. When broadcast s comes, A delivers it, then DOWN, and B
// is deleted with the unicast still queued: it is never delivered, and the
// deleted member keeps nothing queued (goroutines that still hold the
// member, such as the leave_timeout timer, would keep its messages alive).
//
// Over the wire the unicast cannot come after the LEAVE: both travel on
// B's reliable FIFO unicast connection, the LEAVE last. So only the state
// machine reaches this path, and three guards stop the delivery each on
// its own: filter returns after remove, its loop stops at a deleted
// member, and remove empties the deferred queue. The delivery assertion
// fails only with all three gone; the last assertion fails when remove no
// longer empties the queue.
func TestNothingQueuedBehindADownIsDeliveredAfterTheMemberIsDeleted(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	a, b := h.n("A").g, h.n("B").g
	b.mandatory = false
	s := b.bcSndNxt
	require.True(t, h.bcast("B", 100)) // on the multicast path, late
	b.leaveAll()
	h.after("B")
	for h.step("B", "A", false) { // the LEAVE
	}
	mb := h.m("A", "B")
	require.Equal(t, Leaving, mb.state)
	require.True(t, mb.downQueued)

	u := &Header{Type: typeUcast, Seqno: s + 1}
	require.True(t, a.data(h.a("B"), u, stack.NewMessage(h.a("A"), make([]byte, 100)).PutHeader(stack.IDGROUPFC, u)))
	h.after("A")
	require.Len(t, mb.deferred, 2, "the DOWN, then the unicast")

	h.settle() // broadcast s comes
	require.Equal(t, []string{fmt.Sprintf("B:bcast%d", s), "DOWN(B,left)"}, h.n("A").got, "nothing of B's after its DOWN")
	require.Nil(t, h.m("A", "B"), "B is deleted")
	require.True(t, mb.deleted)
	require.Len(t, mb.deferred, 0, "the deleted member keeps nothing queued")
}

// seedCluster starts n members over SIM with NAKACK, UNICAST2 and GROUPFC
// and one injected view, and waits until they have joined each other.
func seedCluster(t *testing.T, n int, cfg func(i int) Config) (*stacktest.Cluster, []*GROUPFC) {
	t.Helper()
	gs := make([]*GROUPFC, n)
	c := stacktest.StartSIM(t, n, 1, func(i int) []stack.Protocol {
		nc := nakack.DefaultConfig()
		nc.XmitInterval = 100 * time.Millisecond
		uc := unicast2.DefaultConfig()
		uc.XmitInterval = 100 * time.Millisecond
		gs[i] = New(cfg(i))
		return []stack.Protocol{nakack.New(nc), unicast2.New(uc), gs[i]}
	})
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

// TestAnycastSkipsACongestedCandidate: instance 5 has two members, X and Y
// (X first in address order, so the round robin starts with it). X's
// application is stuck, and A has used all of X's window; Y's is open. An
// anycast goes to Y at once: TryAnycast does not report ErrWouldBlock and
// Anycast does not wait. (TIPC: stop at the first uncongested candidate,
// trying each in turn.)
//
// Without the fix (only the round robin's first candidate tried),
// TryAnycast reports ErrWouldBlock, and Anycast would wait for X, which
// never reads.
func TestAnycastSkipsACongestedCandidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, gs := seedCluster(t, 3, func(i int) Config {
			cfg := DefaultConfig()
			if i > 0 {
				cfg.Instance = 5
			}
			return cfg
		})
		addrs := c.Addresses()
		x, y := 1, 2
		if addrs[2].Compare(addrs[1]) < 0 {
			x, y = 2, 1
		}
		stuck := make(chan struct{})
		defer close(stuck)
		c.Channels[x].SetReceiver(stack.ReceiverFuncs{OnReceive: func(*stack.Message) { <-stuck }})
		a := gs[0]
		require.NoError(t, a.TryUnicast(addrs[x], make([]byte, MaxMessageSize)), "one largest message fills X's idle window")
		synctest.Wait()
		window := func(i int) int {
			for _, mi := range a.Members() {
				if mi.Addr == addrs[i] {
					return mi.Window
				}
			}
			return -1
		}
		require.Zero(t, window(x), "X has not read it, so its window stays used up")
		require.GreaterOrEqual(t, window(y), advIdle)

		to, err := a.TryAnycast(5, []byte("try"))
		require.NoError(t, err, "the anycast passes over X to Y, whose window is open")
		require.Equal(t, addrs[y], to)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		start := time.Now()
		to, err = a.Anycast(ctx, 5, []byte("wait"))
		require.NoError(t, err, "the anycast passes over X to Y, whose window is open")
		require.Equal(t, addrs[y], to)
		require.Zero(t, time.Since(start), "it did not wait (virtual time)")
		stacktest.WaitFor(t, time.Minute, func() bool { return c.Recv[y].Len() == 2 }, "Y got both")
		require.Equal(t, []string{"try", "wait"}, []string{string(c.Recv[y].Messages()[0].Payload), string(c.Recv[y].Messages()[1].Payload)})
	})
}
