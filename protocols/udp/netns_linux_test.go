package udp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/netlab"
	"github.com/strata-go/strata/protocols/udp"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func TestMembersInThreeNetworkNamespaces(t *testing.T) {
	lab := netlab.New(t, 3)
	cfg := testConfig(t)
	cfg.IPTTL = 1
	var ms []*member
	for i, h := range lab.Hosts {
		c := cfg
		c.BindAddr = netlab.IP(i + 1)
		m := &member{udp: udp.New(c), col: stacktest.NewCollector()}
		require.NoError(t, netlab.In(h, func() error {
			ch, err := stack.New(stack.FromProtocols([]stack.Protocol{m.udp}...), stack.WithName(fmt.Sprintf("ns%d", i+1)), stack.WithReceiver(m.col))
			if err != nil {
				return err
			}
			m.ch = ch
			return ch.Connect(context.Background(), "netns")
		}))
		t.Cleanup(func() { _ = m.ch.Close() })
		ms = append(ms, m)
	}
	introduce(t, ms)
	ctx := context.Background()
	round := func(senders []*member, tag string) {
		t.Helper()
		for _, m := range senders {
			require.NoError(t, m.ch.SendTo(ctx, stack.Address{}, []byte(tag+" mcast from "+m.ch.Name())))
			for _, o := range senders {
				if o != m {
					require.NoError(t, m.ch.SendTo(ctx, o.ch.Address(), []byte(tag+" ucast from "+m.ch.Name())))
				}
			}
		}
		for _, o := range senders {
			want := 2*len(senders) - 1 // every multicast (own included) + a unicast from each other sender
			stacktest.WaitFor(t, 10*time.Second, func() bool { return count(o.col, tag) == want },
				"%s receives %d %q messages", o.ch.Name(), want, tag)
		}
	}
	round(ms, "all")
	lab.LinkDown(3)
	round(ms[:2], "two")
	require.Zero(t, count(ms[2].col, "two"), "the cut-off host hears nothing")
}

func count(c *stacktest.Collector, tag string) int {
	n := 0
	for _, m := range c.Messages() {
		if strings.HasPrefix(string(m.Payload), tag+" ") {
			n++
		}
	}
	return n
}
