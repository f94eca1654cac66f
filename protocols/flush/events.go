package flush

import (
	"context"
	"time"

	"github.com/strata-go/strata/stack"
)

// ---- events

// DownEvent runs flushes for the channel, blocks a joiner from the moment
// it asks to join, and tracks the view.
func (f *FLUSH) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvStartFlush:
		_, err := f.startFlush(ctx, flushReq{EvStartViewChangeFlush: stack.EvStartViewChangeFlush{Participants: e.Participants}})
		return stack.Answer{}, err
	case stack.EvStopFlush:
		return stack.Answer{}, f.stopFlush(ctx, stopReq{})
	case stack.EvConnect:
		return stack.Answer{}, f.connect(ctx, ev, false, stack.Address{})
	case stack.EvConnectWithState:
		return stack.Answer{}, f.connect(ctx, ev, true, e.StateFrom)
	case stack.EvViewChange:
		if e.View != nil {
			f.viewChange(e.View)
		}
	case stack.EvDisconnect:
		f.step(func(p *participant, now time.Time) []effect { return p.disconnect(now) })
	}
	return f.PassDownEvent(ctx, ev)
}

// UpEvent runs GMS's flushes around view changes.
func (f *FLUSH) UpEvent(ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvStartViewChangeFlush:
		ctx, cancel := context.WithTimeout(f.Context(), f.cfg.Timeout)
		defer cancel()
		res, err := f.startFlush(ctx, flushReq{EvStartViewChangeFlush: e, vc: true})
		return stack.Reply(e, res), err
	case stack.EvStopViewChangeFlush:
		return stack.Answer{}, f.stopFlush(f.Context(), stopReq{EvStopViewChangeFlush: e, vc: true})
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

// connect joins (ev: EvConnect or, with state, EvConnectWithState, which
// fetches the state from stateFrom inside the flush of the first view).
func (f *FLUSH) connect(ctx context.Context, ev stack.Event, state bool, stateFrom stack.Address) error {
	joined := make(chan struct{})
	f.step(func(p *participant, now time.Time) []effect {
		f.joinDone = joined
		return p.connect(now)
	})
	unblock := func(p *participant, now time.Time) []effect { return p.open(true, now) }
	if _, err := f.PassDownEvent(ctx, ev); err != nil {
		f.step(unblock)
		return err
	}
	f.mu.Lock()
	alone := f.part.view.Size() <= 1
	f.mu.Unlock()
	if alone {
		f.step(unblock)
		return nil
	}
	var stateErr error
	if state {
		// Still blocked, as is the group: fetch the state, then let the
		// round's initiator (the view's creator) stop the flush.
		_, stateErr = f.PassDownEvent(ctx, stack.EvGetState{From: stateFrom})
		f.mu.Lock()
		coord := f.part.view.ID.Creator
		f.mu.Unlock()
		f.send(coord, &Header{Type: typeStateDone})
	}
	// Connect returns into a group where everyone can send: after the
	// STOP_FLUSH of the flush that installs this member's view.
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
	f.part.view = v
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

// viewDelivered runs once the application has v (see
// participant.viewDelivered).
func (f *FLUSH) viewDelivered(v *stack.View) {
	f.mu.Lock()
	waits := f.part.awaitsView()
	f.mu.Unlock()
	if waits {
		self := f.LocalAddress()
		f.step(func(p *participant, now time.Time) []effect { return p.viewDelivered(v, self, now) })
	}
}
