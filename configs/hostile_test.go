//go:build linux

package configs_test

import (
	"context"
	"encoding/hex"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/encrypt"
	"github.com/strata-go/strata/protocols/gms"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// attackCounters are the counters that catch an outsider's attacks on a
// secure.toml member, by layer.
var attackCounters = map[string][]string{
	"UDP":     {"addr_moves_unproven", "dropped_malformed"},
	"ENCRYPT": {"unencrypted", "auth_failures", "replays"},
}

func sumStats(chs []*stack.Channel) map[string]int64 {
	out := map[string]int64{}
	for _, ch := range chs {
		for _, ps := range ch.Stats() {
			for _, s := range ps.Stats {
				for _, name := range attackCounters[ps.Protocol] {
					if s.Name == name {
						out[ps.Protocol+"."+name] += s.Value
					}
				}
			}
		}
	}
	return out
}

// forgedGMS returns GMS messages in member's name that would each disrupt
// the group if believed: a VIEW that leaves out victim, a LEAVE_REQ and a
// JOIN_REQ. An outsider without the key can only send them in the clear,
// or under an ENCRYPT header it cannot seal.
func forgedGMS(member, victim stack.Address, members []stack.Address) []*stack.Message {
	var rest []stack.Address
	for _, a := range members {
		if a != victim {
			rest = append(rest, a)
		}
	}
	var out []*stack.Message
	for _, h := range stack.HeaderSamples(stack.IDGMS) {
		g := h.(*gms.Header)
		switch g.Kind() {
		case "VIEW", "LEAVE_REQ", "JOIN_REQ":
		default:
			continue
		}
		if g.View != nil {
			g.View = stack.NewView(member, 1000, rest...)
		}
		m := stack.NewMessage(stack.Address{}, nil).Set(stack.Internal)
		m.Src = member
		m.PutHeader(stack.IDGMS, g)
		out = append(out, m)
	}
	return out
}

// TestSecureConfigWithstandsAnOutsiderWithoutTheKey: three members on
// secure.toml (ENCRYPT, AUTH, real UDP on 127.0.0.1) run a perf-sized load
// of multicasts and unicasts while an attacker on the same network, who
// knows neither the key nor the secret, sends without pause:
//   - empty bundles naming each member as their source, from the
//     attacker's port, to every member and to the group (address-cache
//     poisoning: what stalled secure.toml groups before);
//   - VIEW, LEAVE_REQ and JOIN_REQ in a member's name, in the clear and
//     under a made-up ENCRYPT header;
//   - replays of the group's own datagrams, sniffed from the group;
//   - floods of random datagrams.
//
// Every message arrives once and in order, the view never changes, no
// datagram meant for a member reaches the attacker, every member keeps the
// others' real addresses, and each attack shows in the counter that
// caught it.
func TestSecureConfigWithstandsAnOutsiderWithoutTheKey(t *testing.T) {
	if testing.Short() {
		t.Skip("soak")
	}
	t.Parallel()
	const members, per, size = 3, 20_000, 1000
	key := randomHex(32)
	vars := secureVars(t, key, "")
	kb, err := hex.DecodeString(key)
	require.NoError(t, err)
	keyID := encrypt.KeyID(kb) // travels in the clear: the attacker sees it
	chs, cols, _ := startFromConfig(t, "secure.toml", members, vars)
	stacktest.LogStatsOnFailure(t, chs...)
	view := chs[0].View()
	addrs := make([]stack.Address, members)
	phys := make([]netip.AddrPort, members)
	for i, ch := range chs {
		addrs[i] = ch.Address()
		pa, err := stack.Ask(context.Background(), stack.Of(ch), stack.EvGetLocalPhysicalAddress{})
		require.NoError(t, err)
		phys[i] = pa
	}
	cluster := chs[0].Cluster()
	group, mport := groupOf(t, vars)
	groupAt := netip.AddrPortFrom(group, mport)

	attacker, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	attackerAt := attacker.LocalAddr().(*net.UDPAddr).AddrPort()
	sniffed := sniff(t, group, mport, attackerAt)

	var misdirected atomic.Int64 // datagrams members sent to the attacker
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { _ = attacker.Close() })
	wg.Go(func() {
		buf := make([]byte, 1<<16)
		for {
			if _, _, err := attacker.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			misdirected.Add(1)
		}
	})

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var sent [4]atomic.Int64 // per attack: datagrams sent
	attackDone := make(chan error, 1)
	wg.Go(func() {
		rng := mrand.New(mrand.NewPCG(3, 4))
		send := func(kind int, d []byte, to netip.AddrPort) bool {
			if _, err := attacker.WriteToUDPAddrPort(d, to); err != nil {
				attackDone <- err
				return false
			}
			sent[kind].Add(1)
			return true
		}
		// About 5,000 datagrams a second, the rate that stalled a group.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				attackDone <- nil
				return
			case <-tick.C:
			}
			for j, a := range addrs {
				// Poisoning: a's name, the attacker's port.
				empty := stack.EncodeBundle(nil, cluster, a, false)
				for k, p := range phys {
					if k != j && !send(0, empty, p) {
						return
					}
				}
				if !send(0, stack.EncodeBundle(nil, cluster, a, true), groupAt) {
					return
				}
				// Forged membership messages in a's name.
				for _, m := range forgedGMS(a, addrs[(j+1)%members], addrs) {
					if !send(1, stack.EncodeBundle(nil, cluster, a, true, m), groupAt) {
						return
					}
					sealed := stack.NewMessage(m.Dest, make([]byte, 64+rng.IntN(64))).Set(m.Flags)
					sealed.Src = a
					_, _ = crand(sealed.Payload)
					sealed.PutHeader(stack.IDENCRYPT, &encrypt.Header{KeyID: keyID, Prefix: rng.Uint32(), Time: uint32(time.Now().Unix()), Counter: rng.Uint64() >> 8})
					if !send(1, stack.EncodeBundle(nil, cluster, a, true, sealed), phys[(j+1)%members]) {
						return
					}
				}
			}
			// Replays of the group's own traffic.
			if got := sniffed(); len(got) > 0 {
				for range 10 {
					if !send(2, got[rng.IntN(len(got))], phys[rng.IntN(members)]) {
						return
					}
				}
			}
			// A flood of random bytes.
			for range 20 {
				d := make([]byte, 1+rng.IntN(1400))
				_, _ = crand(d)
				if !send(3, d, phys[rng.IntN(members)]) {
					return
				}
			}
		}
	})

	started := time.Now()
	for s := range per {
		for i, ch := range chs {
			require.NoError(t, ch.Send(ctx, stack.NewMessage(stack.Address{}, stacktest.Payload(i, s, size))))
			require.NoError(t, ch.Send(ctx, stack.NewMessage(addrs[(i+1)%members], stacktest.Payload(i, per+s, size))))
		}
		if s%256 == 255 {
			// Keep within a window of the receivers (no flow control in
			// this stack yet).
			stacktest.WaitFor(t, 3*time.Minute, func() bool { return cols[0].Len() >= (members+1)*(s-255) }, "member 0 keeps up")
		}
	}
	stacktest.WaitFor(t, 3*time.Minute, func() bool {
		for _, c := range cols {
			if c.Len() < members*per+per {
				return false
			}
		}
		return true
	}, "all the group's messages delivered")
	took := time.Since(started)
	cancel()
	require.NoError(t, <-attackDone)

	for i, c := range cols {
		require.Equal(t, members*per+per, c.Len(), "member %d: nothing extra delivered", i)
		for j, a := range addrs {
			var mc, uc []int
			for _, q := range c.Seqs(a) {
				if q < per {
					mc = append(mc, q)
				} else {
					uc = append(uc, q-per)
				}
			}
			require.Equal(t, seq(per), mc, "member %d: multicasts from %d, once each and in order", i, j)
			if j == (i+members-1)%members {
				require.Equal(t, seq(per), uc, "member %d: unicasts from %d, once each and in order", i, j)
			} else {
				require.Empty(t, uc)
			}
		}
	}
	for i, ch := range chs {
		require.True(t, ch.View().ID == view.ID, "member %d's view never changed: %s", i, ch.View())
		for j, a := range addrs {
			if i != j {
				pa, err := stack.Ask(context.Background(), stack.Of(ch), stack.EvGetPhysicalAddress{Member: a})
				require.NoError(t, err)
				require.Equal(t, phys[j], pa, "member %d knows member %d's real address", i, j)
			}
		}
	}
	require.Zero(t, misdirected.Load(), "datagrams meant for members that reached the attacker")
	got := sumStats(chs)
	t.Logf("%d msgs per member delivered in %s under attack; attacker sent poison=%d forged=%d replays=%d flood=%d; counted %v",
		members*per+per, took.Round(time.Millisecond), sent[0].Load(), sent[1].Load(), sent[2].Load(), sent[3].Load(), got)
	for kind, counter := range map[int]string{0: "UDP.addr_moves_unproven", 1: "ENCRYPT.unencrypted", 3: "UDP.dropped_malformed"} {
		require.Positive(t, sent[kind].Load(), "attack %d sent", kind)
		require.Positive(t, got[counter], "attack %d caught by %s", kind, counter)
	}
	// Half the forgeries carry a made-up ENCRYPT header, one member each;
	// a replayed datagram comes from the attacker's port, not its sealer's,
	// so it does not open either (the replay windows catch only replays
	// from the sealer's own address).
	require.Positive(t, sent[2].Load(), "replays sent")
	require.Greater(t, got["ENCRYPT.auth_failures"]+got["ENCRYPT.replays"], sent[1].Load()/2, "forged headers and replays caught")
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func crand(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(mrand.Uint32())
	}
	return len(b), nil
}
