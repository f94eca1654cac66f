package stack

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSlabBytesAreZeroedAndApart: each slice is zeroed, its capacity is its
// length (an append reallocates instead of writing into the next), and
// writing one never changes another, across blocks too.
func TestSlabBytesAreZeroedAndApart(t *testing.T) {
	var s Slab
	var bs [][]byte
	for i := range 3 * slabBytes / 1000 { // three blocks' worth
		b := s.Bytes(1000)
		require.Len(t, b, 1000)
		require.Equal(t, 1000, cap(b))
		require.Equal(t, make([]byte, 1000), b, "slice %d is not zeroed", i)
		for j := range b {
			b[j] = byte(i)
		}
		bs = append(bs, b)
	}
	grown := append(bs[0], 0xff)
	require.Equal(t, byte(1), bs[1][0], "an append to the first slice wrote into the second")
	grown[0] = 0xee
	require.Equal(t, byte(0), bs[0][0], "the grown slice still shares the first's array")
	for i, b := range bs {
		for _, c := range b {
			require.Equal(t, byte(i), c, "slice %d was overwritten", i)
		}
	}
}

func TestSlabMakesLargeBytesOnTheirOwn(t *testing.T) {
	var s Slab
	small := s.Bytes(10)
	big := s.Bytes(slabMaxPayload + 1)
	require.Len(t, big, slabMaxPayload+1)
	require.Equal(t, slabBytes-10, len(s.bytes), "a large payload took room from the block")
	require.Len(t, small, 10)
	require.Empty(t, s.Bytes(0))
}

func TestSlabMessagesAreApart(t *testing.T) {
	var s Slab
	dest := NewAddress()
	var ms []*Message
	for i := range 2*msgSlab + 1 {
		m := s.NewMessage(dest, []byte{byte(i)})
		m.Set(OOB)
		m.PutHeader(100, &numHdr{i})
		ms = append(ms, m)
	}
	for i, m := range ms {
		require.Equal(t, dest, m.Dest)
		require.Equal(t, []byte{byte(i)}, m.Payload)
		require.True(t, m.Has(OOB))
		require.Equal(t, &numHdr{i}, m.Header(100), "message %d", i)
	}
}

// BenchmarkSlab compares a 1 KB payload and its message from a Slab with
// a make and NewMessage each.
func BenchmarkSlab(b *testing.B) {
	sink := make([]*Message, 4096) // kept a while, as a retransmission window keeps them
	b.Run("each", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(1000)
		for i := 0; b.Loop(); i++ {
			sink[i%len(sink)] = NewMessage(Address{}, make([]byte, 1000))
		}
	})
	b.Run("slab", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(1000)
		var s Slab
		for i := 0; b.Loop(); i++ {
			sink[i%len(sink)] = s.NewMessage(Address{}, s.Bytes(1000))
		}
	})
}
