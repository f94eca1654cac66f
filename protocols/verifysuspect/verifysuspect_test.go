package verifysuspect_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/verifysuspect"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

var cfg = verifysuspect.Config{Timeout: 2 * time.Second, NumMsgs: 2}

func start(t *testing.T) (*stacktest.Cluster, *stacktest.EventRecorder, *verifysuspect.VerifySuspect) {
	var rec *stacktest.EventRecorder
	var vs *verifysuspect.VerifySuspect
	c := stacktest.StartSIM(t, 3, 1, func(i int) []stack.Protocol {
		v, r := verifysuspect.New(cfg), stacktest.NewEventRecorder()
		if i == 0 {
			vs, rec = v, r
		}
		return []stack.Protocol{v, r}
	})
	return c, rec, vs
}

func TestLiveSuspectIsClearedAndNotPassedUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, rec, vs := start(t)
		b := c.Addresses()[1]
		_, _ = vs.UpEvent(stack.EvSuspect{Members: []stack.Address{b}})
		stacktest.WaitFor(t, time.Minute, func() bool { return len(stacktest.Recorded[stack.EvUnsuspect](rec)) == 1 }, "b answers")
		time.Sleep(2 * cfg.Timeout)
		require.Empty(t, rec.Suspected(), "a live member's suspicion never reaches the layers above")
		require.EqualValues(t, 1, stacktest.Stat(t, vs, "suspicions_cleared"))
	})
}

func TestDeadSuspectIsPassedUpAfterTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, rec, vs := start(t)
		b := c.Addresses()[1]
		c.Net.Cut(b)
		start := time.Now()
		_, _ = vs.UpEvent(stack.EvSuspect{Members: []stack.Address{b}})
		_, _ = vs.UpEvent(stack.EvSuspect{Members: []stack.Address{b}}) // again: still one check
		stacktest.WaitFor(t, time.Minute, func() bool { return len(rec.Suspected()) > 0 }, "suspicion confirmed")
		require.Equal(t, []stack.Address{b}, rec.Suspected())
		// Exactly after timeout, give or take WaitFor's poll.
		took := time.Since(start)
		require.GreaterOrEqual(t, took, cfg.Timeout, "not before timeout")
		require.LessOrEqual(t, took, cfg.Timeout+stacktest.Poll, "right after timeout")
		require.EqualValues(t, cfg.NumMsgs, stacktest.Stat(t, vs, "verifications"), "num_msgs requests, spread over the timeout")
	})
}

func TestSuspectOutsideTheViewIsIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, rec, vs := start(t)
		_, _ = vs.UpEvent(stack.EvSuspect{Members: []stack.Address{stack.NewAddress()}})
		time.Sleep(2 * cfg.Timeout)
		require.Empty(t, rec.Suspected())
		require.Zero(t, stacktest.Stat(t, vs, "verifications"))
	})
}
