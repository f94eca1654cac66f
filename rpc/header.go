package rpc

import (
	"fmt"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Kinds of rpc messages.
const (
	kindRequest  uint8 = 1
	kindResponse uint8 = 2
)

// Header flags.
const (
	// flagNoReply (request): fire and forget, send no response.
	flagNoReply uint8 = 1 << iota
	// flagError (response): the handler returned an error; the payload is
	// its text.
	flagError
	// flagPanic (response): the handler panicked; the payload says with
	// what.
	flagPanic
	// flagNoHandler (response): the member has no handler.
	flagNoHandler

	flagsMask = flagNoReply | flagError | flagPanic | flagNoHandler
)

// Header is the one header of package rpc, on requests and responses
// alike (stack.IDRPC): the kind, flags, and the request id, which a
// response repeats so that the caller can match it.
//
//	header = kind(1) flags(1) id(uvarint)
type Header struct {
	Kind  uint8
	Flags uint8
	ID    uint64
}

// Size returns the encoded length.
func (h *Header) Size() int { return 2 + wire.UvarintSize(h.ID) }

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = append(b, h.Kind, h.Flags)
	return wire.AppendUvarint(b, h.ID)
}

// String summarises the header for logs.
func (h *Header) String() string {
	k := "REQ"
	if h.Kind == kindResponse {
		k = "RSP"
	}
	return fmt.Sprintf("RPC %s id=%d flags=%#x", k, h.ID, h.Flags)
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Kind: r.Uint8(), Flags: r.Uint8(), ID: r.Uvarint()}
	if err := r.Err(); err != nil {
		return nil, err
	}
	switch {
	case h.Kind != kindRequest && h.Kind != kindResponse:
		return nil, fmt.Errorf("%w: rpc: kind %d", stack.ErrMalformed, h.Kind)
	case h.Flags&^flagsMask != 0:
		return nil, fmt.Errorf("%w: rpc: flags %#x", stack.ErrMalformed, h.Flags)
	case h.Kind == kindRequest && h.Flags&^flagNoReply != 0,
		h.Kind == kindResponse && h.Flags&flagNoReply != 0:
		return nil, fmt.Errorf("%w: rpc: flags %#x on kind %d", stack.ErrMalformed, h.Flags, h.Kind)
	}
	return h, nil
}

func init() {
	stack.RegisterHeader(stack.HeaderType{
		ID:     stack.IDRPC,
		Name:   "RPC",
		Decode: decodeHeader,
		Samples: func() []stack.Header {
			return []stack.Header{
				&Header{Kind: kindRequest, ID: 1},
				&Header{Kind: kindRequest, Flags: flagNoReply, ID: 1 << 40},
				&Header{Kind: kindResponse, ID: 300},
				&Header{Kind: kindResponse, Flags: flagError, ID: 7},
				&Header{Kind: kindResponse, Flags: flagPanic, ID: 1<<64 - 1},
				&Header{Kind: kindResponse, Flags: flagNoHandler, ID: 0},
			}
		},
	})
}
