package nakack

import (
	"fmt"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

type hdrType uint8

const (
	typeMsg hdrType = iota
	typeXmitReq
	typeXmitRsp
	typeHighestSeqno
	typePurged
	numTypes
)

var typeNames = [...]string{"MSG", "XMIT_REQ", "XMIT_RSP", "HIGHEST_SEQNO", "PURGED"}

func (t hdrType) String() string {
	if t < numTypes {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", t)
}

// Header is NAKACK's header.
//
//	MSG, XMIT_RSP:  seqno (an XMIT_RSP is a retransmitted copy; its source is the original sender)
//	XMIT_REQ:       original sender, missing seqnos (delta encoded)
//	HIGHEST_SEQNO:  the sender's highest seqno (recovers a lost last message)
//	PURGED:         the sender's answer to a request for its own messages it
//	                no longer holds: seqno is the highest it purged
type Header struct {
	Type    hdrType
	Seqno   uint64
	Sender  stack.Address
	Missing []uint64
}

func (h *Header) String() string {
	switch h.Type {
	case typeXmitReq:
		return fmt.Sprintf("XMIT_REQ(%s %v)", h.Sender, h.Missing)
	default:
		return fmt.Sprintf("%s(#%d)", h.Type, h.Seqno)
	}
}

// Size returns the encoded length.
func (h *Header) Size() int {
	if h.Type != typeXmitReq {
		return 1 + wire.UvarintSize(h.Seqno)
	}
	return 1 + stack.AddressSize + wire.SeqnoListSize(h.Missing)
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = append(b, byte(h.Type))
	if h.Type != typeXmitReq {
		return wire.AppendUvarint(b, h.Seqno)
	}
	b = stack.AppendAddress(b, h.Sender)
	return wire.AppendSeqnoList(b, h.Missing)
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := stack.NewHeader[Header](r) // from the bundle's slab of NAKACK headers
	h.Type = hdrType(r.Uint8())
	switch h.Type {
	case typeMsg, typeXmitRsp, typeHighestSeqno, typePurged:
		h.Seqno = r.Uvarint()
	case typeXmitReq:
		h.Sender = stack.ReadAddress(r)
		h.Missing = r.SeqnoList()
	default:
		r.Fail("unknown NAKACK header type %d", h.Type)
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

func init() {
	stack.RegisterHeader(stack.HeaderType{
		ID: stack.IDNAKACK, Name: "NAKACK", Decode: decodeHeader,
		Samples: func() []stack.Header {
			return []stack.Header{
				&Header{Type: typeMsg, Seqno: 1},
				&Header{Type: typeXmitRsp, Seqno: 1 << 50},
				&Header{Type: typeHighestSeqno, Seqno: 77},
				&Header{Type: typePurged, Seqno: 12},
				&Header{Type: typeXmitReq, Sender: stack.NewAddress(), Missing: []uint64{3, 4, 1000}},
				&Header{Type: typeXmitReq, Sender: stack.NewAddress(), Missing: []uint64{}},
			}
		},
	})
}
