package flush

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// ---- the initiator

// flushReq asks for a round: the application's (EvStartFlush, vc false)
// or the membership layer's before a view change (vc).
type flushReq struct {
	stack.EvStartViewChangeFlush
	vc bool
}

// stopReq ends a round of its own kind (vc): the application's
// (EvStopFlush) or a view change's.
type stopReq struct {
	stack.EvStopViewChangeFlush
	vc bool
}

// startFlush runs a round over the participants (nil: the view) and
// returns when they are all blocked and have delivered the same messages,
// saying which participants a view-change round went on without. It
// retries a refused or timed-out round up to max_attempts times.
func (f *FLUSH) startFlush(ctx context.Context, req flushReq) (stack.FlushResult, error) {
	var res stack.FlushResult
	select {
	case f.owner <- struct{}{}:
	case <-ctx.Done():
		return res, ctx.Err()
	case <-f.Done():
		return res, stack.ErrClosed
	}
	var err error
	for attempt := 1; ; attempt++ {
		var skipped []stack.Address
		if skipped, err = f.attempt(ctx, req); err == nil {
			f.count.completed.Add(1)
			if req.vc {
				// Suspected participants the round stopped waiting for
				// are not in the cut either.
				for _, a := range skipped {
					if !slices.Contains(res.Without, a) {
						res.Without = append(res.Without, a)
					}
				}
			}
			return res, nil
		}
		if attempt >= f.cfg.MaxAttempts || ctx.Err() != nil {
			break
		}
		// Before a view change, a participant that does not answer (it
		// crashed, or left while the round ran) must not stop the others
		// from agreeing on what they delivered: go on without it at once.
		var na *noAnswer
		if req.vc && errors.As(err, &na) {
			if req.Participants == nil {
				f.mu.Lock()
				if f.part.view != nil {
					req.Participants = f.part.view.Members
				}
				f.mu.Unlock()
			}
			req.Participants = slices.DeleteFunc(slices.Clone(req.Participants), func(a stack.Address) bool {
				return a != f.LocalAddress() && slices.Contains(na.missing, a)
			})
			// Those left out are unblocked (the round was aborted) and
			// take no part in the cut: the view must not contain them.
			for _, a := range na.missing {
				if a != f.LocalAddress() && !slices.Contains(res.Without, a) {
					res.Without = append(res.Without, a)
				}
			}
			f.count.wentWithout.Add(int64(len(na.missing)))
			f.Log().Info("flush: going on without the participants that did not answer", "members", na.missing)
			continue
		}
		backoff := f.cfg.RetryTimeout/2 + f.Rand().Duration(f.cfg.RetryTimeout/2+1)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-f.Done():
		}
		t.Stop()
	}
	f.count.failed.Add(1)
	<-f.owner
	return res, fmt.Errorf("%w: %w", ErrFlushFailed, err)
}

