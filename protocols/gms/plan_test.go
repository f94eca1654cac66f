package gms

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// TestPlanView checks the coordinator's decision for one bundle of
// requests, case by case, without a stack: who is in the next view, in
// what order, under which number, and who gets which answer.
func TestPlanView(t *testing.T) {
	a, b, c, d, e := stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	names := map[stack.Address]string{a: "A", b: "B", c: "C", d: "D", e: "E"}
	nm := func(as []stack.Address) []string {
		var out []string
		for _, x := range as {
			out = append(out, names[x])
		}
		return out
	}
	join := func(x stack.Address) request { return request{kind: reqJoin, addr: x} }
	leave := func(x stack.Address) request { return request{kind: reqLeave, addr: x} }
	v := stack.NewView(a, 7, a, b, c)

	type want struct {
		next                  []string // nil: no new view
		seq                   uint64
		joiners, stateJoiners []string
		leaving, leavers      []string
		rejoiners, merge      []string
		joins                 int
	}
	cases := []struct {
		name     string
		self     stack.Address
		suspects []stack.Address
		reqs     []request
		want     want
	}{
		{name: "nothing to do", self: a, want: want{}},
		{name: "joiners come in at the end, in the order they asked", self: a,
			reqs: []request{join(e), join(d)},
			want: want{next: []string{"A", "B", "C", "E", "D"}, seq: 8, joiners: []string{"E", "D"}, joins: 2}},
		{name: "a joiner asking twice in one bundle joins once", self: a,
			reqs: []request{join(d), join(d)},
			want: want{next: []string{"A", "B", "C", "D"}, seq: 8, joiners: []string{"D"}, joins: 2}},
		{name: "a joiner fetching the state is listed for the flush", self: a,
			reqs: []request{join(d), {kind: reqJoin, addr: e, state: true}},
			want: want{next: []string{"A", "B", "C", "D", "E"}, seq: 8, joiners: []string{"D", "E"}, stateJoiners: []string{"E"}, joins: 2}},
		{name: "a graceful leaver takes part in the flush and gets an answer", self: a,
			reqs: []request{leave(b)},
			want: want{next: []string{"A", "C"}, seq: 8, leaving: []string{"B"}, leavers: []string{"B"}}},
		{name: "a suspected member goes without a flush of its own", self: a, suspects: []stack.Address{c},
			want: want{next: []string{"A", "B"}, seq: 8}},
		{name: "a suspected member that asks to leave is answered but not awaited", self: a, suspects: []stack.Address{c},
			reqs: []request{leave(c)},
			want: want{next: []string{"A", "B"}, seq: 8, leavers: []string{"C"}}},
		{name: "a member asking to join again gets the current view, no new one", self: a,
			reqs: []request{join(b)},
			want: want{rejoiners: []string{"B"}, joins: 1}},
		{name: "joining and leaving in one bundle: not a member", self: a,
			reqs: []request{join(d), leave(d)},
			want: want{leavers: []string{"D"}, joins: 1}},
		{name: "a suspected joiner is not taken in", self: a, suspects: []stack.Address{d},
			reqs: []request{join(d)},
			want: want{joins: 1}},
		{name: "a refresh makes a view above the one never installed", self: a,
			reqs: []request{{kind: reqRefresh, above: 9}, {kind: reqRefresh, above: 8}},
			want: want{next: []string{"A", "B", "C"}, seq: 10}},
		{name: "a refresh below the current view still moves it on", self: a,
			reqs: []request{{kind: reqRefresh}},
			want: want{next: []string{"A", "B", "C"}, seq: 8}},
		{name: "taking over: the next coordinator drops the old one and creates the view", self: b, suspects: []stack.Address{a},
			reqs: []request{join(d)},
			want: want{next: []string{"B", "C", "D"}, seq: 8, joiners: []string{"D"}, joins: 1}},
		{name: "the last merge request counts", self: a,
			reqs: []request{{kind: reqMerge, coords: []stack.Address{a, d}}, {kind: reqMerge, coords: []stack.Address{a, e}}},
			want: want{merge: []string{"A", "E"}}},
		{name: "the coordinator leaving gets no LEAVE_RSP of its own but leaves", self: a,
			reqs: []request{leave(a), join(d)},
			want: want{next: []string{"B", "C", "D"}, seq: 8, joiners: []string{"D"}, leaving: []string{"A"}, leavers: []string{"A"}, joins: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sus := map[stack.Address]bool{}
			for _, s := range tc.suspects {
				sus[s] = true
			}
			p := planView(v, tc.self, sus, tc.reqs)
			var got want
			if p.next != nil {
				got.next, got.seq = nm(p.next.Members), p.next.ID.Seq
				require.Equal(t, tc.self, p.next.ID.Creator, "the coordinator creates the view")
			}
			got.joiners, got.stateJoiners = nm(p.joiners), nm(p.stateJoiners)
			got.leaving, got.leavers = nm(p.leaving), nm(p.leavers)
			got.rejoiners, got.merge, got.joins = nm(p.rejoiners), nm(p.merge), p.joins
			require.Equal(t, tc.want, got)
		})
	}
}

