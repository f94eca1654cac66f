package flush

import (
	"fmt"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Message types.
const (
	typeStart        uint8 = 1  // initiator -> participant: block, answer with your digest
	typeCompleted    uint8 = 2  // participant -> initiator: blocked; here is my digest
	typeNotCompleted uint8 = 3  // participant -> initiator: I am in another round (collision)
	typeReconcile    uint8 = 4  // initiator -> participant: deliver everything up to this digest
	typeReconcileOK  uint8 = 5  // participant -> initiator: done
	typeStop         uint8 = 6  // initiator -> participant (and joiners): unblock
	typeUnblocked    uint8 = 7  // participant -> initiator: unblocked (the stop is synchronous)
	typeAbort        uint8 = 8  // initiator -> participant: the round is off; unblock
	typeStateDone    uint8 = 9  // joiner -> coordinator: fetched the state in the join's round
	typeCarried      uint8 = 10 // the message's real header is in its payload (carried)
	maxType                = typeCarried
)

var typeNames = [...]string{"?", "START_FLUSH", "FLUSH_COMPLETED", "FLUSH_NOT_COMPLETED", "FLUSH_RECONCILE", "FLUSH_RECONCILE_OK", "STOP_FLUSH", "UNBLOCKED", "ABORT_FLUSH", "STATE_DONE", "CARRIED"}

// RoundID names one flush round: its initiator and the initiator's counter.
// Rounds of one initiator are ordered by N.
type RoundID struct {
	Initiator stack.Address
	N         uint64
}

func (r RoundID) String() string { return fmt.Sprintf("%s#%d", r.Initiator, r.N) }

// maxParticipants bounds a START_FLUSH's participant list on the wire.
const maxParticipants = 1 << 16

// maxInline is the largest header FLUSH sends as a header. A START_FLUSH's
// participants and a digest grow with the group (about 16 and 20 bytes per
// member), and headers are never fragmented: a larger header goes in the
// payload of a CARRIED message, which FRAG below splits like any large
// message, each fragment carried by the reliable layers below it.
const maxInline = 512

// carried returns h as it goes on the wire: itself, or a CARRIED header
// and h's encoding as the payload when h is larger than maxInline.
func carried(h *Header) (*Header, []byte) {
	if h.Size() <= maxInline {
		return h, nil
	}
	return &Header{Type: typeCarried}, h.AppendTo(make([]byte, 0, h.Size()))
}

// uncarried returns the header a CARRIED message carries in payload.
func uncarried(payload []byte) (*Header, error) {
	r := wire.NewReader(payload)
	dh, err := decodeHeader(r)
	if err != nil {
		return nil, err
	}
	h := dh.(*Header)
	switch {
	case h.Type == typeCarried:
		return nil, fmt.Errorf("flush: a CARRIED header carries another")
	case r.Len() != 0:
		return nil, fmt.Errorf("flush: %d bytes after a carried header", r.Len())
	}
	return h, nil
}

// Header is a FLUSH message.
type Header struct {
	Type         uint8
	Round        RoundID
	ViewChange   bool            // START: GMS's flush before a view change
	Participants []stack.Address // START
	Digest       stack.Digest    // COMPLETED, RECONCILE
	From         []stack.Address // RECONCILE: per digest entry, a member that holds its messages
	View         stack.ViewID    // STOP after a view change: unblock once in this view (Seq 0: at once)
}

// Kind names the message type ("STOP_FLUSH", ...).
func (h *Header) Kind() string {
	if int(h.Type) < len(typeNames) {
		return typeNames[h.Type]
	}
	return "?"
}

func (h *Header) String() string { return fmt.Sprintf("%s %s", h.Kind(), h.Round) }

func hasDigest(t uint8) bool { return t == typeCompleted || t == typeReconcile }

// Size returns the encoded length.
func (h *Header) Size() int {
	n := 1 + stack.AddressSize + wire.UvarintSize(h.Round.N)
	switch {
	case h.Type == typeStart:
		n += 1 + wire.UvarintSize(uint64(len(h.Participants))) + len(h.Participants)*stack.AddressSize
	case h.Type == typeStop:
		n += stack.ViewIDSize(h.View)
	case hasDigest(h.Type):
		n += stack.DigestSize(h.Digest)
		if h.Type == typeReconcile {
			n += wire.UvarintSize(uint64(len(h.From))) + len(h.From)*stack.AddressSize
		}
	}
	return n
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = append(b, h.Type)
	b = stack.AppendAddress(b, h.Round.Initiator)
	b = wire.AppendUvarint(b, h.Round.N)
	switch {
	case h.Type == typeStart:
		b = wire.AppendBool(b, h.ViewChange)
		b = wire.AppendUvarint(b, uint64(len(h.Participants)))
		for _, p := range h.Participants {
			b = stack.AppendAddress(b, p)
		}
	case h.Type == typeStop:
		b = stack.AppendViewID(b, h.View)
	case hasDigest(h.Type):
		b = stack.AppendDigest(b, h.Digest)
		if h.Type == typeReconcile {
			b = wire.AppendUvarint(b, uint64(len(h.From)))
			for _, a := range h.From {
				b = stack.AppendAddress(b, a)
			}
		}
	}
	return b
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Type: r.Uint8()}
	if r.Err() == nil && (h.Type == 0 || h.Type > maxType) {
		r.Fail("FLUSH message type %d", h.Type)
	}
	h.Round = RoundID{Initiator: stack.ReadAddress(r), N: r.Uvarint()}
	switch {
	case h.Type == typeStart:
		h.ViewChange = r.Bool()
		n := r.Uvarint()
		if n > maxParticipants || n*stack.AddressSize > uint64(r.Len()) {
			r.Fail("FLUSH participant count %d", n)
			break
		}
		h.Participants = make([]stack.Address, n)
		for i := range h.Participants {
			h.Participants[i] = stack.ReadAddress(r)
		}
	case h.Type == typeStop:
		h.View = stack.ReadViewID(r)
	case hasDigest(h.Type):
		h.Digest = stack.ReadDigest(r)
		if h.Type != typeReconcile || r.Err() != nil {
			break
		}
		n := r.Uvarint()
		if n > uint64(len(h.Digest)) || n*stack.AddressSize > uint64(r.Len()) {
			r.Fail("FLUSH holder count %d for %d digest entries", n, len(h.Digest))
			break
		}
		h.From = make([]stack.Address, n)
		for i := range h.From {
			h.From[i] = stack.ReadAddress(r)
		}
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

func sampleHeaders() []stack.Header {
	a, b := stack.NewAddress(), stack.NewAddress()
	r := RoundID{Initiator: a, N: 3}
	d := stack.Digest{{Member: a, HighestDelivered: 4, HighestReceived: 6}, {Member: b}}
	return []stack.Header{
		&Header{Type: typeStart, Round: r, ViewChange: true, Participants: []stack.Address{a, b}},
		&Header{Type: typeStart, Round: r, Participants: []stack.Address{}},
		&Header{Type: typeCompleted, Round: r, Digest: d},
		&Header{Type: typeNotCompleted, Round: r},
		&Header{Type: typeReconcile, Round: r, Digest: d, From: []stack.Address{a, b}},
		&Header{Type: typeReconcileOK, Round: r},
		&Header{Type: typeStop, Round: r},
		&Header{Type: typeStop, Round: r, View: stack.ViewID{Creator: b, Seq: 7}},
		&Header{Type: typeUnblocked, Round: r},
		&Header{Type: typeAbort, Round: r},
		&Header{Type: typeStateDone},
		&Header{Type: typeCarried},
	}
}
