package udp_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

const wait = 20 * time.Second

func exchange(t *testing.T, cfg udp.Config) {
	const n, per = 3, 200
	ms := startMembers(t, n, "exchange", cfg, nil)
	addrs := make([]stack.Address, n)
	for i, m := range ms {
		addrs[i] = m.ch.Address()
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			for seq := range per {
				if !assert.NoError(t, m.ch.Send(ctx, stack.NewMessage(stack.Address{}, stacktest.Payload(i, seq, 100)))) {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, m := range ms {
		stacktest.WaitFor(t, wait, func() bool { return m.col.Len() == n*per }, "%s gets every multicast", m.ch.Address())
		require.Empty(t, m.col.CheckExactlyOnce(addrs, per, true))
		m.col.Reset()
	}
	// Unicasts: every member to every other member.
	for i, m := range ms {
		for j, o := range ms {
			if i != j {
				for seq := range per {
					require.NoError(t, m.ch.Send(ctx, stack.NewMessage(o.ch.Address(), stacktest.Payload(i, seq, 1000))))
				}
			}
		}
	}
	for j, o := range ms {
		others := append(append([]stack.Address{}, addrs[:j]...), addrs[j+1:]...)
		stacktest.WaitFor(t, wait, func() bool { return o.col.Len() == (n-1)*per }, "%s gets every unicast", o.ch.Address())
		require.Empty(t, o.col.CheckExactlyOnce(others, per, true))
	}
	for _, m := range ms {
		require.Zero(t, stacktest.Stat(t, m.udp, "socket_errors"))
		require.Zero(t, stacktest.Stat(t, m.udp, "dropped_no_physical_address"))
		require.Positive(t, stacktest.Stat(t, m.udp, "bundles_sent"))
	}
}

func TestThreeMembersExchangeUnicastsAndMulticasts(t *testing.T) {
	t.Parallel()
	stacktest.CheckLeaks(t)
	exchange(t, testConfig(t))
}

func TestThreeMembersWithoutIPMulticast(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.IPMcast = false
	exchange(t, cfg)
}

func TestTwoClustersOnOneMulticastAddressNeverMix(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	one := startMembers(t, 2, "one", cfg, nil)
	two := startMembers(t, 2, "two", cfg, nil)
	ctx := context.Background()
	require.NoError(t, one[0].ch.SendTo(ctx, stack.Address{}, []byte("for one")))
	require.NoError(t, two[0].ch.SendTo(ctx, stack.Address{}, []byte("for two")))
	for _, grp := range []struct {
		ms   []*member
		want string
	}{{one, "for one"}, {two, "for two"}} {
		for _, m := range grp.ms {
			stacktest.WaitFor(t, wait, func() bool {
				return m.col.Len() == 1 && stacktest.Stat(t, m.udp, "dropped_wrong_cluster") >= 1
			}, "%s gets its own cluster's message and drops the other's", m.ch.Address())
			require.Equal(t, grp.want, string(m.col.Messages()[0].Payload))
		}
	}
}

func TestOwnMulticastIsLoopedBackOnceAndNetworkCopyDropped(t *testing.T) {
	t.Parallel()
	ms := startMembers(t, 2, "loop", testConfig(t), nil)
	a := ms[0]
	require.NoError(t, a.ch.SendTo(context.Background(), stack.Address{}, []byte("self")))
	stacktest.WaitFor(t, wait, func() bool { return ms[1].col.Len() == 1 }, "peer receives")
	if stacktest.Stat(t, a.udp, "own_multicasts_filtered") == 0 {
		stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, a.udp, "dropped_own_multicast") == 1 }, "own copy from the network dropped")
	} // else the kernel drops it (ownMulticastFilter)
	stacktest.WaitFor(t, wait, func() bool { return a.col.Len() == 1 }, "delivered to self by loopback")
	require.EqualValues(t, 1, stacktest.Stat(t, a.udp, "loopbacks"))

	m := stack.NewMessage(stack.Address{}, []byte("not to self"))
	m.SetTransient(stack.DontLoopback)
	require.NoError(t, a.ch.Send(context.Background(), m))
	stacktest.WaitFor(t, wait, func() bool { return ms[1].col.Len() == 2 }, "peer receives")
	require.Equal(t, 1, a.col.Len(), "DontLoopback is not delivered to self")
}