// TestWithoutUnflushed checks that the members a flush went on without
// are taken out of the view that follows it, under the same view id, and
// reported; a view without such members is kept as it is.
func TestWithoutUnflushed(t *testing.T) {
	a, b, c, d := stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	nv := stack.NewView(a, 4, a, b, c)

	same, ex := withoutUnflushed(nv, []stack.Address{d})
	require.Same(t, nv, same, "no member of the view is excluded")
	require.Empty(t, ex)

	got, ex := withoutUnflushed(nv, []stack.Address{c, d, b})
	require.Equal(t, []stack.Address{a}, got.Members)
	require.Equal(t, nv.ID, got.ID)
	require.Equal(t, []stack.Address{b, c}, ex, "excluded in the view's order")
}

// TestPlanMerge checks the merge view a leader composes: its own subgroup
// first, the others by coordinator, each member once (a member in two
// subgroups' views counts in the first), without the members the flush went
// on without, numbered above every subgroup, with each member's digest entry
// from the subgroup it is listed in, and every subgroup's view recorded.
func TestPlanMerge(t *testing.T) {
	lo, mid, hi, x, y := sortedAddrs()
	e := func(m stack.Address, n uint64) stack.DigestEntry {
		return stack.DigestEntry{Member: m, HighestDelivered: n, HighestReceived: n}
	}
	own := mergeSub{view: stack.NewView(mid, 4, mid, x), digest: stack.Digest{e(mid, 10), e(x, 11)}}
	high := mergeSub{view: stack.NewView(hi, 9, hi, y, x), digest: stack.Digest{e(hi, 20), e(y, 21), e(x, 99)}}
	low := mergeSub{view: stack.NewView(lo, 2, lo), digest: stack.Digest{e(lo, 30)}}

	mv, d := planMerge(mid, []mergeSub{own, high, low}, []stack.Address{y})
	require.Equal(t, []stack.Address{mid, x, lo, hi}, mv.Members, "own subgroup first, then by coordinator; x once; y excluded")
	require.Equal(t, stack.ViewID{Creator: mid, Seq: 10}, mv.ID)
	require.Equal(t, stack.Digest{e(mid, 10), e(x, 11), e(lo, 30), e(hi, 20)}, d, "x's entry from its own subgroup")
	require.Equal(t, []*stack.View{own.view, low.view, high.view}, mv.Subgroups)
	require.Equal(t, []stack.Address{mid, x, lo, hi, y}, mergeParticipants([]mergeSub{own, low, high}), "every member flushes, once")
}

// sortedAddrs returns five addresses in address order.
func sortedAddrs() (a, b, c, d, e stack.Address) {
	as := make([]stack.Address, 5)
	for i := range as {
		as[i] = stack.NewAddress()
	}
	slices.SortFunc(as, stack.Address.Compare)
	return as[0], as[1], as[2], as[3], as[4]
}

