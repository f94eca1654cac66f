package gms_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/fdall"
	"github.com/strata-go/strata/protocols/frag"
	"github.com/strata-go/strata/protocols/gms"
	"github.com/strata-go/strata/protocols/merge3"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/ping"
	"github.com/strata-go/strata/protocols/stable"
	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/protocols/verifysuspect"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// Real-time settings for tests on sockets: short enough for a test, long
// enough not to suspect a member on a loaded CI machine.
var udpFD = fdall.Config{Interval: 300 * time.Millisecond, Timeout: 3 * time.Second, CheckInterval: 200 * time.Millisecond}

const udpVerify = 500 * time.Millisecond

type udpMember struct {
	ch   *stack.Channel
	drop *discard.Discard // drops nothing until a test "crashes" the member
}

// udpStack is the membership stack on a UDP transport with fast failure
// detection and merging.
func udpStack(cfg udp.Config) (*discard.Discard, []stack.Protocol) {
	pingCfg := ping.DefaultConfig()
	pingCfg.Timeout = 500 * time.Millisecond
	gmsCfg := gms.DefaultConfig()
	gmsCfg.JoinTimeout = time.Second
	gmsCfg.MaxJoinAttempts = 0
	nakCfg := nakack.DefaultConfig()
	nakCfg.XmitInterval = 200 * time.Millisecond
	d := discard.New(discard.DefaultConfig())
	return d, []stack.Protocol{
		udp.New(cfg), d, ping.New(pingCfg),
		merge3.New(merge3.Config{MinInterval: 300 * time.Millisecond, MaxInterval: time.Second, CheckInterval: 2 * time.Second}),
		fdall.New(udpFD), verifysuspect.New(verifysuspect.Config{Timeout: udpVerify, NumMsgs: 2}),
		nakack.New(nakCfg), unicast2.New(unicast2.DefaultConfig()), stable.New(stable.DefaultConfig()),
		gms.New(gmsCfg), frag.New(frag.DefaultConfig()),
	}
}

func loopbackUDP(t *testing.T, group string, mport int) udp.Config {
	cfg := udp.DefaultConfig()
	cfg.BindAddr, cfg.BindPort, cfg.IPTTL = "127.0.0.1", 0, 0
	cfg.McastAddr, cfg.McastPort = group, mport
	return cfg
}

func freeUDPPort(t *testing.T) int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

func connectConcurrently(t *testing.T, ms []*udpMember, cluster string, connect func(i int, ch *stack.Channel) error) {
	t.Helper()
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = connect(i, m.ch) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "member %d connects to %s", i, cluster)
	}
}

func udpChannels(ms []*udpMember) []*stack.Channel {
	out := make([]*stack.Channel, len(ms))
	for i, m := range ms {
		out[i] = m.ch
	}
	return out
}

// TestCrashOnLoopbackUDPIsDetected measures, on real sockets, the time from
// start to a 4-member view and from a crash (every packet to and from the
// member dropped) to the view without it.
func TestCrashOnLoopbackUDPIsDetected(t *testing.T) {
	t.Parallel()
	group := fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254))
	cfg := loopbackUDP(t, group, freeUDPPort(t))
	var ms []*udpMember
	for i := range 4 {
		d, protos := udpStack(cfg)
		ch, err := stack.New(stack.FromProtocols(protos...), stack.WithName(fmt.Sprintf("L%d", i)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		ms = append(ms, &udpMember{ch: ch, drop: d})
	}
	start := time.Now()
	connectConcurrently(t, ms, "crash", func(_ int, ch *stack.Channel) error { return ch.Connect(context.Background(), "crash") })
	stacktest.WaitForSameView(t, 30*time.Second, udpChannels(ms)...)
	t.Logf("start to a 4-member view: %s", time.Since(start))

	v := ms[0].ch.View()
	victim := slices.IndexFunc(ms, func(m *udpMember) bool { return m.ch.Address() == v.Members[1] })
	rest := slices.Delete(slices.Clone(ms), victim, victim+1)
	start = time.Now()
	ms[victim].drop.SetRates(1, 1)
	stacktest.WaitForSameView(t, 30*time.Second, udpChannels(rest)...)
	t.Logf("crash to the view without it: %s (timeout %s + verify %s)", time.Since(start), udpFD.Timeout, udpVerify)
	require.False(t, rest[0].ch.View().Contains(ms[victim].ch.Address()))
}
