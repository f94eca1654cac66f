package tcp_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestSimultaneousDialsEndWithOneConnection: two members that dial each
// other at the same moment end with one connection, the same one at both
// ends, and the other closed at both ends. Rounds repeat until the race
// happened (both dials completed) often enough.
func TestSimultaneousDialsEndWithOneConnection(t *testing.T) {
	stacktest.CheckLeaks(t)
	raced := 0
	for round := 0; round < 40 && raced < 5; round++ {
		ms := startMembers(t, 2, "dial", testConfig(), nil)
		a, b := ms[0], ms[1]
		pa, pb := a.tcp.PhysicalAddress(), b.tcp.PhysicalAddress()
		var start sync.WaitGroup
		start.Add(1)
		var wg sync.WaitGroup
		wg.Go(func() { start.Wait(); a.tcp.DialPeer(pb) })
		wg.Go(func() { start.Wait(); b.tcp.DialPeer(pa) })
		start.Done()
		wg.Wait()
		stacktest.WaitFor(t, wait, func() bool {
			al, ar, aok := a.tcp.ConnEnds(pb)
			bl, br, bok := b.tcp.ConnEnds(pa)
			return aok && bok && al == br && ar == bl &&
				stacktest.Stat(t, a.tcp, "sockets_open") == 1 && stacktest.Stat(t, b.tcp, "sockets_open") == 1
		}, "round %d: one connection, the same at both ends, and only it open", round)
		// Both dials got through (each end dialled one and accepted one).
		if stacktest.Stat(t, a.tcp, "connections_accepted") == 1 && stacktest.Stat(t, b.tcp, "connections_accepted") == 1 {
			raced++
		}
		// The connection carries messages both ways.
		require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(b.ch.Address(), []byte("ab"))))
		require.NoError(t, b.ch.Send(context.Background(), stack.NewMessage(a.ch.Address(), []byte("ba"))))
		stacktest.WaitFor(t, wait, func() bool { return a.col.Len() == 1 && b.col.Len() == 1 }, "both get the other's message")
		_ = a.ch.Close()
		_ = b.ch.Close()
	}
	t.Logf("both dials completed in %d rounds", raced)
	require.Positive(t, raced, "the race never happened: the test proved nothing")
}

// TestUnreachablePeerDoesNotBlockOthers: a view member whose socket
// accepts but never reads (a stalled or vanished host) fills only its own
// queue; its frames are dropped and counted, and the other member gets
// every message. The sender sends rounds of at most send_queue_size
// messages (so at most that many frames) and waits for the live member
// to have each round: the live member's queue can never overflow, however
// its writer is scheduled, while the stalled member's fills up.
func TestUnreachablePeerDoesNotBlockOthers(t *testing.T) {
	stacktest.CheckLeaks(t)
	cfg := testConfig()
	cfg.SendQueueSize = 16
	ms := startMembers(t, 2, "stall", cfg, nil)
	a, b := ms[0], ms[1]
	hole, err := net.Listen("tcp4", "127.0.0.1:0") // never accepts, never reads
	require.NoError(t, err)
	defer hole.Close()
	x := stack.NewAddress()
	teach(t, a, x, hole.Addr().(*net.TCPAddr).AddrPort())
	members := []stack.Address{a.ch.Address(), b.ch.Address(), x}
	stacktest.InjectView(t, stack.NewView(members[0], 3, members...), a.ch)

	const rounds, per = 60, 16 // per <= cfg.SendQueueSize; 960 KB, more than the stalled socket's buffers hold
	for r := range rounds {
		for seq := range per {
			require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, r*per+seq, 1000))))
		}
		stacktest.WaitFor(t, wait, func() bool { return b.col.Len() == (r+1)*per }, "round %d reaches the live member", r)
	}
	require.Empty(t, b.col.CheckExactlyOnce([]stack.Address{a.ch.Address()}, rounds*per, true))
	require.Positive(t, stacktest.Stat(t, a.tcp, "dropped_peer_queue_full"), "frames for the stalled member were dropped and counted: %s", statsOf(a))
}

// TestConnectionsToFormerMembersExpire: a connection to an address no view
// member has closes after conn_expiry_timeout idle; one to a member stays.
func TestConnectionsToFormerMembersExpire(t *testing.T) {
	stacktest.CheckLeaks(t)
	cfg := testConfig()
	cfg.ConnExpiry = 300 * time.Millisecond
	ms := startMembers(t, 3, "expire", cfg, nil)
	a, b, c := ms[0], ms[1], ms[2]
	for _, o := range []*member{b, c} {
		require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(o.ch.Address(), []byte("hi"))))
		stacktest.WaitFor(t, wait, func() bool { return o.col.Len() == 1 }, "delivered")
	}
	require.Equal(t, 2, a.tcp.Connections())
	stacktest.InjectView(t, stack.NewView(a.ch.Address(), 3, a.ch.Address(), c.ch.Address()), a.ch)
	stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, a.tcp, "connections_expired") == 1 }, "b's connection expires")
	_, _, ok := a.tcp.ConnEnds(b.tcp.PhysicalAddress())
	require.False(t, ok, "b's connection is closed")
	_, _, ok = a.tcp.ConnEnds(c.tcp.PhysicalAddress())
	require.True(t, ok, "c, a member, keeps its connection though idle")
}

// statsOf lists m's non-zero transport counters, for failure messages.
func statsOf(m *member) string {
	var s string
	for _, st := range m.tcp.Stats() {
		if st.Value != 0 && !strings.Contains(st.Name, "_sent_") && !strings.Contains(st.Name, "_received_") {
			s += st.Name + "=" + fmt.Sprint(st.Value) + " "
		}
	}
	return s
}