// TestOnView checks what a member does with a view it receives: only
// members with a say in a view are heard (a member of the current view, or
// of the view itself when this member is in it, or a merge leader whose
// merge view names this member's view and leaves it out); a newer view
// without this member is its exclusion, or confirms its leave.
func TestOnView(t *testing.T) {
	a, b, c, out, self := sortedAddrs()
	cur := stack.NewView(a, 5, a, b, self)
	other := stack.NewView(c, 7, c)
	cases := []struct {
		name    string
		src     stack.Address
		cur     *stack.View
		v       *stack.View
		leaving bool
		want    viewAction
	}{
		{"still joining", a, nil, stack.NewView(a, 6, a, self), false, viewIgnore},
		{"the next view from the coordinator", a, cur, stack.NewView(a, 6, a, b, self), false, viewInstall},
		{"this member's own view coming back", self, cur, stack.NewView(self, 6, self, b), false, viewInstall},
		{"a view with this member from a member of that view (a merge leader)", c, cur, stack.NewView(c, 8, c, a, b, self), false, viewInstall},
		{"a view with this member from an outsider not in it", out, cur, stack.NewView(a, 6, a, b, self), false, viewIgnore},
		{"an exclusion from an outsider", out, cur, stack.NewView(out, 9, out, a), false, viewIgnore},
		{"an exclusion from a member of the view it names (not of this member's)", c, cur, stack.NewView(c, 9, c, a), false, viewIgnore},
		{"an exclusion from a member of the current view", b, cur, stack.NewView(b, 6, b, a), false, viewExcluded},
		{"an older view without this member", b, cur, stack.NewView(b, 4, b, a), false, viewStale},
		{"the view after this member's leave", a, cur, stack.NewView(a, 6, a, b), true, viewLeft},
		{"a merge view that names this member's view and leaves it out", c, cur, stack.NewMergeView(c, 8, []stack.Address{c, a, b}, []*stack.View{other, cur}), false, viewExcluded},
		{"a merge view without this member that does not name its view", c, cur, stack.NewMergeView(c, 8, []stack.Address{c, a}, []*stack.View{other}), false, viewIgnore},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, onView(self, tc.src, tc.cur, tc.v, tc.leaving))
		})
	}
}

// TestViewAcks walks the acknowledgements of one view in time: the view
// goes again every view_ack_timeout to those that have not acknowledged
// it, an acknowledgement of another view does not count, a suspected
// member is no longer awaited, and after max_view_ack_wait the coordinator
// gives up.
func TestViewAcks(t *testing.T) {
	a, b, c, _, _ := sortedAddrs()
	id := stack.ViewID{Creator: a, Seq: 4}
	t0 := time.Unix(1000, 0)
	sec := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Second))) }
	acks := newViewAcks(id, []stack.Address{b, c}, t0, 2*time.Second, 5*time.Second)
	require.Equal(t, sec(2), acks.due())

	miss, giveUp := acks.tick(sec(1.9))
	require.Nil(t, miss, "nothing due before view_ack_timeout")
	require.False(t, giveUp)

	require.False(t, acks.ack(b, stack.ViewID{Creator: a, Seq: 3}), "an older view's ack does not count")
	miss, _ = acks.tick(sec(2))
	require.Equal(t, []stack.Address{b, c}, miss, "both get the view again")
	require.Equal(t, sec(4), acks.due())

	require.False(t, acks.ack(b, id))
	require.False(t, acks.ack(b, id), "a duplicate ack is nothing new")
	miss, giveUp = acks.tick(sec(4.5))
	require.Equal(t, []stack.Address{c}, miss)
	require.False(t, giveUp)
	require.Equal(t, sec(5), acks.due(), "max_view_ack_wait comes before the next resend")

	miss, giveUp = acks.tick(sec(5))
	require.Equal(t, []stack.Address{c}, miss)
	require.True(t, giveUp, "max_view_ack_wait passed")

	acks = newViewAcks(id, []stack.Address{b, c}, t0, 2*time.Second, 5*time.Second)
	require.False(t, acks.forget(b))
	require.True(t, acks.ack(c, id), "the last one awaited")
	require.True(t, acks.complete())
	miss, giveUp = acks.tick(sec(9))
	require.Nil(t, miss)
	require.False(t, giveUp, "complete: nothing to resend, no giving up")

	require.True(t, newViewAcks(id, nil, t0, time.Second, time.Second).complete(), "a view of the coordinator alone")
}

