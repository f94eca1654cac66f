package flush

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// ---- the initiator

// StartFlush runs a round over the participants (nil: the view) and
// returns when they are all blocked and have delivered the same messages.
// It retries a refused or timed-out round up to max_attempts times.
func (f *FLUSH) StartFlush(ctx context.Context, req stack.EvStartFlush) error {
	_, err := f.startFlush(ctx, req)
	return err
}

// startFlush is StartFlush that also says which participants a view-change
// round went on without.
func (f *FLUSH) startFlush(ctx context.Context, req stack.EvStartFlush) (stack.FlushResult, error) {
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
			if req.ViewChange {
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
		if req.ViewChange && errors.As(err, &na) {
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
			f.Log().Info("flush: going on without the participants that did not answer", "missing", na.missing)
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

func (f *FLUSH) attempt(ctx context.Context, req stack.EvStartFlush) ([]stack.Address, error) {
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
	ir := &initRound{id: RoundID{Initiator: self, N: f.n}, vc: req.ViewChange, merge: req.Merge, parts: slices.Clone(parts),
		phase: typeCompleted, answered: map[stack.Address]stack.Digest{}, wake: make(chan struct{}, 1)}
	f.run = ir
	f.mu.Unlock()
	f.count.started.Add(1)
	start := &Header{Type: typeStart, Round: ir.id, ViewChange: ir.vc, Participants: ir.parts}
	for _, p := range ir.parts {
		f.send(p, start)
	}
	err := f.await(ctx, ir, f.cfg.StartTimeout, func(p stack.Address) { f.send(p, start) })
	if err == nil {
		// Every participant fetches and delivers what anyone received.
		f.mu.Lock()
		target := maxDigest(ir.answered) // late duplicate answers still write to it
		ir.phase, ir.answered = typeReconcileOK, map[stack.Address]stack.Digest{}
		f.mu.Unlock()
		f.Log().Debug("flush: reconcile", "round", ir.id, "target", target.Target)
		rec := &Header{Type: typeReconcile, Round: ir.id, Digest: target.Target, From: target.From}
		for _, p := range ir.parts {
			f.send(p, rec)
		}
		err = f.await(ctx, ir, f.cfg.StartTimeout, func(p stack.Address) { f.send(p, rec) })
	}
	if err != nil {
		for _, p := range ir.parts {
			f.send(p, &Header{Type: typeAbort, Round: ir.id})
		}
		f.mu.Lock()
		f.run = nil
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(ir.skipped), nil
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

// await waits until every participant still in the view has answered the
// current phase, the round is refused, or timeout passes. Every quarter of
// the timeout it sends the phase's message again to those that have not
// answered: participants take duplicates in their stride, and a lost or
// slow copy then never costs the whole timeout.
func (f *FLUSH) await(ctx context.Context, ir *initRound, timeout time.Duration, again func(p stack.Address)) error {
	retry := stack.NewRetry(time.Now(), timeout/4, timeout)
	for {
		f.mu.Lock()
		refused := ir.refused
		missing := ir.awaiting(f.LocalAddress(), f.part.view, f.suspects)
		phase := ir.phase
		f.mu.Unlock()
		switch {
		case refused:
			return fmt.Errorf("round %s refused by a participant in another round", ir.id)
		case len(missing) == 0:
			return nil
		}
		t := time.NewTimer(time.Until(retry.Due()))
		select {
		case <-ir.wake:
		case <-t.C:
			switch resend, expired := retry.At(time.Now()); {
			case expired:
				f.Log().Warn("flush: participants did not answer in time", "round", ir.id, "awaiting", typeNames[phase], "missing", missing, "timeout", timeout)
				return &noAnswer{round: ir.id, phase: phase, missing: missing, timeout: timeout}
			case resend:
				for _, p := range missing {
					again(p)
				}
			}
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

// StopFlush ends the round this member started: STOP_FLUSH to the
// participants and it returns when every one of them still in the view has
// said it is unblocked (or after end_flush_timeout). Joiners (extra) get
// their STOP_FLUSH only after that, so a joiner's Connect returns into a
// group where everyone can send.
func (f *FLUSH) StopFlush(ctx context.Context, extra []stack.Address) error {
	return f.stopFlush(ctx, stack.EvStopFlush{Participants: extra})
}

func (f *FLUSH) stopFlush(ctx context.Context, req stack.EvStopFlush) error {
	extra := req.Participants
	f.mu.Lock()
	ir := f.run
	if ir == nil || ir.phase == typeUnblocked || ir.vc != req.ViewChange {
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
	ir.phase, ir.answered = typeUnblocked, map[stack.Address]stack.Digest{}
	// Only the members of this phase are awaited.
	for _, p := range ir.parts {
		if !slices.Contains(to, p) {
			ir.answered[p] = nil
		}
	}
	stop := &Header{Type: typeStop, Round: ir.id}
	switch {
	case !ir.view.Creator.IsZero():
		stop.View = ir.view // unblock in the view the round installed, not before it
	case ir.vc && !ir.merge && f.part.view != nil && f.part.view.Contains(f.LocalAddress()):
		// (A merge round without its view was cancelled: the other
		// subgroups' members are in views of their own.)
		stop.View = f.part.view.ID
	}
	f.mu.Unlock()
	for _, p := range to {
		f.send(p, stop)
	}
	return f.await(ctx, ir, f.cfg.EndTimeout, func(p stack.Address) { f.send(p, stop) })
}
