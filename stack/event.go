package stack

import (
	"io"
	"net/netip"
	"time"
)

// Event is a control event travelling the stack (DownEvent, UpEvent). Each
// kind is a struct type of its own, named Ev...; a layer handles the kinds
// it knows in a type switch and passes the others on. A protocol may define
// events of its own: any type with an EventName.
type Event interface {
	// EventName is the event's name in logs and traces (VIEW_CHANGE).
	EventName() string
}

// EvConnect (down): join Cluster. Returns when the member has its first
// view, or an error. With State (Channel.ConnectWithState) the member
// fetches the state from StateFrom (zero: the coordinator) inside the flush
// that installs its first view.
type EvConnect struct {
	Cluster   string
	State     bool
	StateFrom Address
}

// EvDisconnect (down): leave the cluster gracefully.
type EvDisconnect struct{}

// EvViewChange (down from the membership layer, and up): View is
// installed. Each layer sees it once in each direction.
type EvViewChange struct{ View *View }

// EvSuspect (up): Members are suspected of having crashed.
type EvSuspect struct{ Members []Address }

// EvUnsuspect (up): a suspected Member is alive again.
type EvUnsuspect struct{ Member Address }

// EvBlock (up): the group is about to flush; the application should stop
// sending until EvUnblock.
type EvBlock struct{}

// EvUnblock (up): the flush ended; sends are allowed again.
type EvUnblock struct{}

// EvGetDigest (down): query the reliable-multicast layer. Returns a Digest.
type EvGetDigest struct{}

// EvSetDigest (down): start each listed sender's table after its highest
// delivered seqno (joiners, flush).
type EvSetDigest struct{ Digest Digest }

// EvFindMembers (down): ask discovery who is out there. Returns
// []MemberInfo (never the local member).
type EvFindMembers struct {
	Timeout time.Duration // how long to collect answers; 0: discovery's own timeout
	// BreakOnCoord returns as soon as a coordinator answers.
	BreakOnCoord bool
}

// EvGetPhysicalAddress (down): query the transport for Member's network
// address (zero Member: the local one). Returns netip.AddrPort, or nil if
// unknown.
type EvGetPhysicalAddress struct{ Member Address }

// EvAddPhysicalAddress (down): discovery teaches the transport that
// Logical listens at Physical.
type EvAddPhysicalAddress struct {
	Logical  Address
	Physical netip.AddrPort
}

// EvWhoHas (up): the transport needs the physical address of Member.
type EvWhoHas struct{ Member Address }

// EvStartFlush (down from the channel, up from GMS): block the group's
// multicasts and have every participant deliver the same messages. Returns
// when the group is flushed (a view change's round: a FlushResult), or an
// error.
type EvStartFlush struct {
	// Participants are the members to block; nil: the current view.
	Participants []Address
	// ViewChange marks GMS's flush before a view change; such a round takes
	// precedence over an application's flush.
	ViewChange bool
	// Merge (with ViewChange): the participants come from several views (a
	// merge); every one of them is awaited, not only those in the
	// initiator's view.
	Merge bool
}

// EvStopFlush (down from the channel, up from GMS): end this member's
// flush round; returns when every participant has unblocked.
type EvStopFlush struct {
	// Participants are the members to unblock; nil: the current view. A
	// stop also reaches joiners listed here.
	Participants []Address
	// ViewChange: a stop ends only a round of its own kind; GMS's stop never
	// ends the application's round.
	ViewChange bool
	// AwaitState: joiners that fetch the state inside this round
	// (Channel.ConnectWithState); the group stays blocked until they have.
	AwaitState []Address
	// View: the view the round installed. Participants unblock only once
	// they have it; a member not in it (a coordinator that leaves) delivers
	// nothing more of what the round held, all of it sent in a view it is
	// not in.
	View *View
}

// FlushResult is what a view change's EvStartFlush returns. Without lists
// the participants the round went on without (they did not answer in
// time): they took no part in the cut, so the view that follows must not
// contain them.
type FlushResult struct {
	Without []Address
}

// EvGetState (down): fetch the application's state from From (zero: the
// coordinator). Returns when SetState has returned.
type EvGetState struct{ From Address }

// EvStable (down): every member has delivered up to Digest's seqnos;
// reliable-multicast layers purge them.
type EvStable struct{ Digest Digest }

// EvSendToPhysical (down): the transport sends Msg to the network address
// To, whose member is not known yet (static discovery). Transports without
// network addresses return ErrNotSupported.
type EvSendToPhysical struct {
	To  netip.AddrPort
	Msg *Message
}

// EvMerge (up): MERGE3 found other subgroups; the membership protocol
// merges them. Coords lists their coordinators, this member (the merge
// leader) first.
type EvMerge struct{ Coords []Address }

// EvKnownMembers (down): the transport lists every member it can reach by
// unicast (its address cache), so MERGE3 can reach other subgroups without
// IP multicast. Returns []Address, or nil if it cannot say.
type EvKnownMembers struct{}

// EvReconcile (down): deliver, from each sender in Target, everything up to
// its entry's highest seqno (fetching what is missing). From[i], when set,
// is a member known to hold Target[i]'s messages; the reliable-multicast
// layer asks it directly, because the sender may be gone. A sender held by
// EvHold is let go up to its target and no further.
type EvReconcile struct {
	Target Digest
	From   []Address
}

