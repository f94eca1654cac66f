package gms_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/netlab"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestThreeHostsSplitAndMergeInNetworkNamespaces: 3 hosts (namespaces on
// a bridge, 198.18.0.1-3) form a view; host 3's link goes down and the
// others install a view without it; the link comes back and a merge view
// of all 3 is installed everywhere.
func TestThreeHostsSplitAndMergeInNetworkNamespaces(t *testing.T) {
	lab := netlab.New(t, 3)
	group := fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254))
	var ms []*udpMember
	for i := range lab.Hosts {
		cfg := loopbackUDP(t, group, 45588)
		cfg.BindAddr, cfg.BindPort, cfg.IPTTL = netlab.IP(i+1), 7800, 1
		d, protos := udpStack(cfg)
		var ch *stack.Channel
		// The transport checks its address (Init) and makes its sockets
		// (Connect) in the host's namespace.
		require.NoError(t, netlab.In(lab.Hosts[i], func() (err error) {
			ch, err = stack.New(stack.FromProtocols(protos...), stack.WithName(fmt.Sprintf("host%d", i+1)))
			return err
		}))
		t.Cleanup(func() { _ = ch.Close() })
		ms = append(ms, &udpMember{ch: ch, drop: d})
	}
	connectConcurrently(t, ms, "netns", func(i int, ch *stack.Channel) error {
		return netlab.In(lab.Hosts[i], func() error { return ch.Connect(context.Background(), "netns") })
	})
	stacktest.WaitForSameView(t, 30*time.Second, udpChannels(ms)...)

	start := time.Now()
	lab.LinkDown(3)
	stacktest.WaitForSameView(t, 30*time.Second, ms[0].ch, ms[1].ch)
	stacktest.WaitForSameView(t, 30*time.Second, ms[2].ch)
	t.Logf("link down to a view of the other two: %s", time.Since(start))

	start = time.Now()
	lab.LinkUp(3)
	stacktest.WaitForSameView(t, 60*time.Second, udpChannels(ms)...)
	t.Logf("link up to the merge view: %s", time.Since(start))
	v := ms[0].ch.View()
	require.True(t, v.IsMerge(), "a merge view: %s", v)
	require.Len(t, v.Subgroups, 2)
}