func TestHostileDatagramsAreCountedAndMemberKeepsWorking(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	ms := startMembers(t, 2, "hostile", cfg, nil)
	victim := ms[1]
	good := stack.EncodeBundle(nil, "hostile", stack.NewAddress(), false, stack.NewMessage(victim.ch.Address(), []byte("ok")))
	attacker, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer attacker.Close()
	targets := []*net.UDPAddr{net.UDPAddrFromAddrPort(victim.udp.PhysicalAddress()),
		{IP: net.ParseIP(cfg.McastAddr), Port: cfg.McastPort}}
	require.NoError(t, setMulticastLoopback(attacker))
	rng := rand.New(rand.NewPCG(stacktest.Seed(t), 1))
	dropped := func() int64 {
		var n int64
		for _, k := range []string{"dropped_malformed", "dropped_wrong_version", "dropped_wrong_cluster", "dropped_oversized", "dropped_not_for_us"} {
			n += stacktest.Stat(t, victim.udp, k)
		}
		return n
	}
	const total = 10000
	sent := 0
	for sent < total {
		// Paced in rounds, so the kernel's socket buffer never overflows.
		for range 200 {
			var d []byte
			switch rng.IntN(3) {
			case 0:
				d = make([]byte, rng.IntN(1500))
				for i := range d {
					d[i] = byte(rng.Uint32())
				}
			case 1:
				d = good[:rng.IntN(len(good))]
			default:
				d = bytes.Clone(good)
				d[rng.IntN(len(d))] ^= byte(1 + rng.IntN(255))
				if bytes.Equal(d[:4], good[:4]) && len(d) == len(good) {
					d[0] = 'X' // keep it bad: a flipped payload byte would still decode
				}
			}
			_, err := attacker.WriteToUDP(d, targets[sent%2])
			require.NoError(t, err)
			sent++
		}
		stacktest.WaitFor(t, wait, func() bool { return dropped() == int64(sent) }, "every bad datagram counted (%d sent)", sent)
	}
	require.Zero(t, victim.col.Len())
	require.NoError(t, ms[0].ch.SendTo(context.Background(), victim.ch.Address(), []byte("still alive")))
	stacktest.WaitFor(t, wait, func() bool { return victim.col.Len() == 1 }, "member still delivers")
	require.EqualValues(t, total, dropped())
}

func TestUnknownPhysicalAddressAsksDiscovery(t *testing.T) {
	t.Parallel()
	w := &whoHasProbe{got: make(chan stack.Address, 4)}
	ms := startMembers(t, 1, "whohas", testConfig(t), func() []stack.Protocol { return []stack.Protocol{w} })
	stranger := stack.NewAddress()
	require.NoError(t, ms[0].ch.SendTo(context.Background(), stranger, []byte("x")))
	select {
	case a := <-w.got:
		require.Equal(t, stranger, a)
	case <-time.After(wait):
		t.Fatal("no WHO_HAS event")
	}
	stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, ms[0].udp, "dropped_no_physical_address") == 1 }, "drop counted")
	require.NoError(t, ms[0].ch.SendTo(context.Background(), stranger, []byte("y")))
	stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, ms[0].udp, "dropped_no_physical_address") == 2 }, "drop counted")
	require.EqualValues(t, 1, stacktest.Stat(t, ms[0].udp, "who_has_sent"), "asked once per who_has_cache_timeout")
}

type whoHasProbe struct {
	stack.Base
	got chan stack.Address
}

func (w *whoHasProbe) Name() string { return "WHOHAS_PROBE" }
func (w *whoHasProbe) UpEvent(ev stack.Event) (stack.Answer, error) {
	if e, ok := ev.(stack.EvWhoHas); ok {
		w.got <- e.Member
		return stack.Answer{}, nil
	}
	return w.PassUpEvent(ev)
}

func TestTooBigMessageIsRejected(t *testing.T) {
	t.Parallel()
	ms := startMembers(t, 1, "big", testConfig(t), nil)
	err := ms[0].ch.SendTo(context.Background(), stack.Address{}, make([]byte, 70000))
	require.ErrorIs(t, err, udp.ErrMessageTooBig)
}

func TestInternalAndDontBundleAreSentAtOnce(t *testing.T) {
	t.Parallel()
	ms := startMembers(t, 2, "urgent", testConfig(t), nil)
	a, b := ms[0], ms[1]
	before := stacktest.Stat(t, a.udp, "datagrams_sent")
	for _, f := range []stack.Flags{stack.Internal, stack.DontBundle} {
		require.NoError(t, a.ch.Send(context.Background(), stack.NewMessage(b.ch.Address(), []byte("now")).Set(f)))
	}
	// Sent on the caller's goroutine: the datagrams are out when Send returns.
	require.Equal(t, before+2, stacktest.Stat(t, a.udp, "datagrams_sent"))
	stacktest.WaitFor(t, wait, func() bool { return b.col.Len() == 2 }, "both delivered")
}

