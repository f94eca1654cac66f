package gms

import (
	"fmt"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Message types.
const (
	typeJoinReq     uint8 = 1  // joiner -> coordinator
	typeJoinRsp     uint8 = 2  // coordinator -> joiner: view and digest, or a refusal with the coordinator to ask
	typeView        uint8 = 3  // coordinator -> group (multicast): a new view
	typeViewAck     uint8 = 4  // member -> view creator: installed
	typeLeaveReq    uint8 = 5  // leaver -> coordinator
	typeLeaveRsp    uint8 = 6  // coordinator -> leaver
	typeMergeReq    uint8 = 7  // merge leader -> subgroup coordinator
	typeMergeRsp    uint8 = 8  // subgroup coordinator -> merge leader: its view and digest, or busy
	typeInstallView uint8 = 9  // merge leader -> every member: the merge view and digest
	typeCancelMerge uint8 = 10 // merge leader -> subgroup coordinators: the merge is off
	typeGetView     uint8 = 11 // member -> a delta's sender: it lacks the view the delta applies to; send the view in full
	typePart        uint8 = 12 // one part of a message too large for one datagram (its bytes in the payload)
	maxType               = typePart
)

var typeNames = [...]string{"?", "JOIN_REQ", "JOIN_RSP", "VIEW", "VIEW_ACK", "LEAVE_REQ", "LEAVE_RSP", "MERGE_REQ", "MERGE_RSP", "INSTALL_VIEW", "CANCEL_MERGE", "GET_VIEW", "PART"}

// Which optional fields a header carries (one bit each).
const (
	hasView uint8 = 1 << iota
	hasDigest
	hasViewID
	hasMergeID
	hasCoord
	hasFail
	flagState // JOIN_REQ: the joiner fetches the state in the view's flush
	hasDelta
)

// maxFail bounds a refusal's text on the wire.
const maxFail = 512

// MergeID names one merge attempt: its leader and a counter of the leader's.
type MergeID struct {
	Leader stack.Address
	N      uint64
}

// Header is a GMS message. Which fields are set depends on the type.
type Header struct {
	Type    uint8
	View    *stack.View   // JOIN_RSP, VIEW, MERGE_RSP, INSTALL_VIEW
	Delta   *Delta        // VIEW, in place of View: the change from the previous view
	Digest  stack.Digest  // JOIN_RSP, MERGE_RSP, INSTALL_VIEW (nil without NAKACK)
	ViewID  stack.ViewID  // VIEW_ACK, GET_VIEW
	MergeID MergeID       // MERGE_*, INSTALL_VIEW of a merge
	Coord   stack.Address // JOIN_RSP refusal: whom to ask instead
	Fail    string        // JOIN_RSP, MERGE_RSP refusals; LEAVE_REQ: a declined join
	State   bool          // JOIN_REQ: fetch the state inside the join's flush
	Part    Part          // PART: which part of which message

	refused error // a JOIN_RSP made of an EvJoinRefused: why (not encoded)
}

// Part says which part a PART message is: of a message of type Of whose
// encoding hashes to ID (parts.ID), part Index of Count. Its payload holds
// the part's bytes of that encoding.
type Part struct {
	Of           uint8
	ID           uint64
	Index, Count uint32
}

// maxPartHeader bounds a PART header's encoding: type, Of, ID, Index and
// Count as uvarints.
const maxPartHeader = 2 + 10 + 5 + 5

// maxParts bounds a message's parts on the wire.
const maxParts = 1 << 20

// Kind names the message type ("JOIN_REQ", "VIEW", ...), for logs and for
// tests that pick messages to drop.
func (h *Header) Kind() string {
	if int(h.Type) < len(typeNames) {
		return typeNames[h.Type]
	}
	return "?"
}

func (h *Header) String() string { return fmt.Sprintf("GMS %s", h.Kind()) }

func (h *Header) bits() uint8 {
	var b uint8
	if h.View != nil {
		b |= hasView
	}
	if h.Digest != nil {
		b |= hasDigest
	}
	if h.ViewID != (stack.ViewID{}) {
		b |= hasViewID
	}
	if h.MergeID != (MergeID{}) {
		b |= hasMergeID
	}
	if !h.Coord.IsZero() {
		b |= hasCoord
	}
	if h.Fail != "" {
		b |= hasFail
	}
	if h.State {
		b |= flagState
	}
	if h.Delta != nil {
		b |= hasDelta
	}
	return b
}

// Size returns the encoded length.
func (h *Header) Size() int {
	if h.Type == typePart {
		return 2 + wire.UvarintSize(h.Part.ID) + wire.UvarintSize(uint64(h.Part.Index)) + wire.UvarintSize(uint64(h.Part.Count))
	}
	n := 2
	bits := h.bits()
	if bits&hasView != 0 {
		n += stack.ViewSize(h.View)
	}
	if bits&hasDigest != 0 {
		n += stack.DigestSize(h.Digest)
	}
	if bits&hasViewID != 0 {
		n += stack.ViewIDSize(h.ViewID)
	}
	if bits&hasMergeID != 0 {
		n += stack.AddressSize + wire.UvarintSize(h.MergeID.N)
	}
	if bits&hasCoord != 0 {
		n += stack.AddressSize
	}
	if bits&hasFail != 0 {
		n += wire.UvarintSize(uint64(len(h.Fail))) + len(h.Fail)
	}
	if bits&hasDelta != 0 {
		n += h.Delta.size()
	}
	return n
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	if h.Type == typePart {
		b = append(b, h.Type, h.Part.Of)
		b = wire.AppendUvarint(b, h.Part.ID)
		b = wire.AppendUvarint(b, uint64(h.Part.Index))
		return wire.AppendUvarint(b, uint64(h.Part.Count))
	}
	bits := h.bits()
	b = append(b, h.Type, bits)
	if bits&hasView != 0 {
		b = stack.AppendView(b, h.View)
	}
	if bits&hasDigest != 0 {
		b = stack.AppendDigest(b, h.Digest)
	}
	if bits&hasViewID != 0 {
		b = stack.AppendViewID(b, h.ViewID)
	}
	if bits&hasMergeID != 0 {
		b = stack.AppendAddress(b, h.MergeID.Leader)
		b = wire.AppendUvarint(b, h.MergeID.N)
	}
	if bits&hasCoord != 0 {
		b = stack.AppendAddress(b, h.Coord)
	}
	if bits&hasFail != 0 {
		b = wire.AppendString(b, h.Fail)
	}
	if bits&hasDelta != 0 {
		b = h.Delta.appendTo(b)
	}
	return b
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Type: r.Uint8()}
	bits := r.Uint8()
	if r.Err() == nil && (h.Type == 0 || h.Type > maxType) {
		r.Fail("GMS message type %d", h.Type)
	}
	if h.Type == typePart {
		h.Part = Part{Of: bits, ID: r.Uvarint()}
		idx, cnt := r.Uvarint(), r.Uvarint()
		if r.Err() == nil && (bits == 0 || bits >= typePart || cnt == 0 || cnt > maxParts || idx >= cnt) {
			r.Fail("GMS part %d of %d of a message of type %d", idx, cnt, bits)
		}
		if err := r.Err(); err != nil {
			return nil, err
		}
		h.Part.Index, h.Part.Count = uint32(idx), uint32(cnt)
		return h, nil
	}
	if bits&hasView != 0 {
		h.View = stack.ReadView(r)
	}
	if bits&hasDigest != 0 {
		h.Digest = stack.ReadDigest(r)
		if h.Digest == nil && r.Err() == nil {
			h.Digest = stack.Digest{}
		}
	}
	if bits&hasViewID != 0 {
		h.ViewID = stack.ReadViewID(r)
	}
	if bits&hasMergeID != 0 {
		h.MergeID = MergeID{Leader: stack.ReadAddress(r), N: r.Uvarint()}
	}
	if bits&hasCoord != 0 {
		h.Coord = stack.ReadAddress(r)
	}
	if bits&hasFail != 0 {
		h.Fail = r.String(maxFail, "GMS refusal")
	}
	if bits&hasDelta != 0 {
		h.Delta = readDelta(r)
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	h.State = bits&flagState != 0
	return h, nil
}

// Delta is a view sent as its change from the view before it (JGroups'
// DeltaView): the members of Prev without Left, then Joined, in order.
type Delta struct {
	ID, Prev     stack.ViewID
	Joined, Left []stack.Address
}

// maxDeltaMembers bounds the addresses of a delta on the wire (as a view's).
const maxDeltaMembers = 1 << 16

func (d *Delta) size() int {
	return stack.ViewIDSize(d.ID) + stack.ViewIDSize(d.Prev) +
		wire.UvarintSize(uint64(len(d.Joined))) + wire.UvarintSize(uint64(len(d.Left))) +
		(len(d.Joined)+len(d.Left))*stack.AddressSize
}

func (d *Delta) appendTo(b []byte) []byte {
	b = stack.AppendViewID(b, d.ID)
	b = stack.AppendViewID(b, d.Prev)
	for _, as := range [][]stack.Address{d.Joined, d.Left} {
		b = wire.AppendUvarint(b, uint64(len(as)))
		for _, a := range as {
			b = stack.AppendAddress(b, a)
		}
	}
	return b
}

func readDelta(r *wire.Reader) *Delta {
	d := &Delta{ID: stack.ReadViewID(r), Prev: stack.ReadViewID(r)}
	for _, as := range []*[]stack.Address{&d.Joined, &d.Left} {
		n := r.Uvarint()
		if r.Err() != nil {
			return nil
		}
		if n > maxDeltaMembers || n*stack.AddressSize > uint64(r.Len()) {
			r.Fail("delta view member count %d too large", n)
			return nil
		}
		if n == 0 {
			continue
		}
		*as = make([]stack.Address, n)
		for i := range *as {
			(*as)[i] = stack.ReadAddress(r)
		}
	}
	return d
}

func (d *Delta) String() string {
	return fmt.Sprintf("%s after %s: +%v -%v", d.ID, d.Prev, d.Joined, d.Left)
}

func sampleHeaders() []stack.Header {
	a, b := stack.NewAddress(), stack.NewAddress()
	v := stack.NewView(a, 4, a, b)
	mv := stack.NewMergeView(a, 7, []stack.Address{a, b}, []*stack.View{stack.NewView(a, 5, a), stack.NewView(b, 6, b)})
	d := stack.Digest{{Member: a, HighestDelivered: 3, HighestReceived: 5}, {Member: b}}
	mid := MergeID{Leader: a, N: 2}
	return []stack.Header{
		&Header{Type: typeJoinReq},
		&Header{Type: typeJoinReq, State: true},
		&Header{Type: typeJoinRsp, View: v, Digest: d},
		&Header{Type: typeJoinRsp, View: v, Digest: stack.Digest{}},
		&Header{Type: typeJoinRsp, Coord: b, Fail: "not the coordinator"},
		&Header{Type: typeView, View: v},
		&Header{Type: typeView, Delta: &Delta{ID: stack.ViewID{Creator: a, Seq: 5}, Prev: v.ID, Joined: []stack.Address{stack.NewAddress()}, Left: []stack.Address{b}}},
		&Header{Type: typeView, Delta: &Delta{ID: stack.ViewID{Creator: a, Seq: 5}, Prev: v.ID}},
		&Header{Type: typeViewAck, ViewID: v.ID},
		&Header{Type: typeGetView, ViewID: v.ID},
		&Header{Type: typeLeaveReq},
		&Header{Type: typeLeaveReq, Fail: declinedJoin, ViewID: v.ID},
		&Header{Type: typeLeaveRsp},
		&Header{Type: typeMergeReq, MergeID: mid},
		&Header{Type: typeMergeRsp, MergeID: mid, View: v, Digest: d},
		&Header{Type: typeMergeRsp, MergeID: mid, Fail: "busy"},
		&Header{Type: typeInstallView, MergeID: mid, View: mv, Digest: d},
		&Header{Type: typeCancelMerge, MergeID: mid},
		&Header{Type: typePart, Part: Part{Of: typeJoinRsp, ID: 1 << 63, Index: 2, Count: 3}},
	}
}

// Membership classifies the message for a layer that guards membership
// (AUTH): joins, merges and views to install need a proven sender.
func (h *Header) Membership() stack.MembershipKind {
	t := h.Type
	if t == typePart {
		t = h.Part.Of // a part is guarded as the message it is part of
	}
	switch t {
	case typeJoinReq:
		return stack.MembershipJoinRequest
	case typeMergeReq, typeMergeRsp:
		return stack.MembershipMerge
	case typeInstallView:
		return stack.MembershipInstall
	}
	return stack.MembershipOther
}

var _ stack.MembershipHeader = (*Header)(nil)
