package ping_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/ping"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func TestParseHosts(t *testing.T) {
	for _, tc := range []struct {
		in    string
		rng   int
		want  []string
		error string
	}{
		{in: "127.0.0.1:7800", want: []string{"127.0.0.1:7800"}},
		{in: "127.0.0.1:7800, 10.0.0.2[7900]", rng: 1, want: []string{"127.0.0.1:7800", "127.0.0.1:7801", "10.0.0.2:7900", "10.0.0.2:7901"}},
		{in: "[::1]:7800", want: []string{"[::1]:7800"}},
		{in: "localhost:7800", error: "must be an IP address"},
		{in: "127.0.0.1", error: "want host:port"},
		{in: "127.0.0.1:0", error: "bad port"},
		{in: " , ", error: "no hosts"},
	} {
		got, err := ping.ParseHosts(tc.in, tc.rng)
		if tc.error != "" {
			require.ErrorContains(t, err, tc.error, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		var s []string
		for _, ap := range got {
			s = append(s, ap.String())
		}
		require.Equal(t, tc.want, s, tc.in)
	}
}

func TestStaticConfigErrorsNameTheKey(t *testing.T) {
	c := ping.DefaultStaticConfig()
	c.InitialHosts = "nowhere"
	require.ErrorContains(t, c.Validate(), "initial_hosts")
	c = ping.DefaultStaticConfig()
	c.Runs = 0
	require.ErrorContains(t, c.Validate(), "num_discovery_runs")
}

func TestFindMembersReportsEveryMemberAndItsCoordinator(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ds := make([]*ping.Discovery, 3)
		c := stacktest.StartSIM(t, 3, 1, func(i int) []stack.Protocol {
			ds[i] = ping.New(ping.DefaultConfig())
			return []stack.Protocol{ds[i]}
		})
		a := c.Addresses()
		start := time.Now()
		found := ds[1].FindMembers(context.Background(), 0, false)
		require.Equal(t, ping.DefaultConfig().Timeout, time.Since(start), "without break_on_coord_rsp the round lasts timeout")
		require.Len(t, found, 2, "both others, not itself")
		for _, mi := range found {
			require.True(t, mi.IsServer)
			require.Equal(t, a[0], mi.Coord, "each names the view's coordinator")
			name, _ := stack.LogicalName(mi.Addr)
			require.Equal(t, mi.Name, name)
		}
		start = time.Now()
		found = ds[2].FindMembers(context.Background(), 0, true)
		require.Less(t, time.Since(start), ping.DefaultConfig().Timeout, "a coordinator's answer ends the round")
		require.NotEmpty(t, found)
	})
}

func TestStaticPingOnATransportWithoutAddressesFindsNoOneAndSaysSo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var d *ping.Discovery
		stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol {
			p := ping.NewStatic(ping.DefaultStaticConfig())
			if i == 0 {
				d = p
			}
			return []stack.Protocol{p}
		})
		require.Empty(t, d.FindMembers(context.Background(), 0, false))
		require.Positive(t, stacktest.Stat(t, d, "send_errors"))
	})
}

// TestStaticPingFindsMembersAtSIMNetworkAddresses: over SIM with bind_port,
// STATIC_PING's probes of initial_hosts reach the members holding those
// addresses, and each answer names where its member is.
func TestStaticPingFindsMembersAtSIMNetworkAddresses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := stacktest.NewNetwork(t, 1)
		ds := make([]*ping.Discovery, 3)
		sims := make([]*sim.SIM, 3)
		stacktest.Start(t, 3, func(i int) []stack.Protocol {
			cfg := sim.DefaultConfig()
			cfg.Network, cfg.BindPort = net.Name(), 7800
			sc := ping.DefaultStaticConfig()
			sc.InitialHosts, sc.PortRange = "127.0.0.1:7800", 2
			sims[i], ds[i] = sim.New(cfg), ping.NewStatic(sc)
			return []stack.Protocol{sims[i], ds[i]}
		})
		found := ds[0].FindMembers(context.Background(), 0, false)
		require.Len(t, found, 2)
		for _, mi := range found {
			i := slices.IndexFunc(sims, func(s *sim.SIM) bool { return s.LocalAddress() == mi.Addr })
			require.Positive(t, i)
			require.Equal(t, netip.AddrPortFrom(localhost, uint16(7800+i)), mi.Physical)
		}
		require.Zero(t, stacktest.Stat(t, ds[0], "send_errors"))
		require.Zero(t, stacktest.Stat(t, ds[0], "physical_address_overridden"))
	})
}

