package stack

import (
	"io"
	"net/netip"
	"time"
)

// Event is a control event travelling the stack (DownEvent, UpEvent). Each
// kind is a struct type of its own, named Ev...; a layer handles the kinds
// it knows in a type switch and passes the others on. A protocol may define
// events of its own; one that answers embeds Answers (see Query).
type Event any

// EvConnect (down): join Cluster. Returns when the member has its first
// view, or an error.
type EvConnect struct {
	Cluster string
}

// EvConnectWithState (down): join Cluster as EvConnect does, and fetch the
// application's state from StateFrom (zero: the coordinator); with FLUSH,
// inside the flush that installs the member's first view
// (Channel.ConnectWithState).
type EvConnectWithState struct {
	Cluster   string
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

// EvGetDigest (down): query the reliable-multicast layer for its Digest.
type EvGetDigest struct{ Answers[Digest] }

// EvSetDigest (down): start each listed sender's table after its highest
// delivered seqno (joiners, flush).
type EvSetDigest struct{ Digest Digest }

// EvFindMembers (down): ask discovery who is out there (never the local
// member).
type EvFindMembers struct {
	Answers[[]MemberInfo]
	Timeout time.Duration // how long to collect answers; 0: discovery's own timeout
	// BreakOnCoord returns as soon as a coordinator answers.
	BreakOnCoord bool
}

// EvGetPhysicalAddress (down): query the transport for Member's network
// address; the zero AddrPort if it does not know it.
type EvGetPhysicalAddress struct {
	Answers[netip.AddrPort]
	Member Address
}

// EvGetLocalPhysicalAddress (down): query the transport for this member's
// own network address; the zero AddrPort if it has none.
type EvGetLocalPhysicalAddress struct{ Answers[netip.AddrPort] }

// EvAddPhysicalAddress (down): discovery teaches the transport that
// Logical listens at Physical.
type EvAddPhysicalAddress struct {
	Logical  Address
	Physical netip.AddrPort
}

// EvWhoHas (up): the transport needs the physical address of Member.
type EvWhoHas struct{ Member Address }

// EvStartFlush (down from the channel): the application's flush. Block the
// group's multicasts and have every participant deliver the same messages;
// returns when the group is flushed, or an error.
type EvStartFlush struct {
	// Participants are the members to block; nil: the current view.
	Participants []Address
}

// EvStopFlush (down from the channel): end the application's flush round
// this member started; returns when every participant has unblocked. It
// never ends a view change's round.
type EvStopFlush struct{}

// EvStartViewChangeFlush (up from the membership layer): the flush before a
// view change, which takes precedence over an application's flush. Answers
// which participants the round went on without.
type EvStartViewChangeFlush struct {
	Answers[FlushResult]
	// Participants are the members to block; nil: the current view.
	Participants []Address
	// Merge: the participants come from several views (a merge); every one
	// of them is awaited, not only those in the initiator's view.
	Merge bool
}

// EvStopViewChangeFlush (up from the membership layer): end the view
// change's round; returns when every participant has unblocked. It never
// ends an application's round.
type EvStopViewChangeFlush struct {
	// Participants are joiners the stop reaches too.
	Participants []Address
	// AwaitState: joiners that fetch the state inside this round
	// (Channel.ConnectWithState); the group stays blocked until they have.
	AwaitState []Address
	// View: the view the round installed. Participants unblock only once
	// they have it; a member not in it (a coordinator that leaves) delivers
	// nothing more of what the round held, all of it sent in a view it is
	// not in.
	View *View
}

// FlushResult answers EvStartViewChangeFlush. Without lists the
// participants the round went on without (they did not answer in time):
// they took no part in the cut, so the view that follows must not contain
// them.
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
// IP multicast; nil if it cannot say.
type EvKnownMembers struct{ Answers[[]Address] }

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
// multicast layer answers its Digest and holds every other sender at what
// it has delivered from it: an EvReconcile lets each go up to the round's
// target, and the rest (sent in the next view) waits until EvReleaseHold,
// which FLUSH sends only once this member has the new view. Internal
// messages pass a hold, in their seqno order.
type EvHold struct{ Answers[Digest] }

// EvReleaseHold (down): the flush ended; every hold ends.
type EvReleaseHold struct{}

// EvJoinRefused (up): a layer below the membership protocol (AUTH) learned
// that the member this one asked to join (By) refused it for Reason, which
// joining again cannot change; the join ends with the reason.
type EvJoinRefused struct {
	By     Address
	Reason error
}
