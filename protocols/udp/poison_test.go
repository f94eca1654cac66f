package udp_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/ipv4"

	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/encrypt"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// keyed is an ENCRYPT whose key was set in code (Init would read the
// environment).
type keyed struct{ *encrypt.Encrypt }

func (k keyed) Init() error { return nil }

func withKey(t *testing.T, key []byte) func() []stack.Protocol {
	return func() []stack.Protocol {
		e := encrypt.New(encrypt.DefaultConfig())
		require.NoError(t, e.SetKeys(key))
		return []stack.Protocol{keyed{e}}
	}
}

// poison sends n empty bundles (no message at all, so nothing for ENCRYPT
// to check) that name victim as their source, from an attacker's own port
// to target, and returns the attacker's address.
func poison(t *testing.T, cluster string, victim stack.Address, target netip.AddrPort, n int) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	pkt := stack.EncodeBundle(nil, cluster, victim, false)
	for range n {
		_, err := c.WriteToUDPAddrPort(pkt, target)
		require.NoError(t, err)
	}
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

func physicalOf(t *testing.T, at *member, of stack.Address) netip.AddrPort {
	t.Helper()
	pa, err := stack.Ask(context.Background(), stack.Of(at.ch), stack.EvGetPhysicalAddress{Member: of})
	require.NoError(t, err)
	return pa
}

// TestForgedPreambleCannotMoveAnAuthenticatedMembersAddress: an attacker
// without the key sends empty bundles naming member A as their source from
// its own port to B. With ENCRYPT in the stack, B learns addresses only
// from what ENCRYPT opened, so A's address stays where it is, every forged
// claim is counted, and A and B go on talking. Without ENCRYPT (a stack
// that trusts its network, as udp.toml does) the same bundles do not move
// A's address either while A was heard from at it within the last two
// seconds (each refused move counted: before, each one moved it, and a
// trickle of them cut perf's throughput by 85%, #33); once A has been
// silent that long they do: the attack is real, and only authentication
// stops it.
func TestForgedPreambleCannotMoveAnAuthenticatedMembersAddress(t *testing.T) {
	t.Parallel()
	const forged = 200
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	for _, secured := range []bool{true, false} {
		var above func() []stack.Protocol
		cluster := "poison-open"
		if secured {
			above, cluster = withKey(t, key), "poison-sealed"
		}
		ms := startMembers(t, 2, cluster, testConfig(t), above)
		a, b := ms[0], ms[1]
		real := a.udp.PhysicalAddress()
		require.Equal(t, real, physicalOf(t, b, a.ch.Address()))
		// A proven message first, so B has learnt A from ENCRYPT itself.
		require.NoError(t, a.ch.SendTo(context.Background(), b.ch.Address(), []byte("before")))
		stacktest.WaitFor(t, 10*time.Second, func() bool { return b.col.Len() == 1 }, "b gets a's first unicast")

		poison(t, cluster, a.ch.Address(), b.udp.PhysicalAddress(), forged)
		stacktest.WaitFor(t, 10*time.Second, func() bool {
			return stacktest.Stat(t, b.udp, "datagrams_received") >= forged+1
		}, "the forged bundles reached b")
		if !secured {
			require.Equal(t, real, physicalOf(t, b, a.ch.Address()), "a's address did not move: a was heard from just now")
			require.EqualValues(t, forged, stacktest.Stat(t, b.udp, "addr_moves_refused"), "every refused move counted")
			require.NoError(t, b.ch.SendTo(context.Background(), a.ch.Address(), []byte("after")))
			stacktest.WaitFor(t, 10*time.Second, func() bool { return a.col.Len() == 1 }, "a gets b's unicast")
			stacktest.WaitFor(t, 30*time.Second, func() bool {
				poison(t, cluster, a.ch.Address(), b.udp.PhysicalAddress(), 1)
				return physicalOf(t, b, a.ch.Address()) != real
			}, "once a is quiet, a stack that trusts its network follows the preamble")
			continue
		}
		require.Equal(t, real, physicalOf(t, b, a.ch.Address()), "a's address did not move")
		require.EqualValues(t, forged, stacktest.Stat(t, b.udp, "addr_moves_unproven"), "every forged claim counted")
		require.NoError(t, b.ch.SendTo(context.Background(), a.ch.Address(), []byte("after")))
		stacktest.WaitFor(t, 10*time.Second, func() bool { return a.col.Len() == 1 }, "a gets b's unicast")
	}
}

