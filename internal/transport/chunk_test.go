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

// TestRecycledChunksOutliveCollections: chunks recycled while no reader
// asks for one are still there after several collections (a sync.Pool
// alone drops them after two, and a busy process collects dozens of times
// a second), and no more than keptChunks are kept for good.
func TestRecycledChunksOutliveCollections(t *testing.T) {
	func() {
		cs := make([][]byte, keptChunks+8)
		for i := range cs {
			cs[i] = NewRecvChunk()
		}
		runtime.KeepAlive(cs)
	}()
	for range 6 {
		runtime.GC() // finalizers run, chunks go to the free list or the pool
	}
	runtime.GC()
	freeMu.Lock()
	kept := len(freeChunks)
	freeMu.Unlock()
	require.LessOrEqual(t, kept, keptChunks)
	require.GreaterOrEqual(t, kept, keptChunks/2, "recycled chunks kept through the collections")
	made := chunksMade.Load()
	cs := make([][]byte, kept)
	for i := range cs {
		cs[i] = NewRecvChunk()
	}
	require.Equal(t, made, chunksMade.Load(), "the kept chunks are handed out again without allocating")
	runtime.KeepAlive(cs)
}
