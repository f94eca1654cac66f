package stack

import (
	"fmt"
	"net/netip"
	"time"
)

// PhysicalMapping ties a member's logical address to the network address
// its transport listens on; discovery passes it down in
// EvAddPhysicalAddress.
type PhysicalMapping struct {
	Logical  Address
	Physical netip.AddrPort
}

// ViewInconsistency is what MERGE3 found among the members of its
// coordinator's own view (EvViewInconsistent): members behind get the
// current view again; a view id this coordinator never installed, at or
// above its own sequence number, makes it install a new view above it, so
// every member's views move forward to one.
type ViewInconsistency struct {
	Behind []Address // announced an older view
	Above  uint64    // highest sequence number of a view id, not older than the current one, that this coordinator never installed (0: none)
}

// MemberInfo is what discovery learns of one member: its addresses, its
// name, and the coordinator it knows. EvFindMembers returns a list of them.
type MemberInfo struct {
	Addr     Address
	Name     string
	Physical netip.AddrPort // invalid when the transport has none (SIM)
	Coord    Address        // the coordinator of its view; zero if it has none
	IsServer bool           // it is a member of a view (not still joining)
}

// maxMemberName bounds a logical name on the wire.
const maxMemberName = 255

// AppendMemberInfo appends mi's encoding (discovery and MERGE3 send it).
func AppendMemberInfo(b []byte, mi MemberInfo) []byte {
	b = AppendAddress(b, mi.Addr)
	b = AppendString(b, mi.Name)
	b = AppendAddrPort(b, mi.Physical)
	b = AppendBool(b, mi.IsServer)
	if mi.IsServer {
		b = AppendAddress(b, mi.Coord)
	}
	return b
}

// MemberInfoSize returns the encoded length of mi.
func MemberInfoSize(mi MemberInfo) int {
	n := AddressSize + UvarintSize(uint64(len(mi.Name))) + len(mi.Name) + AddrPortSize(mi.Physical) + 1
	if mi.IsServer {
		n += AddressSize
	}
	return n
}

// ReadMemberInfo reads a MemberInfo written by AppendMemberInfo.
func ReadMemberInfo(r *Reader) MemberInfo {
	mi := MemberInfo{Addr: r.Address(), Name: r.String(maxMemberName, "logical name"), Physical: r.AddrPort(), IsServer: r.Bool()}
	if mi.IsServer {
		mi.Coord = r.Address()
	}
	return mi
}

// IsCoord reports whether the member says it is the coordinator of its view.
func (mi MemberInfo) IsCoord() bool { return mi.IsServer && mi.Coord == mi.Addr }

// FindMembers is the argument of EvFindMembers.
type FindMembers struct {
	Timeout time.Duration // how long to collect answers; 0: discovery's own timeout
	// BreakOnCoord returns as soon as a coordinator answers.
	BreakOnCoord bool
}

// PhysicalSend is the argument of EvSendToPhysical: one message to a
// network address whose member is not known yet (static discovery).
type PhysicalSend struct {
	To  netip.AddrPort
	Msg *Message
}

// FlushRequest is the argument of EvStartFlush and EvStopFlush.
type FlushRequest struct {
	// Participants are the members to block (start) or unblock (stop); nil:
	// the current view. A stop also reaches joiners listed here.
	Participants []Address
	// ViewChange marks GMS's flush before a view change; such a round takes
	// precedence over an application's flush. A stop ends only a round of
	// its own kind: GMS's stop never ends the application's round.
	ViewChange bool
	// Merge (start, with ViewChange): the participants come from several
	// views (a merge); every one of them is awaited, not only those in
	// the initiator's view.
	Merge bool
	// AwaitState (stop): joiners that fetch the state inside this round
	// (Channel.ConnectWithState); the group stays blocked until they have.
	AwaitState []Address
	// View (stop): the view the round installed. Participants unblock only
	// once they have it; a member not in it (a coordinator that leaves)
	// delivers nothing more of what the round held, all of it sent in a
	// view it is not in.
	View *View
}

// FlushResult is what a view-change EvStartFlush returns. Without lists the
// participants the round went on without (they did not answer in time): they
// took no part in the cut, so the view that follows must not contain them.
type FlushResult struct {
	Without []Address
}

// ConnectRequest is EvConnect's argument: join Cluster and, with State
// (Channel.ConnectWithState), fetch the state from StateFrom (zero: the
// coordinator) inside the flush that installs the first view.
type ConnectRequest struct {
	Cluster   string
	State     bool
	StateFrom Address
}

// EventType names a control event. Core events are below UserEvent;
// protocols that define events of their own number them from UserEvent up
// (and say so in ids.go comments of their package).
type EventType int

