package gms

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// TestCast drives the coordinator's view change (castRun) step by step, as
// coord.go and merge.go do, with time passed in: who takes part in the
// flush, who the flush excludes, what is installed, sent and answered, what
// goes again to whom when acknowledgements are missing, when the wait gives
// up, and how the flush ends.
func TestCast(t *testing.T) {
	as := []stack.Address{stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress()}
	slices.SortFunc(as, stack.Address.Compare)
	self, b, c, j, l := as[0], as[1], as[2], as[3], as[4]
	cfg := DefaultConfig()
	every, maxWait := cfg.ViewAckTimeout, cfg.MaxViewAckWait
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	noLogs := func(out []effect) []effect {
		return slices.DeleteFunc(out, func(e effect) bool { _, ok := e.(logLine); return ok })
	}
	d := stack.Digest{{Member: self, HighestDelivered: 4, HighestReceived: 4}}
	cur := stack.NewView(self, 3, self, b, c, l)

	t.Run("join and leave; the flush went on without a member", func(t *testing.T) {
		var n counters
		nv := stack.NewView(self, 4, self, b, c, j)
		r := newCast(self, &n, cfg, cur, nv, []stack.Address{j}, []stack.Address{l}, []stack.Address{j})
		require.Equal(t, []stack.Address{self, b, c, l}, r.parts, "the members that stay and the graceful leaver; not the joiner")

		require.NotEmpty(t, r.flushDone(stack.FlushResult{Without: []stack.Address{c}}, nil))
		want := stack.NewView(self, 4, self, b, j)
		require.Equal(t, want, r.nv, "c is out of the view")
		require.Equal(t, []stack.Address{c}, r.excluded)
		require.EqualValues(t, 1, n.flushExclusions.Load())
		require.True(t, r.needsDigest())

		vh := &Header{Type: typeView, View: want}
		rsp := &Header{Type: typeJoinRsp, View: want, Digest: d}
		require.Equal(t, []effect{
			installView{v: want},
			sendMsg{h: vh},
			rememberJoins{joiners: []stack.Address{j}, d: d, view: want.ID},
			sendMsg{to: j, h: rsp},
		}, r.announce(d, t0))

		r.acks.ack(b, want.ID)
		out, over := r.tick(t0.Add(every - 1))
		require.False(t, over)
		require.Empty(t, out, "nothing due yet")
		out, over = r.tick(t0.Add(every))
		require.False(t, over)
		require.Equal(t, []effect{sendMsg{to: c, h: vh}, sendMsg{to: j, h: rsp}}, noLogs(out),
			"the excluded member gets the view again, the joiner its answer")
		require.EqualValues(t, 2, n.viewsResent.Load())

		require.False(t, r.acks.ack(c, want.ID))
		require.True(t, r.acks.ack(j, want.ID), "the last acknowledgement")
		require.Equal(t, []effect{stopFlush{stack.EvStopViewChangeFlush{Participants: []stack.Address{j}, AwaitState: []stack.Address{j}, View: want}}}, r.finish())
	})

	t.Run("a failed flush: the view anyway, no round to stop", func(t *testing.T) {
		var n counters
		nv := stack.NewView(self, 4, self, b)
		r := newCast(self, &n, cfg, cur, nv, nil, nil, nil)
		require.Equal(t, []stack.Address{self, b}, r.parts, "suspected members take no part")
		require.NotEmpty(t, r.flushDone(stack.FlushResult{}, errors.New("flush: failed")))
		require.Equal(t, nv, r.nv)
		require.False(t, r.needsDigest())
		require.Equal(t, []effect{installView{v: nv}, sendMsg{h: &Header{Type: typeView, View: nv}}}, r.announce(nil, t0))
		require.Nil(t, r.finish())
		require.EqualValues(t, 1, n.flushFailures.Load())
	})

	t.Run("a leaving coordinator installs nothing and gives up at max_view_ack_wait", func(t *testing.T) {
		var n counters
		nv := stack.NewView(b, 4, b, c, l)
		r := newCast(self, &n, cfg, cur, nv, nil, []stack.Address{self}, nil)
		require.Equal(t, []stack.Address{self, b, c, l}, r.parts)
		r.flushDone(stack.FlushResult{}, nil)
		delta := &Delta{ID: nv.ID, Prev: cur.ID, Left: []stack.Address{self}}
		require.Equal(t, []effect{sendMsg{h: &Header{Type: typeView, Delta: delta}}}, r.announce(nil, t0),
			"the members that stay hold cur: the view goes as a delta, smaller than the view")
		out, over := r.tick(t0.Add(every))
		require.False(t, over)
		require.Equal(t, []effect{sendMsg{to: b, h: &Header{Type: typeView, View: nv}}, sendMsg{to: c, h: &Header{Type: typeView, View: nv}}, sendMsg{to: l, h: &Header{Type: typeView, View: nv}}},
			noLogs(out), "a member that did not acknowledge gets the view in full")
		out, over = r.tick(t0.Add(maxWait))
		require.True(t, over)
		require.Empty(t, noLogs(out))
		require.Equal(t, []effect{stopFlush{stack.EvStopViewChangeFlush{View: nv}}}, r.finish())
	})

	t.Run("a merge view goes to each member with its digest; those left out are told, not awaited", func(t *testing.T) {
		var n counters
		mv := stack.NewView(self, 9, self, b, j)
		id := MergeID{Leader: self, N: 2}
		r := newMergeCast(self, &n, cfg, id, mv, d, []stack.Address{c})
		ih := &Header{Type: typeInstallView, View: mv, Digest: d, MergeID: id}
		require.Equal(t, []effect{installView{v: mv, d: d}, sendMsg{to: b, h: ih}, sendMsg{to: j, h: ih}, sendMsg{to: c, h: ih}}, r.announce(nil, t0))
		r.acks.ack(b, mv.ID)
		out, _ := r.tick(t0.Add(every))
		require.Equal(t, []effect{sendMsg{to: j, h: ih}}, noLogs(out))
		require.True(t, r.acks.ack(j, mv.ID), "c is not awaited")
		require.Equal(t, []effect{stopFlush{stack.EvStopViewChangeFlush{View: mv}}}, r.finish())
	})
}

