package gms

import (
	"time"

	"github.com/strata-go/strata/stack"
)

// ---- the coordinator's view handler

func (g *GMS) enqueue(r request) {
	g.mu.Lock()
	g.reqs = append(g.reqs, r)
	g.mu.Unlock()
	g.kick()
}

func (g *GMS) kick() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// handler runs the coordinator's work: it bundles the requests that arrive
// within max_bundling_time into one view change.
func (g *GMS) handler(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-g.wake:
		}
		if g.cfg.MaxBundlingTime > 0 && !sleep(done, g.cfg.MaxBundlingTime) {
			return
		}
		if !g.waitMerge(done) {
			return
		}
		g.mu.Lock()
		reqs := g.reqs
		g.reqs = nil
		g.mu.Unlock()
		g.process(reqs)
	}
}

func sleep(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}

// waitMerge holds the handler while this member takes part in another
// leader's merge (until the merge view comes or the merge times out).
func (g *GMS) waitMerge(done <-chan struct{}) bool {
	for {
		g.mu.Lock()
		ms := g.merge
		if ms != nil && !ms.leader && !time.Now().Before(ms.until) {
			g.merge, ms = nil, nil
		}
		g.mu.Unlock()
		if ms == nil || ms.leader {
			return true
		}
		if !sleep(done, time.Until(ms.until)+time.Millisecond) {
			return false
		}
	}
}

func (g *GMS) process(reqs []request) {
	self := g.LocalAddress()
	g.mu.Lock()
	v := g.view
	if v == nil || g.coordLocked() != self {
		g.mu.Unlock()
		return
	}
	if v.Coordinator() != self {
		g.count.takeovers.Add(1)
		g.Log().Info("taking over as coordinator from a suspected member", "view", v.ID, "member", v.Coordinator())
	}
	p := planView(v, self, g.suspects, reqs)
	g.mu.Unlock()
	g.count.joinsHandled.Add(int64(p.joins))
	g.count.leavesHandled.Add(int64(len(p.leavers)))

	if p.next != nil {
		g.cast(v, p.next, p.joiners, p.leaving, p.stateJoiners)
	}
	// The view may be gone by now: this member left (a Disconnect whose
	// context ended during the view change) or is joining again. Then it
	// answers nobody; they ask again and find the coordinator.
	g.mu.Lock()
	cur := g.view
	g.mu.Unlock()
	if len(p.rejoiners) > 0 && cur != nil {
		// Already members (the coordinator that took them in crashed before
		// it answered): answer with the view they are in.
		// A joiner whose answer was lost gets the digest of the view it
		// joined in, not today's: it must deliver what was sent since.
		d := g.digest()
		for _, a := range p.rejoiners {
			g.mu.Lock()
			jd, ok := g.joinDigests[a]
			g.mu.Unlock()
			if !ok || cur.ID != g.joinView {
				jd = d
			}
			g.send(a, &Header{Type: typeJoinRsp, View: cur, Digest: jd})
		}
	}
	for _, a := range p.leavers {
		if a != self {
			g.send(a, &Header{Type: typeLeaveRsp})
		} else {
			g.leftGroup()
		}
	}
	if p.merge != nil {
		g.runMerge(p.merge)
	}
}

// cast carries out the change from cur to nv (castRun, cast.go, decides each
// step): the flush, the view installed here, multicast and answered to the
// joiners, every member's acknowledgement, and the flush's stop. Graceful
// leavers take part in the flush before the view that drops them; the
// flush stops only when the state joiners have fetched the state.
func (g *GMS) cast(cur, nv *stack.View, joiners, leaving, stateJoiners []stack.Address) {
	r := newCast(g.LocalAddress(), &g.count, g.cfg, cur, nv, joiners, leaving, stateJoiners)
	// With FLUSH above, the participants block and deliver the same
	// messages before the view changes (without it the event reaches the
	// channel, which ignores it).
	g.do(r.flushDone(stack.AskUp(g, stack.EvStartViewChangeFlush{Participants: r.parts})))
	var d stack.Digest
	if r.needsDigest() {
		d = g.digest()
	}
	g.announce(r, d)
}

// announce sends the view of r (with the joiners' digest d), waits for its
// acknowledgements and ends its flush.
func (g *GMS) announce(r *castRun, d stack.Digest) {
	g.mu.Lock()
	out := r.announce(d, time.Now())
	if !r.merge {
		g.announced = r.nv
	}
	aw := newAckWait(r.acks)
	g.acks = aw // before the view goes: an acknowledgement may come at once
	g.mu.Unlock()
	g.do(out)
	g.waitAcks(r, aw)
	g.do(r.finish())
	if len(r.excluded) > 0 {
		g.mergeBackSoon(r.excluded)
	}
}

// mergeBackSoon merges the members a view's flush went on without (they
// did not answer in time, under loss) back 1-3 s later, once they know
// they were excluded: MERGE3 would find them only at its next check, a
// whole check_interval later.
func (g *GMS) mergeBackSoon(excluded []stack.Address) {
	coords := append([]stack.Address{g.LocalAddress()}, excluded...)
	d := time.Second + g.Rand().Duration(2*time.Second)
	g.Go(func(done <-chan struct{}) {
		if sleep(done, d) {
			g.enqueue(request{kind: reqMerge, coords: coords})
		}
	})
}

// waitAcks waits until every member of the view has acknowledged it. The
// members that have not get the view again (resend, by reliable unicast) every
// view_ack_timeout: a coordinator that went on without them would let the
// others unblock and send in the new view while they are still in the old
// one (and a leaving coordinator would leave them there for good). A member
// suspected meanwhile is no longer awaited; max_view_ack_wait bounds it all.
func (g *GMS) waitAcks(r *castRun, aw *ackWait) {
	defer func() {
		g.mu.Lock()
		if g.acks == aw {
			g.acks = nil
		}
		g.mu.Unlock()
	}()
	for {
		g.mu.Lock()
		wake := aw.due()
		g.mu.Unlock()
		t := time.NewTimer(time.Until(wake))
		select {
		case <-aw.done:
			t.Stop()
			return
		case <-g.Done():
			t.Stop()
			return
		case <-t.C:
		}
		g.mu.Lock()
		out, over := r.tick(time.Now())
		g.mu.Unlock()
		g.do(out)
		if over {
			return
		}
	}
}

// do carries out a castRun's effects.
func (g *GMS) do(out []effect) {
	for _, e := range out {
		switch e := e.(type) {
		case sendMsg:
			g.send(e.to, e.h)
		case installView:
			g.install(e.v, e.d)
		case rememberJoins:
			g.mu.Lock()
			g.joinDigests, g.joinView = map[stack.Address]stack.Digest{}, e.view
			for _, j := range e.joiners {
				g.joinDigests[j] = e.d
			}
			g.mu.Unlock()
		case stopFlush:
			_, _ = g.PassUpEvent(e.ev)
		case logLine:
			g.Log().Log(g.Context(), e.level, e.msg, e.args...)
		}
	}
}

func (g *GMS) ack(from stack.Address, id stack.ViewID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if aw := g.acks; aw != nil {
		aw.settle(aw.ack(from, id))
	}
}
