package transport

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// fill writes a pattern of id into b, as a datagram read into a slot.
func fill(b []byte, id int) {
	for i := range b {
		b[i] = byte(id*31 + i*7)
	}
}

func intact(b []byte, id int) bool {
	for i := range b {
		if b[i] != byte(id*31+i*7) {
			return false
		}
	}
	return true
}

// TestRecvArenaKeptDatagramsSurviveLaterReads reads thousands of datagrams
// of mixed sizes into an arena, keeps some and drops others, and checks
// that every kept one is unchanged at the end: no later read, move or
// drop wrote into bytes handed out. It also checks that a chunk holds
// more than it wastes.
func TestRecvArenaKeptDatagramsSurviveLaterReads(t *testing.T) {
	const slot = RecvChunkSize / 64
	a := NewRecvArena(slot)
	rng := rand.New(rand.NewPCG(1, 2))
	type kept struct {
		b  []byte
		id int
	}
	var all []kept
	bufs := make([][]byte, 5)
	id, chunks, keptBytes := 0, 0, 0
	var cur *byte
	for range 3000 {
		k := a.Slots(bufs)
		require.Positive(t, k)
		if p := &a.chunk[0]; p != cur {
			cur = p
			chunks++
		}
		for i := range k {
			fill(bufs[i], -1) // the kernel may write anywhere in what it was given
		}
		n := 1 + rng.IntN(k) // and filled n of the k slots
		sizes := make([]int, n)
		for i := range n {
			switch rng.IntN(3) {
			case 0:
				sizes[i] = slot - rng.IntN(64) // a full bundle
			case 1:
				sizes[i] = rng.IntN(200) // a heartbeat, an ack
			default:
				sizes[i] = rng.IntN(slot + 1)
			}
			require.Len(t, bufs[i], slot)
			require.Equal(t, slot, cap(bufs[i]), "a slot cannot be appended into the next")
			fill(bufs[i][:sizes[i]], id+i)
		}
		for i := range n {
			b := a.Take(i, sizes[i])
			require.Len(t, b, sizes[i])
			require.Equal(t, sizes[i], cap(b), "a datagram cannot be appended into the next")
			require.True(t, intact(b, id+i), "datagram %d moved without its bytes", id+i)
			if rng.IntN(4) == 0 {
				a.Drop()
				continue
			}
			all = append(all, kept{b, id + i})
			keptBytes += len(b)
		}
		id += n
	}
	for _, k := range all {
		require.True(t, intact(k.b, k.id), "kept datagram %d was overwritten", k.id)
	}
	t.Logf("%d chunks for %d bytes kept", chunks, keptBytes)
	require.LessOrEqual(t, chunks*RecvChunkSize, 2*keptBytes+4*RecvChunkSize,
		"chunks allocated (%d) should waste at most what they hold (%d bytes kept)", chunks, keptBytes)
}

// TestRecvArenaDropGivesBackTheSpace checks that a dropped datagram's
// bytes are read into again, and that a short datagram after a long gap
// moves down to close it.
func TestRecvArenaDropGivesBackTheSpace(t *testing.T) {
	a := NewRecvArena(RecvChunkSize / 4)
	bufs := make([][]byte, 4)
	require.Equal(t, 4, a.Slots(bufs))
	first := &bufs[0][0]
	fill(bufs[0][:900], 1)
	b := a.Take(0, 900)
	require.Same(t, first, &b[0], "a long datagram stays where it was read")
	a.Drop()

	require.Equal(t, 4, a.Slots(bufs), "the dropped datagram's room is free again")
	require.Same(t, first, &bufs[0][0])
	fill(bufs[0][:900], 2)
	fill(bufs[1][:50], 3)
	b0 := a.Take(0, 900)
	b1 := a.Take(1, 50)
	require.Same(t, &b0[899], &a.chunk[899])
	require.Same(t, &b1[0], &a.chunk[900], "a short datagram moves down next to the one before")
	require.True(t, intact(b0, 2))
	require.True(t, intact(b1, 3))

	require.Equal(t, 3, a.Slots(bufs), "slots start after what was kept")
	require.Same(t, &bufs[0][0], &a.chunk[950])
	require.Panics(t, func() { a.Drop() }, "Drop without Take")

	// A long datagram after a dropped one stays where it was read; the
	// dropped one's room and the gap before it are free again.
	const long = RecvChunkSize / 8
	fill(bufs[0][:100], 4)
	fill(bufs[1][:long], 5)
	_ = a.Take(0, 100)
	a.Drop()
	b2 := a.Take(1, long)
	require.Same(t, &bufs[1][0], &b2[0], "a long datagram is not moved")
	require.True(t, intact(b2, 5))
	a.Drop()
	require.Equal(t, 3, a.Slots(bufs))
	require.Same(t, &bufs[0][0], &a.chunk[950], "both dropped: the space after the kept ones is free")
	require.Panics(t, func() { a.Take(0, RecvChunkSize/4+1) })
}

// TestRecvArenaRecyclesOnlyUnreferencedChunks reads through many chunks
// while keeping one datagram of every tenth, with garbage collections in
// between that recycle the others: the kept ones must come out intact,
// and chunks must be recycled (no fresh chunk per chunk filled).
func TestRecvArenaRecyclesOnlyUnreferencedChunks(t *testing.T) {
	nextCycle(t) // no chunk armed yet in this cycle
	const slot = 65508
	a := NewRecvArena(slot)
	bufs := make([][]byte, 16)
	type kept struct {
		b  []byte
		id int
	}
	var all []kept
	made := chunksMade.Load()
	for id := range 16 * 200 {
		if a.Slots(bufs[:1]) != 1 {
			t.Fatal("no slot")
		}
		fill(bufs[0], -1)
		fill(bufs[0][:60000], id)
		b := a.Take(0, 60000)
		if id%160 == 0 {
			all = append(all, kept{b, id})
		}
		if id%64 == 0 {
			runtime.GC()
		}
	}
	for _, k := range all {
		require.True(t, intact(k.b, k.id), "kept datagram %d was overwritten after its chunk was recycled", k.id)
	}
	made = chunksMade.Load() - made
	t.Logf("200 chunks filled, %d allocated", made)
	require.Less(t, made, int64(150), "chunks are recycled")
}

// BenchmarkRecvArena64KB is the arena's cost per 64 KB datagram kept,
// clearing of fresh chunks included.
func BenchmarkRecvArena64KB(b *testing.B) {
	a := NewRecvArena(65508)
	bufs := make([][]byte, 16)
	b.SetBytes(64000)
	b.ReportAllocs()
	for b.Loop() {
		a.Slots(bufs[:1])
		_ = a.Take(0, 64000)
	}
}
