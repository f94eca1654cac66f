package unicast2_test

// Tests for the parts of the JGRP-1873 fix (and JGRP-1874) that the other
// tests would not miss if they were removed (issue #27, class 5). Each one
// fails when its fix is taken out; the comment says how.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// Header types, as on the wire.
const (
	typeData           = 0
	typeSendFirstSeqno = 2
)

func isData(m *stack.Message) bool {
	h := hdr(m)
	return h != nil && h.Type == typeData
}

// TestReceiverSendsItsPendingStableWhenItClosesAConnection: B has delivered
// A's five messages but not yet said so (its next STABLE is an
// xmit_interval away), and closes its receive connection (A left its
// view). The STABLE it owed goes out before the connection is forgotten, so
// A purges the five at once. Nothing else could tell A: B has no
// connection to send STABLEs for any more, and A's messages to B are lost
// from here on, so no resync can either.
//
// Without the fix (CloseReceiveConnection not sending the STABLE), A keeps
// the five for good.
func TestReceiverSendsItsPendingStableWhenItClosesAConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.XmitInterval = time.Hour // no STABLE from the retransmission task (every xmit_interval/10)
		cfg.StableInterval = time.Hour
		p := newPair(t, 1, cfg, false, nil)
		p.sendRange(t, 0, 4)
		stacktest.WaitFor(t, time.Second, func() bool { return len(p.recvFrom()) == 5 }, "B delivered A's five messages")
		require.Zero(t, stacktest.Stat(t, p.u[1], "stables_sent"), "B has not acknowledged them yet: its STABLE is pending")
		require.EqualValues(t, 5, stacktest.Stat(t, p.u[0], "msgs_held_for_retransmission"))

		p.d[1].DropUpIf(isData) // no resync can acknowledge them later
		p.u[1].CloseReceiveConnection(p.aa)
		purged := stacktest.Eventually(time.Second, func() bool {
			return stacktest.Stat(t, p.u[0], "msgs_held_for_retransmission") == 0
		})
		require.True(t, purged, "A purged what B delivered before it closed the connection (a second later A still holds %d; B sent %d STABLEs)",
			stacktest.Stat(t, p.u[0], "msgs_held_for_retransmission"), stacktest.Stat(t, p.u[1], "stables_sent"))
		require.EqualValues(t, 1, stacktest.Stat(t, p.u[1], "stables_sent"), "exactly the pending STABLE")
		require.Zero(t, stacktest.Stat(t, p.u[0], "retransmissions"))
	})
}

// TestStableFromClosedConnectionIsIgnored: A's view drops B, so A closes
// its send connection to B; B's view still has A, so B keeps its receive
// connection (the old connection id). A's next five messages go on a new
// connection and are lost on the way. A STABLE that B sends now is for
// the old connection: it says "delivered up to 5", which is true of the
// old connection and false of the new one. A must not purge the new
// connection's messages on it, or they can never be resent: B must get
// all ten, once each, in order, once the network heals.
//
// Without the fix (handleStable not comparing the connection id), A purges
// seqnos 1-5 of the new connection and B never gets messages 5-9.
func TestStableFromClosedConnectionIsIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.StableInterval = time.Hour // B's STABLEs: after each delivery, and when the test says
		p := newPair(t, 1, cfg, false, nil)
		p.sendRange(t, 0, 4)
		stacktest.WaitFor(t, time.Minute, func() bool {
			return len(p.recvFrom()) == 5 && stacktest.Stat(t, p.u[0], "msgs_held_for_retransmission") == 0
		}, "B delivered and acknowledged the old connection's five messages")

		stacktest.InjectView(t, stack.NewView(p.aa, 10, p.aa), p.a) // A alone: its send connection to B is closed
		require.Zero(t, stacktest.Stat(t, p.u[0], "send_connections"))
		p.d[1].DropUpIf(isData)
		p.sendRange(t, 5, 9) // seqnos 1-5 of a new connection, lost
		synctest.Wait()
		require.EqualValues(t, 5, stacktest.Stat(t, p.u[0], "msgs_held_for_retransmission"))

		stables := stacktest.Stat(t, p.u[0], "stables_received")
		p.u[1].SendStables() // for the old connection: delivered up to 5
		stacktest.WaitFor(t, time.Second, func() bool { return stacktest.Stat(t, p.u[0], "stables_received") > stables }, "B's STABLE reached A")
		require.EqualValues(t, 5, stacktest.Stat(t, p.u[0], "msgs_held_for_retransmission"),
			"a STABLE of the closed connection purged messages of the new one")

		p.d[1].DropUpIf(nil)
		stacktest.WaitFor(t, time.Minute, func() bool { return len(p.recvFrom()) >= 10 }, "B gets the new connection's messages (B has %v)", p.recvFrom())
		stacktest.WaitFor(t, time.Minute, func() bool { return stacktest.Stat(t, p.u[0], "msgs_held_for_retransmission") == 0 }, "all stable")
		require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, p.recvFrom())
	})
}

