package flush

import (
	"log/slog"
	"time"

	"github.com/strata-go/strata/stack"
)

// participant is a member's side of FLUSH rounds as a state machine. Each
// input (a START_FLUSH, RECONCILE, STOP_FLUSH or ABORT; a view known or
// delivered; Connect and Disconnect; time passing) is a method that changes
// the state and returns what to do, in order, as effects. It holds no lock,
// starts no goroutine and reads no clock: FLUSH (io.go) calls it under its
// lock with the time and then carries the effects out, one transition at a
// time. participant_test.go drives it directly.
type participant struct {
	timeout time.Duration // the safety valve's: longest a member stays blocked
	count   *counters

	view *stack.View
	cur  *partRound // the round this member is blocked for
	// stopWait: a STOP_FLUSH that came before the view its round
	// installed; it takes effect when that view is delivered.
	stopWait *Header
	// joining: blocked since Connect, until the flush that installs the
	// joiner's view stops.
	joining     bool
	blockCalled bool
	since       time.Time // blocked since
	// heldSince: an aborted view-change round left NAKACK's hold on, since.
	heldSince time.Time
	// done: per initiator, its rounds up to N have ended here.
	done map[stack.Address]uint64
	// left: this member is not in the view its last round installed (it
	// is a leaving coordinator); what the round held is never released.
	left bool
}

// partRound is the round a participant is blocked for.
type partRound struct {
	id     RoundID
	vc     bool
	parts  []stack.Address
	from   stack.ViewID // this member's view when the round started
	warned bool         // the safety valve said it waits for the view
	asked  time.Time    // when it last asked the initiator whether the round is on
}

// String names the round, for logs.
func (r *partRound) String() string {
	if r == nil {
		return "none"
	}
	return r.id.String()
}

// An effect is one thing the participant asks FLUSH to do.
type effect interface{ isEffect() }

// sendMsg sends a flush message.
type sendMsg struct {
	to stack.Address
	h  *Header
}

// blockGate closes the gate to the application's multicasts and returns
// when none is on its way down; call: Receiver.Block first.
type blockGate struct{ call bool }

// answerCompleted takes this member's digest (holding every sender at what
// it delivered, before a view change) and answers FLUSH_COMPLETED with it.
type answerCompleted struct {
	to    stack.Address
	round RoundID
	hold  bool
}

// fetchMissing fetches and delivers what a RECONCILE names, then answers
// RECONCILE_OK.
type fetchMissing struct {
	to stack.Address
	h  *Header
}

// releaseHold ends the hold a view-change round put on every sender.
type releaseHold struct{}

// openGate lets the senders waiting below go and opens the gate; call:
// Receiver.Unblock after; joined: the joiner's Connect may return.
type openGate struct{ call, joined bool }

// logLine is a line for FLUSH's log.
type logLine struct {
	level slog.Level
	msg   string
	args  []any
}

func (sendMsg) isEffect()         {}
func (blockGate) isEffect()       {}
func (answerCompleted) isEffect() {}
func (fetchMissing) isEffect()    {}
func (releaseHold) isEffect()     {}
func (openGate) isEffect()        {}
func (logLine) isEffect()         {}

func newParticipant(timeout time.Duration, c *counters) participant {
	return participant{timeout: timeout, count: c, done: map[stack.Address]uint64{}}
}

// reset forgets everything (Start).
func (p *participant) reset() {
	*p = participant{timeout: p.timeout, count: p.count, done: p.done}
	clear(p.done)
}

