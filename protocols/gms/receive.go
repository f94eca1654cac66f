package gms

import (
	"github.com/strata-go/strata/stack"
)

// ---- receiving

// Up handles GMS messages; others pass.
func (g *GMS) Up(m *stack.Message) {
	h, ok := m.Header(g.ID()).(*Header)
	if !ok {
		g.PassUp(m)
		return
	}
	if h.Type == typePart {
		g.part(m.Src, h.Part, m.Payload)
		return
	}
	g.handle(m.Src, h)
}

func (g *GMS) handle(src stack.Address, h *Header) {
	self := g.LocalAddress()
	if src == self && h.Type != typeView {
		return
	}
	switch h.Type {
	case typeJoinReq:
		g.mu.Lock()
		v := g.view
		coord := stack.Address{}
		if v != nil {
			coord = g.coordLocked()
		}
		g.mu.Unlock()
		if v == nil {
			g.count.msgsIgnored.Add(1)
			return
		}
		if coord != self {
			g.send(src, &Header{Type: typeJoinRsp, Coord: coord, Fail: "not the coordinator"})
			return
		}
		g.enqueue(request{kind: reqJoin, addr: src, state: h.State})
	case typeJoinRsp:
		g.mu.Lock()
		asked, cur := g.askedCoord, g.view
		g.mu.Unlock()
		if src != asked {
			g.count.msgsIgnored.Add(1) // not the member this one asked to join
			if cur != nil && h.Fail == "" && h.View.Contains(self) && !cur.Contains(src) {
				// A coordinator this member asked earlier (its answer
				// was late, and this member joined another) took it in:
				// it declines at once, or that coordinator waits for its
				// acknowledgement of the view until max_view_ack_wait,
				// holding up its joins and merges, and its view overlaps
				// another (a cold start under loss). Not while still
				// joining: it may yet ask that coordinator again and join
				// it.
				g.count.joinsDeclined.Add(1)
				g.Log().Info("a late join answer from a coordinator this member did not join; leaving its view", "coordinator", src, "view", h.View.ID)
				g.send(src, &Header{Type: typeLeaveReq, Fail: declinedJoin, ViewID: h.View.ID})
			}
			return
		}
		select {
		case g.joinRsp <- h:
		default:
		}
	case typeView:
		if h.Delta != nil {
			g.handleDelta(src, h.Delta)
			return
		}
		g.handleView(src, h.View, nil)
	case typeGetView:
		// A member lacks the view a delta of this member's applies to:
		// it gets the view in full (the current one, or the last this
		// member announced if that is newer: a leaving coordinator does
		// not install its last view). Only a member of that view: one it
		// leaves out gets it again with the others that did not
		// acknowledge it, and an outsider gets nothing.
		g.mu.Lock()
		v := g.view
		if a := g.announced; a != nil && (v == nil || a.ID.Compare(v.ID) > 0) {
			v = a
		}
		var rsp *Header
		if v != nil && v.ID.Compare(h.ViewID) >= 0 && v.Contains(src) {
			rsp = g.fullViewLocked(v)
		}
		g.mu.Unlock()
		if rsp == nil {
			g.count.msgsIgnored.Add(1)
			return
		}
		g.count.viewsResent.Add(1)
		g.send(src, rsp)
	case typeInstallView:
		g.handleView(src, h.View, h.Digest)
	case typeViewAck:
		g.ack(src, h.ViewID)
	case typeLeaveReq:
		if h.Fail != "" {
			// A joiner that joined another group declines view h.ViewID
			// (a late join answer): it is gone as a crashed member is,
			// so its acknowledgement is not awaited and it takes no part
			// in the flush of the view without it (a leaver would, and
			// would wait for ever for a view it is not in). Only while
			// that view is this member's: after another (a merge with
			// the decliner's group, say) the decline is stale.
			g.mu.Lock()
			cur := g.view
			g.mu.Unlock()
			if cur != nil && cur.ID == h.ViewID {
				g.suspect([]stack.Address{src})
			} else {
				g.count.msgsIgnored.Add(1)
			}
			return
		}
		g.enqueue(request{kind: reqLeave, addr: src})
	case typeLeaveRsp:
		g.leftGroup()
	case typeMergeReq:
		g.handleMergeReq(src, h)
	case typeMergeRsp:
		// One answer from each coordinator asked: any other is stray or
		// forged (merge ids are not secret).
		g.mu.Lock()
		ms := g.merge
		var ok bool
		var out []effect
		if ms != nil && ms.ask != nil {
			ok, out = ms.ask.answer(src, h)
		}
		g.mu.Unlock()
		g.Log().Debug("gms: merge response", "from", src, "merge", h.MergeID, "taken", ok)
		if !ok {
			g.count.msgsIgnored.Add(1)
			return
		}
		g.do(out)
		select {
		case ms.wake <- struct{}{}:
		default:
		}
	case typeCancelMerge:
		g.mu.Lock()
		if g.merge != nil && g.merge.id == h.MergeID && !g.merge.leader {
			g.merge = nil
		}
		g.mu.Unlock()
		g.kick()
	}
}

