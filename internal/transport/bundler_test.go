package transport

import (
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
			require.LessOrEqual(t, n, 16, "bundles held back before a flush: %v", sink.flushes)
			sent += n
		}
		require.Equal(t, int(c.BundlesSent.Load()), sent)
		require.Greater(t, sent, msgs/4, "bundles of about three messages")
	})
}

// TestReadingChunksDoesNotDriveTheHeapGoal: a reader that goes through
// chunks much faster than it allocates anything else keeps the heap goal
// near its live heap. Every finalized chunk counts as live in the
// collection after the one that found it unreachable, so when all were
// finalized the chunks read between two collections set the next goal,
// and the goal grew without bound (past 2 GB over 8 GB read here).
func TestReadingChunksDoesNotDriveTheHeapGoal(t *testing.T) {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	var maxGoal uint64
	var other [][]byte
	for i := range 6000 { // 6 GB read
		c := NewRecvChunk()
		c[i%len(c)] = 1
		other = append(other, make([]byte, 100<<10)) // a tenth as much allocated otherwise
		if len(other) > 16 {
			other = other[:0]
		}
		if i%64 == 0 {
			metrics.Read(s)
			maxGoal = max(maxGoal, s[0].Value.Uint64())
		}
	}
	t.Logf("largest heap goal: %d MB", maxGoal>>20)
	require.Less(t, maxGoal, uint64(512<<20), "the heap goal follows the chunks read")
}
