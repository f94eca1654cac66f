package flush

import (
	"context"
	"errors"
	"time"

	"github.com/strata-go/strata/stack"
)

// ---- messages

func (f *FLUSH) send(dest stack.Address, h *Header) {
	if dest == f.LocalAddress() {
		f.handle(dest, h)
		return
	}
	flags := stack.Internal | stack.OOB
	f.mu.Lock()
	if f.regularStop && (h.Type == typeStop || h.Type == typeUnblocked) {
		flags = 0
	}
	f.mu.Unlock()
	wh, payload := carried(h)
	m := stack.NewMessage(dest, payload).Set(flags)
	m.PutHeader(f.ID(), wh)
	if err := f.PassDown(f.Context(), m); err != nil && !errors.Is(err, stack.ErrClosed) {
		f.Log().Debug("flush: send failed", "type", h.Kind(), "to", dest, "error", err)
	}
}

// Up handles flush messages; others pass.
func (f *FLUSH) Up(m *stack.Message) {
	h, ok := m.Header(f.ID()).(*Header)
	if !ok {
		f.PassUp(m)
		return
	}
	if h.Type == typeCarried {
		var err error
		if h, err = uncarried(m.Payload); err != nil {
			f.count.malformed.Add(1)
			f.Log().Debug("flush: a carried header does not decode", "from", m.Src, "error", err)
			return
		}
	}
	f.handle(m.Src, h)
}

func (f *FLUSH) handle(src stack.Address, h *Header) {
	switch h.Type {
	case typeStart:
		f.step(func(p *participant, now time.Time) []effect { return p.start(src, h, now) })
	case typeStop, typeAbort:
		f.step(func(p *participant, now time.Time) []effect { return p.stop(src, h, now) })
	case typeReconcile:
		// Not a transition (no pmu): the fetch runs on a goroutine of its
		// own while the member stays blocked.
		f.mu.Lock()
		out := f.part.reconcile(src, h)
		f.mu.Unlock()
		f.do(out)
	case typeCompleted, typeReconcileOK, typeUnblocked:
		f.answer(src, h)
	case typeStateDone:
		f.mu.Lock()
		f.stateDone[src] = true
		f.mu.Unlock()
		select {
		case f.stateWake <- struct{}{}:
		default:
		}
	case typeNotCompleted:
		f.mu.Lock()
		if ir := f.run; ir != nil && ir.refuse(h) {
			ir.kick()
		}
		f.mu.Unlock()
		f.count.refusals.Add(1)
	}
}

// step runs one participant transition: fn changes the state under mu and
// returns its effects, which are carried out in order, without mu (the
// effects call other layers and the application) but before the next
// transition (pmu).
func (f *FLUSH) step(fn func(p *participant, now time.Time) []effect) {
	f.pmu <- struct{}{}
	defer func() { <-f.pmu }()
	f.mu.Lock()
	out := fn(&f.part, time.Now())
	f.mu.Unlock()
	f.do(out)
}

// do carries out a participant's effects.
func (f *FLUSH) do(out []effect) {
	for _, e := range out {
		switch e := e.(type) {
		case sendMsg:
			f.send(e.to, e.h)
		case blockGate:
			if e.call {
				f.notify(stack.EvBlock{})
			}
			f.gate.Close()
			// A sender past the gate that waits below for flow-control
			// credits would make the drain wait for credits (which a
			// member blocked the same way may never return): it gives its
			// message back and waits at the gate.
			_, _ = f.PassDownEvent(f.Context(), stack.EvRecallSenders{})
			// Every sender already past the gate is waited for, so the
			// digest taken next covers every multicast this member sent.
			f.waitInflight()
		case answerCompleted:
			d := f.digest(e.hold)
			f.Log().Debug("flush: completed", "round", e.round, "digest", d)
			f.send(e.to, &Header{Type: typeCompleted, Round: e.round, Digest: d})
		case fetchMissing:
			f.fetch(e.to, e.h)
		case releaseHold:
			_, _ = f.PassDownEvent(f.Context(), stack.EvReleaseHold{})
		case openGate:
			_, _ = f.PassDownEvent(f.Context(), stack.EvReleaseSenders{})
			f.gate.Open()
			if e.call {
				f.notify(stack.EvUnblock{})
			}
			if e.joined {
				f.mu.Lock()
				joined := f.joinDone
				f.joinDone = nil
				f.mu.Unlock()
				if joined != nil {
					close(joined) // the joiner's Connect returns into an open gate
				}
			}
		case logLine:
			f.Log().Log(f.Context(), e.level, e.msg, e.args...)
		}
	}
}

// notify passes BLOCK or UNBLOCK up, in order, on FLUSH's callback
// goroutine: the application's Block and Unblock run while FLUSH holds
// none of its locks, and a Block that waits (or starts a flush of its own)
// holds up neither this round nor the safety valve. The gate, not the
// callback, stops the member's multicasts.
func (f *FLUSH) notify(ev stack.Event) {
	f.callbacks.Do(&f.Base, func() { _, _ = f.PassUpEvent(ev) })
}

// fetch fetches and delivers what the reconcile h names, off the receive
// path, and answers RECONCILE_OK to its initiator.
func (f *FLUSH) fetch(to stack.Address, h *Header) {
	f.Go(func(<-chan struct{}) {
		ctx, cancel := context.WithTimeout(f.Context(), f.cfg.StartTimeout) // ends at Stop too
		defer cancel()
		if _, err := f.PassDownEvent(ctx, stack.EvReconcile{Target: h.Digest, From: h.From}); err != nil {
			f.Log().Info("flush: could not fetch every message of the round in time", "round", h.Round, "error", err)
			return
		}
		f.Log().Debug("flush: reconciled", "round", h.Round)
		f.send(to, &Header{Type: typeReconcileOK, Round: h.Round})
	})
}

// answer takes a participant's answer to a round this member initiated. A
// FLUSH_COMPLETED for a round that is over (a late copy, or a participant
// that missed the end and asks) is answered with the round's end again:
// its ABORT or STOP_FLUSH. Otherwise a member that took a late START after
// the round was aborted without it would wait for the round's view for
// ever, and refuse every other round meanwhile.
func (f *FLUSH) answer(src stack.Address, h *Header) {
	f.mu.Lock()
	if ir := f.run; ir != nil && ir.answer(src, h) {
		ir.kick()
		f.mu.Unlock()
		return
	}
	var again *Header
	if h.Type == typeCompleted && h.Round.Initiator == f.LocalAddress() && (f.run == nil || f.run.id != h.Round) {
		again = f.ends.end(h.Round, f.n)
	}
	f.mu.Unlock()
	if again != nil {
		f.count.endsAgain.Add(1)
		f.send(src, again)
	}
}

// digest returns this member's digest; with hold (before a view change) it
// also holds every sender at what this member delivered until the round
// ends (see stack.EvHold).
func (f *FLUSH) digest(hold bool) stack.Digest {
	var d stack.Digest
	if hold {
		d, _ = stack.Ask(f.Context(), f, stack.EvHold{})
	} else {
		d, _ = stack.Ask(f.Context(), f, stack.EvGetDigest{})
	}
	return d
}