func (f *FLUSH) attempt(ctx context.Context, req flushReq) ([]stack.Address, error) {
	self := f.LocalAddress()
	parts := req.Participants
	f.mu.Lock()
	if parts == nil && f.part.view != nil {
		parts = f.part.view.Members
	}
	if len(parts) == 0 {
		parts = []stack.Address{self}
	}
	f.n++
	ir := newRound(RoundID{Initiator: self, N: f.n}, req, parts)
	f.run = ir
	out := ir.start(f.cfg.StartTimeout, time.Now())
	f.mu.Unlock()
	f.count.started.Add(1)
	f.do(out)
	err := f.await(ctx, ir)
	if err == nil {
		// Every participant fetches and delivers what anyone received.
		f.mu.Lock()
		out = ir.reconcile(f.cfg.StartTimeout, time.Now())
		f.mu.Unlock()
		f.do(out)
		err = f.await(ctx, ir)
	}
	if err != nil {
		f.mu.Lock()
		out = ir.abort()
		f.ends.ended(&Header{Type: typeAbort, Round: ir.id})
		f.run = nil
		f.mu.Unlock()
		f.do(out)
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(ir.skipped), nil
}

// await polls the round's phase until it is over: when an answer, a
// suspicion or a view comes, and when the round has something to send
// again or its time is up.
func (f *FLUSH) await(ctx context.Context, ir *initRound) error {
	self := f.LocalAddress()
	for {
		f.mu.Lock()
		out, done, err := ir.poll(self, f.part.view, f.suspects, time.Now())
		due := ir.retry.Due()
		f.mu.Unlock()
		f.do(out)
		if done {
			return err
		}
		t := time.NewTimer(time.Until(due))
		select {
		case <-ir.wake:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-f.Done():
			t.Stop()
			return stack.ErrClosed
		}
		t.Stop()
	}
}

// stopFlush ends the round of req's kind this member started: STOP_FLUSH
// to the participants and it returns when every one of them still in the
// view has said it is unblocked (or after end_flush_timeout). Joiners
// (req.Participants) get their STOP_FLUSH only after that, so a joiner's
// Connect returns into a group where everyone can send.
func (f *FLUSH) stopFlush(ctx context.Context, req stopReq) error {
	extra := req.Participants
	f.mu.Lock()
	ir := f.run
	if ir == nil || ir.phase == typeUnblocked || ir.vc != req.vc {
		// Only the owner ends its round: GMS's stop never ends the
		// application's round (GMS's own start may have failed), nor the
		// application's GMS's.
		f.mu.Unlock()
		return nil
	}
	if req.View != nil {
		ir.view = req.View.ID
		f.part.left = !req.View.Contains(f.LocalAddress())
	}
	f.mu.Unlock()
	f.awaitStates(ctx, req.AwaitState)
	f.mu.Lock()
	var joiners []stack.Address
	for _, a := range extra {
		if !slices.Contains(ir.parts, a) {
			joiners = append(joiners, a)
		}
	}
	f.mu.Unlock()
	err := f.stopPhase(ctx, ir, slices.Clone(ir.parts))
	if len(joiners) > 0 && !errors.Is(err, stack.ErrClosed) {
		f.mu.Lock()
		ir.parts = append(ir.parts, joiners...)
		f.mu.Unlock()
		err = f.stopPhase(ctx, ir, joiners)
	}
	f.mu.Lock()
	if ir.msg != nil && ir.msg.Type == typeStop {
		f.ends.ended(ir.msg)
	}
	if f.run == ir {
		f.run = nil
	}
	f.mu.Unlock()
	<-f.owner
	if err != nil {
		// Logged by await; the members unblock themselves at the latest
		// after timeout.
		return fmt.Errorf("flush: stop: %w", err)
	}
	return nil
}

// awaitStates holds the stop until every joiner in js that is still in the
// view has fetched the state (ConnectWithState), or timeout passes: the
// group stays quiet while the state is read.
func (f *FLUSH) awaitStates(ctx context.Context, js []stack.Address) {
	if len(js) == 0 {
		return
	}
	t := time.NewTimer(f.cfg.Timeout)
	defer t.Stop()
	check := time.NewTicker(f.cfg.StartTimeout / 4)
	defer check.Stop()
	for {
		f.mu.Lock()
		var missing []stack.Address
		for _, j := range js {
			if !f.stateDone[j] && (f.part.view == nil || f.part.view.Contains(j)) {
				missing = append(missing, j)
			}
		}
		if len(missing) == 0 {
			for _, j := range js {
				delete(f.stateDone, j)
			}
		}
		f.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		select {
		case <-f.stateWake:
		case <-check.C:
		case <-t.C:
			f.Log().Warn("flush: joiners did not fetch the state in time; unblocking the group", "joiners", missing, "timeout", f.cfg.Timeout)
			return
		case <-ctx.Done():
			return
		case <-f.Done():
			return
		}
	}
}

func (f *FLUSH) stopPhase(ctx context.Context, ir *initRound, to []stack.Address) error {
	f.mu.Lock()
	out := ir.stop(to, f.part.view, f.LocalAddress(), f.cfg.EndTimeout, time.Now())
	f.mu.Unlock()
	f.do(out)
	return f.await(ctx, ir)
}
