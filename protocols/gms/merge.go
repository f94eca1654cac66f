package gms

import (
	"errors"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// ---- merging

// runMerge is the merge leader's part: it asks the other coordinators for
// their views and digests, and installs one merge view on every member.
func (g *GMS) runMerge(coords []stack.Address) {
	self := g.LocalAddress()
	g.mu.Lock()
	v := g.view
	if !g.mayLeadMergeLocked() {
		g.mu.Unlock()
		return
	}
	g.mergeN++
	ms := &mergeState{id: MergeID{Leader: self, N: g.mergeN}, until: time.Now().Add(g.cfg.MergeTimeout), leader: true, wake: make(chan struct{}, 1)}
	g.merge = ms
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		if g.merge == ms {
			g.merge = nil
		}
		g.mu.Unlock()
	}()

	var others []stack.Address
	for _, c := range coords {
		if c != self && !v.Contains(c) && !slices.Contains(others, c) {
			others = append(others, c)
		}
	}
	if len(others) == 0 {
		return
	}
	g.count.merges.Add(1)
	g.Log().Info("merging subgroups", "coordinators", append([]stack.Address{self}, others...))
	var subs []mergeSub
	var fr stack.FlushResult
	flushed := false // by FLUSH; without it no layer answers the flush
	for attempt := 0; ; attempt++ {
		var ok bool
		if subs, ok = g.collectMerge(ms, v, others); !ok {
			return
		}
		for try := 0; len(subs) < 2 && ms.ask.busy && try < mergeBusyRetries; try++ {
			// Another leader's merge held a coordinator (two coordinators
			// that each heard only part of the other's subgroup led at
			// once, and the other's merge is bound to fail): ask again
			// shortly, not a whole check_interval later. Meanwhile this
			// member is free to take part in that other merge; if it
			// does, it stops here.
			if !g.pauseMerge(ms) {
				return
			}
			if subs, ok = g.collectMerge(ms, v, others); !ok {
				return
			}
		}
		if len(subs) < 2 {
			g.count.mergesFailed.Add(1)
			for _, c := range others {
				g.send(c, &Header{Type: typeCancelMerge, MergeID: ms.id})
			}
			return
		}
		// With FLUSH above, every member of every subgroup blocks and the
		// members of each subgroup deliver the same messages before the
		// merge view, as before any view change. The digests are asked for
		// again after the flush: they must start the other subgroups'
		// senders where the flush left them, or a member would deliver in
		// the merge view what the others delivered in their old one.
		parts := mergeParticipants(subs)
		var err error
		fr, err = stack.AskUp(g, stack.EvStartViewChangeFlush{Participants: parts, Merge: true})
		if errors.Is(err, stack.ErrNotSupported) {
			break
		}
		if err == nil {
			flushed = true
			break
		}
		g.count.flushFailures.Add(1)
		for _, c := range others {
			g.send(c, &Header{Type: typeCancelMerge, MergeID: ms.id})
		}
		// The flush collided with another round (a subgroup changing its
		// view, say, which ends within seconds): the merge is asked for
		// and flushed again shortly, not a whole check_interval later.
		if attempt >= mergeBusyRetries || !g.pauseMerge(ms) {
			g.count.mergesFailed.Add(1)
			g.Log().Warn("merge: cancelled, the flush failed", "error", err)
			return
		}
		g.Log().Info("merge: the flush failed; asking again", "error", err)
	}
	stopped := false
	defer func() {
		// The merge gave up after its flush: the group may send again.
		if !stopped {
			_, _ = g.PassUpEvent(stack.EvStopViewChangeFlush{})
		}
	}()
	var without []stack.Address
	if flushed {
		without = fr.Without
		var answered []stack.Address
		for _, s := range subs[1:] {
			answered = append(answered, s.view.Coordinator())
		}
		g.mu.Lock()
		own, leaving := g.view, g.leaving
		g.mu.Unlock()
		if own == nil || leaving {
			// This member left (or began to) during the flush: nothing
			// to merge into.
			g.count.mergesFailed.Add(1)
			for _, c := range others {
				g.send(c, &Header{Type: typeCancelMerge, MergeID: ms.id})
			}
			return
		}
		again, ok := g.collectMerge(ms, own, answered)
		if !ok {
			return
		}
		if len(again) != len(subs) {
			// Without every subgroup's digest after the flush, the merge
			// view would start some senders at the wrong place.
			g.count.mergesFailed.Add(1)
			g.Log().Warn("merge: cancelled, a coordinator did not answer after the flush")
			for _, c := range others {
				g.send(c, &Header{Type: typeCancelMerge, MergeID: ms.id})
			}
			return
		}
		subs = again
	}
	mv, digest := planMerge(self, subs, without)
	if len(without) > 0 {
		g.Log().Warn("merge: excluding members the flush went on without", "members", without)
		g.count.flushExclusions.Add(int64(len(without)))
	}
	g.Log().Info("installing merge view", "view", mv.ID, "size", mv.Size())
	// After every member acknowledged the merge view (or the merge gave
	// up): its flush stops in it, and the group may send again.
	stopped = true
	g.announce(newMergeCast(self, &g.count, g.cfg, ms.id, mv, digest, without), nil)
}

