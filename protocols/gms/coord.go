package gms

import (
	"slices"
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
		if ms != nil && ms.rsps == nil && !time.Now().Before(ms.until) {
			g.merge, ms = nil, nil
		}
		g.mu.Unlock()
		if ms == nil || ms.rsps != nil {
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
		g.takeovers.Add(1)
		g.Log().Info("taking over as coordinator", "view", v, "suspected", v.Coordinator())
	}
	p := planView(v, self, g.suspects, reqs)
	g.mu.Unlock()
	g.joinsHandled.Add(int64(p.joins))
	g.leavesHandled.Add(int64(len(p.leavers)))

	if p.next != nil {
		g.cast(p.next, p.joiners, p.leaving, p.stateJoiners)
	}
	if len(p.rejoiners) > 0 {
		// Already members (the coordinator that took them in crashed before
		// it answered): answer with the view they are in.
		// A joiner whose answer was lost gets the digest of the view it
		// joined in, not today's: it must deliver what was sent since.
		cur, d := g.View(), g.digest()
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

// cast installs nv here (unless this coordinator is leaving it), multicasts
// it, answers the joiners, and waits for every member's acknowledgement.
// Graceful leavers take part in the flush before the view that drops them;
// the flush stops only when the state joiners have fetched the state.
func (g *GMS) cast(nv *stack.View, joiners, leaving, stateJoiners []stack.Address) {
	self := g.LocalAddress()
	// With FLUSH above, the members that stay block and deliver the same
	// messages before the view changes (without it the event reaches the
	// channel, which ignores it). A leaver blocks too, so that what it sent
	// in this view reaches all or none of those that stay.
	var parts []stack.Address
	for _, m := range g.View().Members {
		if nv.Contains(m) || slices.Contains(leaving, m) {
			parts = append(parts, m)
		}
	}
	res, err := g.PassUpEvent(stack.EvStartFlush{Participants: parts, ViewChange: true})
	if err != nil {
		g.flushFailures.Add(1)
		g.Log().Warn("installing the view without a completed flush", "view", nv, "error", err)
	}
	var excluded []stack.Address
	if fr, ok := res.(stack.FlushResult); ok && len(fr.Without) > 0 {
		// The flush went on without members that did not answer: they were
		// unblocked, may have sent since, and are not in the cut the others
		// agreed on. Keeping them would let the others deliver those
		// messages in the new view; they are excluded, and merge back.
		nv, excluded = withoutUnflushed(nv, fr.Without)
		if len(excluded) > 0 {
			g.Log().Warn("excluding members the flush went on without", "view", nv, "excluded", excluded)
			g.flushExclusions.Add(int64(len(excluded)))
		}
	}
	defer func() {
		if err == nil { // a failed start left no round of GMS's to stop
			_, _ = g.PassUpEvent(stack.EvStopFlush{Participants: joiners, AwaitState: stateJoiners, View: nv, ViewChange: true})
		}
	}()
	// An excluded member is told too, as reliably as the members: until it
	// knows, its NAKACK holds the others' next messages, which it could
	// only deliver in the old view. It acknowledges and goes on alone.
	aw := g.newAckWait(nv.ID, append(slices.DeleteFunc(slices.Clone(nv.Members), func(m stack.Address) bool { return m == self }), excluded...))
	g.mu.Lock()
	g.acks = aw
	g.mu.Unlock()
	// The joiners' digest is taken before the view is installed here or
	// sent: a member (this one first) may multicast the moment it has the
	// view, and a digest taken after that would start the joiners above
	// those messages, which they would never deliver. (Without FLUSH a
	// joiner may in turn deliver a few messages sent just before the view,
	// as in JGroups.)
	var d stack.Digest
	if len(joiners) > 0 {
		d = g.digest()
	}
	if nv.Contains(self) {
		g.install(nv, nil)
	}
	vh := &Header{Type: typeView, View: nv}
	g.send(stack.Address{}, vh)
	if len(joiners) > 0 {
		g.mu.Lock()
		g.joinDigests, g.joinView = map[stack.Address]stack.Digest{}, nv.ID
		for _, j := range joiners {
			g.joinDigests[j] = d
		}
		g.mu.Unlock()
		for _, j := range joiners {
			g.send(j, &Header{Type: typeJoinRsp, View: nv, Digest: d})
		}
	}
	g.waitAcks(aw, func(a stack.Address) {
		// A joiner ignores views until it has joined: it gets its answer
		// again, with the digest of the view it joined in.
		if slices.Contains(joiners, a) {
			g.mu.Lock()
			d := g.joinDigests[a]
			g.mu.Unlock()
			g.send(a, &Header{Type: typeJoinRsp, View: nv, Digest: d})
			return
		}
		g.send(a, vh)
	})
}

// waitAcks waits until every member of the view has acknowledged it. The
// members that have not get the view again (resend, by reliable unicast) every
// view_ack_timeout: a coordinator that went on without them would let the
// others unblock and send in the new view while they are still in the old
// one (and a leaving coordinator would leave them there for good). A member
// suspected meanwhile is no longer awaited; max_view_ack_wait bounds it all.
func (g *GMS) waitAcks(aw *ackWait, resend func(stack.Address)) {
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
		missing, giveUp := aw.tick(time.Now())
		g.mu.Unlock()
		if missing == nil && !giveUp {
			continue // not due yet, or acknowledged meanwhile
		}
		g.ackTimeouts.Add(1)
		if giveUp {
			g.Log().Warn("view not acknowledged by every member within max_view_ack_wait", "view", aw.id, "missing", missing, "max_view_ack_wait", g.cfg.MaxViewAckWait)
			return
		}
		g.Log().Info("view not acknowledged within view_ack_timeout; sending it again", "view", aw.id, "missing", missing, "timeout", g.cfg.ViewAckTimeout)
		for _, a := range missing {
			g.viewsResent.Add(1)
			resend(a)
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
