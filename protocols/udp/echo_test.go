package udp

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEchoPacerWaitsUntilOwnMulticastsAreReadBack: with more than the limit
// sent and not read back, the bundler waits; reading back enough of it
// releases it, without a timeout.
func TestEchoPacerWaitsUntilOwnMulticastsAreReadBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newEchoPacer()
		p.limit.Store(100_000)
		p.wrote(64_000)
		p.wait(nil) // under the limit: no wait
		require.Zero(t, p.waits.Load())
		p.wrote(64_000)
		var returned atomic.Bool
		go func() { p.wait(nil); returned.Store(true) }()
		synctest.Wait()
		require.False(t, returned.Load(), "128,000 bytes out, limit 100,000: the bundler waits")
		p.readBack(20_000)
		p.signal()
		synctest.Wait()
		require.False(t, returned.Load(), "108,000 bytes out: still waiting")
		p.readBack(64_000)
		p.signal()
		synctest.Wait()
		require.True(t, returned.Load(), "44,000 bytes out: released")
		require.Equal(t, int64(1), p.waits.Load())
		require.Zero(t, p.timeouts.Load())
	})
}

// TestEchoPacerForgetsLostDatagramsWhenTheSocketIsDrained: own datagrams
// the kernel dropped never come back; a read that finds the socket empty
// accounts for everything sent before it began, so the bundler does not
// wait for them.
func TestEchoPacerForgetsLostDatagramsWhenTheSocketIsDrained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newEchoPacer()
		p.limit.Store(100_000)
		p.wrote(200_000) // all lost
		mark := p.sent.Load()
		p.drained(mark)
		start := time.Now()
		p.wait(nil)
		require.Zero(t, time.Since(start))
		require.Zero(t, p.waits.Load())
	})
}

// TestEchoPacerWaitsAtMostEchoWaitMax: a reader that never reads back (gone,
// or starved) holds the bundler for echoWaitMax at most.
func TestEchoPacerWaitsAtMostEchoWaitMax(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newEchoPacer()
		p.limit.Store(100_000)
		p.wrote(200_000)
		start := time.Now()
		p.wait(nil)
		require.Equal(t, echoWaitMax, time.Since(start))
		require.Equal(t, int64(1), p.timeouts.Load())
		p.wrote(64_000)
		p.wait(nil)
		require.Equal(t, echoWaitMax, time.Since(start), "what was out is forgiven: no second wait until limit bytes more")
		require.Equal(t, int64(1), p.waits.Load())
	})
}

// TestEchoPacerDrainedNeverLowersTheAccount: a read that blocked since
// before the datagrams were sent finds the socket drained with an old mark;
// what it read back still counts.
func TestEchoPacerDrainedNeverLowersTheAccount(t *testing.T) {
	p := newEchoPacer()
	mark := p.sent.Load()
	p.wrote(64_000)
	p.readBack(64_000)
	p.drained(mark)
	require.Zero(t, p.outstanding())
}

// TestEchoPacerCountsADatagramReadBeforeItsWriteReturned: the reader may
// take a datagram before the bundler's write returns and counts it; the
// account is right once the write is counted.
func TestEchoPacerCountsADatagramReadBeforeItsWriteReturned(t *testing.T) {
	p := newEchoPacer()
	p.readBack(64_000)
	require.Equal(t, int64(-64_000), p.outstanding())
	p.wrote(64_000)
	require.Zero(t, p.outstanding())
}
