package flush

import (
	"slices"

	"github.com/strata-go/strata/stack"
)

// A participant's decisions: what it does with a START_FLUSH and with a
// STOP_FLUSH or ABORT (the participant's state machine, participant.go,
// acts on them). They take the state they need and return the answer; no
// locks, sends or clocks, so they are tested directly (decide_test.go).

// startAction is what a participant does with a START_FLUSH.
type startAction uint8

const (
	// startTake: block for the new round (no round is on).
	startTake startAction = iota
	// startOver: the round is over already (its STOP_FLUSH or ABORT
	// overtook the start); ignore it.
	startOver
	// startAgain: the start of the current round, again (the initiator
	// resent it): answer COMPLETED again.
	startAgain
	// startSupersede: the new round takes the current one's place; the
	// current initiator gets NOT_COMPLETED.
	startSupersede
	// startRefuse: the current round stays; the new initiator gets
	// NOT_COMPLETED.
	startRefuse
)

// onStart decides what a participant blocked for cur (nil: none) does with
// the start h, given the number of the last round of h's initiator that
// ended here (done).
func onStart(h *Header, cur *partRound, done uint64) startAction {
	switch {
	case h.Round.N <= done:
		return startOver
	case cur == nil:
		return startTake
	case cur.id == h.Round:
		return startAgain
	case supersedes(h, cur):
		return startSupersede
	}
	return startRefuse
}

// supersedes reports whether round n takes the place of cur at a
// participant: a newer round of the same initiator; a view-change round
// over an application's round, or over a view-change round whose initiator
// it leaves out (the coordinator crashed or left); between two application
// rounds, the initiator with the lower address wins, so colliding
// initiators never livelock.
func supersedes(n *Header, cur *partRound) bool {
	switch {
	case n.Round.Initiator == cur.id.Initiator:
		return n.Round.N > cur.id.N
	case n.ViewChange && !cur.vc:
		return true
	case n.ViewChange && cur.vc:
		return !slices.Contains(n.Participants, cur.id.Initiator)
	case !n.ViewChange && !cur.vc:
		return n.Round.Initiator.Compare(cur.id.Initiator) < 0
	}
	return false
}

// stopAction is what a participant does with a STOP_FLUSH or an ABORT.
type stopAction uint8

const (
	// stopIgnore: not this member's round (an old one, or another
	// initiator's); it only answers UNBLOCKED.
	stopIgnore stopAction = iota
	// stopUnblock: the round ends here; release what it held and open the
	// gate.
	stopUnblock
	// stopAwaitView: the stop names a view this member does not have yet;
	// it stays blocked until that view comes.
	stopAwaitView
	// stopAbortViewChange: a view change's round was abandoned; the member
	// may send again but delivers nothing more of the others until a view
	// comes (it may not be in the next one).
	stopAbortViewChange
)

// onStop decides what a participant blocked for cur (nil: none; joining: it
// is joining and blocked since it asked) with view does with the stop or
// abort h.
func onStop(h *Header, cur *partRound, joining bool, view *stack.View) stopAction {
	mine := cur != nil && cur.id == h.Round
	joiner := cur == nil && joining
	switch {
	case !mine && !joiner:
		return stopIgnore
	case h.Type == typeStop && h.View.Seq > 0 && (view == nil || view.ID.Seq < h.View.Seq):
		return stopAwaitView
	case mine && h.Type == typeAbort && cur.vc:
		return stopAbortViewChange
	}
	return stopUnblock
}