// TestMergeAsk drives a merge leader's request for the other coordinators'
// views: each asked once at the start and again, only those silent, every
// fifth of merge_timeout; one answer per coordinator under the current id
// counts; a refusal counts as an answer without a subgroup; asking ends
// when all answered or the timeout passed, and nothing counts after.
func TestMergeAsk(t *testing.T) {
	as := []stack.Address{stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress()}
	slices.SortFunc(as, stack.Address.Compare)
	self, b, c, x := as[0], as[1], as[2], as[3]
	const timeout = 5 * time.Second
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	id := MergeID{Leader: self, N: 3}
	own := mergeSub{view: stack.NewView(self, 2, self)}
	vb := stack.NewView(b, 7, b)
	req := &Header{Type: typeMergeReq, MergeID: id, View: own.view} // the leader's view: a member left out of it answers for the rest (onMergeReq)
	noLogs := func(out []effect) []effect {
		return slices.DeleteFunc(out, func(e effect) bool { _, ok := e.(logLine); return ok })
	}

	t.Run("answers and a refusal", func(t *testing.T) {
		a, out := newMergeAsk(id, own, []stack.Address{b, c, b}, timeout, t0)
		require.Equal(t, []effect{sendMsg{to: b, h: req}, sendMsg{to: c, h: req}}, out, "each coordinator once")
		ok, _ := a.answer(b, &Header{Type: typeMergeRsp, MergeID: MergeID{Leader: self, N: 2}, View: vb})
		require.False(t, ok, "an answer to an earlier request")
		ok, _ = a.answer(x, &Header{Type: typeMergeRsp, MergeID: id, View: vb})
		require.False(t, ok, "from a member not asked")
		ok, _ = a.answer(b, &Header{Type: typeMergeRsp, MergeID: id, View: vb, Digest: stack.Digest{{Member: b, HighestDelivered: 1}}})
		require.True(t, ok)
		ok, _ = a.answer(b, &Header{Type: typeMergeRsp, MergeID: id, View: vb})
		require.False(t, ok, "a second answer from the same coordinator")

		out, over := a.poll(t0.Add(timeout/5 - 1))
		require.False(t, over)
		require.Empty(t, out)
		out, over = a.poll(t0.Add(timeout / 5))
		require.False(t, over)
		require.Equal(t, []effect{sendMsg{to: c, h: req}}, out, "only the silent coordinator is asked again")

		ok, _ = a.answer(c, &Header{Type: typeMergeRsp, MergeID: id, Fail: "busy with another merge"})
		require.True(t, ok, "a refusal is an answer")
		_, over = a.poll(t0.Add(timeout / 5))
		require.True(t, over)
		require.Equal(t, []mergeSub{own, {view: vb, digest: stack.Digest{{Member: b, HighestDelivered: 1}}}}, a.subs)
	})

	t.Run("timeout", func(t *testing.T) {
		a, _ := newMergeAsk(id, own, []stack.Address{b}, timeout, t0)
		out, over := a.poll(t0.Add(timeout))
		require.True(t, over)
		require.Empty(t, noLogs(out))
		ok, _ := a.answer(b, &Header{Type: typeMergeRsp, MergeID: id, View: vb})
		require.False(t, ok, "nothing counts once asking is over")
		require.Equal(t, []mergeSub{own}, a.subs)
	})
}