func TestBindAddrErrorsAreClear(t *testing.T) {
	for addr, want := range map[string]string{
		"203.0.113.7": "no interface of this machine has that address",
		"no-such-if0": "not an IPv4 address, an interface name, or one of loopback",
		"::1":         "only IPv4 is supported",
	} {
		cfg := testConfig(t)
		cfg.BindAddr = addr
		_, err := stack.New(stack.FromProtocols([]stack.Protocol{udp.New(cfg)}...))
		require.ErrorContains(t, err, want, addr)
		require.ErrorContains(t, err, addr)
	}
	for _, addr := range []string{"loopback", "lo"} {
		cfg := testConfig(t)
		cfg.BindAddr = addr
		ms := startMembers(t, 1, "bind", cfg, nil)
		require.True(t, ms[0].udp.PhysicalAddress().Addr().IsLoopback(), addr)
	}
}

func TestSmallKernelBufferIsReportedOnce(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg := testConfig(t)
	cfg.UcastRecvBuf = 1 << 30
	u := udp.New(cfg)
	ch, err := stack.New(stack.FromProtocols([]stack.Protocol{u}...), stack.WithLogger(slog.New(slog.NewTextHandler(&lockedWriter{&logs, &mu}, nil))))
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.Connect(context.Background(), "buf"))
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	require.Equal(t, 1, strings.Count(out, "kernel granted smaller socket buffers"), out)
	require.Contains(t, out, "recv_asked=1073741824")
	require.Contains(t, out, "socket=unicast")
	granted := u.ReceiveBuffer(false)
	require.Positive(t, granted, "flow control sizes its credits by what the kernel granted")
	require.Less(t, granted, 1<<30, "not by what was asked")
}

// TestOwnMulticastsAreFilteredOrReadBackAndAccounted: on Linux the kernel
// drops the multicasts a member sends for its own multicast socket (a
// socket filter), and other members' on the same address still arrive;
// where no filter is attached they come back and are read and dropped,
// and once all are read nothing is outstanding, so the bundler is not
// held (echoPacer).
func TestOwnMulticastsAreFilteredOrReadBackAndAccounted(t *testing.T) {
	for _, filter := range []bool{true, false} {
		t.Run(fmt.Sprintf("filter=%v", filter), func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t)
			var ms []*member
			for i := range 2 {
				u := udp.New(cfg)
				if !filter {
					udp.WithoutOwnFilter(u)
				}
				col := stacktest.NewCollector()
				ch, err := stack.New(stack.FromProtocols(u), stack.WithName(fmt.Sprintf("echo-%d", i)), stack.WithReceiver(col))
				require.NoError(t, err)
				t.Cleanup(func() { _ = ch.Close() })
				require.NoError(t, ch.Connect(context.Background(), "echo"))
				ms = append(ms, &member{ch: ch, udp: u, col: col})
			}
			introduce(t, ms)
			stacktest.InjectView(t, stack.NewView(ms[0].ch.Address(), 2, ms[0].ch.Address(), ms[1].ch.Address()), ms[0].ch, ms[1].ch)
			a := ms[0]
			if filter && stacktest.Stat(t, a.udp, "own_multicasts_filtered") == 0 {
				t.Skip("no socket filter on this system")
			}
			for range 200 {
				require.NoError(t, a.ch.SendTo(context.Background(), stack.Address{}, make([]byte, 1000)))
			}
			stacktest.WaitFor(t, wait, func() bool { return ms[1].col.Len() == 200 }, "B receives A's 200")
			// A's datagrams reached A's multicast socket before B's: once A
			// has B's, its reader is past its own.
			require.NoError(t, ms[1].ch.SendTo(context.Background(), stack.Address{}, []byte("from B")))
			stacktest.WaitFor(t, wait, func() bool { return a.col.Len() == 201 }, "A receives its own 200 and B's, from the same address")
			if filter {
				require.Zero(t, stacktest.Stat(t, a.udp, "dropped_own_multicast"), "the kernel dropped them")
				require.Zero(t, stacktest.Stat(t, a.udp, "echo_waits"))
				return
			}
			stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, a.udp, "dropped_own_multicast") == 200 }, "own copies read back")
			stacktest.WaitFor(t, wait, func() bool { return stacktest.Stat(t, a.udp, "own_multicast_bytes_unread") == 0 },
				"nothing outstanding: %d", stacktest.Stat(t, a.udp, "own_multicast_bytes_unread"))
		})
	}
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
