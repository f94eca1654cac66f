//go:build linux

package configs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/ipv4"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// secureVars binds secure.toml like mcastVars and gives it a key file and a
// secret file (fresh random ones unless key or secret is set).
func secureVars(t *testing.T, key, secret string) map[string]string {
	t.Helper()
	if key == "" {
		key = randomHex(32)
	}
	if secret == "" {
		secret = randomHex(16)
	}
	dir := t.TempDir()
	kf, sf := filepath.Join(dir, "key"), filepath.Join(dir, "secret")
	require.NoError(t, os.WriteFile(kf, []byte(key+"\n"), 0o600))
	require.NoError(t, os.WriteFile(sf, []byte(secret+"\n"), 0o600))
	vars := mcastVars(t)
	vars["STRATA_ENCRYPT_KEY_FILE"], vars["STRATA_AUTH_SECRET_FILE"] = kf, sf
	return vars
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// dropCounters sums the counters that account for hostile input on one
// member: the transport's decoding drops and ENCRYPT's.
func dropCounters(ch *stack.Channel) int64 {
	want := map[string]map[string]bool{
		"UDP":     {"dropped_malformed": true, "dropped_wrong_version": true, "dropped_wrong_cluster": true, "dropped_not_for_us": true, "dropped_oversized": true},
		"ENCRYPT": {"auth_failures": true, "replays": true, "unknown_key": true, "unencrypted": true, "malformed": true},
	}
	var n int64
	for _, ps := range ch.Stats() {
		for _, s := range ps.Stats {
			if want[ps.Protocol][s.Name] {
				n += s.Value
			}
		}
	}
	return n
}

// TestSecureConfigKeepsOutWhoHasNoSecretOrKey: three members from
// secure.toml form a group; a fourth with the right key but another secret
// gets ErrAuthFailed from Connect, one with another key finds nobody (its
// datagrams fail authentication) and stays alone; the group's view never
// lists either, and the group's multicasts reach none of them.
func TestSecureConfigKeepsOutWhoHasNoSecretOrKey(t *testing.T) {
	t.Parallel()
	key, secret := randomHex(32), randomHex(16)
	vars := secureVars(t, key, secret)
	chs, cols, took := startFromConfig(t, "secure.toml", 3, vars)
	t.Logf("secure.toml: 3 members in one view %s after start", took)

	wrongSecret := secureVars(t, key, randomHex(16))
	wrongKey := secureVars(t, randomHex(32), secret)
	for _, v := range []map[string]string{wrongSecret, wrongKey} {
		v["STRATA_BIND_PORT"], v["STRATA_MCAST_ADDR"], v["STRATA_MCAST_PORT"] = vars["STRATA_BIND_PORT"], vars["STRATA_MCAST_ADDR"], vars["STRATA_MCAST_PORT"]
	}
	var outsiders []*stacktest.Collector
	mk := func(v map[string]string, name string) *stack.Channel {
		col := stacktest.NewCollector()
		ch, err := stack.New(stack.Shipped("secure.toml"), stack.WithVars(v), stack.WithName(name), stack.WithReceiver(col))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		outsiders = append(outsiders, col)
		return ch
	}
	err := mk(wrongSecret, "X").Connect(t.Context(), "cfg-secure.toml")
	require.ErrorIs(t, err, stack.ErrAuthFailed)
	y := mk(wrongKey, "Y")
	require.NoError(t, y.Connect(t.Context(), "cfg-secure.toml"))
	require.Equal(t, 1, len(y.View().Members), "the member with another key is alone")

	checkMulticasts(t, chs, cols)
	for _, ch := range chs {
		require.Equal(t, 3, len(ch.View().Members), "%s's view", ch.Name())
	}
	for i, col := range outsiders {
		require.Zero(t, col.Len(), "outsider %d received the group's traffic", i)
	}
	var refused int64
	for _, ch := range chs {
		refused += stacktest.Stat(t, stack.Of(ch).Find("ENCRYPT").(stack.StatsReporter), "unknown_key")
	}
	require.Positive(t, refused, "Y's discovery requests, under a key the group does not have, were dropped and counted")
}

// TestSecureConfigSoakWithGarbageOnLoopback: three members from secure.toml
// (ENCRYPT and AUTH over real UDP on 127.0.0.1) run their traffic while a
// separate goroutine throws 100,000 datagrams at their ports: random bytes,
// and real datagrams (sniffed from the multicast group) truncated, replayed
// and with a bit flipped. The group's own messages all arrive, once each,
// nothing else is delivered, and every garbage datagram that reached a
// member is accounted for by a drop counter: the thrower keeps within 300
// of the count, so none is lost in a socket buffer, and stalls (failing
// the test) if one goes uncounted.
func TestSecureConfigSoakWithGarbageOnLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("soak")
	}
	t.Parallel()
	const members, per, garbage, slack = 3, 2000, 100_000, 300
	vars := secureVars(t, "", "")
	chs, cols, _ := startFromConfig(t, "secure.toml", members, vars)
	stacktest.LogStatsOnFailure(t, chs...)
	addrs := make([]stack.Address, members)
	var phys []netip.AddrPort
	for i, ch := range chs {
		addrs[i] = ch.Address()
		pa, err := stack.Ask(context.Background(), stack.Of(ch), stack.EvGetLocalPhysicalAddress{})
		require.NoError(t, err)
		phys = append(phys, pa)
	}

	thrower, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer thrower.Close()
	throwerAddr := thrower.LocalAddr().(*net.UDPAddr).AddrPort()

	group, mport := groupOf(t, vars)
	sniffed := sniff(t, group, mport, throwerAddr)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	base := int64(0)
	for _, ch := range chs {
		base += dropCounters(ch)
	}
	counted := func() int64 {
		n := -base
		for _, ch := range chs {
			n += dropCounters(ch)
		}
		return n
	}
	var arrivals int64 // garbage datagrams that reach a member
	throwErr := make(chan error, 1)
	wg.Go(func() {
		targets := append([]netip.AddrPort{netip.AddrPortFrom(group, mport)}, phys...)
		rng := mrand.New(mrand.NewPCG(1, 2))
		for i := 0; i < garbage; i++ {
			var real []byte
			if got := sniffed(); len(got) > 0 {
				real = got[rng.IntN(len(got))]
			}
			var d []byte
			switch {
			case real == nil || i%4 == 0:
				d = make([]byte, 1+rng.IntN(1500))
				for j := range d {
					d[j] = byte(rng.Uint32())
				}
			case i%4 == 1:
				d = real[:1+rng.IntN(len(real)-1)]
			case i%4 == 2:
				d = real // replayed as it was
			default:
				d = append([]byte(nil), real...)
				d[rng.IntN(len(d))] ^= 1 << rng.IntN(8)
			}
			k := rng.IntN(len(targets))
			if _, err := thrower.WriteToUDPAddrPort(d, targets[k]); err != nil {
				throwErr <- err
				return
			}
			if k == 0 {
				arrivals += members
			} else {
				arrivals++
			}
			if i%32 == 31 {
				deadline := time.Now().Add(time.Minute)
				for counted() < arrivals-slack {
					if time.Now().After(deadline) || ctx.Err() != nil {
						throwErr <- fmt.Errorf("after %d datagrams the drop counters account for %d of %d arrivals", i+1, counted(), arrivals)
						return
					}
					time.Sleep(time.Millisecond) // polling the counters
				}
			}
		}
		throwErr <- nil
	})
	for s := range per {
		for i, ch := range chs {
			require.NoError(t, ch.Send(ctx, stack.NewMessage(stack.Address{}, stacktest.Payload(i, s, 200))))
			require.NoError(t, ch.Send(ctx, stack.NewMessage(addrs[(i+1)%members], stacktest.Payload(i, per+s, 200))))
		}
		if s%256 == 255 {
			// Keep within a window of the receivers (no flow control in
			// this stack).
			stacktest.WaitFor(t, 3*time.Minute, func() bool { return cols[0].Len() >= (members+1)*(s-255) }, "member 0 keeps up")
		}
	}
	require.NoError(t, <-throwErr)
	stacktest.WaitFor(t, time.Minute, func() bool { return counted() >= arrivals }, "every garbage datagram counted")
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
	for _, ch := range chs {
		require.Equal(t, members, len(ch.View().Members), "the garbage cost nobody their membership")
	}
	t.Logf("garbage datagrams: %d thrown, %d arrivals at members; drops counted: %d", garbage, arrivals, counted())
}

