package stack

import (
	"errors"
	"fmt"

	"github.com/strata-go/strata/stack/wire"
)

// Wire format, version 1. All integers big-endian or varint.
//
//	bundle  = magic(2) version(2) bflags(1) cluster(len8 + bytes) src(16) count(uvarint) message*
//	message = flags(2) leading(1) [dest(16)] [src(16)] nhdr(1) header* payload(uvarint len + bytes)
//	header  = id(2) len(uvarint) body
//
// A message's source is written only when it differs from the bundle's.
// The cluster name is written once per bundle.
const (
	// WireVersion is the version of the encoding written by this package.
	WireVersion uint16 = 1

	wireMagic0 = 'S'
	wireMagic1 = 'T'

	bundleMulticast = 1

	leadDest = 1
	leadSrc  = 2

	// MaxClusterName is the longest cluster name the wire format carries.
	MaxClusterName = 255
	// MaxPayload is the largest payload a decoder accepts.
	MaxPayload = 1 << 26
	// maxHeaderBody is the largest header body a decoder accepts.
	maxHeaderBody = 1 << 20
	// maxHeadersPerMsg is the most headers a decoder accepts on one message.
	maxHeadersPerMsg = 32
	// BundleOverhead is the size of a bundle preamble without the cluster
	// name: magic, version, flags, cluster length, source, a 3-byte count.
	BundleOverhead = 2 + 2 + 1 + 1 + AddressSize + 3
)

// Errors a transport counts separately when it drops a bundle.
var (
	ErrWrongVersion = fmt.Errorf("%w: wrong wire version", ErrMalformed)
	ErrWrongCluster = errors.New("bundle for another cluster")
)

// EncodedSize returns the encoded length of m inside a bundle whose source
// is bundleSrc.
func (m *Message) EncodedSize(bundleSrc Address) int {
	n := 2 + 1 + 1
	if !m.Dest.IsZero() {
		n += AddressSize
	}
	if m.Src != bundleSrc {
		n += AddressSize
	}
	m.EachHeader(func(_ uint16, h Header) {
		s := h.Size()
		n += 2 + wire.UvarintSize(uint64(s)) + s
	})
	return n + wire.UvarintSize(uint64(len(m.Payload))) + len(m.Payload)
}

// AppendMessage appends the encoding of m, as part of a bundle from
// bundleSrc.
func AppendMessage(b []byte, m *Message, bundleSrc Address) []byte {
	b = wire.AppendUint16(b, uint16(m.Flags))
	var lead byte
	if !m.Dest.IsZero() {
		lead |= leadDest
	}
	if m.Src != bundleSrc {
		lead |= leadSrc
	}
	b = append(b, lead)
	if lead&leadDest != 0 {
		b = AppendAddress(b, m.Dest)
	}
	if lead&leadSrc != 0 {
		b = AppendAddress(b, m.Src)
	}
	b = append(b, m.nh)
	m.EachHeader(func(id uint16, h Header) {
		b = wire.AppendUint16(b, id)
		b = wire.AppendUvarint(b, uint64(h.Size()))
		b = h.AppendTo(b)
	})
	return wire.AppendLenBytes(b, m.Payload)
}

// ReadMessage decodes one message written by AppendMessage. The payload
// aliases the reader's buffer.
func ReadMessage(r *wire.Reader, bundleSrc Address) (*Message, error) {
	m := &Message{}
	if err := readMessageInto(r, bundleSrc, m); err != nil {
		return nil, err
	}
	return m, nil
}

// readMessageInto is ReadMessage into m, a zero message.
func readMessageInto(r *wire.Reader, bundleSrc Address, m *Message) error {
	m.Flags = Flags(r.Uint16())
	if m.Flags&^flagsMask != 0 {
		r.Fail("unknown message flags %#x", uint16(m.Flags&^flagsMask))
	}
	lead := r.Uint8()
	if lead&^(leadDest|leadSrc) != 0 {
		r.Fail("bad leading byte %#x", lead)
	}
	if lead&leadDest != 0 {
		m.Dest = ReadAddress(r)
	}
	m.Src = bundleSrc
	if lead&leadSrc != 0 {
		m.Src = ReadAddress(r)
	}
	nh := int(r.Uint8())
	if nh > maxHeadersPerMsg {
		r.Fail("%d headers on one message", nh)
	}
	if err := r.Err(); err != nil {
		return err
	}
	for range nh {
		id := r.Uint16()
		n := r.Len32(maxHeaderBody, "header")
		if err := r.Err(); err != nil {
			return err
		}
		t, ok := lookupHeader(id)
		if !ok {
			return fmt.Errorf("%w: unknown header id %d", ErrMalformed, id)
		}
		if m.Header(id) != nil {
			return fmt.Errorf("%w: header %s twice", ErrMalformed, t.name)
		}
		// The decoder reads from r itself, limited to the body, so decoding
		// allocates nothing beyond the header.
		bound := r.Limit(n)
		h, err := t.decode(r)
		if err == nil {
			err = r.Err()
		}
		if unread := r.Unlimit(bound); err == nil && unread != 0 {
			err = fmt.Errorf("%w: %d trailing bytes", ErrMalformed, unread)
		}
		if err != nil {
			return fmt.Errorf("header %s: %w", t.name, err)
		}
		m.PutHeader(id, h)
	}
	if p := r.LenBytes(MaxPayload, "payload"); len(p) > 0 {
		m.Payload = p
	}
	if err := r.Err(); err != nil {
		return err
	}
	return nil
}

