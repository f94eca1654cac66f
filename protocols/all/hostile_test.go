package all_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/configs"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// simStack turns a shipped UDP or TCP config into the same stack over SIM
// (the network named ${STRATA_SIM_NETWORK}), with AUTH below GMS when
// secretFile is set. A TCP table's bind_addr, bind_port and port_range
// stay: each member then has a network address on SIM, the first free
// port from bind_port as on a host, where STATIC_PING's initial_hosts
// finds it.
func simStack(t testing.TB, file, secretFile string) []byte {
	t.Helper()
	b, err := configs.FS.ReadFile(file)
	require.NoError(t, err)
	s := string(b)
	tr := strings.Index(s, "[[protocol]]\ntype = \"UDP\"")
	isTCP := tr < 0
	if isTCP {
		tr = strings.Index(s, "[[protocol]]\ntype = \"TCP\"")
	}
	require.True(t, tr >= 0, "%s has a UDP or TCP table", file)
	next := strings.Index(s[tr+1:], "[[protocol]]") + tr + 1
	require.True(t, next > tr, "%s has a protocol above its transport", file)
	table := "[[protocol]]\ntype = \"SIM\"\nnetwork = \"${STRATA_SIM_NETWORK}\"\n"
	for line := range strings.Lines(s[tr:next]) {
		// The datagram limit goes with it: SIM refuses larger packets as
		// UDP does (and TCP larger frames).
		if k, _, _ := strings.Cut(line, " = "); k == "max_bundle_size" || isTCP && (k == "bind_addr" || k == "bind_port" || k == "port_range") {
			table += line
		}
	}
	s = s[:tr] + table + "\n" + s[next:]
	if secretFile != "" {
		gms := strings.Index(s, "[[protocol]]\ntype = \"GMS\"")
		require.True(t, gms >= 0)
		s = s[:gms] + fmt.Sprintf("[[protocol]]\ntype = \"AUTH\"\nsecret_file = %q\n\n", secretFile) + s[gms:]
	}
	return []byte(s)
}

var hostileNet atomic.Int64

// hostileGroup is three members of a shipped stack over SIM, in one view,
// and an address outside it.
type hostileGroup struct {
	chs      []*stack.Channel
	outsider stack.Address
}