// EvProvideState (up, to the channel): write the application's state to W.
// Returns the StateHandler's error.
type EvProvideState struct{ W io.Writer }

// EvApplyState (up, to the channel): read the application's state from R.
// Returns the StateHandler's error.
type EvApplyState struct{ R io.Reader }

// EvViewInconsistent (up): MERGE3 heard members of this coordinator's own
// view announce another view id than its own (they missed a view, for
// example the last one a leaving coordinator sent, or installed one this
// coordinator never saw). Members Behind get the current view again; Above,
// a view id's sequence number this coordinator never installed, at or above
// its own, makes it install a new view above it, so every member's views
// move forward to one.
type EvViewInconsistent struct {
	Behind []Address // announced an older view
	Above  uint64    // 0: none
}

// EvRecallSenders (down): a layer closed its gate (FLUSH blocking); senders
// waiting in a layer below (for flow-control credits) give their message
// back with ErrNotSent and wait at that gate instead, so the layer can
// drain what passed it. Until EvReleaseSenders.
type EvRecallSenders struct{}

// EvReleaseSenders (down): the gate is open again; senders below wait as
// usual.
type EvReleaseSenders struct{}

// EvHold (down): a flush before a view change begins. The reliable-
// multicast layer returns its Digest and holds every other sender at what
// it has delivered from it: an EvReconcile lets each go up to the round's
// target, and the rest (sent in the next view) waits until EvReleaseHold,
// which FLUSH sends only once this member has the new view. Internal
// messages pass a hold, in their seqno order.
type EvHold struct{}

// EvReleaseHold (down): the flush ended; every hold ends.
type EvReleaseHold struct{}

// EvJoinRefused (up): a layer below the membership protocol (AUTH) learned
// that the member this one asked to join (By) refused it for Reason, which
// joining again cannot change; the join ends with the reason.
type EvJoinRefused struct {
	By     Address
	Reason error
}

// EventName returns "CONNECT".
func (EvConnect) EventName() string { return "CONNECT" }

// EventName returns "DISCONNECT".
func (EvDisconnect) EventName() string { return "DISCONNECT" }

// EventName returns "VIEW_CHANGE".
func (EvViewChange) EventName() string { return "VIEW_CHANGE" }

// EventName returns "SUSPECT".
func (EvSuspect) EventName() string { return "SUSPECT" }

// EventName returns "UNSUSPECT".
func (EvUnsuspect) EventName() string { return "UNSUSPECT" }

// EventName returns "BLOCK".
func (EvBlock) EventName() string { return "BLOCK" }

// EventName returns "UNBLOCK".
func (EvUnblock) EventName() string { return "UNBLOCK" }

// EventName returns "GET_DIGEST".
func (EvGetDigest) EventName() string { return "GET_DIGEST" }

// EventName returns "SET_DIGEST".
func (EvSetDigest) EventName() string { return "SET_DIGEST" }

// EventName returns "FIND_MBRS".
func (EvFindMembers) EventName() string { return "FIND_MBRS" }

// EventName returns "GET_PHYSICAL_ADDRESS".
func (EvGetPhysicalAddress) EventName() string { return "GET_PHYSICAL_ADDRESS" }

// EventName returns "ADD_PHYSICAL_ADDRESS".
func (EvAddPhysicalAddress) EventName() string { return "ADD_PHYSICAL_ADDRESS" }

// EventName returns "WHO_HAS".
func (EvWhoHas) EventName() string { return "WHO_HAS" }

// EventName returns "START_FLUSH".
func (EvStartFlush) EventName() string { return "START_FLUSH" }

// EventName returns "STOP_FLUSH".
func (EvStopFlush) EventName() string { return "STOP_FLUSH" }

// EventName returns "GET_STATE".
func (EvGetState) EventName() string { return "GET_STATE" }

// EventName returns "STABLE".
func (EvStable) EventName() string { return "STABLE" }

// EventName returns "SEND_TO_PHYSICAL".
func (EvSendToPhysical) EventName() string { return "SEND_TO_PHYSICAL" }

// EventName returns "MERGE".
func (EvMerge) EventName() string { return "MERGE" }

// EventName returns "KNOWN_MEMBERS".
func (EvKnownMembers) EventName() string { return "KNOWN_MEMBERS" }

// EventName returns "RECONCILE".
func (EvReconcile) EventName() string { return "RECONCILE" }

// EventName returns "PROVIDE_STATE".
func (EvProvideState) EventName() string { return "PROVIDE_STATE" }

// EventName returns "APPLY_STATE".
func (EvApplyState) EventName() string { return "APPLY_STATE" }

// EventName returns "VIEW_INCONSISTENT".
func (EvViewInconsistent) EventName() string { return "VIEW_INCONSISTENT" }

// EventName returns "RECALL_SENDERS".
func (EvRecallSenders) EventName() string { return "RECALL_SENDERS" }

// EventName returns "RELEASE_SENDERS".
func (EvReleaseSenders) EventName() string { return "RELEASE_SENDERS" }

// EventName returns "HOLD".
func (EvHold) EventName() string { return "HOLD" }

// EventName returns "RELEASE_HOLD".
func (EvReleaseHold) EventName() string { return "RELEASE_HOLD" }

// EventName returns "JOIN_REFUSED".
func (EvJoinRefused) EventName() string { return "JOIN_REFUSED" }
