package groupfc

import (
	"fmt"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Message types: data (as TIPC's GRP_BCAST, GRP_MCAST, GRP_UCAST) and the
// group protocol (GRP_JOIN ... GRP_REMIT). Events never go on the wire.
const (
	typeBcast   uint8 = 1 // broadcast; Seqno is the sender's broadcast seqno
	typeMcast   uint8 = 2 // multicast to Instance; travels as a broadcast
	typeUcast   uint8 = 3 // unicast; Seqno is the sender's next broadcast seqno
	typeJoin    uint8 = 4 // Seqno: sync point; N: window advertised; Instance: the sender's
	typeLeave   uint8 = 5 // Seqno: sync point
	typeAdv     uint8 = 6 // N: window advertised
	typeAck     uint8 = 7 // N: next broadcast seqno expected from the receiver of the ACK
	typeReclaim uint8 = 8
	typeRemit   uint8 = 9 // N: the remitter's window toward the reclaimer
	// typeLeaveAck confirms a LEAVE: the leaver waits for it from every
	// member still in the view before its stack stops, so its LEAVE, the
	// sync point in it and everything before it reach every member.
	typeLeaveAck uint8 = 10
	maxType            = typeLeaveAck
)

var typeNames = [...]string{"?", "BCAST", "MCAST", "UCAST", "JOIN", "LEAVE", "ADV", "ACK", "RECLAIM", "REMIT", "LEAVE_ACK"}

// The bits of a header's flags byte (bit 0 was the AckReq bool before
// Reply came, so older encodings read the same).
const (
	flagAckReq uint8 = 1 << iota
	flagReply
)

// maxWindow bounds an advertised or remitted window on the wire (blocks).
const maxWindow = 1 << 24

// Header is a GROUPFC message.
type Header struct {
	Type   uint8
	AckReq bool // BCAST, MCAST: the receiver answers with ACK
	// Reply: a JOIN that answers the peer's JOIN (the one this member
	// sent when the peer appeared may have gone to an earlier incarnation
	// of it); a reply is answered by an ADV, never by another JOIN.
	Reply bool
	// Inc: JOIN: the sender's incarnation number of the receiver (see
	// member.inc); a JOIN of a higher number is a new incarnation.
	Inc      uint64
	Seqno    uint64 // data: broadcast seqno; JOIN, LEAVE: sync point
	Instance uint64 // MCAST: target instance; JOIN: the joiner's instance
	N        uint64 // JOIN, ADV: window; ACK: acked; REMIT: remitted
}

// Kind names the message type.
func (h *Header) Kind() string {
	if int(h.Type) < len(typeNames) {
		return typeNames[h.Type]
	}
	return "?"
}

func (h *Header) String() string {
	return fmt.Sprintf("GROUPFC %s seqno=%d inst=%d n=%d ack=%t reply=%t inc=%d", h.Kind(), h.Seqno, h.Instance, h.N, h.AckReq, h.Reply, h.Inc)
}

func isData(t uint8) bool { return t == typeBcast || t == typeMcast || t == typeUcast }

// Size returns the encoded length.
func (h *Header) Size() int {
	n := 2 + wire.UvarintSize(h.Seqno) + wire.UvarintSize(h.Instance) + wire.UvarintSize(h.N)
	if h.Type == typeJoin {
		n += wire.UvarintSize(h.Inc)
	}
	return n
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	var flags uint8
	if h.AckReq {
		flags |= flagAckReq
	}
	if h.Reply {
		flags |= flagReply
	}
	b = append(b, h.Type, flags)
	b = wire.AppendUvarint(b, h.Seqno)
	b = wire.AppendUvarint(b, h.Instance)
	b = wire.AppendUvarint(b, h.N)
	if h.Type == typeJoin {
		b = wire.AppendUvarint(b, h.Inc)
	}
	return b
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Type: r.Uint8()}
	flags := r.Uint8()
	h.Seqno, h.Instance, h.N = r.Uvarint(), r.Uvarint(), r.Uvarint()
	if h.Type == typeJoin {
		h.Inc = r.Uvarint()
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	h.AckReq, h.Reply = flags&flagAckReq != 0, flags&flagReply != 0
	switch {
	case flags&^(flagAckReq|flagReply) != 0:
		return nil, fmt.Errorf("%w: GROUPFC flags %#x", stack.ErrMalformed, flags)
	case h.Type == 0 || h.Type > maxType:
		return nil, fmt.Errorf("%w: GROUPFC message type %d", stack.ErrMalformed, h.Type)
	case (h.Type == typeJoin || h.Type == typeAdv || h.Type == typeRemit) && h.N > maxWindow:
		return nil, fmt.Errorf("%w: GROUPFC %s window %d", stack.ErrMalformed, h.Kind(), h.N)
	}
	return h, nil
}

func sampleHeaders() []stack.Header {
	return []stack.Header{
		&Header{Type: typeBcast, Seqno: 7, AckReq: true}, &Header{Type: typeMcast, Seqno: 8, Instance: 3},
		&Header{Type: typeUcast, Seqno: 9}, &Header{Type: typeJoin, Seqno: 1, Instance: 42, N: 65, Inc: 1}, &Header{Type: typeJoin, Seqno: 5, Reply: true, Inc: 3},
		&Header{Type: typeLeave, Seqno: 12}, &Header{Type: typeAdv, N: 780}, &Header{Type: typeAck, N: 13},
		&Header{Type: typeReclaim}, &Header{Type: typeRemit, N: 65}, &Header{Type: typeLeaveAck},
	}
}
