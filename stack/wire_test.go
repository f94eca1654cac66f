package stack_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
	"github.com/strata-go/strata/stack/wire"
)

// Test headers, registered under user ids, stand in for protocol headers.
const (
	idSeq  = stack.IDUserMin + 1
	idAddr = stack.IDUserMin + 2
	idName = stack.IDUserMin + 3
)

type seqHdr struct {
	Seq   uint64
	First bool
}

func (h *seqHdr) Size() int { return wire.UvarintSize(h.Seq) + 1 }
func (h *seqHdr) AppendTo(b []byte) []byte {
	return wire.AppendBool(wire.AppendUvarint(b, h.Seq), h.First)
}

type addrHdr struct{ A stack.Address }

func (h *addrHdr) Size() int                { return stack.AddressSize }
func (h *addrHdr) AppendTo(b []byte) []byte { return stack.AppendAddress(b, h.A) }

type nameHdr struct{ Name string }

func (h *nameHdr) Size() int                { return wire.UvarintSize(uint64(len(h.Name))) + len(h.Name) }
func (h *nameHdr) AppendTo(b []byte) []byte { return wire.AppendString(b, h.Name) }

func init() {
	stack.RegisterHeader(stack.HeaderType{ID: idSeq, Name: "TEST_SEQ",
		Decode: func(r *wire.Reader) (stack.Header, error) {
			h := &seqHdr{Seq: r.Uvarint(), First: r.Bool()}
			return h, r.Err()
		},
		Samples: func() []stack.Header {
			return []stack.Header{&seqHdr{}, &seqHdr{Seq: 1 << 40, First: true}}
		}})
	stack.RegisterHeader(stack.HeaderType{ID: idAddr, Name: "TEST_ADDR",
		Decode: func(r *wire.Reader) (stack.Header, error) { return &addrHdr{A: stack.ReadAddress(r)}, r.Err() },
		Samples: func() []stack.Header {
			return []stack.Header{&addrHdr{A: stack.NewAddress()}}
		}})
	stack.RegisterHeader(stack.HeaderType{ID: idName, Name: "TEST_NAME",
		Decode: func(r *wire.Reader) (stack.Header, error) { return &nameHdr{Name: r.String(255, "name")}, r.Err() },
		Samples: func() []stack.Header {
			return []stack.Header{&nameHdr{}, &nameHdr{Name: "cluster-member-7"}}
		}})
}

func sampleMessage(payload int) *stack.Message {
	m := stack.NewMessage(stack.NewAddress(), bytes.Repeat([]byte{0xab}, payload))
	m.Src = stack.NewAddress()
	m.Set(stack.OOB | stack.NoFC)
	m.PutHeader(idSeq, &seqHdr{Seq: 123456, First: true})
	m.PutHeader(idAddr, &addrHdr{A: stack.NewAddress()})
	m.PutHeader(idName, &nameHdr{Name: "node-1"})
	return m
}

func TestBundleRoundTrip(t *testing.T) {
	src := stack.NewAddress()
	m1 := sampleMessage(1024)
	m2 := stack.NewMessage(stack.Address{}, nil) // multicast, no payload, source = bundle's
	m2.Src = src
	m2.SetTransient(stack.DontLoopback) // transient: must not travel
	buf := stack.EncodeBundle(nil, "demo", src, true, m1, m2)

	h, msgs, err := stack.DecodeBundle(buf, "demo")
	require.NoError(t, err)
	require.Equal(t, stack.BundleHeader{Cluster: "demo", Src: src, Multicast: true, Count: 2}, h)
	require.Len(t, msgs, 2)
	got := msgs[0]
	require.Equal(t, m1.Dest, got.Dest)
	require.Equal(t, m1.Src, got.Src)
	require.Equal(t, m1.Flags, got.Flags)
	require.Equal(t, m1.Payload, got.Payload)
	require.Equal(t, 3, got.NumHeaders())
	require.Equal(t, m1.Header(idSeq), got.Header(idSeq))
	require.Equal(t, m1.Header(idAddr), got.Header(idAddr))
	require.Equal(t, m1.Header(idName), got.Header(idName))
	require.Equal(t, src, msgs[1].Src)
	require.True(t, msgs[1].IsMulticast())
	require.Zero(t, msgs[1].Transient(), "transient flags never go on the wire")

	_, _, err = stack.DecodeBundle(buf, "other")
	require.ErrorIs(t, err, stack.ErrWrongCluster)
	bad := bytes.Clone(buf)
	bad[3] = 99 // version
	_, _, err = stack.DecodeBundle(bad, "demo")
	require.ErrorIs(t, err, stack.ErrWrongVersion)
	for n := range len(buf) {
		_, _, err := stack.DecodeBundle(buf[:n], "demo")
		require.ErrorIs(t, err, stack.ErrMalformed, "truncated to %d bytes", n)
	}
}

func TestEncodedSizeMatchesEncoding(t *testing.T) {
	src := stack.NewAddress()
	for _, m := range []*stack.Message{sampleMessage(0), sampleMessage(1024), stack.NewMessage(stack.Address{}, []byte("x"))} {
		for _, bsrc := range []stack.Address{src, m.Src} {
			require.Equal(t, m.EncodedSize(bsrc), len(stack.AppendMessage(nil, m, bsrc)))
		}
	}
}

