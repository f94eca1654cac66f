package flush

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// initRound is a round this member initiated, as a state machine. FLUSH
// (initiator.go) starts each phase (start, reconcile, stop; abort ends the
// attempt), records the answers, and polls the round with the time; the
// round says what to send to whom and when the phase is over. It holds no
// lock, starts no goroutine and reads no clock; round_test.go drives it.
type initRound struct {
	id    RoundID
	vc    bool
	merge bool         // participants from several views: all are awaited
	view  stack.ViewID // the view the round installed (GMS's stop), if known
	parts []stack.Address
	// phase: typeCompleted, typeReconcileOK, typeUnblocked: the answers
	// awaited; msg is the phase's message, sent again every quarter of
	// timeout to the participants that have not answered: participants
	// take duplicates in their stride, and a lost or slow copy then never
	// costs the whole timeout.
	phase    uint8
	msg      *Header
	timeout  time.Duration
	retry    stack.Retry
	answered map[stack.Address]stack.Digest
	refused  bool
	skipped  []stack.Address // suspected participants no longer awaited
	wake     chan struct{}   // FLUSH's: an answer, a suspicion or a view came
}

func newRound(id RoundID, req flushReq, parts []stack.Address) *initRound {
	return &initRound{id: id, vc: req.vc, merge: req.Merge, parts: slices.Clone(parts), wake: make(chan struct{}, 1)}
}

func (ir *initRound) kick() {
	select {
	case ir.wake <- struct{}{}:
	default:
	}
}

// begin starts a phase: msg to the participants in to, whose answers of
// kind phase are then awaited for timeout.
func (ir *initRound) begin(phase uint8, msg *Header, to []stack.Address, timeout time.Duration, now time.Time) []effect {
	ir.phase, ir.msg, ir.timeout = phase, msg, timeout
	ir.answered = map[stack.Address]stack.Digest{}
	for _, p := range ir.parts {
		if !slices.Contains(to, p) {
			ir.answered[p] = nil // only the members of this phase are awaited
		}
	}
	ir.retry = stack.NewRetry(now, timeout/4, timeout)
	out := make([]effect, 0, len(to))
	for _, p := range to {
		out = append(out, sendMsg{to: p, h: msg})
	}
	return out
}

// start sends START_FLUSH to every participant.
func (ir *initRound) start(timeout time.Duration, now time.Time) []effect {
	return ir.begin(typeCompleted, &Header{Type: typeStart, Round: ir.id, ViewChange: ir.vc, Participants: ir.parts}, ir.parts, timeout, now)
}

// reconcile sends every participant what all must deliver: the highest
// seqno anyone received from each sender, and who holds it.
func (ir *initRound) reconcile(timeout time.Duration, now time.Time) []effect {
	target := maxDigest(ir.answered)
	out := []effect{logLine{slog.LevelDebug, "flush: reconcile", []any{"round", ir.id, "target", target.Target}}}
	return append(out, ir.begin(typeReconcileOK, &Header{Type: typeReconcile, Round: ir.id, Digest: target.Target, From: target.From}, ir.parts, timeout, now)...)
}

// abort ends a failed attempt: every participant unblocks.
func (ir *initRound) abort() []effect {
	out := make([]effect, 0, len(ir.parts))
	for _, p := range ir.parts {
		out = append(out, sendMsg{to: p, h: &Header{Type: typeAbort, Round: ir.id}})
	}
	return out
}

// stop sends STOP_FLUSH to the participants in to. It names the view the
// round installed, or before a view change (not a merge's) this member's
// view, so that no one unblocks before it has that view.
func (ir *initRound) stop(to []stack.Address, view *stack.View, self stack.Address, timeout time.Duration, now time.Time) []effect {
	stop := &Header{Type: typeStop, Round: ir.id}
	switch {
	case !ir.view.Creator.IsZero():
		stop.View = ir.view // unblock in the view the round installed, not before it
	case ir.vc && !ir.merge && view != nil && view.Contains(self):
		// (A merge round without its view was cancelled: the other
		// subgroups' members are in views of their own.)
		stop.View = view.ID
	}
	return ir.begin(typeUnblocked, stop, to, timeout, now)
}

// answer records src's answer h; it reports whether the round awaited it.
func (ir *initRound) answer(src stack.Address, h *Header) bool {
	if ir.id != h.Round || ir.phase != h.Type {
		return false
	}
	ir.answered[src] = h.Digest
	return true
}

// refuse records a NOT_COMPLETED: a participant is in another round, which
// takes precedence; it reports whether this round is refused by it.
func (ir *initRound) refuse(h *Header) bool {
	if ir.id != h.Round || ir.phase != typeCompleted {
		return false
	}
	ir.refused = true
	return true
}

