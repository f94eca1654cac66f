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
	m := stack.NewMessage(dest, nil).Set(flags)
	m.PutHeader(f.ID(), h)
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
	f.handle(m.Src, h)
}

func (f *FLUSH) handle(src stack.Address, h *Header) {
	switch h.Type {
	case typeStart:
		f.handleStart(src, h)
	case typeReconcile:
		f.handleReconcile(src, h)
	case typeStop, typeAbort:
		f.handleStop(src, h)
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
		if ir := f.run; ir != nil && ir.id == h.Round && ir.phase == typeCompleted {
			ir.refused = true
			ir.kick()
		}
		f.mu.Unlock()
		f.refusals.Add(1)
	}
}

func (f *FLUSH) handleStart(src stack.Address, h *Header) {
	if src != h.Round.Initiator {
		return
	}
	f.pmu.Lock()
	defer f.pmu.Unlock()
	f.mu.Lock()
	var old *partRound
	switch onStart(h, f.cur, f.done[src]) {
	case startOver:
		f.mu.Unlock()
		f.lateStarts.Add(1)
		return
	case startAgain:
		cur := f.cur
		f.mu.Unlock()
		f.send(src, &Header{Type: typeCompleted, Round: h.Round, Digest: f.digest(cur)})
		return
	case startRefuse:
		f.mu.Unlock()
		f.send(src, &Header{Type: typeNotCompleted, Round: h.Round})
		return
	case startSupersede:
		old = f.cur
	}
	cur := &partRound{id: h.Round, vc: h.ViewChange, parts: h.Participants}
	if f.view != nil {
		cur.from = f.view.ID
	}
	f.cur = cur
	f.mu.Unlock()
	if old != nil {
		f.superseded.Add(1)
		f.send(old.id.Initiator, &Header{Type: typeNotCompleted, Round: old.id})
	}
	f.block()
	d := f.digest(cur)
	f.Log().Debug("flush: completed", "round", h.Round, "digest", d)
	f.send(src, &Header{Type: typeCompleted, Round: h.Round, Digest: d})
}

func (f *FLUSH) handleReconcile(src stack.Address, h *Header) {
	f.mu.Lock()
	cur := f.cur
	f.mu.Unlock()
	if cur == nil || cur.id != h.Round {
		return
	}
	f.Go(func(<-chan struct{}) {
		ctx, cancel := context.WithTimeout(f.Context(), f.cfg.StartTimeout) // ends at Stop too
		defer cancel()
		if _, err := f.PassDownEvent(ctx, stack.EvReconcile{Target: h.Digest, From: h.From}); err != nil {
			f.Log().Info("flush: could not fetch every message of the round in time", "round", h.Round, "error", err)
			return
		}
		f.Log().Debug("flush: reconciled", "round", h.Round)
		f.send(src, &Header{Type: typeReconcileOK, Round: h.Round})
	})
}

type stopWait struct {
	src stack.Address
	h   *Header
}

func (f *FLUSH) handleStop(src stack.Address, h *Header) {
	if src != h.Round.Initiator {
		return
	}
	f.pmu.Lock()
	f.mu.Lock()
	if h.Round.N > f.done[src] {
		f.done[src] = h.Round.N
	}
	act := onStop(h, f.cur, f.joining, f.view)
	if act == stopAwaitView {
		// The view this round installed has not reached this member yet
		// (its copy was lost): unblocked now, it would send in the old view
		// what the others deliver in the new one. It unblocks when the view
		// comes (the safety valve bounds the wait).
		f.stopWait = &stopWait{src: src, h: h}
		f.mu.Unlock()
		f.pmu.Unlock()
		f.stopsDeferred.Add(1)
		return
	}
	if act == stopAbortViewChange {
		f.heldSince = time.Now()
	}
	f.mu.Unlock()
	switch act {
	case stopAbortViewChange:
		// The initiator gave up on this attempt and may go on without
		// this member, which is then not in the next view. It may send
		// again, but delivers nothing beyond what it had delivered until
		// a view comes (or timeout passes): what the others send now
		// belongs to a view it may not be in.
		f.open(false)
	case stopUnblock:
		f.unblock()
	}
	f.pmu.Unlock()
	f.send(src, &Header{Type: typeUnblocked, Round: h.Round})
}

func (f *FLUSH) answer(src stack.Address, h *Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ir := f.run
	if ir == nil || ir.id != h.Round || ir.phase != h.Type {
		return
	}
	ir.answered[src] = h.Digest
	ir.kick()
}

// digest returns this member's digest for the round; before a view change
// it also holds every sender at what this member delivered until the round
// ends (see stack.EvHold).
func (f *FLUSH) digest(r *partRound) stack.Digest {
	var ev stack.Event = stack.EvGetDigest{}
	if r != nil && r.vc {
		ev = stack.EvHold{}
	}
	v, err := f.PassDownEvent(f.Context(), ev)
	if err != nil {
		return nil
	}
	d, _ := v.(stack.Digest)
	return d
}