// TestEveryHeaderSizeEqualsEncodedLength checks every header registered in
// this binary (the protocols imported by the test, plus the test headers).
func TestEveryHeaderSizeEqualsEncodedLength(t *testing.T) {
	require.NotEmpty(t, stack.HeaderIDs())
	stacktest.CheckHeaderSizes(t)
}

func TestMessageHeadersInlineAndSpill(t *testing.T) {
	m := stack.NewMessage(stack.Address{}, nil)
	for i := range 9 {
		m.PutHeader(stack.IDUserMin+100+uint16(i), &seqHdr{Seq: uint64(i)})
	}
	require.Equal(t, 9, m.NumHeaders())
	for i := range 9 {
		require.Equal(t, uint64(i), m.Header(stack.IDUserMin+100+uint16(i)).(*seqHdr).Seq)
	}
	m.PutHeader(stack.IDUserMin+100, &seqHdr{Seq: 42})
	require.Equal(t, 9, m.NumHeaders(), "replacing keeps one header per id")
	c := m.Copy()
	require.NotNil(t, m.RemoveHeader(stack.IDUserMin+102))
	require.Nil(t, m.Header(stack.IDUserMin+102))
	require.Equal(t, 8, m.NumHeaders())
	require.NotNil(t, c.Header(stack.IDUserMin+102), "a copy is not changed by the original")
	require.Equal(t, uint64(8), m.Header(stack.IDUserMin+108).(*seqHdr).Seq)
}

func TestCopySemantics(t *testing.T) {
	m := sampleMessage(4)
	m.SetTransient(stack.OOBDelivered)
	c := m.Copy()
	require.Zero(t, c.Transient(), "transient flags are not copied")
	require.Equal(t, m.Flags, c.Flags)
	c.Payload[0] = 1
	require.Equal(t, byte(1), m.Payload[0], "Copy shares the payload")
	d := m.DeepCopy()
	d.Payload[1] = 2
	require.Equal(t, byte(0xab), m.Payload[1], "DeepCopy does not")
	require.True(t, m.SetTransientIfAbsent(stack.DontBlock))
	require.False(t, m.SetTransientIfAbsent(stack.DontBlock))
}

func TestViewRoundTrip(t *testing.T) {
	a, b, c := stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	v := stack.NewView(a, 5, a, b, c)
	mv := stack.NewMergeView(b, 9, []stack.Address{b, a, c}, []*stack.View{stack.NewView(a, 5, a), stack.NewView(b, 3, b, c)})
	for _, in := range []*stack.View{v, mv} {
		r := wire.NewReader(stack.AppendView(nil, in))
		out := stack.ReadView(r)
		require.NoError(t, r.Err())
		require.Equal(t, in, out)
		require.Zero(t, r.Len())
	}
	require.Equal(t, a, v.Coordinator())
	require.True(t, mv.IsMerge())
	joined, left := stack.NewView(a, 6, a, c, stack.Address{}).Diff(v)
	require.Len(t, joined, 1)
	require.Equal(t, []stack.Address{b}, left)
}

func FuzzDecodeBundle(f *testing.F) {
	src := stack.NewAddress()
	f.Add(stack.EncodeBundle(nil, "demo", src, true, sampleMessage(16), stack.NewMessage(stack.Address{}, nil)))
	f.Add(stack.EncodeBundle(nil, "demo", src, false, sampleMessage(0)))
	f.Add([]byte("ST"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, msgs, err := stack.DecodeBundle(data, "")
		if err != nil {
			if !errors.Is(err, stack.ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		// What decodes must re-encode to the same messages.
		again := stack.EncodeBundle(nil, h.Cluster, h.Src, h.Multicast, msgs...)
		h2, msgs2, err := stack.DecodeBundle(again, h.Cluster)
		if err != nil {
			t.Fatalf("re-encoded bundle does not decode: %v", err)
		}
		if h2.Count != h.Count || len(msgs2) != len(msgs) {
			t.Fatalf("count changed: %d -> %d", h.Count, h2.Count)
		}
		for i := range msgs {
			if fmt.Sprint(msgs[i]) != fmt.Sprint(msgs2[i]) || !bytes.Equal(msgs[i].Payload, msgs2[i].Payload) {
				t.Fatalf("message %d changed: %v -> %v", i, msgs[i], msgs2[i])
			}
		}
	})
}

func FuzzReadView(f *testing.F) {
	a, b := stack.NewAddress(), stack.NewAddress()
	f.Add(stack.AppendView(nil, stack.NewView(a, 1, a, b)))
	f.Add(stack.AppendView(nil, stack.NewMergeView(a, 2, []stack.Address{a, b}, []*stack.View{stack.NewView(a, 1, a)})))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := wire.NewReader(data)
		v := stack.ReadView(r)
		if r.Err() != nil {
			if !errors.Is(r.Err(), stack.ErrMalformed) {
				t.Fatal(r.Err())
			}
			return
		}
		r2 := wire.NewReader(stack.AppendView(nil, v))
		if v2 := stack.ReadView(r2); r2.Err() != nil || v2.String() != v.String() {
			t.Fatalf("view does not round-trip: %v vs %v (%v)", v, v2, r2.Err())
		}
	})
}
