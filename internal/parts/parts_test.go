package parts

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

var lim = Limits{MaxWhole: 1 << 20, MaxPerSender: 2, MaxBytes: 1 << 20, TTL: time.Minute}

func TestPartsInAnyOrderAndTwiceMakeTheMessageOnce(t *testing.T) {
	msg := make([]byte, 10_000)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	chunks := Split(msg, 999)
	require.Len(t, chunks, 11)
	r := NewReassembler(lim)
	src, now := stack.NewAddress(), time.Now()
	order := rand.New(rand.NewPCG(1, 2)).Perm(len(chunks))
	var got []byte
	for i, k := range order {
		out := r.Add(src, ID(msg), k, len(chunks), chunks[k], now)
		if i < len(order)-1 {
			require.Nil(t, out)
			require.Nil(t, r.Add(src, ID(msg), k, len(chunks), chunks[k], now), "a duplicate part")
		} else {
			got = out
		}
	}
	require.True(t, bytes.Equal(msg, got))
	require.Zero(t, r.Pending())
	require.EqualValues(t, 1, r.Completed.Load())
}

func TestReassemblerIsBoundedPerSenderAndInTime(t *testing.T) {
	r := NewReassembler(lim)
	src, now := stack.NewAddress(), time.Now()
	for id := range uint64(5) {
		require.Nil(t, r.Add(src, id, 0, 3, []byte("x"), now.Add(time.Duration(id)*time.Second)))
	}
	require.Equal(t, 2, r.Pending(), "the sender's oldest are evicted")
	require.EqualValues(t, 3, r.Dropped.Load())
	other := stack.NewAddress()
	require.Nil(t, r.Add(other, 9, 0, 3, []byte("x"), now.Add(2*time.Minute)))
	require.Equal(t, 1, r.Pending(), "what got no part within the TTL is dropped")
	require.Nil(t, r.Add(other, 9, 1, 4, []byte("x"), now), "a count that changes drops the message")
	require.Zero(t, r.Pending())
	require.Nil(t, r.Add(other, 10, 3, 3, []byte("x"), now), "an index beyond the count")
	require.Nil(t, r.Add(other, 11, 0, 2, make([]byte, lim.MaxWhole+1), now), "larger than a whole message")
}