// mayLeadMergeLocked reports whether this member may lead a merge now: it
// coordinates a view, takes part in no merge, and is not leaving (its view
// without itself and a merge view planned from the same view would get the
// same id). Callers hold g.mu.
func (g *GMS) mayLeadMergeLocked() bool {
	return g.view != nil && !g.leaving && g.merge == nil && g.coordLocked() == g.LocalAddress()
}

// mergeBusyRetries is how many times a merge leader asks again the
// coordinators that were busy with another merge.
const mergeBusyRetries = 2

// pauseMerge waits a random 1-3 s with ms off (so this member may take
// part in another leader's merge) and takes ms up again; it reports false
// when the merge must not go on: the stack stops, this member left, its
// view changed, or another merge took it.
func (g *GMS) pauseMerge(ms *mergeState) bool {
	g.mu.Lock()
	v := g.view
	if g.merge == ms {
		g.merge = nil
	}
	g.mu.Unlock()
	t := time.NewTimer(time.Second + g.Rand().Duration(2*time.Second))
	defer t.Stop()
	select {
	case <-t.C:
	case <-g.Done():
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.view != v || !g.mayLeadMergeLocked() {
		return false
	}
	ms.until = time.Now().Add(g.cfg.MergeTimeout)
	g.merge = ms
	return true
}

// mergeSub is one subgroup of a merge: its view and its coordinator's digest.
type mergeSub struct {
	view   *stack.View
	digest stack.Digest
}

// collectMerge asks the coordinators for their views and digests (again,
// after the flush: under a new merge id) and returns the leader's subgroup
// first, then those that accepted, within merge_timeout (mergeAsk decides).
// ok is false when the stack stops.
func (g *GMS) collectMerge(ms *mergeState, own *stack.View, coords []stack.Address) (subs []mergeSub, ok bool) {
	d := g.digest()
	g.mu.Lock()
	if ms.ask != nil {
		// Asking again (after the flush): a new id, so that no answer to
		// the earlier request, with a digest from before the flush, counts.
		g.mergeN++
		ms.id = MergeID{Leader: ms.id.Leader, N: g.mergeN}
	}
	ask, out := newMergeAsk(ms.id, mergeSub{own, d}, coords, g.cfg.MergeTimeout, time.Now())
	ms.ask = ask
	g.mu.Unlock()
	g.do(out)
	for {
		g.mu.Lock()
		out, over := ask.poll(time.Now())
		due := ask.retry.Due()
		g.mu.Unlock()
		g.do(out)
		if over {
			return ask.subs, true // over: no answer changes them any more
		}
		t := time.NewTimer(time.Until(due))
		select {
		case <-ms.wake:
		case <-t.C:
		case <-g.Done():
			t.Stop()
			return nil, false
		}
		t.Stop()
	}
}

// handleMergeReq is a subgroup coordinator's part: it answers with its view
// and digest and holds its own view changes until the merge view comes or
// merge_timeout passes.
func (g *GMS) handleMergeReq(src stack.Address, h *Header) {
	self := g.LocalAddress()
	g.mu.Lock()
	v := g.view
	var coord stack.Address
	if v != nil {
		coord = g.coordLocked()
	}
	now := time.Now()
	suspected := func(a stack.Address) bool { return g.suspects[a] } // under g.mu
	sub, fail, ignore := onMergeReq(self, coord, src, v, h.View, suspected, g.merge, h.MergeID, now)
	if fail == "" && g.leaving {
		// Its subgroup gets a view without it, whose coordinator merges.
		sub, fail = nil, "leaving"
	}
	if ignore {
		g.mu.Unlock()
		g.count.msgsIgnored.Add(1)
		return
	}
	if fail == "" {
		g.merge = &mergeState{id: h.MergeID, until: now.Add(g.cfg.MergeTimeout)}
	}
	g.mu.Unlock()
	g.Log().Debug("gms: merge request", "from", src, "merge", h.MergeID, "fail", fail)
	if fail != "" {
		g.send(src, &Header{Type: typeMergeRsp, MergeID: h.MergeID, Fail: fail})
		return
	}
	g.send(src, &Header{Type: typeMergeRsp, MergeID: h.MergeID, View: sub, Digest: g.digest()})
}

// Stats reports GMS's counters.