// start takes a START_FLUSH from src. Only a round's initiator starts,
// reconciles and ends it: anything else is forged or stray.
func (p *participant) start(src stack.Address, h *Header, now time.Time) []effect {
	if src != h.Round.Initiator {
		return nil
	}
	var old *partRound
	switch onStart(h, p.cur, p.done[src]) {
	case startOver:
		p.count.lateStarts.Add(1)
		return nil
	case startAgain:
		return []effect{answerCompleted{to: src, round: h.Round, hold: p.cur.vc}}
	case startRefuse:
		return []effect{sendMsg{to: src, h: &Header{Type: typeNotCompleted, Round: h.Round}}}
	case startSupersede:
		old = p.cur
	}
	cur := &partRound{id: h.Round, vc: h.ViewChange, parts: h.Participants}
	if p.view != nil {
		cur.from = p.view.ID
	}
	p.cur = cur
	var out []effect
	if old != nil {
		p.count.superseded.Add(1)
		out = append(out, sendMsg{to: old.id.Initiator, h: &Header{Type: typeNotCompleted, Round: old.id}})
	}
	out = append(out, p.block(now)...)
	return append(out, answerCompleted{to: src, round: h.Round, hold: cur.vc})
}

// block closes the gate; Receiver.Block is called once per blocked period.
func (p *participant) block(now time.Time) []effect {
	call := !p.blockCalled
	p.blockCalled = true
	if p.since.IsZero() {
		p.since = now
	}
	return []effect{logLine{slog.LevelDebug, "flush: blocking", []any{"round", p.cur.String()}}, blockGate{call: call}}
}

// reconcile takes a RECONCILE from src: the round's participants fetch
// what anyone received.
func (p *participant) reconcile(src stack.Address, h *Header) []effect {
	if src != h.Round.Initiator || p.cur == nil || p.cur.id != h.Round {
		return nil
	}
	return []effect{fetchMissing{to: src, h: h}}
}

// stop takes a STOP_FLUSH or an ABORT from src.
func (p *participant) stop(src stack.Address, h *Header, now time.Time) []effect {
	if src != h.Round.Initiator {
		return nil
	}
	if h.Round.N > p.done[src] {
		p.done[src] = h.Round.N
	}
	var out []effect
	switch onStop(h, p.cur, p.joining, p.view) {
	case stopAwaitView:
		// The view this round installed has not reached this member yet
		// (its copy was lost): unblocked now, it would send in the old
		// view what the others deliver in the new one. It unblocks when
		// the view comes (the safety valve bounds the wait).
		p.stopWait = h
		p.count.stopsDeferred.Add(1)
		return nil
	case stopAbortViewChange:
		// The initiator gave up on this attempt and may go on without
		// this member, which is then not in the next view. It may send
		// again, but delivers nothing beyond what it had delivered until
		// a view comes (or timeout passes): what the others send now
		// belongs to a view it may not be in.
		p.heldSince = now
		out = p.open(false, now)
	case stopUnblock:
		out = p.open(true, now)
	}
	return append(out, sendMsg{to: src, h: &Header{Type: typeUnblocked, Round: h.Round}})
}

// open ends this member's part in a round: the gate opens and
// Receiver.Unblock is called if Block was; with release, a view-change
// round's hold on every sender ends too (unless this member left).
func (p *participant) open(release bool, now time.Time) []effect {
	release = release && !p.left
	out := []effect{logLine{slog.LevelDebug, "flush: unblocking", []any{"round", p.cur.String(), "release", release}}}
	call, joined := p.blockCalled, p.joining
	p.blockCalled, p.joining = false, false
	p.cur, p.stopWait = nil, nil
	if !p.since.IsZero() {
		p.count.blockedNanos.Add(int64(now.Sub(p.since)))
		p.since = time.Time{}
	}
	if release {
		p.heldSince = time.Time{}
		out = append(out, releaseHold{})
	}
	return append(out, openGate{call: call, joined: joined})
}

// releaseHeld ends the hold an aborted view-change round left, unless a
// round has begun since (its end releases it).
func (p *participant) releaseHeld() []effect {
	held := p.cur == nil && !p.heldSince.IsZero()
	p.heldSince = time.Time{}
	if held {
		return []effect{releaseHold{}}
	}
	return nil
}

// connect blocks a joiner from the moment it asks to join.
func (p *participant) connect(now time.Time) []effect {
	p.joining = true
	return p.block(now)
}

