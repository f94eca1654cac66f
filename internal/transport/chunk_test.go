package transport

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNewRecvChunkIsRecycled: chunks a stream reader takes and drops are
// recycled like the arena's once the garbage collector finds nothing
// refers into them, and a kept one is never handed out again.
func TestNewRecvChunkIsRecycled(t *testing.T) {
	nextCycle(t) // no chunk armed yet in this cycle
	made := chunksMade.Load()
	keep := NewRecvChunk()
	require.Len(t, keep, RecvChunkSize)
	fill(keep, 7)
	for i := range 200 {
		c := NewRecvChunk()
		require.Len(t, c, RecvChunkSize)
		require.NotSame(t, &keep[0], &c[0], "a chunk still referred to is handed out again")
		fill(c[:4096], -1)
		if i%8 == 0 {
			runtime.GC()
		}
	}
	require.True(t, intact(keep, 7), "the kept chunk was written into")
	made = chunksMade.Load() - made
	t.Logf("201 chunks taken, %d allocated", made)
	require.Less(t, made, int64(150), "chunks are recycled")
}

// collectUntil runs collections (and lets finalizers run) until ok holds
// for the number of kept chunks, at most 200 times.
func collectUntil(t *testing.T, ok func(kept int) bool, msg string) {
	t.Helper()
	for range 200 {
		nextCycle(t)
		freeMu.Lock()
		n := len(freeChunks)
		freeMu.Unlock()
		if ok(n) {
			return
		}
	}
	t.Fatal(msg)
}

// TestRecycledChunksOutliveCollectionsWhileTaken: while a reader takes
// chunks, the recycled ones are kept through any number of collections (a
// sync.Pool alone drops them after two, and a busy process collects dozens
// of times a second), no more than keptChunks of them; once no chunk is
// taken for a collection, they are given back.
func TestRecycledChunksOutliveCollectionsWhileTaken(t *testing.T) {
	nextCycle(t) // no chunk armed yet in this cycle
	func() {
		cs := make([][]byte, keptChunks+8)
		for i := range cs {
			cs[i] = NewRecvChunk()
		}
		runtime.KeepAlive(cs)
	}()
	collectUntil(t, func(kept int) bool { return kept >= keptChunks/2 }, "dropped chunks recycled")
	made := chunksMade.Load()
	func() {
		cs := make([][]byte, 8)
		for i := range cs {
			cs[i] = NewRecvChunk() // a reader takes one per collection
			nextCycle(t)
		}
		require.Equal(t, made, chunksMade.Load(), "the kept chunks are handed out again without allocating")
		freeMu.Lock()
		require.LessOrEqual(t, len(freeChunks), keptChunks)
		freeMu.Unlock()
		runtime.KeepAlive(cs)
	}()
	collectUntil(t, func(kept int) bool { return kept == 0 }, "an idle process gives the kept chunks back")
}
