package stack

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestMessageFitsItsSizeClass: every message sent and received is an
// allocation of a Message (or a slab's share); at 208 bytes it is a size
// class below the 288 it had with six inline header entries.
func TestMessageFitsItsSizeClass(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(Message{}), uintptr(208))
}

type numHdr struct{ n int }

func (h *numHdr) Size() int                { return 8 }
func (h *numHdr) AppendTo(b []byte) []byte { return b }

// TestHeadersBeyondTheInlineOnes: a message with more headers than fit
// inline keeps, replaces, finds, lists and removes all of them in order.
func TestHeadersBeyondTheInlineOnes(t *testing.T) {
	m := NewMessage(Address{}, nil)
	const n = inlineHeaders + 3
	for i := range n {
		m.PutHeader(uint16(100+i), &numHdr{i})
	}
	m.PutHeader(100+inlineHeaders+1, &numHdr{-1}) // replaces a spilled one
	m.PutHeader(101, &numHdr{-2})                 // and an inline one
	require.Equal(t, n, m.NumHeaders())
	var ids []uint16
	m.EachHeader(func(id uint16, h Header) { ids = append(ids, id) })
	require.Len(t, ids, n)
	for i, id := range ids {
		require.Equal(t, uint16(100+i), id, "insertion order")
	}
	require.Equal(t, -1, m.Header(100+inlineHeaders+1).(*numHdr).n)
	require.Equal(t, -2, m.Header(101).(*numHdr).n)
	require.Equal(t, 0, m.RemoveHeader(100).(*numHdr).n)
	require.Nil(t, m.Header(100))
	require.Equal(t, n-1, m.NumHeaders())
	require.Equal(t, inlineHeaders+2, m.Header(100+inlineHeaders+2).(*numHdr).n, "a spilled header moved inline")
	c := m.Copy()
	require.Equal(t, n-1, c.NumHeaders())
	require.Equal(t, -1, c.Header(100+inlineHeaders+1).(*numHdr).n)
}