func startHostileGroup(t testing.TB, file string) *hostileGroup {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("a hostile network, sixteen bytes and more"), 0o600))
	data := simStack(t, file, secret)
	vars := map[string]string{"STRATA_SIM_NETWORK": fmt.Sprint("hostile-", file, "-", hostileNet.Add(1))}
	g := &hostileGroup{outsider: stack.NewAddress()}
	for i := range 3 {
		sc, err := stack.ParseConfigVars(file, data, vars)
		require.NoError(t, err)
		ch, err := stack.New(stack.FromConfig(sc), stack.WithName(stacktest.Names[i]), stack.WithReceiver(stacktest.NewCollector()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		require.NoError(t, ch.Connect(context.Background(), "hostile"))
		g.chs = append(g.chs, ch)
	}
	stacktest.WaitForSameView(t, 30*time.Second, g.chs...)
	return g
}

// inject hands member 0's transport a datagram holding m from the member
// (or outsider) sel picks: the wire decoder and every layer see it as if
// it came from the network.
func (g *hostileGroup) inject(sel uint8, m *stack.Message) {
	srcs := []stack.Address{g.chs[1].Address(), g.chs[2].Address(), g.outsider, g.chs[0].Address()}
	src := srcs[int(sel)%len(srcs)]
	if sel&0x10 != 0 {
		m.Dest = g.chs[0].Address()
	}
	t := stack.Of(g.chs[0]).Protocols()[0].(interface {
		Receive([]byte, netip.AddrPort) (stack.BundleHeader, bool)
	})
	t.Receive(stack.EncodeBundle(nil, "hostile", src, m.Dest.IsZero(), m), netip.AddrPort{})
}

// forged builds a message carrying the header of protocol id decoded from
// body; ok is false if body does not decode.
func forged(id uint16, body []byte, flags uint16, payload []byte) (*stack.Message, bool) {
	h, err := stack.DecodeHeader(id, body)
	if err != nil {
		return nil, false
	}
	m := stack.NewMessage(stack.Address{}, payload)
	m.Flags = stack.Flags(flags) & (stack.OOB | stack.Internal | stack.NoReliability)
	m.PutHeader(id, h)
	return m, true
}

// FuzzForgedProtocolMessages sends one forged message (any shipped
// protocol's header with any content, from a member, an outsider or
// itself, multicast or unicast) to a running member of the flush.toml and
// groupfc.toml stacks, AUTH included, over SIM. No input may crash a layer.
func FuzzForgedProtocolMessages(f *testing.F) {
	for id := range stack.HeaderIDs() {
		for i, h := range stack.HeaderSamples(id) {
			f.Add(uint8(i), id, h.AppendTo(nil), uint16(0), []byte("x"))
			f.Add(uint8(i+0x11), id, h.AppendTo(nil), uint16(stack.OOB), []byte(nil))
		}
	}
	groups := []*hostileGroup{startHostileGroup(f, "flush.toml"), startHostileGroup(f, "groupfc.toml")}
	f.Fuzz(func(t *testing.T, sel uint8, id uint16, body []byte, flags uint16, payload []byte) {
		m, ok := forged(id, body, flags, payload)
		if !ok {
			return
		}
		groups[int(sel>>7)].inject(sel, m)
	})
}

// TestOutsiderCannotDisturbTheGroup throws 20,000 forged messages from an
// address outside the view (every shipped header, its samples with bytes
// changed at random, with whatever seqnos, view ids and windows the bytes
// say; multicast and unicast) at one member of each stack. The view stays
// the one it was, and every member still delivers every member's
// multicast once. (Forgeries in a member's name are real messages to a
// stack without ENCRYPT; FuzzForgedProtocolMessages sends those too, and
// only asks that nothing crashes.)
func TestOutsiderCannotDisturbTheGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("many messages")
	}
	for _, file := range []string{"flush.toml", "groupfc.toml"} {
		t.Run(file, func(t *testing.T) {
			t.Parallel()
			g := startHostileGroup(t, file)
			before := g.chs[0].View()
			var samples [][2]any
			for id := range stack.HeaderIDs() {
				for _, h := range stack.HeaderSamples(id) {
					b := h.AppendTo(nil)
					samples = append(samples, [2]any{id, b})
				}
			}
			seed := stacktest.Seed(t)
			stacktest.LogSeedOnFailure(t, seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			sent := 0
			for i := 0; i < 20_000; i++ {
				s := samples[rng.IntN(len(samples))]
				body := append([]byte(nil), s[1].([]byte)...)
				for range rng.IntN(3) {
					if len(body) > 0 {
						body[rng.IntN(len(body))] = byte(rng.Uint32())
					}
				}
				if m, ok := forged(s[0].(uint16), body, uint16(rng.Uint32()), []byte("forged")); ok {
					g.inject(2|uint8(rng.IntN(2))<<4, m)
					sent++
				}
			}
			t.Logf("%s: %d forged messages injected", file, sent)
			var addrs []stack.Address
			cols := make([]*stacktest.Collector, len(g.chs))
			for i, ch := range g.chs {
				addrs = append(addrs, ch.Address())
				cols[i] = stacktest.NewCollector()
				ch.SetReceiver(cols[i])
			}
			for i, ch := range g.chs {
				require.NoError(t, ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, 0, 8))), "member %d", i)
			}
			for i, col := range cols {
				from := addrs
				if file == "groupfc.toml" { // loopback = false: not its own
					from = slices.Delete(slices.Clone(addrs), i, i+1)
				}
				stacktest.WaitFor(t, time.Minute, func() bool {
					for _, a := range from {
						if len(col.Seqs(a)) == 0 {
							return false
						}
					}
					return true
				}, "member %d gets every multicast", i)
				require.Empty(t, col.CheckExactlyOnce(from, 1, true))
			}
			for i, ch := range g.chs {
				require.Equal(t, before.ID, ch.View().ID, "member %d's view", i)
			}
		})
	}
}
