package fdall_test

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/fdall"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

var cfg = fdall.Config{Interval: time.Second, Timeout: 5 * time.Second, CheckInterval: 500 * time.Millisecond}

func start(t *testing.T, n int) (*stacktest.Cluster, []*stacktest.EventRecorder, []*fdall.FDAll) {
	recs := make([]*stacktest.EventRecorder, n)
	fds := make([]*fdall.FDAll, n)
	c := stacktest.StartSIM(t, n, 1, func(i int) []stack.Protocol {
		recs[i], fds[i] = stacktest.NewEventRecorder(), fdall.New(cfg)
		return []stack.Protocol{fds[i], recs[i]}
	})
	return c, recs, fds
}

func TestSilentMemberIsSuspectedAfterTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, recs, _ := start(t, 3)
		addrs := c.Addresses()
		time.Sleep(3 * cfg.Timeout)
		for i, r := range recs {
			require.Empty(t, r.Suspected(), "member %d suspects no one while all are alive", i)
		}
		cut := time.Now()
		c.Net.Cut(addrs[2])
		stacktest.WaitFor(t, time.Minute, func() bool {
			return slices.Contains(recs[0].Suspected(), addrs[2]) && slices.Contains(recs[1].Suspected(), addrs[2])
		}, "members 0 and 1 suspect member 2")
		took := time.Since(cut)
		require.GreaterOrEqual(t, took, cfg.Timeout-cfg.Interval, "not before timeout (less the last heartbeat's age)")
		require.LessOrEqual(t, took, cfg.Timeout+cfg.CheckInterval+stacktest.Poll, "within timeout and one check (and one poll of WaitFor)")
		require.NotContains(t, recs[0].Suspected(), addrs[1])

		c.Net.Restore(addrs[2])
		stacktest.WaitFor(t, time.Minute, func() bool { return len(stacktest.Recorded[stack.EvUnsuspect](recs[0])) > 0 }, "member 2 unsuspected when heard again")
		require.Equal(t, addrs[2], stacktest.Recorded[stack.EvUnsuspect](recs[0])[0].Member)
	})
}

func TestAnyMessageCountsAsAHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, recs, fds := start(t, 2)
		c.Net.SetDefault(sim.Rule{DropIf: func(m *stack.Message) bool { return m.Header(stack.IDFDALL) != nil }})
		stop := make(chan struct{})
		done := make(chan struct{})
		stopped := false
		halt := func() {
			if !stopped {
				stopped = true
				close(stop)
				<-done
			}
		}
		defer halt()
		go func() {
			defer close(done)
			tick := time.NewTicker(cfg.Interval)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					for _, ch := range c.Channels {
						_ = ch.SendTo(t.Context(), stack.Address{}, []byte("traffic"))
					}
				}
			}
		}()
		time.Sleep(4 * cfg.Timeout)
		for i, r := range recs {
			require.Empty(t, r.Suspected(), "member %d: traffic alone keeps the other alive", i)
		}
		require.Zero(t, stacktest.Stat(t, fds[0], "heartbeats_received"), "every heartbeat was dropped")
		halt()
		stacktest.WaitFor(t, time.Minute, func() bool { return len(recs[0].Suspected()) > 0 }, "suspected once the traffic stops")
	})
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	for key, c := range map[string]fdall.Config{
		"interval":               {Interval: 0, Timeout: time.Second, CheckInterval: time.Second},
		"timeout":                {Interval: time.Second, Timeout: time.Second, CheckInterval: time.Second},
		"timeout_check_interval": {Interval: time.Second, Timeout: 2 * time.Second, CheckInterval: 3 * time.Second},
	} {
		err := c.Validate()
		require.Error(t, err, key)
		require.Contains(t, err.Error(), key)
	}
	def := fdall.DefaultConfig()
	require.NoError(t, def.Validate())
}
