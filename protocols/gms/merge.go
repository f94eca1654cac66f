package gms

import (
	"maps"
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
	if v == nil || g.coordLocked() != self || g.merge != nil {
		g.mu.Unlock()
		return
	}
	g.mergeN++
	ms := &mergeState{id: MergeID{Leader: self, N: g.mergeN}, until: time.Now().Add(g.cfg.MergeTimeout), rsps: make(chan *mergeRsp, len(coords))}
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
	subs, ok := g.collectMerge(ms, v, others)
	if !ok {
		return
	}
	if len(subs) < 2 {
		g.count.mergesFailed.Add(1)
		for _, c := range others {
			g.send(c, &Header{Type: typeCancelMerge, MergeID: ms.id})
		}
		return
	}
	// With FLUSH above, every member of every subgroup blocks and the
	// members of each subgroup deliver the same messages before the merge
	// view, as before any view change. The digests are asked for again
	// after the flush: they must start the other subgroups' senders where
	// the flush left them, or a member would deliver in the merge view what
	// the others delivered in their old one.
	parts := mergeParticipants(subs)
	res, err := g.PassUpEvent(stack.EvStartFlush{Participants: parts, ViewChange: true, Merge: true})
	if err != nil {
		g.count.flushFailures.Add(1)
		g.count.mergesFailed.Add(1)
		g.Log().Warn("merge: cancelled, the flush failed", "error", err)
		for _, c := range others {
			g.send(c, &Header{Type: typeCancelMerge, MergeID: ms.id})
		}
		return
	}
	stopped := false
	defer func() {
		// The merge gave up after its flush: the group may send again.
		if !stopped {
			_, _ = g.PassUpEvent(stack.EvStopFlush{ViewChange: true})
		}
	}()
	var without []stack.Address
	if fr, ok := res.(stack.FlushResult); ok {
		without = fr.Without
		var answered []stack.Address
		for _, s := range subs[1:] {
			answered = append(answered, s.view.Coordinator())
		}
		again, ok := g.collectMerge(ms, g.View(), answered)
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
		g.Log().Warn("merge: excluding members the flush went on without", "excluded", without)
		g.count.flushExclusions.Add(int64(len(without)))
	}
	g.Log().Info("installing merge view", "view", mv)
	// After every member acknowledged the merge view (or the merge gave
	// up): its flush stops in it, and the group may send again.
	stopped = true
	g.announce(newMergeCast(self, &g.count, g.cfg, ms.id, mv, digest, without), nil)
}

// mergeSub is one subgroup of a merge: its view and its coordinator's digest.
type mergeSub struct {
	view   *stack.View
	digest stack.Digest
}

// collectMerge asks the coordinators for their views and digests (again,
// after the flush: the same merge id) and returns the leader's subgroup
// first, then those that accepted, within merge_timeout. ok is false when
// the stack stops.
func (g *GMS) collectMerge(ms *mergeState, own *stack.View, coords []stack.Address) (subs []mergeSub, ok bool) {
	g.mu.Lock()
	if ms.asked != nil {
		// Asking again (after the flush): a new id, so that no answer to
		// the earlier request, with a digest from before the flush, counts.
		g.mergeN++
		ms.id = MergeID{Leader: ms.id.Leader, N: g.mergeN}
	}
	for len(ms.rsps) > 0 { // answers to an earlier request
		<-ms.rsps
	}
	ms.asked = map[stack.Address]bool{}
	for _, c := range coords {
		ms.asked[c] = true
	}
	g.mu.Unlock()
	for _, c := range coords {
		g.send(c, &Header{Type: typeMergeReq, MergeID: ms.id})
	}
	subs = []mergeSub{{own, g.digest()}}
	t := time.NewTimer(g.cfg.MergeTimeout)
	defer t.Stop()
	// A request or answer can be lost (the last message of a reliable
	// unicast connection is not repaired until the next one): ask again
	// those that have not answered. The same merge id gets the same answer.
	again := time.NewTicker(g.cfg.MergeTimeout / 5)
	defer again.Stop()
	for waiting := len(coords); waiting > 0; {
		select {
		case <-again.C:
			g.mu.Lock()
			missing := slices.Collect(maps.Keys(ms.asked))
			g.mu.Unlock()
			for _, c := range missing {
				g.send(c, &Header{Type: typeMergeReq, MergeID: ms.id})
			}
		case r := <-ms.rsps:
			waiting--
			if r.h.Fail != "" || r.h.View == nil {
				g.Log().Info("merge refused", "by", r.from, "reason", r.h.Fail)
				continue
			}
			subs = append(subs, mergeSub{r.h.View, r.h.Digest})
		case <-t.C:
			g.Log().Warn("merge: not every coordinator answered within merge_timeout", "answered", len(subs)-1, "asked", len(coords))
			waiting = 0
		case <-g.Done():
			return nil, false
		}
	}
	return subs, true
}

// handleMergeReq is a subgroup coordinator's part: it answers with its view
// and digest and holds its own view changes until the merge view comes or
// merge_timeout passes.
func (g *GMS) handleMergeReq(src stack.Address, h *Header) {
	self := g.LocalAddress()
	g.mu.Lock()
	v := g.view
	fail := ""
	switch {
	case v == nil || g.coordLocked() != self:
		fail = "not a coordinator"
	case g.merge != nil && g.merge.id.Leader == h.MergeID.Leader && h.MergeID.N < g.merge.id.N:
		// A late copy of the leader's earlier request: it asks again with a
		// new id after its flush, and only that answer counts.
		g.mu.Unlock()
		g.count.msgsIgnored.Add(1)
		return
	case g.merge != nil && g.merge.id.Leader != h.MergeID.Leader && time.Now().Before(g.merge.until):
		fail = "busy with another merge"
	case v.Contains(src):
		fail = "already in one view"
	default:
		g.merge = &mergeState{id: h.MergeID, until: time.Now().Add(g.cfg.MergeTimeout)}
	}
	g.mu.Unlock()
	g.Log().Debug("gms: merge request", "from", src, "merge", h.MergeID, "fail", fail)
	if fail != "" {
		g.send(src, &Header{Type: typeMergeRsp, MergeID: h.MergeID, Fail: fail})
		return
	}
	g.send(src, &Header{Type: typeMergeRsp, MergeID: h.MergeID, View: v, Digest: g.digest()})
}

// Stats reports GMS's counters.
