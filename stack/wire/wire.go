// Package wire is strata's wire codec for protocol headers: a Reader that
// decodes the primitive types (integers, varints, strings, seqno lists,
// network addresses) with a sticky first error, and the Append functions
// and sizes that encode them. Package stack adds the encodings of its own
// types (addresses, view ids, digests, views, messages and bundles).
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
)

// ErrMalformed is wrapped by every decoding error, so receivers can count
// and drop bad input with one errors.Is check.
var ErrMalformed = errors.New("malformed input")

// Reader decodes the primitive types of the wire format from a byte slice.
// The first failure sticks: later reads return zero values and Err reports
// the first error, so decoders check once at the end.
type Reader struct {
	buf     []byte
	off     int
	err     error
	scratch any
}

// NewReader returns a Reader over b. The reader never modifies b; slices it
// returns alias b.
func NewReader(b []byte) *Reader { return &Reader{buf: b} }

// Reset makes r read b from the start, clearing any error.
func (r *Reader) Reset(b []byte) { *r = Reader{buf: b} }

// Scratch returns what SetScratch stored: state that the decoders reading
// from r share while it reads one thing (package stack keeps a bundle's
// header slabs there). NewReader and Reset clear it.
func (r *Reader) Scratch() any { return r.scratch }

// SetScratch stores s for Scratch.
func (r *Reader) SetScratch(s any) { r.scratch = s }

// Err returns the first decoding error, or nil.
func (r *Reader) Err() error { return r.err }

// Len returns the number of unread bytes.
func (r *Reader) Len() int { return len(r.buf) - r.off }

// Offset returns the number of bytes consumed so far.
func (r *Reader) Offset() int { return r.off }

// Fail records err (wrapped with ErrMalformed) if no error is recorded yet.
func (r *Reader) Fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
		r.off = len(r.buf)
	}
}

func (r *Reader) need(n int, what string) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.buf)-r.off < n {
		r.Fail("truncated %s at offset %d: need %d bytes, have %d", what, r.off, n, len(r.buf)-r.off)
		return false
	}
	return true
}

// Uint8 reads one byte.
func (r *Reader) Uint8() uint8 {
	if !r.need(1, "byte") {
		return 0
	}
	v := r.buf[r.off]
	r.off++
	return v
}

// Bool reads a byte that must be 0 or 1.
func (r *Reader) Bool() bool {
	v := r.Uint8()
	if v > 1 {
		r.Fail("bad bool %d", v)
	}
	return v == 1
}

// Uint16 reads a big-endian uint16.
func (r *Reader) Uint16() uint16 {
	if !r.need(2, "uint16") {
		return 0
	}
	v := binary.BigEndian.Uint16(r.buf[r.off:])
	r.off += 2
	return v
}

// Uint32 reads a big-endian uint32.
func (r *Reader) Uint32() uint32 {
	if !r.need(4, "uint32") {
		return 0
	}
	v := binary.BigEndian.Uint32(r.buf[r.off:])
	r.off += 4
	return v
}

// Uint64 reads a big-endian uint64.
func (r *Reader) Uint64() uint64 {
	if !r.need(8, "uint64") {
		return 0
	}
	v := binary.BigEndian.Uint64(r.buf[r.off:])
	r.off += 8
	return v
}

// Uvarint reads an unsigned varint.
func (r *Reader) Uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.buf[r.off:])
	if n <= 0 {
		r.Fail("bad varint at offset %d", r.off)
		return 0
	}
	r.off += n
	return v
}

// Varint reads a signed (zig-zag) varint.
func (r *Reader) Varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.buf[r.off:])
	if n <= 0 {
		r.Fail("bad varint at offset %d", r.off)
		return 0
	}
	r.off += n
	return v
}

// Len32 reads a uvarint length and checks it against max and the bytes left.
func (r *Reader) Len32(max int, what string) int {
	v := r.Uvarint()
	if r.err != nil {
		return 0
	}
	if v > uint64(max) || v > math.MaxInt32 {
		r.Fail("%s length %d exceeds limit %d", what, v, max)
		return 0
	}
	if int(v) > r.Len() {
		r.Fail("truncated %s: length %d, have %d", what, v, r.Len())
		return 0
	}
	return int(v)
}

// Bytes reads n bytes; the result aliases the input.
func (r *Reader) Bytes(n int) []byte {
	if !r.need(n, "bytes") {
		return nil
	}
	v := r.buf[r.off : r.off+n : r.off+n]
	r.off += n
	return v
}

// LenBytes reads a uvarint length (at most max) and that many bytes.
func (r *Reader) LenBytes(max int, what string) []byte {
	n := r.Len32(max, what)
	return r.Bytes(n)
}

// String reads a uvarint-length-prefixed string of at most max bytes.
func (r *Reader) String(max int, what string) string {
	return string(r.LenBytes(max, what))
}

// AppendUint16 appends v big-endian.
func AppendUint16(b []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(b, v) }

// AppendUint32 appends v big-endian.
func AppendUint32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }

// AppendUint64 appends v big-endian.
func AppendUint64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

// AppendUvarint appends v as an unsigned varint.
func AppendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