// TestOnMergeReq checks a coordinator's answer to a merge request: refused
// by a member that is not coordinator, busy with another leader's merge
// (until it times out), or already in the leader's view; a late copy of the
// leader's earlier request is ignored; a leader's new request replaces its
// earlier one. A member whose coordinator is in the leader's view (it went
// on without the member) answers for what is left of its view when it is
// the first of them.
func TestOnMergeReq(t *testing.T) {
	self, b, leader, other, x, gone := stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	v := stack.NewView(self, 4, self, b)
	lv := stack.NewView(leader, 9, leader)
	movedOn := stack.NewView(leader, 9, leader, b) // b went on to the leader's view
	vb := stack.NewView(b, 5, b, self, x)          // b's view, which b left
	id := MergeID{Leader: leader, N: 5}
	cases := []struct {
		name   string
		coord  stack.Address
		src    stack.Address
		v, lv  *stack.View
		cur    *mergeState
		sub    *stack.View
		fail   string
		ignore bool
	}{
		{"accepted", self, leader, v, lv, nil, v, "", false},
		{"no view yet", self, leader, nil, lv, nil, nil, "not a coordinator", false},
		{"not the coordinator", b, leader, v, lv, nil, nil, "not a coordinator", false},
		{"another leader's merge", self, leader, v, lv, &mergeState{id: MergeID{Leader: other, N: 1}, until: t0.Add(time.Second)}, nil, "busy with another merge", false},
		{"another leader's merge, timed out", self, leader, v, lv, &mergeState{id: MergeID{Leader: other, N: 1}, until: t0}, v, "", false},
		{"the leader's earlier request, late", self, leader, v, lv, &mergeState{id: MergeID{Leader: leader, N: 6}, until: t0.Add(time.Second)}, nil, "", true},
		{"the leader asks again after its flush", self, leader, v, lv, &mergeState{id: MergeID{Leader: leader, N: 4}, until: t0.Add(time.Second)}, v, "", false},
		{"the leader is in this view already", self, b, v, lv, nil, nil, "already in one view", false},
		{"left out by its coordinator, first of the rest", b, leader, vb, movedOn, nil, stack.NewView(b, 5, self, x), "", false},
		{"left out by its coordinator, not first of the rest", b, leader, stack.NewView(b, 5, b, x, self), movedOn, nil, nil, "not a coordinator", false},
		{"its coordinator is not in the leader's view", b, leader, vb, lv, nil, nil, "not a coordinator", false},
		{"its coordinator crashed, the rest left out", gone, leader, stack.NewView(gone, 5, gone, self, x), movedOn, nil, stack.NewView(gone, 5, self, x), "", false},
		{"its coordinator crashed, not first of the rest", gone, leader, stack.NewView(gone, 5, gone, x, self), lv, nil, nil, "not a coordinator", false},
		{"left out by the leader itself", b, b, vb, stack.NewView(b, 6, b), nil, stack.NewView(b, 5, self, x), "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sub, fail, ignore := onMergeReq(self, tc.coord, tc.src, tc.v, tc.lv, func(a stack.Address) bool { return a == gone }, tc.cur, id, t0)
			require.Equal(t, tc.fail, fail)
			require.Equal(t, tc.ignore, ignore)
			require.Equal(t, tc.sub, sub)
		})
	}
}
