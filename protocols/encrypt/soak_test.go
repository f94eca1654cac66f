//go:build linux

package encrypt_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/ipv4"

	"github.com/strata-go/strata/protocols/encrypt"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func freePort(t *testing.T) int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// TestSoakGarbageOnUDP: three members on 127.0.0.1 with ENCRYPT run their
// traffic while a separate goroutine throws 100,000 datagrams at their
// ports: random bytes, real datagrams truncated, replayed and with a bit
// flipped (sniffed from the multicast group). The group's own messages all
// arrive, once each, nothing else is delivered, and the drop counters
// account for the garbage that reached the members.
func TestSoakGarbageOnUDP(t *testing.T) {
	if testing.Short() {
		t.Skip("soak")
	}
	const members, per, garbage = 3, 2000, 100_000
	k := newKey(t)
	cfg := udp.DefaultConfig()
	cfg.BindAddr, cfg.BindPort, cfg.IPTTL = "127.0.0.1", 0, 0
	cfg.McastAddr = fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254))
	cfg.McastPort = freePort(t)
	cluster := fmt.Sprint("soak-", rand.Uint32())
	var chs []*stack.Channel
	var cols []*stacktest.Collector
	var es []*encrypt.Encrypt
	var us []*udp.UDP
	for range members {
		e := encrypt.New(encrypt.Config{KeyEnv: "unused", Window: 4096})
		require.NoError(t, e.SetKeys(k))
		u := udp.New(cfg)
		col := stacktest.NewCollector()
		ch, err := stack.NewChannel([]stack.Protocol{u, &preKeyed{e}, nakack.New(nakack.DefaultConfig()), unicast2.New(unicast2.DefaultConfig())}, stack.WithReceiver(col))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		require.NoError(t, ch.Connect(context.Background(), cluster))
		chs, cols, es, us = append(chs, ch), append(cols, col), append(es, e), append(us, u)
	}
	var phys []netip.AddrPort
	for _, ch := range chs {
		pa, err := ch.Stack().DownEvent(context.Background(), stack.Ev(stack.EvGetPhysicalAddress, stack.Address{}))
		require.NoError(t, err)
		phys = append(phys, pa.(netip.AddrPort))
	}
	for i, a := range chs {
		for j, b := range chs {
			if i != j {
				_, err := a.Stack().DownEvent(context.Background(), stack.Ev(stack.EvAddPhysicalAddress, stack.PhysicalMapping{Logical: b.Address(), Physical: phys[j]}))
				require.NoError(t, err)
			}
		}
	}
	addrs := make([]stack.Address, members)
	for i, ch := range chs {
		addrs[i] = ch.Address()
	}
	stacktest.InjectView(t, stack.NewView(addrs[0], 2, addrs...), chs...)

	// A sniffer in the group records real datagrams to replay and damage.
	group := netip.MustParseAddr(cfg.McastAddr)
	lcfg := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
		return errors.Join(err, serr)
	}}
	lc, err := lcfg.ListenPacket(context.Background(), "udp4", netip.AddrPortFrom(group, uint16(cfg.McastPort)).String())
	require.NoError(t, err)
	defer lc.Close()
	pc := ipv4.NewPacketConn(lc)
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	require.NoError(t, pc.JoinGroup(lo, &net.UDPAddr{IP: group.AsSlice()}))
	var smu sync.Mutex
	var sniffed [][]byte
	go func() {
		buf := make([]byte, 1<<16)
		for {
			n, _, err := lc.ReadFrom(buf)
			if err != nil {
				return
			}
			smu.Lock()
			if len(sniffed) < 500 {
				sniffed = append(sniffed, append([]byte(nil), buf[:n]...))
			}
			smu.Unlock()
		}
	}()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	thrower, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer thrower.Close()
	sentGarbage := 0
	wg.Go(func() {
		targets := append([]netip.AddrPort{netip.AddrPortFrom(group, uint16(cfg.McastPort))}, phys...)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < garbage && ctx.Err() == nil; i++ {
			var d []byte
			smu.Lock()
			var real []byte
			if len(sniffed) > 0 {
				real = sniffed[rng.IntN(len(sniffed))]
			}
			smu.Unlock()
			switch {
			case real == nil || i%4 == 0:
				d = make([]byte, 1+rng.IntN(1500))
				for j := range d {
					d[j] = byte(rng.Uint32())
				}
			case i%4 == 1:
				d = real[:rng.IntN(len(real))]
			case i%4 == 2:
				d = real // replayed as it was
			default:
				d = append([]byte(nil), real...)
				d[rng.IntN(len(d))] ^= 1 << rng.IntN(8)
			}
			to := targets[rng.IntN(len(targets))]
			_, _ = thrower.WriteToUDPAddrPort(d, to)
			sentGarbage++
			if i%64 == 0 {
				time.Sleep(100 * time.Microsecond) // a flood, not a kernel-buffer test
			}
		}
	})
	for s := range per {
		for i, ch := range chs {
			require.NoError(t, ch.Send(ctx, stack.NewMessage(stack.Address{}, stacktest.Payload(i, s, 200))))
			require.NoError(t, ch.Send(ctx, stack.NewMessage(addrs[(i+1)%members], stacktest.Payload(i, per+s, 200))))
		}
		if s%256 == 255 {
			// Keep within a window of the receivers (there is no flow
			// control in this stack).
			stacktest.WaitFor(t, time.Minute, func() bool { return cols[0].Len() >= (members+1)*(s-255) }, "member 0 keeps up")
		}
	}
	wg.Wait()
	stacktest.WaitFor(t, time.Minute, func() bool {
		for _, c := range cols {
			if c.Len() < members*per+per {
				return false
			}
		}
		return true
	}, "all the group's messages delivered")
	for i, c := range cols {
		require.Equal(t, members*per+per, c.Len(), "member %d: nothing extra delivered", i)
		for j, a := range addrs {
			want := per
			if j == (i+members-1)%members {
				want = 2 * per
			}
			require.Len(t, c.Seqs(a), want, "member %d from %d", i, j)
		}
	}
	var dropped int64
	for i := range chs {
		for _, n := range []string{"auth_failures", "replays", "unknown_key", "unencrypted", "malformed"} {
			dropped += stacktest.Stat(t, es[i], n)
		}
		for _, n := range []string{"dropped_malformed", "dropped_wrong_cluster"} {
			dropped += stacktest.Stat(t, us[i], n)
		}
	}
	t.Logf("garbage datagrams sent %d; drops counted by UDP and ENCRYPT on the 3 members: %d", sentGarbage, dropped)
	require.Positive(t, dropped)
}
