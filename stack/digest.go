package stack

import (
	"fmt"
	"strings"

	"github.com/strata-go/strata/stack/wire"
)

// DigestEntry is what one member knows of one sender's multicasts.
type DigestEntry struct {
	Member           Address
	HighestDelivered uint64
	HighestReceived  uint64
}

// Digest is, per sender, the highest multicast seqno delivered and received
// at one member. The reliable-multicast layer answers EvGetDigest and
// EvHold with it; joiners and FLUSH set it (EvSetDigest), STABLE gossips
// it (EvStable). It lives in the core so that GMS, FLUSH and STABLE work
// with any reliable-multicast layer.
type Digest []DigestEntry

// Get returns the entry of member.
func (d Digest) Get(member Address) (DigestEntry, bool) {
	for _, e := range d {
		if e.Member == member {
			return e, true
		}
	}
	return DigestEntry{}, false
}

// String lists each entry as member:delivered/received, for logs.
func (d Digest) String() string {
	var b strings.Builder
	for i, e := range d {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%d/%d", e.Member, e.HighestDelivered, e.HighestReceived)
	}
	return b.String()
}

// DigestSize returns the encoded length of d.
func DigestSize(d Digest) int {
	n := wire.UvarintSize(uint64(len(d)))
	for _, e := range d {
		n += AddressSize + wire.UvarintSize(e.HighestDelivered) + wire.UvarintSize(e.HighestReceived)
	}
	return n
}

// AppendDigest appends the wire encoding of d.
func AppendDigest(b []byte, d Digest) []byte {
	b = wire.AppendUvarint(b, uint64(len(d)))
	for _, e := range d {
		b = AppendAddress(b, e.Member)
		b = wire.AppendUvarint(b, e.HighestDelivered)
		b = wire.AppendUvarint(b, e.HighestReceived)
	}
	return b
}

// ReadDigest decodes a digest written by AppendDigest.
func ReadDigest(r *wire.Reader) Digest {
	n := r.Uvarint()
	if n > 1<<16 || n*AddressSize > uint64(r.Len()) {
		r.Fail("digest of %d members", n)
		return nil
	}
	d := make(Digest, n)
	for i := range d {
		d[i] = DigestEntry{Member: ReadAddress(r), HighestDelivered: r.Uvarint(), HighestReceived: r.Uvarint()}
	}
	if r.Err() != nil {
		return nil
	}
	return d
}
