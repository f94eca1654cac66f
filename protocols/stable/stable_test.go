package stable_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/stable"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

func TestPurgesOnlyWhatEveryMemberHasDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var naks []*nakack.NAKACK
		var sts []*stable.STABLE
		var ds []*discard.Discard
		c := stacktest.StartSIM(t, 3, 1, func(i int) []stack.Protocol {
			cfg := stable.DefaultConfig()
			cfg.Interval = time.Second
			n, s, d := nakack.New(nakack.DefaultConfig()), stable.New(cfg), discard.New(discard.DefaultConfig())
			naks, sts, ds = append(naks, n), append(sts, s), append(ds, d)
			return []stack.Protocol{d, n, s}
		})
		a := c.Channels[0]
		// C hears nothing from A, so C has delivered nothing of A's.
		ds[2].DropUpIf(func(m *stack.Message) bool { return m.Src == a.Address() && m.Header(stack.IDNAKACK) != nil })
		for s := range 10 {
			require.NoError(t, a.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(0, s, 100))))
		}
		stacktest.WaitFor(t, time.Minute, func() bool {
			return stacktest.Stat(t, sts[0], "stable_rounds") >= 3
		}, "stability rounds run")
		require.EqualValues(t, 10, stacktest.Stat(t, naks[0], "msgs_held"), "C has delivered none: A keeps all")
		require.EqualValues(t, 1000, stacktest.Stat(t, naks[0], "bytes_held"))

		ds[2].DropUpIf(nil)
		stacktest.WaitFor(t, time.Minute, func() bool { return c.Recv[2].Len() == 10 }, "C catches up")
		stacktest.WaitFor(t, time.Minute, func() bool {
			for _, n := range naks {
				if stacktest.Stat(t, n, "msgs_held") != 0 {
					return false
				}
			}
			return true
		}, "then every table is purged")
	})
}

func TestGossipFromAnotherViewIsIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sts []*stable.STABLE
		c := stacktest.StartSIM(t, 2, 1, func(i int) []stack.Protocol {
			cfg := stable.DefaultConfig()
			cfg.Interval = time.Second
			s := stable.New(cfg)
			sts = append(sts, s)
			return []stack.Protocol{nakack.New(nakack.DefaultConfig()), s}
		})
		// B moves to a view of its own; A still has {A, B}.
		b := c.Channels[1]
		stacktest.InjectView(t, stack.NewView(b.Address(), 9, b.Address()), b)
		stacktest.WaitFor(t, time.Minute, func() bool { return stacktest.Stat(t, sts[0], "gossips_ignored") >= 2 }, "A ignores B's gossips")
		require.Zero(t, stacktest.Stat(t, sts[0], "stable_rounds"), "A never has a gossip from every member of its view")
	})
}
