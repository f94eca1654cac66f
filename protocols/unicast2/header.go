package unicast2

import (
	"fmt"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// hdrType is the kind of a UNICAST2 message.
type hdrType uint8

const (
	typeData hdrType = iota
	typeXmitReq
	typeSendFirstSeqno
	typeStable
	numTypes
)

var typeNames = [...]string{"DATA", "XMIT_REQ", "SEND_FIRST_SEQNO", "STABLE"}

func (t hdrType) String() string {
	if t < numTypes {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", t)
}

// Header is UNICAST2's header.
//
//	DATA:             seqno, conn_id, first
//	XMIT_REQ:         conn_id, missing seqnos (delta encoded)
//	SEND_FIRST_SEQNO: timestamp
//	STABLE:           conn_id, highest delivered, highest received, timestamp
type Header struct {
	Type      hdrType
	Seqno     uint64
	ConnID    uint16
	First     bool
	HD, HR    uint64
	Timestamp uint32
	Missing   []uint64
}

func (h *Header) String() string {
	switch h.Type {
	case typeData:
		return fmt.Sprintf("DATA(#%d conn=%d first=%v)", h.Seqno, h.ConnID, h.First)
	case typeXmitReq:
		return fmt.Sprintf("XMIT_REQ(conn=%d %v)", h.ConnID, h.Missing)
	case typeSendFirstSeqno:
		return fmt.Sprintf("SEND_FIRST_SEQNO(ts=%d)", h.Timestamp)
	case typeStable:
		return fmt.Sprintf("STABLE(conn=%d hd=%d hr=%d ts=%d)", h.ConnID, h.HD, h.HR, h.Timestamp)
	}
	return h.Type.String()
}

// Size returns the encoded length.
func (h *Header) Size() int {
	n := 1
	switch h.Type {
	case typeData:
		n += wire.UvarintSize(h.Seqno) + 2 + 1
	case typeXmitReq:
		n += 2 + wire.SeqnoListSize(h.Missing)
	case typeSendFirstSeqno:
		n += 4
	case typeStable:
		n += 2 + wire.UvarintSize(h.HD) + wire.UvarintSize(h.HR) + 4
	}
	return n
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = append(b, byte(h.Type))
	switch h.Type {
	case typeData:
		b = wire.AppendUvarint(b, h.Seqno)
		b = wire.AppendUint16(b, h.ConnID)
		b = wire.AppendBool(b, h.First)
	case typeXmitReq:
		b = wire.AppendUint16(b, h.ConnID)
		b = wire.AppendSeqnoList(b, h.Missing)
	case typeSendFirstSeqno:
		b = wire.AppendUint32(b, h.Timestamp)
	case typeStable:
		b = wire.AppendUint16(b, h.ConnID)
		b = wire.AppendUvarint(b, h.HD)
		b = wire.AppendUvarint(b, h.HR)
		b = wire.AppendUint32(b, h.Timestamp)
	}
	return b
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := stack.NewHeader[Header](r) // from the bundle's slab of UNICAST2 headers
	h.Type = hdrType(r.Uint8())
	switch h.Type {
	case typeData:
		h.Seqno = r.Uvarint()
		h.ConnID = r.Uint16()
		h.First = r.Bool()
	case typeXmitReq:
		h.ConnID = r.Uint16()
		h.Missing = r.SeqnoList()
	case typeSendFirstSeqno:
		h.Timestamp = r.Uint32()
	case typeStable:
		h.ConnID = r.Uint16()
		h.HD = r.Uvarint()
		h.HR = r.Uvarint()
		h.Timestamp = r.Uint32()
	default:
		r.Fail("unknown UNICAST2 header type %d", h.Type)
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

func init() {
	stack.RegisterHeader(stack.HeaderType{
		ID: stack.IDUNICAST2, Name: "UNICAST2", Decode: decodeHeader,
		Samples: func() []stack.Header {
			return []stack.Header{
				&Header{Type: typeData, Seqno: 1, ConnID: 7, First: true},
				&Header{Type: typeData, Seqno: 1 << 40, ConnID: 65535},
				&Header{Type: typeXmitReq, ConnID: 3, Missing: []uint64{5, 6, 900, 1 << 33}},
				&Header{Type: typeXmitReq, ConnID: 3, Missing: []uint64{}},
				&Header{Type: typeSendFirstSeqno, Timestamp: 1<<32 - 1},
				&Header{Type: typeStable, ConnID: 9, HD: 12, HR: 20, Timestamp: 42},
			}
		},
	})
}
