package nakack

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// bundleOf encodes n multicasts from src, numbered from 1, and one
// retransmission request, as NAKACK sends them.
func bundleOf(src stack.Address, n int) []byte {
	var msgs []*stack.Message
	for i := range n {
		m := stack.NewMessage(stack.Address{}, []byte{byte(i)})
		m.PutHeader(stack.IDNAKACK, &Header{Type: typeMsg, Seqno: uint64(i + 1)})
		msgs = append(msgs, m)
	}
	req := stack.NewMessage(stack.Address{}, nil)
	req.PutHeader(stack.IDNAKACK, &Header{Type: typeXmitReq, Sender: src, Missing: []uint64{3, 9}})
	msgs = append(msgs, req)
	return stack.EncodeBundle(nil, "c", src, true, msgs...)
}

// TestBundleHeadersDecodeIntoSlabs: the NAKACK headers of a bundle are
// decoded into slabs (a few allocations for 200 messages, not one per
// message), each message has its own header with its own values.
func TestBundleHeadersDecodeIntoSlabs(t *testing.T) {
	src := stack.NewAddress()
	const n = 200
	data := bundleOf(src, n)
	_, msgs, err := stack.DecodeBundle(data, "c")
	require.NoError(t, err)
	require.Len(t, msgs, n+1)
	seen := map[*Header]bool{}
	for i, m := range msgs {
		h := m.Header(stack.IDNAKACK).(*Header)
		require.False(t, seen[h], "message %d shares a header", i)
		seen[h] = true
		if i < n {
			require.Equal(t, Header{Type: typeMsg, Seqno: uint64(i + 1)}, *h)
		} else {
			require.Equal(t, Header{Type: typeXmitReq, Sender: src, Missing: []uint64{3, 9}}, *h)
		}
	}
	allocs := testing.AllocsPerRun(20, func() {
		if _, _, err := stack.DecodeBundle(data, "c"); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.0f allocations for a bundle of %d messages", allocs, n+1)
	require.Less(t, allocs, float64(20), "messages and headers come in slabs of 64")
}

// FuzzDecodeBundleOfNAKACKMessages: bundles of NAKACK messages, whose
// headers come from per-bundle slabs, decode or fail with ErrMalformed,
// and what decodes re-encodes to the same messages.
func FuzzDecodeBundleOfNAKACKMessages(f *testing.F) {
	src := stack.NewAddress()
	f.Add(bundleOf(src, 3))
	f.Add(bundleOf(src, 70))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, msgs, err := stack.DecodeBundle(data, "")
		if err != nil {
			if !errors.Is(err, stack.ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		again := stack.EncodeBundle(nil, h.Cluster, h.Src, h.Multicast, msgs...)
		_, msgs2, err := stack.DecodeBundle(again, h.Cluster)
		if err != nil {
			t.Fatalf("re-encoded bundle does not decode: %v", err)
		}
		for i := range msgs {
			if fmt.Sprint(msgs[i]) != fmt.Sprint(msgs2[i]) || !bytes.Equal(msgs[i].Payload, msgs2[i].Payload) {
				t.Fatalf("message %d changed: %v -> %v", i, msgs[i], msgs2[i])
			}
		}
	})
}