// BundleHeader is the preamble of a bundle.
type BundleHeader struct {
	Cluster   string
	Src       Address
	Multicast bool
	Count     int
}

// AppendBundleHeader appends a bundle preamble announcing count messages.
// The count is written as a fixed 3-byte varint so a sender can reserve
// room and patch it with PatchBundleCount.
func AppendBundleHeader(b []byte, cluster string, src Address, multicast bool, count int) []byte {
	if len(cluster) > MaxClusterName {
		panic("stack: cluster name longer than 255 bytes")
	}
	b = append(b, wireMagic0, wireMagic1)
	b = wire.AppendUint16(b, WireVersion)
	var fl byte
	if multicast {
		fl |= bundleMulticast
	}
	b = append(b, fl, byte(len(cluster)))
	b = append(b, cluster...)
	b = AppendAddress(b, src)
	return appendCount3(b, count)
}

const maxBundleCount = 1<<21 - 1

func appendCount3(b []byte, n int) []byte {
	if n < 0 || n > maxBundleCount {
		panic("stack: bundle count out of range")
	}
	return append(b, byte(n)|0x80, byte(n>>7)|0x80, byte(n>>14))
}

// PatchBundleCount rewrites the message count of the bundle that starts at
// b[0], for senders that count messages while appending them.
func PatchBundleCount(b []byte, count int) {
	off := 2 + 2 + 1 + 1 + int(b[5]) + AddressSize
	appendCount3(b[off:off], count)
}

// ReadBundleHeader decodes a bundle preamble. If cluster is not empty, a
// bundle for another cluster yields ErrWrongCluster (without allocating).
func ReadBundleHeader(r *wire.Reader, cluster string) (BundleHeader, error) {
	var h BundleHeader
	if r.Uint8() != wireMagic0 || r.Uint8() != wireMagic1 {
		r.Fail("bad magic")
		return h, r.Err()
	}
	if v := r.Uint16(); v != WireVersion && r.Err() == nil {
		return h, fmt.Errorf("%w: got %d, want %d", ErrWrongVersion, v, WireVersion)
	}
	fl := r.Uint8()
	if fl&^bundleMulticast != 0 {
		r.Fail("bad bundle flags %#x", fl)
	}
	h.Multicast = fl&bundleMulticast != 0
	name := r.Bytes(int(r.Uint8()))
	if err := r.Err(); err != nil {
		return h, err
	}
	if cluster != "" && string(name) != cluster {
		return h, ErrWrongCluster
	}
	if cluster != "" {
		h.Cluster = cluster
	} else {
		h.Cluster = string(name)
	}
	h.Src = ReadAddress(r)
	n := r.Uvarint()
	if n > maxBundleCount || n > uint64(r.Len()) {
		r.Fail("bundle count %d too large", n)
	}
	h.Count = int(n)
	return h, r.Err()
}

// EncodeBundle encodes msgs, all from src, as one bundle.
func EncodeBundle(b []byte, cluster string, src Address, multicast bool, msgs ...*Message) []byte {
	b = AppendBundleHeader(b, cluster, src, multicast, len(msgs))
	for _, m := range msgs {
		b = AppendMessage(b, m, src)
	}
	return b
}

// DecodeBundle decodes a whole bundle. Payloads alias buf, so buf must not be
// reused while the messages live. A non-empty cluster filters as in
// ReadBundleHeader.
func DecodeBundle(buf []byte, cluster string) (BundleHeader, []*Message, error) {
	r := wire.NewReader(buf)
	h, err := ReadBundleHeader(r, cluster)
	if err != nil {
		return h, nil, err
	}
	msgs, err := readBundleMessages(r, h)
	return h, msgs, err
}

// msgSlab is how many messages readBundleMessages allocates at once.
const msgSlab = 64

// minHeaderSlab is the fewest messages a bundle has for its headers to be
// decoded into slabs: below it, the slabs' own bookkeeping costs more
// allocations than it saves.
const minHeaderSlab = 5

// readBundleMessages decodes the messages of a bundle whose header r has
// read.
func readBundleMessages(r *wire.Reader, h BundleHeader) ([]*Message, error) {
	// The messages are allocated msgSlab at a time, not one by one: a
	// message a layer keeps keeps the others' structs of its slab too (as
	// its payload keeps the datagram), and a bundle that claims more
	// messages than it holds costs at most one slab.
	msgs := make([]*Message, h.Count)
	var slab []Message
	var hs *headerSlabs
	if h.Count >= minHeaderSlab { // headers likewise (NewHeader)
		hs = &headerSlabs{}
		r.SetScratch(hs)
		defer r.SetScratch(nil)
	}
	for i := range msgs {
		if len(slab) == 0 {
			slab = make([]Message, min(h.Count-i, msgSlab))
		}
		if hs != nil {
			hs.left = h.Count - i
		}
		if err := readMessageInto(r, h.Src, &slab[0]); err != nil {
			return nil, err
		}
		msgs[i], slab = &slab[0], slab[1:]
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after bundle", ErrMalformed, r.Len())
	}
	return msgs, nil
}
