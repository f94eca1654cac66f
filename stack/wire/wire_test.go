package wire_test

import (
	"errors"
	"math"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack/wire"
)

// record is one value of every primitive, in a fixed order.
type record struct {
	u8     uint8
	b      bool
	u16    uint16
	u32    uint32
	u64    uint64
	uv     uint64
	v      int64
	s      string
	lb     []byte
	seqnos []uint64
	ap     netip.AddrPort
}

func (x record) append(b []byte) []byte {
	b = append(b, x.u8)
	b = wire.AppendBool(b, x.b)
	b = wire.AppendUint16(b, x.u16)
	b = wire.AppendUint32(b, x.u32)
	b = wire.AppendUint64(b, x.u64)
	b = wire.AppendUvarint(b, x.uv)
	b = wire.AppendVarint(b, x.v)
	b = wire.AppendString(b, x.s)
	b = wire.AppendLenBytes(b, x.lb)
	b = wire.AppendSeqnoList(b, x.seqnos)
	return wire.AppendAddrPort(b, x.ap)
}

func (x record) size() int {
	return 1 + 1 + 2 + 4 + 8 + wire.UvarintSize(x.uv) + wire.VarintSize(x.v) +
		wire.UvarintSize(uint64(len(x.s))) + len(x.s) + wire.UvarintSize(uint64(len(x.lb))) + len(x.lb) +
		wire.SeqnoListSize(x.seqnos) + wire.AddrPortSize(x.ap)
}

func read(r *wire.Reader) record {
	return record{u8: r.Uint8(), b: r.Bool(), u16: r.Uint16(), u32: r.Uint32(), u64: r.Uint64(),
		uv: r.Uvarint(), v: r.Varint(), s: r.String(1<<20, "s"), lb: r.LenBytes(1<<20, "lb"),
		seqnos: r.SeqnoList(), ap: r.AddrPort()}
}

// TestRoundTrip encodes every primitive at its edges and reads it back;
// each size function matches its encoding.
func TestRoundTrip(t *testing.T) {
	for _, x := range []record{
		{lb: []byte{}, seqnos: []uint64{}},
		{u8: 255, b: true, u16: math.MaxUint16, u32: math.MaxUint32, u64: math.MaxUint64, uv: math.MaxUint64, v: math.MinInt64,
			s: "héllo", lb: []byte{0, 1, 2}, seqnos: []uint64{1, 2, 300, 1 << 40}, ap: netip.MustParseAddrPort("127.0.0.1:7800")},
		{v: math.MaxInt64, lb: []byte{}, seqnos: []uint64{}, ap: netip.MustParseAddrPort("[::1]:1")},
	} {
		b := x.append(nil)
		require.Len(t, b, x.size())
		r := wire.NewReader(b)
		got := read(r)
		require.NoError(t, r.Err())
		require.Zero(t, r.Len())
		require.Equal(t, x, got)
	}
}

// TestFirstErrorSticks: a truncated input fails once, with ErrMalformed,
// and every later read returns a zero value.
func TestFirstErrorSticks(t *testing.T) {
	r := wire.NewReader([]byte{1, 2})
	require.Zero(t, r.Uint32())
	require.ErrorIs(t, r.Err(), wire.ErrMalformed)
	first := r.Err()
	require.Zero(t, r.Uint8())
	require.Equal(t, first, r.Err())
	require.Zero(t, r.Len())

	r = wire.NewReader([]byte{2, 5, 0})
	require.Nil(t, r.SeqnoList(), "a list that does not increase")
	require.ErrorIs(t, r.Err(), wire.ErrMalformed)
}

// TestLimit: a limited reader ends at the limit; lifting it reports what
// the body left unread and reads on after the body.
func TestLimit(t *testing.T) {
	r := wire.NewReader([]byte{1, 2, 3, 4, 9})
	bd := r.Limit(4)
	require.Equal(t, uint8(1), r.Uint8())
	require.Zero(t, r.Uint64(), "cannot read past the limit")
	require.Equal(t, 0, r.Unlimit(bd), "a failed read consumed the body")
	require.Error(t, r.Err())

	r = wire.NewReader([]byte{1, 2, 3, 4, 9})
	bd = r.Limit(4)
	require.Equal(t, uint16(0x0102), r.Uint16())
	require.Equal(t, 2, r.Unlimit(bd))
	require.NoError(t, r.Err())
}

// FuzzReader decodes arbitrary input as a record: it never panics, fails
// only with ErrMalformed, and what it decodes encodes back to the bytes it
// consumed (the encoding has one form per value).
func FuzzReader(f *testing.F) {
	f.Add(record{lb: []byte{}}.append(nil))
	f.Add(record{u8: 7, b: true, s: "x", seqnos: []uint64{3, 9}, ap: netip.MustParseAddrPort("127.0.0.1:1")}.append(nil))
	f.Add([]byte{0, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := wire.NewReader(b)
		x := read(r)
		if err := r.Err(); err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if x.lb == nil {
			x.lb = []byte{}
		}
		if x.ap.IsValid() && x.ap.Addr().Is4In6() {
			return // written unmapped: a second form of the same address
		}
		used := b[:r.Offset()]
		if got := x.append(nil); string(got) != string(used) {
			// Varints have overlong forms that decode to the same value;
			// the re-encoding must then be shorter, never different in
			// length the other way.
			if len(got) >= len(used) {
				t.Fatalf("re-encoding %x of %x differs", got, used)
			}
		}
	})
}

// TestSplitSeqnoListFitsTheLimit: the lists SplitSeqnoList makes each
// encode within the limit, hold at least one seqno, and together are the
// input in order; a list that fits is not cut.
func TestSplitSeqnoListFitsTheLimit(t *testing.T) {
	var s []uint64
	for i := range uint64(3000) {
		s = append(s, 1+i*i) // gaps from 1 byte to 2 bytes
	}
	s = append(s, 1<<62) // and one of 9 bytes
	for _, limit := range []int{wire.MinSeqnoListLimit, 100, 512, 64 << 10} {
		parts := wire.SplitSeqnoList(s, limit)
		var joined []uint64
		for _, p := range parts {
			require.NotEmpty(t, p)
			require.LessOrEqual(t, wire.SeqnoListSize(p), limit, "limit %d", limit)
			joined = append(joined, p...)
		}
		require.Equal(t, s, joined, "limit %d", limit)
	}
	require.Len(t, wire.SplitSeqnoList([]uint64{5, 6, 7}, 512), 1)
	require.Empty(t, wire.SplitSeqnoList(nil, 512))
}
