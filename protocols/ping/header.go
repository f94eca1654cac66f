package ping

import (
	"net/netip"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Message types.
const (
	typeRequest  uint8 = 1 // GET_MBRS_REQ: who is there? (Target: only that member answers)
	typeResponse uint8 = 2 // GET_MBRS_RSP: here I am
)

// Header is a discovery request or answer: the sender's own MemberInfo, and
// for a targeted request (WHO_HAS) the member asked for.
type Header struct {
	Type   uint8
	Info   stack.MemberInfo
	Target stack.Address
}

// Size returns the encoded length.
func (h *Header) Size() int {
	n := 1 + stack.MemberInfoSize(h.Info)
	if h.Type == typeRequest {
		n += stack.AddressSize
	}
	return n
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = append(b, h.Type)
	b = stack.AppendMemberInfo(b, h.Info)
	if h.Type == typeRequest {
		b = stack.AppendAddress(b, h.Target)
	}
	return b
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Type: r.Uint8()}
	if h.Type != typeRequest && h.Type != typeResponse && r.Err() == nil {
		r.Fail("discovery message type %d", h.Type)
	}
	h.Info = stack.ReadMemberInfo(r)
	if h.Type == typeRequest {
		h.Target = stack.ReadAddress(r)
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

func sampleHeaders() []stack.Header {
	a, b := stack.NewAddress(), stack.NewAddress()
	return []stack.Header{
		&Header{Type: typeRequest, Info: stack.MemberInfo{Addr: a, Name: "A", Physical: netip.MustParseAddrPort("127.0.0.1:7800")}},
		&Header{Type: typeRequest, Info: stack.MemberInfo{Addr: a}, Target: b},
		&Header{Type: typeResponse, Info: stack.MemberInfo{Addr: b, Name: "B", Physical: netip.MustParseAddrPort("[::1]:7801"), IsServer: true, Coord: a}},
		&Header{Type: typeResponse, Info: stack.MemberInfo{Addr: b, IsServer: true, Coord: b}},
	}
}
