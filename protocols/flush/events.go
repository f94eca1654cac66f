package flush

import (
	"context"

	"github.com/strata-go/strata/stack"
)

// ---- events

// DownEvent runs flushes for the channel, blocks a joiner from the moment
// it asks to join, and tracks the view.
func (f *FLUSH) DownEvent(ctx context.Context, ev stack.Event) (any, error) {
	switch e := ev.(type) {
	case stack.EvStartFlush:
		return nil, f.StartFlush(ctx, e)
	case stack.EvStopFlush:
		return nil, f.stopFlush(ctx, e)
	case stack.EvConnect:
		return nil, f.connect(ctx, e)
	case stack.EvViewChange:
		if e.View != nil {
			f.viewChange(e.View)
		}
	case stack.EvDisconnect:
		// Senders blocked at the gate return, but what a view-change round
		// holds stays held: it was sent in a view this member is leaving
		// (a leaving coordinator, say), and must not reach it.
		f.pmu.Lock()
		f.open(false)
		f.pmu.Unlock()
	}
	return f.PassDownEvent(ctx, ev)
}

// UpEvent runs GMS's flushes around view changes.
func (f *FLUSH) UpEvent(ev stack.Event) (any, error) {
	switch e := ev.(type) {
	case stack.EvStartFlush:
		ctx, cancel := context.WithTimeout(f.Context(), f.cfg.Timeout)
		defer cancel()
		return f.startFlush(ctx, e)
	case stack.EvStopFlush:
		return nil, f.stopFlush(f.Context(), e)
	case stack.EvSuspect:
		f.mu.Lock()
		for _, a := range e.Members {
			f.suspects[a] = true
		}
		if ir := f.run; ir != nil {
			ir.kick()
		}
		f.mu.Unlock()
	case stack.EvUnsuspect:
		f.mu.Lock()
		delete(f.suspects, e.Member)
		f.mu.Unlock()
	case stack.EvViewChange:
		// Above the membership layer, which passes views up. After the
		// application has the view: a STOP_FLUSH that waited for it takes
		// effect.
		v := e.View
		if v != nil {
			f.viewChange(v)
		}
		res, err := f.PassUpEvent(ev)
		if v != nil {
			f.viewDelivered(v)
		}
		return res, err
	}
	return f.PassUpEvent(ev)
}

func (f *FLUSH) connect(ctx context.Context, ev stack.EvConnect) error {
	f.pmu.Lock()
	f.mu.Lock()
	f.joining, f.joinDone = true, make(chan struct{})
	joined := f.joinDone
	f.mu.Unlock()
	f.block()
	f.pmu.Unlock()
	if _, err := f.PassDownEvent(ctx, ev); err != nil {
		f.pmu.Lock()
		f.unblock()
		f.pmu.Unlock()
		return err
	}
	f.mu.Lock()
	alone := f.view.Size() <= 1
	f.mu.Unlock()
	if alone {
		f.pmu.Lock()
		f.unblock()
		f.pmu.Unlock()
		return nil
	}
	var stateErr error
	if ev.State {
		// Still blocked, as is the group: fetch the state, then let the
		// round's initiator (the view's creator) stop the flush.
		_, stateErr = f.PassDownEvent(ctx, stack.EvGetState{From: ev.StateFrom})
		f.mu.Lock()
		coord := f.view.ID.Creator
		f.mu.Unlock()
		f.send(coord, &Header{Type: typeStateDone})
	}
	// Connect returns into a group where everyone can send: after the
	// STOP_FLUSH of the flush that installed this member's view.
	select {
	case <-joined:
		return stateErr
	case <-ctx.Done():
		return ctx.Err()
	case <-f.Done():
		return stack.ErrClosed
	}
}

func (f *FLUSH) viewChange(v *stack.View) {
	f.mu.Lock()
	f.view = v
	for a := range f.suspects {
		if !v.Contains(a) {
			delete(f.suspects, a)
		}
	}
	if ir := f.run; ir != nil {
		ir.kick() // members that left are no longer awaited
	}
	f.mu.Unlock()
}

// viewDelivered runs once the application has v: a round whose initiator
// left the view ends here (not before, or what the members send in the new
// view could reach the application before the view does), and so does a
// STOP_FLUSH that waited for v.
func (f *FLUSH) viewDelivered(v *stack.View) {
	f.mu.Lock()
	cur := f.cur
	orphan := cur != nil && !v.Contains(cur.id.Initiator) && cur.id.Initiator != f.LocalAddress()
	sw := f.stopWait
	ready := sw != nil && f.view != nil && f.view.ID.Seq >= sw.h.View.Seq
	held := cur == nil && !f.heldSince.IsZero()
	f.mu.Unlock()
	if ready {
		f.handleStop(sw.src, sw.h)
	}
	if held {
		f.releaseHeld()
	}
	if orphan {
		f.Log().Info("flush: the round's initiator left the view; unblocking", "round", cur.id)
		f.pmu.Lock()
		f.mu.Lock()
		still := f.cur == cur
		f.mu.Unlock()
		if still {
			f.unblock()
		}
		f.pmu.Unlock()
	}
}

// Stats reports FLUSH's counters.
