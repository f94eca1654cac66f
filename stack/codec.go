package stack

import "github.com/strata-go/strata/stack/wire"

// ErrMalformed is wrapped by every decoding error, so receivers can count
// and drop bad input with one errors.Is check (it is wire.ErrMalformed).
var ErrMalformed = wire.ErrMalformed

// AppendAddress appends the 16 bytes of a.
func AppendAddress(b []byte, a Address) []byte { return append(b, a.id[:]...) }

// ReadAddress reads a 16-byte address written by AppendAddress.
func ReadAddress(r *wire.Reader) Address {
	var a Address
	if r.Len() < AddressSize {
		r.Fail("truncated address at offset %d: need %d bytes, have %d", r.Offset(), AddressSize, r.Len())
		return a
	}
	copy(a.id[:], r.Bytes(AddressSize))
	return a
}

// AppendViewID appends the wire encoding of a view id.
func AppendViewID(b []byte, id ViewID) []byte {
	return wire.AppendUvarint(AppendAddress(b, id.Creator), id.Seq)
}

// ViewIDSize returns the encoded length of id.
func ViewIDSize(id ViewID) int { return AddressSize + wire.UvarintSize(id.Seq) }

// ReadViewID reads a view id written by AppendViewID.
func ReadViewID(r *wire.Reader) ViewID { return ViewID{Creator: ReadAddress(r), Seq: r.Uvarint()} }
