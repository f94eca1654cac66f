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
