package transport

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

type testOwner struct {
	addr stack.Address
	st   stack.Stack
}

func (o *testOwner) LocalAddress() stack.Address { return o.addr }
func (o *testOwner) Stack() *stack.Stack         { return &o.st }

// recordingSink records how many bundles each Flush sent.
type recordingSink struct {
	pool    *BufPool
	mu      sync.Mutex
	pending int
	flushes []int
}

func (s *recordingSink) Bundle(buf *[]byte, _ stack.Address) {
	s.mu.Lock()
	s.pending++
	s.mu.Unlock()
	s.pool.Put(buf)
}

func (s *recordingSink) Flush() {
	s.mu.Lock()
	if s.pending > 0 {
		s.flushes = append(s.flushes, s.pending)
	}
	s.pending = 0
	s.mu.Unlock()
}

// TestBundlerSendsWhileTheQueueNeverDrains: under a load that keeps the
// queue from running dry, finished bundles are sent every flushAfter of
// them, not held (64 KB each) until the queue is empty.
func TestBundlerSendsWhileTheQueueNeverDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const msgs, max = 2000, 4096
		q := NewSendQueue(msgs)
		for range msgs {
			require.True(t, q.TryPut(stack.NewMessage(stack.Address{}, make([]byte, 1000))))
		}
		pool := NewBufPool(max + 256)
		sink := &recordingSink{pool: pool}
		var c BundleCounters
		b := NewBundler(&testOwner{addr: stack.NewAddress()}, q, max, pool, sink, &c)
		done := make(chan struct{})
		go b.Run(done)
		synctest.Wait() // everything queued is bundled and sent
		close(done)
		synctest.Wait()

		require.Equal(t, int64(msgs), c.BundleMsgs.Load())
		var sent int
		for _, n := range sink.flushes {
			require.LessOrEqual(t, n, flushAfter, "bundles held back before a flush: %v", sink.flushes)
			sent += n
		}
		require.Equal(t, int(c.BundlesSent.Load()), sent)
		require.Greater(t, sent, msgs/4, "bundles of about three messages")
		require.Greater(t, len(sink.flushes), sent/64, "flushes while the queue never drained: %v", sink.flushes)
	})
}

// TestChunksOfOneCycleAreNotAllKeptForRecycling: of the chunks read
// between two collections, at most armedPerCycle outlive the collection
// that finds them unreachable (to be recycled); the others are freed.
// Every finalized chunk survives that collection and counts in the live
// heap that sets the next heap goal, so when all were finalized the chunks
// read in one cycle set the next goal, and the goal how many were read in
// the next: four members in one process drove it past 6 GB. The collector
// is off while the chunks are read, so that they are all of one cycle.
func TestChunksOfOneCycleAreNotAllKeptForRecycling(t *testing.T) {
	const read = 384 // MB
	nextCycle(t)
	t.Cleanup(func() { nextCycle(t) }) // the next test starts with no chunk armed
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for i := range read {
		c := NewRecvChunk()
		c[i] = 1
	}
	nextCycle(t) // the unreachable chunks: freed, or finalized and recycled
	nextCycle(t) // what is recycled is still held (kept, or in the pool)
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	live := s[0].Value.Uint64() >> 20
	t.Logf("live heap after %d MB of chunks read in one cycle: %d MB", read, live)
	require.Less(t, live, uint64(read/2), "the chunks of one cycle are kept alive for recycling")
}

// nextCycle runs a collection and waits for the finalizers it queued,
// which include the one that resets the chunks armed in a cycle.
func nextCycle(t *testing.T) {
	t.Helper()
	tick := idleTicks.Load()
	runtime.GC()
	for idleTicks.Load() == tick {
		runtime.Gosched()
	}
}