// poll says at now whether the phase is over (done; err if it failed:
// refused, or participants did not answer within timeout) and what to send
// again; FLUSH polls it again at retry.Due or when kicked.
func (ir *initRound) poll(self stack.Address, view *stack.View, suspects map[stack.Address]bool, now time.Time) (out []effect, done bool, err error) {
	if ir.refused {
		return nil, true, fmt.Errorf("round %s refused by a participant in another round", ir.id)
	}
	missing := ir.awaiting(self, view, suspects)
	if len(missing) == 0 {
		return nil, true, nil
	}
	switch resend, expired := ir.retry.At(now); {
	case expired:
		out = append(out, logLine{slog.LevelWarn, "flush: participants did not answer in time", []any{"round", ir.id, "awaiting", typeNames[ir.phase], "missing", missing, "timeout", ir.timeout}})
		return out, true, &noAnswer{round: ir.id, phase: ir.phase, missing: missing, timeout: ir.timeout}
	case resend:
		for _, p := range missing {
			out = append(out, sendMsg{to: p, h: ir.msg})
		}
	}
	return out, false, nil
}

// awaiting returns the participants that have not answered the round's
// current phase and are still awaited: a suspected participant (not self)
// is no longer awaited and goes on the round's skipped list; one that left
// the initiator's view is not awaited, unless the round is a merge (its
// participants come from several views) or the initiator has no view yet.
func (ir *initRound) awaiting(self stack.Address, view *stack.View, suspects map[stack.Address]bool) []stack.Address {
	var missing []stack.Address
	for _, p := range ir.parts {
		_, ok := ir.answered[p]
		switch {
		case ok:
		case suspects[p] && p != self:
			if !slices.Contains(ir.skipped, p) {
				ir.skipped = append(ir.skipped, p)
			}
		case ir.merge || view == nil || view.Contains(p) || p == self:
			missing = append(missing, p)
		}
	}
	return missing
}

// maxDigest is what every participant must deliver before the round ends,
// and per sender a participant that holds those messages. For a sender that
// takes part, the highest seqno anyone received, held by the sender itself.
// For a sender that does not (it crashed or was excluded), the highest seqno
// any participant delivered, held by that participant; a message received
// beyond a gap nobody can fill is delivered by no one in the view.
func maxDigest(ds map[stack.Address]stack.Digest) stack.EvReconcile {
	type best struct {
		hi   uint64
		from stack.Address
	}
	bs := map[stack.Address]best{}
	for p, d := range ds {
		for _, e := range d {
			b := best{hi: e.HighestDelivered, from: p}
			if _, ok := ds[e.Member]; ok {
				b = best{hi: max(e.HighestDelivered, e.HighestReceived), from: e.Member}
			}
			cur, ok := bs[e.Member]
			switch {
			case !ok:
				bs[e.Member] = b
			case b.from == e.Member: // the sender itself holds them all
				bs[e.Member] = best{hi: max(b.hi, cur.hi), from: e.Member}
			case b.hi > cur.hi || b.hi == cur.hi && b.from.Compare(cur.from) < 0:
				bs[e.Member] = b
			}
		}
	}
	members := slices.SortedFunc(maps.Keys(bs), stack.Address.Compare)
	rc := stack.EvReconcile{Target: make(stack.Digest, 0, len(bs)), From: make([]stack.Address, 0, len(bs))}
	for _, a := range members {
		b := bs[a]
		rc.Target = append(rc.Target, stack.DigestEntry{Member: a, HighestDelivered: b.hi, HighestReceived: b.hi})
		rc.From = append(rc.From, b.from)
	}
	return rc
}

// noAnswer is await's error when participants did not answer in time.
type noAnswer struct {
	round   RoundID
	phase   uint8
	missing []stack.Address
	timeout time.Duration
}

func (e *noAnswer) Error() string {
	return fmt.Sprintf("round %s: no %s from %v within %s", e.round, typeNames[e.phase], e.missing, e.timeout)
}

// roundEnds remembers how this member's last rounds ended (their STOP_FLUSH
// or ABORT), to tell again a participant that missed it.
type roundEnds [16]*Header

// ended records h, the last message of its round.
func (e *roundEnds) ended(h *Header) { e[h.Round.N%uint64(len(e))] = h }

// end returns how round r ended, given n, the number of the initiator's
// last round: its STOP_FLUSH or ABORT if remembered, an ABORT if it is
// older than those remembered (a participant still in it missed the end
// long ago), nil if it has not ended (or never began).
func (e *roundEnds) end(r RoundID, n uint64) *Header {
	if r.N == 0 || r.N > n {
		return nil
	}
	if h := e[r.N%uint64(len(e))]; h != nil && h.Round == r {
		return h
	}
	if n-r.N < uint64(len(e)) {
		return nil // the round has not ended (its stop is on its way)
	}
	return &Header{Type: typeAbort, Round: r}
}
