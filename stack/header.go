package stack

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/strata-go/strata/stack/wire"
)

// Header is the per-message data one protocol adds: at most one header per
// protocol id. Headers are immutable once put on a message, so copies of a
// message share them.
type Header interface {
	// Size returns the exact encoded length of the header body.
	Size() int
	// AppendTo appends the encoded header body to b.
	AppendTo(b []byte) []byte
}

// headerSlabs is the memory a bundle's headers decode into: one slab per
// header type, sized by the messages still to decode (at most one header
// of a type per message) and at most msgSlab.
type headerSlabs struct {
	left  int   // messages of the bundle from the one being decoded on
	slabs []any // *[]T, one per header type met so far
}

// NewHeader returns a zero T for a header decoder to fill. While r reads
// a bundle, the T comes from a slab of the bundle's Ts (one allocation for
// up to 64 headers of a type, not one per message); otherwise it is
// new(T). A header kept keeps its slab too.
func NewHeader[T any](r *wire.Reader) *T {
	b, _ := r.Scratch().(*headerSlabs)
	if b == nil || b.left <= 1 {
		return new(T)
	}
	var p *[]T
	for _, s := range b.slabs {
		if q, ok := s.(*[]T); ok {
			p = q
			break
		}
	}
	if p == nil {
		p = new([]T)
		b.slabs = append(b.slabs, p)
	}
	if len(*p) == 0 {
		*p = make([]T, min(b.left, msgSlab))
	}
	h := &(*p)[0]
	*p = (*p)[1:]
	return h
}

// HeaderDecoder decodes a header body. The reader holds exactly the body;
// decoders read from it and return r.Err() or a wrapped ErrMalformed.
type HeaderDecoder func(r *wire.Reader) (Header, error)

// HeaderType describes a protocol's header to RegisterHeader.
type HeaderType struct {
	ID     uint16 // the protocol's id from ids.go
	Name   string // the protocol's name, for logs and errors
	Decode HeaderDecoder
	// Samples returns headers covering every variant of the type, for the
	// test that checks each header's Size against its encoding and for the
	// decoders' fuzz seeds.
	Samples func() []Header
}

var (
	headerMu       sync.Mutex // serialises registrations
	headerDecoders = map[uint16]headerType{}
	// headerFast is what decoding reads: a snapshot, replaced whole on
	// each registration, so a lookup is one atomic load and no lock (a
	// read lock per header was 2% of a receiver's CPU, its counter
	// bouncing between the cores that decode).
	headerFast atomic.Pointer[headerSnapshot]
)

// headerSnapshot holds the registered header types, the stack's own ids
// in an array.
type headerSnapshot struct {
	low  [IDUserMin]*headerType
	high map[uint16]*headerType
}

type headerType struct {
	name    string
	decode  HeaderDecoder
	samples func() []Header
}

// RegisterHeader registers the decoder of a protocol's header. It is meant
// for init functions; a zero id, a nil decoder or a second registration of
// the same id panics.
func RegisterHeader(t HeaderType) {
	headerMu.Lock()
	defer headerMu.Unlock()
	if t.ID == 0 {
		panic("stack: RegisterHeader with id 0")
	}
	if t.Decode == nil || t.Samples == nil {
		panic("stack: RegisterHeader " + t.Name + " needs Decode and Samples")
	}
	if old, dup := headerDecoders[t.ID]; dup {
		panic(fmt.Sprintf("stack: header id %d registered twice (%s and %s)", t.ID, old.name, t.Name))
	}
	headerDecoders[t.ID] = headerType{name: t.Name, decode: t.Decode, samples: t.Samples}
	snap := &headerSnapshot{high: map[uint16]*headerType{}}
	for id, h := range headerDecoders {
		if id < IDUserMin {
			snap.low[id] = &h
		} else {
			snap.high[id] = &h
		}
	}
	headerFast.Store(snap)
}

// HeaderSamples returns the sample headers of protocol id.
func HeaderSamples(id uint16) []Header {
	h, ok := lookupHeader(id)
	if !ok {
		return nil
	}
	return h.samples()
}

func lookupHeader(id uint16) (headerType, bool) {
	snap := headerFast.Load()
	if snap == nil {
		return headerType{}, false
	}
	var h *headerType
	if id < IDUserMin {
		h = snap.low[id]
	} else {
		h = snap.high[id]
	}
	if h == nil {
		return headerType{}, false
	}
	return *h, true
}

// HeaderIDs returns the ids of every registered header, for tests that check
// each header's Size against its encoding.
func HeaderIDs() map[uint16]string {
	headerMu.Lock()
	defer headerMu.Unlock()
	out := make(map[uint16]string, len(headerDecoders))
	for id, h := range headerDecoders {
		out[id] = h.name
	}
	return out
}

// DecodeHeader decodes one header body of protocol id, for tests and tools.
func DecodeHeader(id uint16, body []byte) (Header, error) {
	h, ok := lookupHeader(id)
	if !ok {
		return nil, fmt.Errorf("%w: unknown header id %d", ErrMalformed, id)
	}
	r := wire.NewReader(body)
	hdr, err := h.decode(r)
	if err == nil {
		err = r.Err()
	}
	if err == nil && r.Len() != 0 {
		err = fmt.Errorf("%w: header %s: %d trailing bytes", ErrMalformed, h.name, r.Len())
	}
	if err != nil {
		return nil, err
	}
	return hdr, nil
}