func freePort(t *testing.T) int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

type udpMember struct {
	ch  *stack.Channel
	d   *ping.Discovery
	u   *udp.UDP
	col *stacktest.Collector
}

func startUDP(t *testing.T, cfg udp.Config, d *ping.Discovery, cluster string) *udpMember {
	m := &udpMember{d: d, u: udp.New(cfg), col: stacktest.NewCollector()}
	ch, err := stack.New(stack.FromProtocols([]stack.Protocol{m.u, d, unicast2.New(unicast2.DefaultConfig())}...), stack.WithReceiver(m.col))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.NoError(t, ch.Connect(context.Background(), cluster))
	m.ch = ch
	return m
}

func udpConfig(t *testing.T) udp.Config {
	cfg := udp.DefaultConfig()
	cfg.BindAddr, cfg.BindPort, cfg.IPTTL = "127.0.0.1", 0, 0
	cfg.McastAddr = fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254))
	cfg.McastPort = freePort(t)
	return cfg
}

// TestWhoHasTeachesTheTransportAnUnknownAddress: a unicast to a member whose
// address the transport does not know makes it ask discovery, whose targeted
// request is answered; the retransmitted message then arrives.
func TestWhoHasTeachesTheTransportAnUnknownAddress(t *testing.T) {
	t.Parallel()
	cfg := udpConfig(t)
	a := startUDP(t, cfg, ping.New(ping.DefaultConfig()), "whohas")
	b := startUDP(t, cfg, ping.New(ping.DefaultConfig()), "whohas")
	require.NoError(t, a.ch.SendTo(context.Background(), b.ch.Address(), []byte("hello")))
	stacktest.WaitFor(t, 10*time.Second, func() bool { return b.col.Len() == 1 }, "b gets the unicast")
	require.Positive(t, stacktest.Stat(t, a.d, "who_has_requests"))
	phys, err := stack.Ask(context.Background(), stack.Of(a.ch), stack.EvGetPhysicalAddress{Member: b.ch.Address()})
	require.NoError(t, err)
	require.Equal(t, b.u.PhysicalAddress(), phys)
}

// TestStaticPingLearnsMembersOutsideItsList: A probes only itself; B probes
// A. After B's round A knows B and finds it in its own rounds.
func TestStaticPingLearnsMembersOutsideItsList(t *testing.T) {
	t.Parallel()
	cfg := udpConfig(t)
	cfg.IPMcast = false
	cfg.BindPort = freePort(t)
	sc := ping.DefaultStaticConfig()
	sc.InitialHosts, sc.PortRange = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(cfg.BindPort)).String(), 0
	a := startUDP(t, cfg, ping.NewStatic(sc), "static")
	require.Equal(t, cfg.BindPort, int(a.u.PhysicalAddress().Port()))
	cfg.BindPort = 0
	b := startUDP(t, cfg, ping.NewStatic(sc), "static")
	require.Empty(t, a.d.FindMembers(context.Background(), 200*time.Millisecond, false), "a alone in its list")
	found := b.d.FindMembers(context.Background(), 0, true)
	require.Len(t, found, 1)
	require.Equal(t, a.ch.Address(), found[0].Addr)
	require.EqualValues(t, 1, stacktest.Stat(t, a.d, "dynamic_hosts"), "a learnt b from its request")
	found = a.d.FindMembers(context.Background(), 0, true)
	require.Len(t, found, 1)
	require.Equal(t, b.ch.Address(), found[0].Addr)
}