// handleDelta takes a view sent as a delta: applied to the view this
// member holds, it is the new view; if this member lacks the view the delta
// follows (it missed a view), it asks the sender for the new one in full.
// A joiner ignores it: its view comes with its join answer. What is made
// of a delta goes through the same checks as a view sent in full.
func (g *GMS) handleDelta(src stack.Address, d *Delta) {
	if src == g.LocalAddress() {
		return // this coordinator's own view: installed when it was sent
	}
	g.mu.Lock()
	cur := g.view
	g.mu.Unlock()
	if cur == nil || !cur.Contains(src) {
		// Joining, or from a member with no say in this member's view
		// (forged or stray; a coordinator this member does not know
		// sends the view again in full if it is real).
		g.count.msgsIgnored.Add(1)
		return
	}
	v := d.apply(cur)
	if v == nil {
		if d.ID.Compare(cur.ID) <= 0 {
			return // not newer than this member's view
		}
		g.count.deltasMissed.Add(1)
		g.Log().Debug("gms: a delta view for a view this member does not hold; asking for it in full", "view", d.ID, "after", d.Prev, "have", cur.ID, "from", src)
		g.send(src, &Header{Type: typeGetView, ViewID: d.ID})
		return
	}
	g.count.deltasApplied.Add(1)
	g.handleView(src, v, nil)
}

func (g *GMS) handleView(src stack.Address, v *stack.View, d stack.Digest) {
	self := g.LocalAddress()
	if v == nil {
		return
	}
	g.mu.Lock()
	cur, leaving := g.view, g.leaving
	g.mu.Unlock()
	switch onView(self, src, cur, v, leaving) {
	case viewIgnore:
		g.count.msgsIgnored.Add(1)
		return
	case viewStale:
		return
	case viewLeft:
		g.leftGroup()
		return
	case viewExcluded:
		// Excluded (suspected while alive, or left out of a flush): say
		// so to the coordinator, which waits for it, and carry on alone;
		// MERGE3 brings this member back.
		if !v.IsMerge() {
			g.send(src, &Header{Type: typeViewAck, ViewID: v.ID})
		}
		g.Log().Warn("excluded from the view; continuing as a group of one until a merge", "view", v.ID)
		g.install(stack.NewView(self, v.ID.Seq+1, self), nil)
		return
	}
	if src != self {
		g.install(v, d)
	}
	g.mu.Lock()
	now := g.view
	g.mu.Unlock()
	if now != nil && now.ID == v.ID && src != self {
		g.send(src, &Header{Type: typeViewAck, ViewID: v.ID})
	}
	if d != nil {
		g.mu.Lock()
		if g.merge != nil && !g.merge.leader && g.merge.id.Leader == src {
			g.merge = nil
		}
		g.mu.Unlock()
	}
}

func (g *GMS) leftGroup() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.leaving {
		return
	}
	select {
	case <-g.leaveDone:
	default:
		close(g.leaveDone)
	}
}

// UpEvent takes suspicions and merge requests.
func (g *GMS) UpEvent(ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvSuspect:
		g.suspect(e.Members)
		// Layers above (GROUPFC) learn that these members' nodes are down.
		return g.PassUpEvent(ev)
	case stack.EvUnsuspect:
		g.mu.Lock()
		delete(g.suspects, e.Member)
		g.mu.Unlock()
		return g.PassUpEvent(ev)
	case stack.EvJoinRefused:
		// A layer below (AUTH) says the coordinator refused this member
		// for good: the join ends with its reason.
		if e.Reason != nil {
			g.mu.Lock()
			asked := g.askedCoord
			g.mu.Unlock()
			if e.By == asked {
				select {
				case g.joinRsp <- &Header{Type: typeJoinRsp, Fail: e.Reason.Error(), refused: e.Reason}:
				default:
				}
			}
		}
		return stack.Answer{}, nil
	case stack.EvMerge:
		if len(e.Coords) > 1 {
			g.enqueue(request{kind: reqMerge, coords: e.Coords})
		}
		return stack.Answer{}, nil
	case stack.EvViewInconsistent:
		g.mu.Lock()
		v := g.view
		g.mu.Unlock()
		if v == nil || v.Coordinator() != g.LocalAddress() {
			return stack.Answer{}, nil
		}
		// Members that missed a view get the current one by unicast
		// (reliable), in full (fullViewLocked); a view this coordinator
		// never installed is overtaken by a new one above it.
		g.mu.Lock()
		h := g.fullViewLocked(v)
		g.mu.Unlock()
		for _, a := range e.Behind {
			if v.Contains(a) && a != g.LocalAddress() {
				g.count.viewsResent.Add(1)
				g.send(a, h)
			}
		}
		if e.Above >= v.ID.Seq {
			g.enqueue(request{kind: reqRefresh, above: e.Above})
		}
		return stack.Answer{}, nil
	}
	return g.PassUpEvent(ev)
}

// fullViewLocked returns the message that sends view v in full to a member
// that missed it; callers hold g.mu. A merge view goes with the digest it
// came with: a member that missed it must start the other subgroups'
// senders where the others did, not at seqno 0, or it waits for ever for
// messages purged long ago. Any other view goes bare: its new members are
// joiners, whose messages start at seqno 1.
func (g *GMS) fullViewLocked(v *stack.View) *Header {
	if g.viewDigestID == v.ID {
		return &Header{Type: typeInstallView, View: v, Digest: g.viewDigest}
	}
	return &Header{Type: typeView, View: v}
}

func (g *GMS) suspect(as []stack.Address) {
	self := g.LocalAddress()
	g.mu.Lock()
	added := false
	for _, a := range as {
		if a != self && g.view.Contains(a) && !g.suspects[a] {
			g.suspects[a] = true
			added = true
		}
		// A view's acknowledgement is no longer awaited from it.
		if aw := g.acks; aw != nil {
			aw.settle(aw.forget(a))
		}
	}
	coord := g.view != nil && g.coordLocked() == self
	g.mu.Unlock()
	if added {
		g.count.suspectsHandled.Add(1)
		g.Log().Info("members suspected", "members", as)
	}
	if added && coord {
		g.enqueue(request{kind: reqSuspect})
	}
}