// disconnect lets senders blocked at the gate return, but what a
// view-change round holds stays held: it was sent in a view this member is
// leaving (a leaving coordinator, say), and must not reach it.
func (p *participant) disconnect(now time.Time) []effect { return p.open(false, now) }

// awaitsView reports whether a delivered view may end something here (see
// viewDelivered); FLUSH skips the transition otherwise.
func (p *participant) awaitsView() bool {
	return p.cur != nil || p.stopWait != nil || !p.heldSince.IsZero()
}

// viewDelivered runs once the application has v: a STOP_FLUSH that waited
// for v takes effect, a hold an aborted round left ends, and a round whose
// initiator left the view ends (not before the view is delivered, or what
// the members send in the new view could reach the application first).
func (p *participant) viewDelivered(v *stack.View, self stack.Address, now time.Time) []effect {
	cur, sw := p.cur, p.stopWait
	ready := sw != nil && p.view != nil && p.view.ID.Seq >= sw.View.Seq
	held := cur == nil && !p.heldSince.IsZero()
	orphan := cur != nil && !v.Contains(cur.id.Initiator) && cur.id.Initiator != self
	var out []effect
	if ready {
		out = append(out, p.stop(sw.Round.Initiator, sw, now)...)
	}
	if held {
		out = append(out, p.releaseHeld()...)
	}
	if orphan && p.cur == cur {
		out = append(out, logLine{slog.LevelInfo, "flush: the round's initiator left the view; unblocking", []any{"round", cur.id}})
		out = append(out, p.open(true, now)...)
	}
	return out
}

// tick is the safety valve: a member blocked (or holding what an aborted
// round left) for longer than timeout unblocks itself, except in a
// view-change round whose view has not come.
func (p *participant) tick(now time.Time) []effect {
	var out []effect
	if p.cur == nil && !p.heldSince.IsZero() && now.Sub(p.heldSince) > p.timeout {
		p.count.safetyUnblocks.Add(1)
		out = append(out, logLine{slog.LevelWarn, "flush: no view within timeout after an aborted view-change round; delivering again", []any{"timeout", p.timeout}})
		out = append(out, p.releaseHeld()...)
	}
	cur := p.cur
	stuck := (cur != nil || p.joining) && !p.since.IsZero() && now.Sub(p.since) > p.timeout
	if !stuck {
		return out
	}
	// A view-change round whose view has not come: unblocked, this member
	// would send in the old view what the others deliver in the new one,
	// and deliver theirs in the old. It waits for the view (its initiator
	// resends it, or MERGE3 finds this member behind); the view ends the
	// round (STOP_FLUSH, or the initiator is not in it), or a newer round
	// takes its place.
	if cur != nil && cur.vc && p.view != nil && p.view.ID == cur.from {
		if !cur.warned {
			cur.warned = true
			p.count.viewWaits.Add(1)
			out = append(out, logLine{slog.LevelWarn, "flush: blocked for longer than timeout, but the round's view has not come; staying blocked until it does", []any{"round", cur.id, "timeout", p.timeout}})
		}
		// The round may be over without this member: its ABORT lost, or
		// its START a late copy that came after the abort, from an
		// initiator that went on without this member (whose view never
		// comes here). Every timeout it answers COMPLETED again, which
		// asks the initiator: a round that is over is told again how it
		// ended (FLUSH.answer).
		if cur.asked.IsZero() || now.Sub(cur.asked) >= p.timeout {
			cur.asked = now
			out = append(out, answerCompleted{to: cur.id.Initiator, round: cur.id})
		}
		return out
	}
	p.count.safetyUnblocks.Add(1)
	if cur != nil {
		out = append(out, logLine{slog.LevelWarn, "flush: blocked for longer than timeout without a STOP_FLUSH; unblocking", []any{"round", cur.id, "timeout", p.timeout}})
	} else {
		out = append(out, logLine{slog.LevelWarn, "flush: joined but no STOP_FLUSH within timeout (is FLUSH in every member's stack?); unblocking", []any{"timeout", p.timeout}})
	}
	return append(out, p.open(true, now)...)
}
