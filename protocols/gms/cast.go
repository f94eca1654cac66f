package gms

import (
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// castRun is one view change a coordinator carries out, a regular view or
// a merge view, as a state machine. It says who takes part in the flush
// before the view, which view the flush leaves (members it went on without
// are excluded), what to install, send and answer once the flush is over,
// what to send again to members that have not acknowledged the view, and
// how the flush ends. It holds no lock, starts no goroutine and reads no
// clock: coord.go and merge.go do the I/O between its steps (the flush,
// the digest, the waits); cast_test.go drives it directly.
type castRun struct {
	self  stack.Address
	count *counters
	prev  *stack.View // the view before nv (a regular view): its delta goes to those who hold it
	nv    *stack.View
	// merge: a merge view, sent to each member with its digest
	// (INSTALL_VIEW); the members its flush went on without are told but
	// not awaited (one from another subgroup is not watched by this
	// member's failure detection: waiting for it would keep the merged
	// group blocked until max_view_ack_wait).
	merge                 bool
	mergeID               MergeID
	joiners, stateJoiners []stack.Address
	parts                 []stack.Address // the flush's participants
	flushed               bool            // the flush completed: its round is stopped at the end
	excluded              []stack.Address // members the flush went on without
	digest                stack.Digest    // the joiners' (a regular view) or the merge view's
	msg                   *Header         // VIEW (a delta where it can be) or INSTALL_VIEW
	full                  *Header         // msg with the view in full: sent again to those that did not acknowledge it
	every, maxWait        time.Duration   // view_ack_timeout, max_view_ack_wait
	acks                  *viewAcks
}

// newCast prepares the change from view cur to nv: the members that stay
// block and deliver the same messages first; a graceful leaver blocks too,
// so that what it sent in cur reaches all or none of those that stay.
func newCast(self stack.Address, c *counters, cfg Config, cur, nv *stack.View, joiners, leaving, stateJoiners []stack.Address) *castRun {
	r := &castRun{self: self, count: c, prev: cur, nv: nv, joiners: joiners, stateJoiners: stateJoiners, every: cfg.ViewAckTimeout, maxWait: cfg.MaxViewAckWait}
	for _, m := range cur.Members {
		if nv.Contains(m) || slices.Contains(leaving, m) {
			r.parts = append(r.parts, m)
		}
	}
	return r
}

// newMergeCast prepares the install of merge view mv with digest d, after
// a flush of every subgroup that went on without the members in without.
func newMergeCast(self stack.Address, c *counters, cfg Config, id MergeID, mv *stack.View, d stack.Digest, without []stack.Address) *castRun {
	return &castRun{self: self, count: c, nv: mv, merge: true, mergeID: id, flushed: true, excluded: without, digest: d,
		every: cfg.ViewAckTimeout, maxWait: cfg.MaxViewAckWait}
}

// flushDone takes the flush's outcome. A failed flush still leads to the
// view (with a warning). Members the flush went on without did not answer,
// were unblocked and may have sent since; they are not in the cut the
// others agreed on, so keeping them would let the others deliver those
// messages in the new view: they are excluded, and merge back. Without
// FLUSH above no layer answers (ErrNotSupported): nothing to wait for.
func (r *castRun) flushDone(fr stack.FlushResult, err error) []effect {
	if errors.Is(err, stack.ErrNotSupported) {
		fr, err = stack.FlushResult{}, nil
	}
	if err != nil {
		r.count.flushFailures.Add(1)
		return []effect{logLine{slog.LevelWarn, "installing the view without a completed flush", []any{"view", r.nv, "error", err}}}
	}
	r.flushed = true
	if len(fr.Without) == 0 {
		return nil
	}
	r.nv, r.excluded = withoutUnflushed(r.nv, fr.Without)
	if len(r.excluded) == 0 {
		return nil
	}
	r.count.flushExclusions.Add(int64(len(r.excluded)))
	return []effect{logLine{slog.LevelWarn, "excluding members the flush went on without", []any{"view", r.nv, "excluded", r.excluded}}}
}

// needsDigest reports whether announce needs the joiners' digest. It is
// taken before the view is installed here or sent: a member (this one
// first) may multicast the moment it has the view, and a digest taken
// after that would start the joiners above those messages, which they
// would never deliver. (Without FLUSH a joiner may in turn deliver a few
// messages sent just before the view, as in JGroups.)
func (r *castRun) needsDigest() bool { return !r.merge && len(r.joiners) > 0 }

// announce starts the view at now: install it here (unless this
// coordinator is leaving it), send it, answer the joiners with it and d,
// and await every member's acknowledgement. An excluded member of a
// regular view is awaited too, as reliably as the members: until it
// knows, its NAKACK holds the others' next messages, which it could only
// deliver in the old view.
func (r *castRun) announce(d stack.Digest, now time.Time) []effect {
	expect := slices.DeleteFunc(slices.Clone(r.nv.Members), func(m stack.Address) bool { return m == r.self })
	if !r.merge {
		r.digest = d
		expect = append(expect, r.excluded...)
	}
	r.acks = newViewAcks(r.nv.ID, expect, now, r.every, r.maxWait)
	var out []effect
	if r.nv.Contains(r.self) {
		var vd stack.Digest
		if r.merge {
			vd = r.digest
		}
		out = append(out, installView{v: r.nv, d: vd})
	}
	if r.merge {
		r.msg = &Header{Type: typeInstallView, View: r.nv, Digest: r.digest, MergeID: r.mergeID}
		r.full = r.msg
		for _, m := range r.nv.Members {
			if m != r.self {
				out = append(out, sendMsg{to: m, h: r.msg})
			}
		}
		for _, w := range r.excluded {
			out = append(out, sendMsg{to: w, h: r.msg}) // so that they know they are out, and merge back
		}
		return out
	}
	// The members that stay hold prev: the multicast carries only who
	// joined and left. A member that lacks prev asks for the view in full
	// (GET_VIEW), and gets it anyway if it does not acknowledge; the
	// joiners get it in their answers.
	r.full = &Header{Type: typeView, View: r.nv}
	r.msg = r.full
	if d := makeDelta(r.prev, r.nv); d != nil {
		r.msg = &Header{Type: typeView, Delta: d}
		r.count.deltasSent.Add(1)
	}
	out = append(out, sendMsg{h: r.msg})
	if len(r.joiners) > 0 {
		out = append(out, rememberJoins{joiners: r.joiners, d: r.digest, view: r.nv.ID})
		for _, j := range r.joiners {
			out = append(out, sendMsg{to: j, h: r.joinRsp()})
		}
	}
	return out
}

func (r *castRun) joinRsp() *Header { return &Header{Type: typeJoinRsp, View: r.nv, Digest: r.digest} }

// tick says at now what to send again to the members that have not
// acknowledged the view, in full (a joiner ignores views until it has
// joined: it gets its answer again), or that the coordinator stops
// waiting (over).
func (r *castRun) tick(now time.Time) (out []effect, over bool) {
	missing, giveUp := r.acks.tick(now)
	if missing == nil && !giveUp {
		return nil, false // not due yet, or acknowledged meanwhile
	}
	r.count.ackTimeouts.Add(1)
	if giveUp {
		return []effect{logLine{slog.LevelWarn, "view not acknowledged by every member within max_view_ack_wait", []any{"view", r.nv.ID, "missing", missing, "max_view_ack_wait", r.maxWait}}}, true
	}
	out = append(out, logLine{slog.LevelInfo, "view not acknowledged within view_ack_timeout; sending it again", []any{"view", r.nv.ID, "missing", missing, "timeout", r.every}})
	for _, a := range missing {
		r.count.viewsResent.Add(1)
		h := r.full
		if slices.Contains(r.joiners, a) {
			h = r.joinRsp()
		}
		out = append(out, sendMsg{to: a, h: h})
	}
	return out, false
}

// finish ends the change once the view is acknowledged (or the wait gave
// up): the flush's round stops, in the new view; the joiners get their
// STOP_FLUSH last, after the state joiners fetched the state. A failed
// flush left no round to stop.
func (r *castRun) finish() []effect {
	if !r.flushed {
		return nil
	}
	if r.merge {
		return []effect{stopFlush{stack.EvStopViewChangeFlush{View: r.nv}}}
	}
	return []effect{stopFlush{stack.EvStopViewChangeFlush{Participants: r.joiners, AwaitState: r.stateJoiners, View: r.nv}}}
}

// An effect is one thing a castRun asks GMS to do.
type effect interface{ isEffect() }

// sendMsg sends a GMS message (to the zero address: to the group).
type sendMsg struct {
	to stack.Address
	h  *Header
}

// installView installs a view here, with the digest of a merge view.
type installView struct {
	v *stack.View
	d stack.Digest
}

// rememberJoins keeps the digest the joiners of a view were answered with,
// for answering again a joiner whose answer was lost.
type rememberJoins struct {
	joiners []stack.Address
	d       stack.Digest
	view    stack.ViewID
}

// stopFlush ends the view change's flush.
type stopFlush struct{ ev stack.EvStopViewChangeFlush }

// logLine is a line for GMS's log.
type logLine struct {
	level slog.Level
	msg   string
	args  []any
}

func (sendMsg) isEffect()       {}
func (installView) isEffect()   {}
func (rememberJoins) isEffect() {}
func (stopFlush) isEffect()     {}
func (logLine) isEffect()       {}