// TestOnJoinRsp checks what a joiner does with each answer to its join
// request: none in time, refused for good, sent to another member (or to
// itself, which means nobody), joined, or a view that does not have it.
func TestOnJoinRsp(t *testing.T) {
	self, coord, other := stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	var none stack.Address
	cases := []struct {
		name string
		rsp  *Header
		act  joinAction
		next stack.Address
	}{
		{"no answer in time", nil, joinRetry, none},
		{"refused by AUTH", &Header{Type: typeJoinRsp, Fail: "bad token", refused: errors.New("bad token")}, joinRefused, none},
		{"not the coordinator: ask the one it names", &Header{Type: typeJoinRsp, Fail: "not coordinator", Coord: coord}, joinRedirected, coord},
		{"busy, names nobody", &Header{Type: typeJoinRsp, Fail: "busy"}, joinRedirected, none},
		{"names this member", &Header{Type: typeJoinRsp, Fail: "not coordinator", Coord: self}, joinRedirected, none},
		{"joined", &Header{Type: typeJoinRsp, View: stack.NewView(coord, 2, coord, self)}, joinJoined, none},
		{"a view without this member", &Header{Type: typeJoinRsp, View: stack.NewView(coord, 2, coord, other)}, joinStray, none},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			act, next := onJoinRsp(self, tc.rsp)
			require.Equal(t, tc.act, act)
			require.Equal(t, tc.next, next)
		})
	}
}

// TestDeltaOfAJoinIsTheSizeOfTheChange: in a group of 64, the view after
// one join and one leave goes as a delta of two addresses and two view
// ids, whatever the group's size, and it makes exactly the new view of the
// previous one and of no other view. A delta is not used where it would
// mislead or not pay: a merge view, a first view, a reordered view, or a
// delta no smaller than the view.
func TestDeltaOfAJoinIsTheSizeOfTheChange(t *testing.T) {
	members := make([]stack.Address, 64)
	for i := range members {
		members[i] = stack.NewAddress()
	}
	j := stack.NewAddress()
	prev := stack.NewView(members[0], 70, members...)
	nv := stack.NewView(members[0], 71, append(slices.Clone(members[:10]), append(slices.Clone(members[11:]), j)...)...)

	d := makeDelta(prev, nv)
	require.NotNil(t, d)
	require.Equal(t, &Delta{ID: nv.ID, Prev: prev.ID, Joined: []stack.Address{j}, Left: []stack.Address{members[10]}}, d)
	h := &Header{Type: typeView, Delta: d}
	full := &Header{Type: typeView, View: nv}
	require.LessOrEqual(t, h.Size(), 2+2*stack.ViewIDSize(nv.ID)+2+2*stack.AddressSize, "the delta holds the two view ids and the two addresses that changed")
	require.Greater(t, full.Size(), 64*stack.AddressSize, "the full view holds every member")
	t.Logf("VIEW of 64 members after one join and one leave: %d bytes as a delta, %d in full", h.Size(), full.Size())

	// On the wire and back.
	dh, err := stack.DecodeHeader(stack.IDGMS, h.AppendTo(nil))
	require.NoError(t, err)
	require.Equal(t, h, dh)

	got := d.apply(prev)
	require.Equal(t, nv, got, "applied to the previous view, the delta is the new view")
	require.Nil(t, d.apply(nv), "not to the new view")
	require.Nil(t, d.apply(stack.NewView(members[0], 69, members...)), "not to an older view")
	require.Nil(t, d.apply(stack.NewView(members[1], 70, members...)), "not to another creator's view of the same number")
	require.Nil(t, d.apply(nil))
	require.Nil(t, (&Delta{ID: nv.ID, Prev: prev.ID, Left: []stack.Address{j}}).apply(prev), "a delta that leaves a member the view lacks")
	require.Nil(t, (&Delta{ID: nv.ID, Prev: prev.ID, Joined: []stack.Address{members[3]}}).apply(prev), "a delta that brings in a member the view has")

	require.Nil(t, makeDelta(nil, nv), "a first view goes in full")
	mv := stack.NewMergeView(members[0], 71, members, []*stack.View{prev})
	require.Nil(t, makeDelta(prev, mv), "a merge view goes in full, with its digest")
	reordered := slices.Clone(members)
	reordered[1], reordered[2] = reordered[2], reordered[1]
	require.Nil(t, makeDelta(prev, stack.NewView(members[0], 71, reordered...)), "members reordered: a delta would not make the view")
	small := stack.NewView(members[0], 5, members[:2]...)
	require.Nil(t, makeDelta(small, stack.NewView(members[0], 6, members[0], j)), "a delta no smaller than the view")
}
