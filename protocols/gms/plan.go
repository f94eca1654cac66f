package gms

import (
	"maps"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// GMS's decisions, apart from its I/O: what view follows a bundle of
// requests, who the flush before it excludes, what a merge view holds, what
// a member does with a view, a join answer or a merge request, and which
// acknowledgements a view still awaits. These functions take the state
// they need and return what to do; they start nothing, send nothing and
// read no clock, so they are tested directly (plan_test.go). The state
// machines that carry a view change and a merge request out are in
// cast.go and mergeask.go; coord.go, join.go, merge.go and receive.go do
// the I/O.

// viewPlan is what the coordinator does with one bundle of requests.
type viewPlan struct {
	// next is the view to install; nil: the membership stays as it is.
	next *stack.View
	// joiners are new members of next; stateJoiners those of them that
	// fetch the state inside its flush.
	joiners, stateJoiners []stack.Address
	// leaving are members that leave gracefully (not suspected): they take
	// part in the flush before next.
	leaving []stack.Address
	// rejoiners asked to join but are members already (their answer was
	// lost): they get the current view again.
	rejoiners []stack.Address
	// leavers asked to leave; each gets a LEAVE_RSP (self: it leaves).
	leavers []stack.Address
	// merge lists the coordinators of the last merge request (this member
	// first); nil: no merge.
	merge []stack.Address
	// joins counts the join requests handled (repeats included).
	joins int
}

// planView decides what follows view v, coordinated by self, once the
// bundled requests reqs are applied: suspected members and leavers go;
// joiners not already members and not going come in, in the order they
// asked; a refresh (a member announced a view id this coordinator never
// installed, or missed one) forces a new view numbered above both. The
// new view's creator is self, its number one above v's (or above the
// refresh's).
func planView(v *stack.View, self stack.Address, suspects map[stack.Address]bool, reqs []request) viewPlan {
	var p viewPlan
	var above uint64
	refresh := false
	gone := map[stack.Address]bool{}
	for a := range suspects {
		gone[a] = true
	}
	var joins []request
	for _, r := range reqs {
		switch r.kind {
		case reqRefresh:
			refresh, above = true, max(above, r.above)
		case reqJoin:
			joins = append(joins, r)
		case reqLeave:
			p.leavers = append(p.leavers, r.addr)
			gone[r.addr] = true
			if !suspects[r.addr] && v.Contains(r.addr) && !slices.Contains(p.leaving, r.addr) {
				p.leaving = append(p.leaving, r.addr)
			}
		case reqMerge:
			p.merge = r.coords
		}
	}
	p.joins = len(joins)
	members := slices.DeleteFunc(slices.Clone(v.Members), func(m stack.Address) bool { return gone[m] })
	for _, r := range joins {
		switch {
		case gone[r.addr]:
		case v.Contains(r.addr):
			if !slices.Contains(p.rejoiners, r.addr) {
				p.rejoiners = append(p.rejoiners, r.addr)
			}
		case !slices.Contains(members, r.addr):
			members = append(members, r.addr)
			p.joiners = append(p.joiners, r.addr)
			if r.state {
				p.stateJoiners = append(p.stateJoiners, r.addr)
			}
		}
	}
	if len(members) != len(v.Members) || len(p.joiners) > 0 || refresh {
		p.next = stack.NewView(self, max(v.ID.Seq, above)+1, members...)
	}
	return p
}

// withoutUnflushed removes from nv the members the flush before it went on
// without (they did not answer in time, were unblocked and may have sent
// since: keeping them would let the others deliver those messages in nv).
// It returns the view to install, and the members it excluded.
func withoutUnflushed(nv *stack.View, without []stack.Address) (*stack.View, []stack.Address) {
	var excluded []stack.Address
	members := slices.DeleteFunc(slices.Clone(nv.Members), func(a stack.Address) bool {
		if slices.Contains(without, a) {
			excluded = append(excluded, a)
			return true
		}
		return false
	})
	if len(excluded) == 0 {
		return nv, nil
	}
	return stack.NewView(nv.ID.Creator, nv.ID.Seq, members...), excluded
}

// mergeParticipants lists every member of every subgroup of a merge, once:
// they all take part in the flush before the merge view.
func mergeParticipants(subs []mergeSub) []stack.Address {
	var parts []stack.Address
	for _, s := range subs {
		for _, m := range s.view.Members {
			if !slices.Contains(parts, m) {
				parts = append(parts, m)
			}
		}
	}
	return parts
}

// planMerge composes the merge view the leader self installs: its own
// subgroup (subs[0]) first, then the others by coordinator; each member
// once, in its first subgroup's order; none of without (members the flush
// went on without); numbered above every subgroup's view. The digest takes
// each member's entry from the subgroup it is listed in. It sorts subs[1:].
func planMerge(self stack.Address, subs []mergeSub, without []stack.Address) (*stack.View, stack.Digest) {
	slices.SortStableFunc(subs[1:], func(a, b mergeSub) int { return a.view.Coordinator().Compare(b.view.Coordinator()) })
	var members []stack.Address
	var views []*stack.View
	var digest stack.Digest
	seq := uint64(0)
	for _, s := range subs {
		views = append(views, s.view)
		seq = max(seq, s.view.ID.Seq)
		for _, m := range s.view.Members {
			if slices.Contains(members, m) || slices.Contains(without, m) {
				continue
			}
			members = append(members, m)
			if e, ok := s.digest.Get(m); ok {
				digest = append(digest, e)
			}
		}
	}
	return stack.NewMergeView(self, seq+1, members, views), digest
}

// onMergeReq decides what coordinator candidate self (coord: the member
// that coordinates its view v; suspected: the members it suspects)
// answers to the MERGE_REQ of merge id from src, whose view is leader,
// while it takes part in merge cur (nil: none). ignore: a late copy of the
// leader's earlier request (it asks again under a new id after its flush,
// and only that answer counts). fail says why it refuses: it is not a
// coordinator, it takes part in another leader's merge that has not timed
// out, or src is in its view already. Otherwise it accepts, and sub is the
// subgroup it answers for: its view, or, when its coordinator is in the
// leader's view (it went on without self) or suspected (it crashed or
// left), what is left of v without the leader's members and the
// suspected, if self is the first of them: nobody else coordinates them.
// failMergeBusy is a coordinator's refusal while it takes part in another
// leader's merge (or leads one); the leader asks again shortly.
const failMergeBusy = "busy with another merge"

// declinedJoin is a LEAVE_REQ's reason from a joiner whose late join
// answer came after it joined another group: the coordinator drops it as
// it drops a crashed member.
const declinedJoin = "joined another group"

func onMergeReq(self, coord, src stack.Address, v, leader *stack.View, suspected func(stack.Address) bool, cur *mergeState, id MergeID, now time.Time) (sub *stack.View, fail string, ignore bool) {
	sub = v
	if v != nil && coord != self {
		sub = nil
		if leader.Contains(coord) || coord.IsZero() || suspected != nil && suspected(coord) {
			sub = leftOut(v, leader, suspected)
		}
	}
	switch {
	case sub == nil || sub.Coordinator() != self:
		return nil, "not a coordinator", false
	case cur != nil && cur.id.Leader == id.Leader && id.N < cur.id.N:
		return nil, "", true
	case cur != nil && cur.id.Leader != id.Leader && now.Before(cur.until):
		return nil, failMergeBusy, false
	case sub.Contains(src):
		return nil, "already in one view", false
	}
	return sub, "", false
}

// leftOut returns what is left of view v without the members of view
// leader and those suspected, under v's id (nil if nothing is). Its first
// member answers a merge for all of them: if the coordinator of v is
// among them, it is that coordinator.
func leftOut(v, leader *stack.View, suspected func(stack.Address) bool) *stack.View {
	rest := slices.DeleteFunc(slices.Clone(v.Members), func(a stack.Address) bool {
		return leader.Contains(a) || suspected != nil && suspected(a)
	})
	if len(rest) == 0 {
		return nil
	}
	return stack.NewView(v.ID.Creator, v.ID.Seq, rest...)
}

// joinAction is what a joiner does with the outcome of one join attempt.
type joinAction uint8

const (
	// joinRetry: no answer within join_timeout; find the coordinator again.
	joinRetry joinAction = iota
	// joinJoined: the answer's view has this member; install it.
	joinJoined
	// joinRefused: refused for good (a layer below, AUTH, says why).
	joinRefused
	// joinRedirected: not the coordinator (or busy); ask the member the
	// answer names, or, if none, find the coordinator again after a pause.
	joinRedirected
	// joinStray: an answer with a view without this member; find the
	// coordinator again.
	joinStray
)

// onJoinRsp decides what joiner self does with the answer rsp to its join
// request (nil: none in time), and whom it asks next (zero: it runs
// discovery again).
func onJoinRsp(self stack.Address, rsp *Header) (joinAction, stack.Address) {
	switch {
	case rsp == nil:
		return joinRetry, stack.Address{}
	case rsp.refused != nil:
		return joinRefused, stack.Address{}
	case rsp.Fail != "":
		if rsp.Coord == self {
			return joinRedirected, stack.Address{}
		}
		return joinRedirected, rsp.Coord
	case rsp.View != nil && rsp.View.Contains(self):
		return joinJoined, stack.Address{}
	}
	return joinStray, stack.Address{}
}

// viewAction is what a member does with a view it received.
type viewAction uint8

const (
	// viewInstall: install it (unless it is this member's own view coming
	// back) and acknowledge it.
	viewInstall viewAction = iota
	// viewIgnore: a view while still joining (it comes with the join
	// answer), or from a member with no say in it (forged or stray);
	// counted as ignored.
	viewIgnore
	// viewStale: a view without this member that is not newer than its
	// own, or its own; nothing to do.
	viewStale
	// viewLeft: this member is leaving and the view without it confirms it.
	viewLeft
	// viewExcluded: the group went on without this member while it is
	// alive; it acknowledges, carries on alone, and merges back.
	viewExcluded
)

// onView decides what member self, in view cur (nil: still joining) and
// leaving or not, does with view v received from src. A view comes from a
// member of the current view or of the view itself (a merge leader); one
// that excludes this member only from a member of the current view, or
// from a merge leader whose merge view names this member's view as a
// subgroup and leaves this member out (the merge's flush went on without
// it). Anything else is forged or stray.
func onView(self, src stack.Address, cur, v *stack.View, leaving bool) viewAction {
	if cur == nil {
		return viewIgnore
	}
	named := v.IsMerge() && slices.ContainsFunc(v.Subgroups, func(s *stack.View) bool { return s.ID == cur.ID })
	if src != self && !cur.Contains(src) && (!v.Contains(src) || !v.Contains(self)) && !(named && !v.Contains(self)) {
		return viewIgnore
	}
	switch {
	case v.Contains(self):
		return viewInstall
	case !newer(v, cur) || src == self:
		return viewStale
	case leaving:
		return viewLeft
	}
	return viewExcluded
}

// viewAcks tracks the acknowledgements of one view at its coordinator:
// who is still awaited, and (the retry schedule) when the view goes again
// to those that have not acknowledged it and when the coordinator stops
// waiting. Time is passed in; it has no clock or lock.
type viewAcks struct {
	id      stack.ViewID
	missing map[stack.Address]bool
	retry   stack.Retry
}

func newViewAcks(id stack.ViewID, expect []stack.Address, now time.Time, every, maxWait time.Duration) *viewAcks {
	a := &viewAcks{id: id, missing: map[stack.Address]bool{}, retry: stack.NewRetry(now, every, maxWait)}
	for _, m := range expect {
		a.missing[m] = true
	}
	return a
}

// ack takes from's acknowledgement of view id; it reports whether that was
// the last one awaited.
func (a *viewAcks) ack(from stack.Address, id stack.ViewID) bool {
	if id != a.id {
		return false
	}
	return a.forget(from)
}

// forget stops awaiting m (suspected); it reports whether m was the last
// one awaited.
func (a *viewAcks) forget(m stack.Address) bool {
	if !a.missing[m] {
		return false
	}
	delete(a.missing, m)
	return len(a.missing) == 0
}

// complete reports whether every acknowledgement has come.
func (a *viewAcks) complete() bool { return len(a.missing) == 0 }

// due returns when tick has something to do.
func (a *viewAcks) due() time.Time { return a.retry.Due() }

// tick returns, at now, the members to send the view again (in address
// order; nil when no resend is due or none is missing), or giveUp once
// max_view_ack_wait has passed (with those still missing).
func (a *viewAcks) tick(now time.Time) (missing []stack.Address, giveUp bool) {
	if a.complete() {
		return nil, false
	}
	resend, expired := a.retry.At(now)
	if !resend && !expired {
		return nil, false
	}
	return slices.SortedFunc(maps.Keys(a.missing), stack.Address.Compare), expired
}

// makeDelta returns view nv as its change from prev, the view every member
// that stays holds (nil: send nv in full). It is nil for a merge view, for
// a first view, when the delta would not apply to prev as nv (members
// reordered), or when it would not be smaller than nv.
func makeDelta(prev, nv *stack.View) *Delta {
	if prev == nil || nv.IsMerge() {
		return nil
	}
	in := make(map[stack.Address]bool, len(nv.Members))
	for _, m := range nv.Members {
		in[m] = true
	}
	was := make(map[stack.Address]bool, len(prev.Members))
	d := &Delta{ID: nv.ID, Prev: prev.ID}
	for _, m := range prev.Members {
		was[m] = true
		if !in[m] {
			d.Left = append(d.Left, m)
		}
	}
	for _, m := range nv.Members {
		if !was[m] {
			d.Joined = append(d.Joined, m)
		}
	}
	if got := d.apply(prev); got == nil || !slices.Equal(got.Members, nv.Members) || d.size() >= stack.ViewSize(nv) {
		return nil
	}
	return d
}

// apply returns the view d makes of cur, or nil if d does not apply to it:
// cur is not the view d follows, or d's members do not fit cur's (it
// leaves members cur lacks, or brings in members cur has).
func (d *Delta) apply(cur *stack.View) *stack.View {
	if cur == nil || cur.ID != d.Prev {
		return nil
	}
	left := make(map[stack.Address]bool, len(d.Left))
	for _, a := range d.Left {
		if !cur.Contains(a) {
			return nil
		}
		left[a] = true
	}
	members := make([]stack.Address, 0, len(cur.Members)-len(d.Left)+len(d.Joined))
	for _, m := range cur.Members {
		if !left[m] {
			members = append(members, m)
		}
	}
	seen := make(map[stack.Address]bool, len(members)+len(d.Joined))
	for _, m := range members {
		seen[m] = true
	}
	for _, a := range d.Joined {
		if seen[a] {
			return nil
		}
		seen[a] = true
		members = append(members, a)
	}
	return stack.NewView(d.ID.Creator, d.ID.Seq, members...)
}