// TestRelayedDatagramDoesNotMoveAnAddress: the attacker records a datagram
// A sealed (a multicast, sniffed from the group) that B never got, and
// relays it to B from its own port, so it is the first copy B sees: it
// passes every check that does not bind where it came from (key, replay
// window, age). ENCRYPT seals the sender's network address too, so the
// relayed copy does not open, and B does not learn that A is at the
// attacker's port.
func TestRelayedDatagramDoesNotMoveAnAddress(t *testing.T) {
	t.Parallel()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	cfg := testConfig(t)
	var holes []*discard.Discard
	ms := startMembers(t, 2, "relay", cfg, func() []stack.Protocol {
		d := discard.New(discard.DefaultConfig())
		holes = append(holes, d)
		return append([]stack.Protocol{d}, withKey(t, key)()...)
	})
	a, b := ms[0], ms[1]
	aAt := a.udp.PhysicalAddress()
	// B loses everything that really comes from A.
	holes[1].DropUpIf(func(m *stack.Message) bool { return m.From == aAt })

	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
		return errors.Join(err, serr)
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", net.JoinHostPort(cfg.McastAddr, strconv.Itoa(cfg.McastPort)))
	require.NoError(t, err)
	defer pc.Close()
	sn := pc.(*net.UDPConn)
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	require.NoError(t, ipv4.NewPacketConn(sn).JoinGroup(lo, &net.UDPAddr{IP: net.ParseIP(cfg.McastAddr)}))

	require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(stack.Address{}, []byte("sealed by A"))))
	buf := make([]byte, 1<<16)
	require.NoError(t, sn.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, from, err := sn.ReadFromUDPAddrPort(buf)
	require.NoError(t, err, "the sniffer sees A's multicast")
	require.Equal(t, aAt, from)

	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(b.udp.PhysicalAddress()))
	require.NoError(t, err)
	defer c.Close()
	failed := stacktest.Stat(t, stack.Of(b.ch).Find("ENCRYPT").(stack.StatsReporter), "auth_failures")
	_, err = c.Write(buf[:n])
	require.NoError(t, err)
	stacktest.WaitFor(t, 10*time.Second, func() bool {
		return stacktest.Stat(t, stack.Of(b.ch).Find("ENCRYPT").(stack.StatsReporter), "auth_failures") > failed
	}, "the relayed copy fails to open")
	require.Equal(t, aAt, physicalOf(t, b, a.ch.Address()), "A's address did not move")
	require.Zero(t, b.col.Len(), "nothing of the relayed copy was delivered")
}

// TestOwnMulticastOpensAtTheSender: a member's own multicasts, looped back
// inside the process (no network address on them), open under ENCRYPT,
// which sealed them with this member's address. (NAKACK would hand the
// sender its own messages anyway, late, so only the counter shows it.)
func TestOwnMulticastOpensAtTheSender(t *testing.T) {
	t.Parallel()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	ms := startMembers(t, 2, "own", testConfig(t), withKey(t, key))
	for i := range 10 {
		require.NoError(t, ms[0].ch.Send(context.Background(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, i, 100))))
	}
	stacktest.WaitFor(t, 10*time.Second, func() bool { return ms[0].col.Len() == 10 && ms[1].col.Len() == 10 }, "both get the multicasts")
	e := stack.Of(ms[0].ch).Find("ENCRYPT").(stack.StatsReporter)
	require.Zero(t, stacktest.Stat(t, e, "auth_failures"), "the sender's own copies opened")
	require.EqualValues(t, 10, stacktest.Stat(t, e, "decrypted"))
}