// TestAnswerGoesWhereTheRequestCameFrom: a discovery request whose body
// names another host's address as the asker's (a reflection attack: aim a
// group's answers at a victim) is answered to the address the request came
// from; the member records the asker there too, and counts the mismatch.
func TestAnswerGoesWhereTheRequestCameFrom(t *testing.T) {
	t.Parallel()
	cfg := udpConfig(t)
	a := startUDP(t, cfg, ping.New(ping.DefaultConfig()), "reflect")
	listen := func() *net.UDPConn {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	asker, victim := listen(), listen()
	askerAt := asker.LocalAddr().(*net.UDPAddr).AddrPort()
	victimAt := victim.LocalAddr().(*net.UDPAddr).AddrPort()

	src := stack.NewAddress()
	m := stack.NewMessage(stack.Address{}, nil).Set(stack.Internal | stack.OOB | stack.DontBundle | stack.NoReliability)
	m.Src = src
	m.PutHeader(stack.IDPING, &ping.Header{Type: ping.TypeRequest, Info: stack.MemberInfo{Addr: src, Physical: victimAt}})
	_, err := asker.WriteToUDPAddrPort(stack.EncodeBundle(nil, "reflect", src, false, m), a.u.PhysicalAddress())
	require.NoError(t, err)

	buf := make([]byte, 1<<16)
	require.NoError(t, asker.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, from, err := asker.ReadFromUDPAddrPort(buf)
	require.NoError(t, err, "the answer reaches the asker")
	require.Equal(t, a.u.PhysicalAddress(), from)
	h, msgs, err := stack.DecodeBundle(buf[:n], "reflect")
	require.NoError(t, err)
	require.Equal(t, a.ch.Address(), h.Src)
	require.Len(t, msgs, 1)
	require.NotNil(t, msgs[0].Header(stack.IDPING), "a discovery answer")

	phys, err := stack.Ask(context.Background(), stack.Of(a.ch), stack.EvGetPhysicalAddress{Member: src})
	require.NoError(t, err)
	require.Equal(t, askerAt, phys, "the asker is where its request came from")
	require.EqualValues(t, 1, stacktest.Stat(t, a.d, "physical_address_overridden"))
	require.NoError(t, victim.SetReadDeadline(time.Now()))
	_, _, err = victim.ReadFromUDPAddrPort(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "nothing was sent to the victim")
}

// TestOnlyTheLowestRanksAnswerInALargeGroup: with max_rank_to_reply = 3,
// a discovery request to a view of twelve is answered by the coordinator
// and the next two members only, not by all eleven others; the member a
// WHO_HAS names answers whatever its rank, and members without a view
// (joining, as when many start at once) answer too.
func TestOnlyTheLowestRanksAnswerInALargeGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 12
		cfg := ping.DefaultConfig()
		cfg.MaxRankToReply = 3
		cfg.Runs = 1 // one request per round
		ds := make([]*ping.Discovery, n+1)
		c := stacktest.StartSIM(t, n, 1, func(i int) []stack.Protocol {
			ds[i] = ping.New(cfg)
			return []stack.Protocol{ds[i]}
		})
		a := c.Addresses()
		v := c.Channels[0].View()
		require.Equal(t, a, v.Members)

		found := ds[n-1].FindMembers(context.Background(), 0, false)
		var got []stack.Address
		for _, mi := range found {
			got = append(got, mi.Addr)
		}
		slices.SortFunc(got, func(x, y stack.Address) int { return v.Index(x) - v.Index(y) })
		require.Equal(t, a[:3], got, "the three lowest ranks answer, the coordinator first among them")
		for i := 3; i < n-1; i++ {
			require.EqualValues(t, 1, stacktest.Stat(t, ds[i], "requests_left_to_lower_ranks"), "member %d", i)
		}

		_, err := ds[n-1].UpEvent(stack.EvWhoHas{Member: a[7]})
		require.NoError(t, err)
		stacktest.WaitFor(t, time.Second, func() bool { return stacktest.Stat(t, ds[7], "responses_sent") == 1 }, "the member a WHO_HAS names answers")

		// A member without a view answers too.
		cfg.MaxRankToReply = 1
		simCfg := sim.DefaultConfig()
		simCfg.Network = c.Net.Name()
		ds[n] = ping.New(cfg)
		joiner, err := stack.New(stack.FromProtocols(sim.New(simCfg), ds[n]), stack.WithName("joiner"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = joiner.Close() })
		require.NoError(t, joiner.Connect(context.Background(), "test"))
		found = ds[n-1].FindMembers(context.Background(), 0, false)
		require.Len(t, found, 4, "the three lowest ranks, and the member without a view")
	})
}