// TestSendFirstSeqnoIsRateLimited (JGRP-1874): B misses A's first message,
// then gets 49 more. Each is dropped (B has no connection for A) and could
// ask A for its first seqno, and A answers each request with its whole
// window: 49 requests at once would make A resend 49 windows. (A's answers
// are lost until all 49 have come, so none of them finds the connection
// open.) B asks at most once per sync_min_interval, and gets all 50
// messages.
//
// Without the fix (mayAskFirst always true), B sends a request for each
// message, all at the same instant.
func TestSendFirstSeqnoIsRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		const n = 50
		p := newPair(t, 1, cfg, false, nil)
		var firstLost, allCame atomic.Bool
		p.d[1].DropUpIf(func(m *stack.Message) bool {
			h := hdr(m)
			return h != nil && h.Type == typeData && h.First && firstLost.CompareAndSwap(false, true)
		})
		p.d[0].DropUpIf(func(m *stack.Message) bool {
			h := hdr(m)
			return h != nil && h.Type == typeSendFirstSeqno && !allCame.Load()
		})
		var mu sync.Mutex
		var asked []time.Time
		p.d[1].DropDownIf(func(m *stack.Message) bool {
			if h := hdr(m); h != nil && h.Type == typeSendFirstSeqno {
				mu.Lock()
				asked = append(asked, time.Now())
				mu.Unlock()
			}
			return false
		})
		p.sendRange(t, 0, n-1)
		stacktest.WaitFor(t, time.Second, func() bool { return stacktest.Stat(t, p.u[1], "dropped_unknown_connection") == n-1 },
			"B dropped the %d messages after the lost first one", n-1)
		allCame.Store(true)
		stacktest.WaitFor(t, time.Minute, func() bool { return len(p.recvFrom()) == n }, "B delivered all %d", n)
		require.Equal(t, seq(n), p.recvFrom())
		require.True(t, firstLost.Load())

		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, asked, "B asked for the first seqno")
		for i := 1; i < len(asked); i++ {
			gap := asked[i].Sub(asked[i-1])
			require.GreaterOrEqual(t, gap, cfg.SyncMinInterval,
				"SEND_FIRST_SEQNO #%d went %s after #%d; sync_min_interval is %s (%d sent in all)", i+1, gap, i, cfg.SyncMinInterval, len(asked))
		}
	})
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// gate sits above UNICAST2 and records the payload seq of each message
// UNICAST2 delivers, in order; it holds the delivery of message hold until
// released.
type gate struct {
	stack.Base
	hold    int
	release chan struct{}
	mu      sync.Mutex
	got     []int
}

func (g *gate) Name() string { return "GATE" }

func (g *gate) Up(m *stack.Message) {
	_, s, ok := stacktest.ParsePayload(m.Payload)
	if ok {
		g.mu.Lock()
		g.got = append(g.got, s)
		g.mu.Unlock()
		if s == g.hold {
			<-g.release
		}
	}
	g.PassUp(m)
}

func (g *gate) UpBatch(b *stack.Batch) {
	for _, m := range b.Msgs {
		g.Up(m)
	}
}

func (g *gate) delivered() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.got...)
}

// TestConnectionClosedDuringADeliveryDeliversNoMore: B's delivery of A's
// message 0 is held up in the layer above (a slow application). Meanwhile
// A's next message, an INTERNAL one (a GROUPFC protocol message, say: it
// comes up on the internal lane, beside the blocked regular one), arrives
// and waits behind it in B's window; then B closes the connection (A left
// its view, or it expired). B remembers what the connection delivered (up
// to seqno 1), and A resends the rest when they resync, so the delivery
// that was under way must stop when the connection is closed: messages it
// still finds in the closed window are the resync's to deliver. B gets 0
// and 1, once each.
//
// Without the fix (deliverFrom not checking that its connection is still
// open), the delivery goes on with message 1 from the closed window, and
// the resync, which continues after seqno 1, delivers it again.
func TestConnectionClosedDuringADeliveryDeliversNoMore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var u [2]*unicast2.UNICAST2
		var d [2]*discard.Discard
		g := &gate{hold: 0, release: make(chan struct{})}
		c := stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol {
			u[i] = unicast2.New(testConfig())
			d[i] = discard.New(discard.DefaultConfig())
			ps := []stack.Protocol{d[i], u[i]}
			if i == 1 {
				ps = append(ps, g)
			}
			return ps
		})
		defer func() {
			select {
			case <-g.release:
			default:
				close(g.release)
			}
		}()
		a, ba := c.Channels[0], c.Channels[1].Address()
		require.NoError(t, a.Send(t.Context(), stack.NewMessage(ba, stacktest.Payload(0, 0, 8))))
		synctest.Wait()
		require.Equal(t, []int{0}, g.delivered(), "B's delivery of message 0 is held")

		require.NoError(t, stack.Of(a).Down(context.Background(), stack.NewMessage(ba, stacktest.Payload(0, 1, 8)).Set(stack.Internal)))
		stacktest.WaitFor(t, time.Second, func() bool { return stacktest.Stat(t, u[1], "msgs_received") == 2 }, "message 1 reached B's window")
		synctest.Wait()
		require.Equal(t, []int{0}, g.delivered(), "message 1 waits behind message 0")

		u[1].CloseReceiveConnection(a.Address())
		close(g.release)
		stacktest.WaitFor(t, time.Minute, func() bool {
			return stacktest.Stat(t, u[0], "msgs_held_for_retransmission") == 0
		}, "A's messages are all acknowledged (B has %v)", g.delivered())
		synctest.Wait()
		require.Equal(t, []int{0, 1}, g.delivered(), "each message once, in order (B received %d data messages)", stacktest.Stat(t, u[1], "msgs_received"))
	})
}