// Core control events. Arg types are listed with each.
const (
	// EvConnect (down): join the cluster. Arg: ConnectRequest. Returns
	// when the member has its first view, or an error.
	EvConnect EventType = iota + 1
	// EvDisconnect (down): leave the cluster gracefully.
	EvDisconnect
	// EvViewChange (down and up): a new view is installed. Arg: *View.
	EvViewChange
	// EvSuspect (up): members are suspected. Arg: []Address.
	EvSuspect
	// EvUnsuspect (up): a suspected member is alive again. Arg: Address.
	EvUnsuspect
	// EvBlock (up): the group is about to flush; the application should stop
	// sending until EvUnblock.
	EvBlock
	// EvUnblock (up): the flush ended; sends are allowed again.
	EvUnblock
	// EvGetDigest (down): query the reliable-multicast layer. Returns a
	// Digest.
	EvGetDigest
	// EvSetDigest (down): start each listed sender's table after its
	// highest delivered seqno (joiners, flush). Arg: Digest.
	EvSetDigest
	// EvFindMembers (down): ask discovery who is out there. Arg:
	// FindMembers. Returns []MemberInfo (never the local member).
	EvFindMembers
	// EvGetPhysicalAddress (down): query the transport. Arg: Address (zero:
	// the local member). Returns netip.AddrPort, or nil if unknown.
	EvGetPhysicalAddress
	// EvAddPhysicalAddress (down): discovery teaches the transport a
	// mapping. Arg: PhysicalMapping.
	EvAddPhysicalAddress
	// EvWhoHas (up): the transport needs the physical address of a member.
	// Arg: Address.
	EvWhoHas
	// EvStartFlush (down from the channel, up from GMS): block the group's
	// multicasts and have every participant deliver the same messages. Arg:
	// FlushRequest or nil. Returns when the group is flushed, or an error.
	EvStartFlush
	// EvStopFlush (down from the channel, up from GMS): end this member's
	// flush round; returns when every participant has unblocked. Arg:
	// FlushRequest or nil.
	EvStopFlush
	// EvGetState (down): fetch the application's state from a member. Arg:
	// Address (zero: the coordinator). Returns when SetState has returned.
	EvGetState
	// EvStable (down): every member has delivered up to the given seqnos;
	// reliable-multicast layers purge them. Arg: Digest.
	EvStable
	// EvSendToPhysical (down): the transport sends one message to a network
	// address. Arg: PhysicalSend. Transports without network addresses
	// return ErrNotSupported.
	EvSendToPhysical
	// EvMerge (up): MERGE3 found other subgroups whose coordinators are
	// listed; the membership protocol merges them. Arg: []Address (this
	// member, the merge leader, first).
	EvMerge
	// EvKnownMembers (down): the transport lists every member it can reach
	// by unicast (its address cache), so MERGE3 can reach other subgroups
	// without IP multicast. Returns []Address, or nil if it cannot say.
	EvKnownMembers
	// EvReconcile (down): wait until this member has delivered, from every
	// listed sender, everything up to the given highest seqno (fetching
	// what it lacks). Arg: Reconcile.
	EvReconcile
	// EvProvideState (up, to the channel): write the application's state.
	// Arg: io.Writer. Returns the StateHandler's error.
	EvProvideState
	// EvApplyState (up, to the channel): read the application's state. Arg:
	// io.Reader. Returns the StateHandler's error.
	EvApplyState
	// EvViewInconsistent (up): MERGE3 heard members of this coordinator's
	// own view announce another view id than its own (they missed a view,
	// for example the last one a leaving coordinator sent, or installed one
	// this coordinator never saw). Arg: ViewInconsistency.
	EvViewInconsistent
	// EvRecallSenders (down): a layer closed its gate (FLUSH blocking);
	// senders waiting in a layer below (for flow-control credits) give
	// their message back with ErrNotSent and wait at that gate instead, so
	// the layer can drain what passed it. Until EvReleaseSenders.
	EvRecallSenders
	// EvReleaseSenders (down): the gate is open again; senders below wait
	// as usual.
	EvReleaseSenders
	// EvHold (down): a flush before a view change begins. The reliable-
	// multicast layer returns its Digest and holds every other sender at
	// what it has delivered from it: an EvReconcile lets each go up to the
	// round's target, and the rest (sent in the next view) waits until
	// EvReleaseHold, which FLUSH sends only once this member has the new
	// view. Internal messages pass a hold, in their seqno order.
	EvHold
	// EvReleaseHold (down): the flush ended; every hold ends.
	EvReleaseHold
	// EvJoinRefused (up): a layer below the membership protocol (AUTH)
	// learned that this member's join was refused for good; the join ends
	// with the reason. Arg: JoinRefused.
	EvJoinRefused

	// UserEvent is the first number free for protocol-defined events.
	UserEvent EventType = 1000
)

var eventNames = map[EventType]string{
	EvConnect: "CONNECT", EvDisconnect: "DISCONNECT", EvViewChange: "VIEW_CHANGE",
	EvSuspect: "SUSPECT", EvUnsuspect: "UNSUSPECT", EvBlock: "BLOCK", EvUnblock: "UNBLOCK",
	EvGetDigest: "GET_DIGEST", EvSetDigest: "SET_DIGEST", EvFindMembers: "FIND_MBRS",
	EvGetPhysicalAddress: "GET_PHYSICAL_ADDRESS", EvAddPhysicalAddress: "ADD_PHYSICAL_ADDRESS",
	EvWhoHas: "WHO_HAS", EvStartFlush: "START_FLUSH", EvStopFlush: "STOP_FLUSH",
	EvGetState: "GET_STATE", EvStable: "STABLE", EvHold: "HOLD", EvReleaseHold: "RELEASE_HOLD", EvJoinRefused: "JOIN_REFUSED",
	EvSendToPhysical: "SEND_TO_PHYSICAL", EvMerge: "MERGE", EvKnownMembers: "KNOWN_MEMBERS",
	EvReconcile: "RECONCILE", EvProvideState: "PROVIDE_STATE", EvApplyState: "APPLY_STATE",
	EvViewInconsistent: "VIEW_INCONSISTENT", EvRecallSenders: "RECALL_SENDERS", EvReleaseSenders: "RELEASE_SENDERS",
}

func (t EventType) String() string {
	if n, ok := eventNames[t]; ok {
		return n
	}
	return fmt.Sprintf("EVENT(%d)", int(t))
}

// Event is a control event: a type and an argument whose type the event
// type documents.
type Event struct {
	Type EventType
	Arg  any
}

// Ev builds an event.
func Ev(t EventType, arg any) Event { return Event{Type: t, Arg: arg} }

func (e Event) String() string {
	if e.Arg == nil {
		return e.Type.String()
	}
	return fmt.Sprintf("%s(%v)", e.Type, e.Arg)
}
