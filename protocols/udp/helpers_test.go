package udp_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// testConfig binds to 127.0.0.1 on a free port, with a multicast group and
// port of the test's own, so tests run in parallel and beside other programs.
func testConfig(t testing.TB) udp.Config {
	t.Helper()
	cfg := udp.DefaultConfig()
	cfg.BindAddr = "127.0.0.1"
	cfg.BindPort = 0
	cfg.McastAddr = fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254))
	cfg.McastPort = freePort(t)
	cfg.IPTTL = 0
	return cfg
}

func freePort(t testing.TB) int {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

type member struct {
	ch  *stack.Channel
	udp *udp.UDP
	col *stacktest.Collector
}

// startMembers connects n channels on UDP to cluster, each built by
// build(udp) (nil: UDP alone), tells each the others' physical addresses
// (as discovery will) and installs one view of all of them.
func startMembers(t testing.TB, n int, cluster string, cfg udp.Config, above func() []stack.Protocol) []*member {
	t.Helper()
	var ms []*member
	for i := range n {
		u := udp.New(cfg)
		protos := []stack.Protocol{u}
		if above != nil {
			protos = append(protos, above()...)
		}
		col := stacktest.NewCollector()
		ch, err := stack.New(stack.FromProtocols(protos...), stack.WithName(fmt.Sprintf("%s-%c", cluster, 'A'+i)), stack.WithReceiver(col))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		require.NoError(t, ch.Connect(context.Background(), cluster))
		ms = append(ms, &member{ch: ch, udp: u, col: col})
	}
	introduce(t, ms)
	addrs := make([]stack.Address, n)
	chs := make([]*stack.Channel, n)
	for i, m := range ms {
		addrs[i], chs[i] = m.ch.Address(), m.ch
	}
	stacktest.InjectView(t, stack.NewView(addrs[0], 2, addrs...), chs...)
	return ms
}

func introduce(t testing.TB, ms []*member) {
	t.Helper()
	for _, a := range ms {
		for _, b := range ms {
			if a == b {
				continue
			}
			pa, err := stack.Ask(context.Background(), stack.Of(b.ch), stack.EvGetLocalPhysicalAddress{})
			require.NoError(t, err)
			err = stack.Of(a.ch).DownEvent(context.Background(), stack.EvAddPhysicalAddress{Logical: b.ch.Address(), Physical: pa})
			require.NoError(t, err)
		}
	}
}
