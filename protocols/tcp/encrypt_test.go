package tcp_test

import (
	"context"
	"encoding/binary"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/encrypt"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestEncryptBindsAddressesOverTCP: with ENCRYPT above TCP, a connection
// that claims to come from a member's address but carries nothing sealed
// with the group key cannot redirect that member's traffic: the claim is
// counted (addr_moves_unproven), and messages still go where the member
// proved to be.
func TestEncryptBindsAddressesOverTCP(t *testing.T) {
	stacktest.CheckLeaks(t)
	t.Setenv("STRATA_TCP_TEST_KEY", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
	ms := startMembers(t, 2, "sealed", testConfig(), func() []stack.Protocol {
		cfg := encrypt.DefaultConfig()
		cfg.KeyEnv = "STRATA_TCP_TEST_KEY"
		return []stack.Protocol{encrypt.New(cfg)}
	})
	a, b := ms[0], ms[1]
	require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(b.ch.Address(), []byte("sealed"))))
	stacktest.WaitFor(t, wait, func() bool { return b.col.Len() == 1 }, "members with the key talk over TCP")

	caught := forgeAs(t, a, b, "sealed")
	stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, a.tcp, "addr_moves_unproven") == 1 }, "the claim is counted")

	require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(b.ch.Address(), []byte("still to b"))))
	stacktest.WaitFor(t, wait, func() bool { return b.col.Len() == 2 }, "A's messages still reach B")
	for _, m := range a.col.Messages() {
		require.NotEqual(t, "forged", string(m.Payload), "nothing unsealed is delivered")
	}
	require.Zero(t, caught.Load(), "nothing was sent to the attacker")
}

// TestForgedPreambleCannotMoveALiveMembersAddress: without ENCRYPT, a
// connection that claims to come from another listening address, with a
// bundle in B's name, does not move B's address while B was heard from at
// its own within transport.MoveQuiet: the move is refused and counted
// (addr_moves_refused), and A's messages still reach B (a trickle of such
// claims moved a busy member's address back and forth, #33).
func TestForgedPreambleCannotMoveALiveMembersAddress(t *testing.T) {
	stacktest.CheckLeaks(t)
	ms := startMembers(t, 2, "open", testConfig(), nil)
	a, b := ms[0], ms[1]
	require.NoError(t, b.ch.Send(context.Background(), stack.NewMessage(a.ch.Address(), []byte("from b"))))
	stacktest.WaitFor(t, wait, func() bool { return a.col.Len() == 1 }, "A heard from B at B's address")

	caught := forgeAs(t, a, b, "open")
	stacktest.WaitFor(t, wait, func() bool { return a.col.Len() == 2 }, "A took the forged bundle (nothing authenticates it here)")
	stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, a.tcp, "addr_moves_refused") == 1 }, "the move is refused and counted")
	at, err := stack.Ask(context.Background(), stack.Of(a.ch), stack.EvGetPhysicalAddress{Member: b.ch.Address()})
	require.NoError(t, err)
	require.Equal(t, b.tcp.PhysicalAddress(), at, "A still has B at B's own address")

	require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(b.ch.Address(), []byte("still to b"))))
	stacktest.WaitFor(t, wait, func() bool { return b.col.Len() == 1 }, "A's messages still reach B")
	require.Zero(t, caught.Load(), "nothing was sent to the claimed address")
}

// forgeAs is the attacker: it listens (to count what it would get) and
// connects to a claiming that listening address, with a bundle in b's name
// for cluster; it returns the count of connections made to it.
func forgeAs(t *testing.T, a, b *member, cluster string) *atomic.Int64 {
	t.Helper()
	trap, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	var caught atomic.Int64
	accepted := make(chan struct{})
	t.Cleanup(func() { _ = trap.Close(); <-accepted })
	go func() {
		defer close(accepted)
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			caught.Add(1)
			_ = c.Close()
		}
	}()
	c, err := net.Dial("tcp4", a.tcp.PhysicalAddress().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	bundle := stack.EncodeBundle(nil, cluster, b.ch.Address(), false, stack.NewMessage(a.ch.Address(), []byte("forged")))
	_, err = c.Write(append(binary.BigEndian.AppendUint32(hello(uint16(trap.Addr().(*net.TCPAddr).Port)), uint32(len(bundle))), bundle...))
	require.NoError(t, err)
	return &caught
}