// AppendVarint appends v as a signed (zig-zag) varint.
func AppendVarint(b []byte, v int64) []byte { return binary.AppendVarint(b, v) }

// AppendBool appends 1 for true, 0 for false.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// AppendLenBytes appends a uvarint length and the bytes.
func AppendLenBytes(b, v []byte) []byte { return append(binary.AppendUvarint(b, uint64(len(v))), v...) }

// AppendString appends a uvarint length and the string.
func AppendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// UvarintSize returns the encoded length of v as an unsigned varint.
func UvarintSize(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// VarintSize returns the encoded length of v as a signed varint.
func VarintSize(v int64) int {
	u := uint64(v) << 1
	if v < 0 {
		u = ^u
	}
	return UvarintSize(u)
}

// MaxSeqnoList is the most seqnos ReadSeqnoList accepts.
const MaxSeqnoList = 8192

// SeqnoListSize returns the encoded length of an increasing seqno list.
func SeqnoListSize(s []uint64) int {
	n := UvarintSize(uint64(len(s)))
	prev := uint64(0)
	for _, v := range s {
		n += UvarintSize(v - prev)
		prev = v
	}
	return n
}

// SplitSeqnoList cuts an increasing seqno list into consecutive lists
// whose encodings (AppendSeqnoList) take at most limit bytes each, each
// holding at least one seqno (a limit below MinSeqnoListLimit still gives
// one seqno a list). An empty list gives no lists.
func SplitSeqnoList(s []uint64, limit int) [][]uint64 {
	var out [][]uint64
	for len(s) > 0 {
		// A count of up to 2 bytes (MaxSeqnoList), the first seqno whole,
		// each later one as its gap to the one before.
		n, size := 1, 2+UvarintSize(s[0])
		for n < len(s) && n < MaxSeqnoList {
			d := UvarintSize(s[n] - s[n-1])
			if size+d > limit {
				break
			}
			size += d
			n++
		}
		out = append(out, s[:n:n])
		s = s[n:]
	}
	return out
}

// MinSeqnoListLimit is the smallest limit for which SplitSeqnoList's
// lists are sure to fit: a count and one seqno.
const MinSeqnoListLimit = 2 + 10

// AppendSeqnoList appends an increasing list of seqnos (retransmission
// requests), delta encoded: a count, then each gap to the previous one.
func AppendSeqnoList(b []byte, s []uint64) []byte {
	b = AppendUvarint(b, uint64(len(s)))
	prev := uint64(0)
	for _, v := range s {
		b = AppendUvarint(b, v-prev)
		prev = v
	}
	return b
}

// SeqnoList decodes a list written by AppendSeqnoList; it rejects lists
// longer than MaxSeqnoList and seqnos that do not increase.
func (r *Reader) SeqnoList() []uint64 {
	n := r.Uvarint()
	if n > MaxSeqnoList || n > uint64(r.Len()) {
		r.Fail("seqno list of %d entries", n)
		return nil
	}
	out := make([]uint64, n)
	prev := uint64(0)
	for i := range out {
		d := r.Uvarint()
		if i > 0 && d == 0 {
			r.Fail("seqno list does not increase")
			return nil
		}
		prev += d
		out[i] = prev
	}
	return out
}

// AppendAddrPort appends a network address: a length byte (0, 4 or 16), the
// IP and, unless the length is 0, a big-endian port.
func AppendAddrPort(b []byte, ap netip.AddrPort) []byte {
	if !ap.IsValid() {
		return append(b, 0)
	}
	ip := ap.Addr().Unmap()
	raw := ip.AsSlice()
	b = append(b, byte(len(raw)))
	b = append(b, raw...)
	return binary.BigEndian.AppendUint16(b, ap.Port())
}

// AddrPortSize returns the encoded length of ap.
func AddrPortSize(ap netip.AddrPort) int {
	if !ap.IsValid() {
		return 1
	}
	if ap.Addr().Unmap().Is4() {
		return 1 + 4 + 2
	}
	return 1 + 16 + 2
}

// AddrPort reads a network address written by AppendAddrPort.
func (r *Reader) AddrPort() netip.AddrPort {
	n := int(r.Uint8())
	switch {
	case r.err != nil || n == 0:
		return netip.AddrPort{}
	case n != 4 && n != 16:
		r.Fail("address length %d", n)
		return netip.AddrPort{}
	}
	raw := r.Bytes(n)
	port := r.Uint16()
	if r.err != nil {
		return netip.AddrPort{}
	}
	ip, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(ip, port)
}

// Bound is a limit Limit put on a Reader, for Unlimit to lift.
type Bound struct {
	end  int
	full []byte
}

// Limit makes r end after its next n bytes (a length-prefixed body that a
// decoder must read exactly); Unlimit lifts it. n must not exceed Len.
func (r *Reader) Limit(n int) Bound {
	b := Bound{end: r.off + n, full: r.buf}
	r.buf = r.buf[:b.end]
	return b
}

// Unlimit lifts the limit b and returns the bytes of the body left unread.
func (r *Reader) Unlimit(b Bound) (unread int) {
	unread = b.end - r.off
	r.buf = b.full
	return unread
}