// groupOf returns the multicast group and port vars give a config.
func groupOf(t *testing.T, vars map[string]string) (netip.Addr, uint16) {
	t.Helper()
	mp, err := strconv.Atoi(vars["STRATA_MCAST_PORT"])
	require.NoError(t, err)
	return netip.MustParseAddr(vars["STRATA_MCAST_ADDR"]), uint16(mp)
}

// sniff joins the group on loopback and records up to 500 of the group's
// datagrams (not those from skip), for an attacker to replay and damage.
// It returns what it has recorded so far; it stops when the test ends.
func sniff(t *testing.T, group netip.Addr, port uint16, skip netip.AddrPort) func() [][]byte {
	t.Helper()
	lcfg := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
		return errors.Join(err, serr)
	}}
	lc, err := lcfg.ListenPacket(context.Background(), "udp4", netip.AddrPortFrom(group, port).String())
	require.NoError(t, err)
	pc := ipv4.NewPacketConn(lc)
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	require.NoError(t, pc.JoinGroup(lo, &net.UDPAddr{IP: group.AsSlice()}))
	var mu sync.Mutex
	var got [][]byte
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { _ = lc.Close() })
	wg.Go(func() {
		buf := make([]byte, 1<<16)
		for {
			n, from, err := lc.ReadFrom(buf)
			if err != nil {
				return
			}
			if ua, ok := from.(*net.UDPAddr); ok && ua.AddrPort() == skip {
				continue
			}
			mu.Lock()
			if len(got) < 500 {
				got = append(got, append([]byte(nil), buf[:n]...))
			}
			mu.Unlock()
		}
	})
	return func() [][]byte {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}
