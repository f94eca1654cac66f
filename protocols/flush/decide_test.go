package flush

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// sorted returns three addresses in address order, so a test can say which
// initiator is the lower.
func sorted3() (lo, mid, hi stack.Address) {
	as := []stack.Address{stack.NewAddress(), stack.NewAddress(), stack.NewAddress()}
	for i := range as {
		for j := i + 1; j < len(as); j++ {
			if as[j].Compare(as[i]) < 0 {
				as[i], as[j] = as[j], as[i]
			}
		}
	}
	return as[0], as[1], as[2]
}

// TestOnStart checks a participant's answer to a START_FLUSH in every
// situation: no round on, the same round again, a late start, and each rule
// of which round takes precedence (a view change over an application's
// flush, a coordinator that is left out, the lower initiator between two
// applications' rounds), so two initiators never both wait on each other.
func TestOnStart(t *testing.T) {
	lo, mid, hi := sorted3()
	start := func(init stack.Address, n uint64, vc bool, parts ...stack.Address) *Header {
		return &Header{Type: typeStart, Round: RoundID{Initiator: init, N: n}, ViewChange: vc, Participants: parts}
	}
	round := func(init stack.Address, n uint64, vc bool) *partRound {
		return &partRound{id: RoundID{Initiator: init, N: n}, vc: vc}
	}
	cases := []struct {
		name string
		h    *Header
		cur  *partRound
		done uint64
		want startAction
	}{
		{"no round on", start(mid, 1, false), nil, 0, startTake},
		{"the round's STOP_FLUSH overtook its start", start(mid, 3, false), nil, 3, startOver},
		{"an older round of the initiator, late", start(mid, 2, false), round(mid, 4, false), 3, startOver},
		{"the same round again (resent)", start(mid, 4, false), round(mid, 4, false), 3, startAgain},
		{"a newer round of the same initiator", start(mid, 5, false), round(mid, 4, false), 3, startSupersede},
		{"a view change over an application's round", start(hi, 1, true), round(lo, 1, false), 0, startSupersede},
		{"an application's round does not displace a view change", start(lo, 1, false), round(hi, 1, true), 0, startRefuse},
		{"a view change that leaves the current initiator out (it crashed)", start(hi, 1, true, hi, mid), round(lo, 1, true), 0, startSupersede},
		{"a view change that includes the current initiator waits", start(hi, 1, true, hi, mid, lo), round(lo, 1, true), 0, startRefuse},
		{"between applications' rounds the lower initiator wins", start(lo, 1, false), round(mid, 1, false), 0, startSupersede},
		{"between applications' rounds the higher initiator is refused", start(hi, 1, false), round(mid, 1, false), 0, startRefuse},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, onStart(tc.h, tc.cur, tc.done))
		})
	}
}

// TestAwaiting checks whom an initiator still waits for: answered
// participants are not, suspected ones are skipped (and listed once, for
// the view that follows), members gone from the view are not awaited
// unless the round is a merge, and the initiator always awaits itself.
func TestAwaiting(t *testing.T) {
	self, b, c, d := stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	view := stack.NewView(self, 3, self, b, c)
	ir := &initRound{parts: []stack.Address{self, b, c, d}, answered: map[stack.Address]stack.Digest{}}

	require.Equal(t, []stack.Address{self, b, c}, ir.awaiting(self, view, nil), "d is not in the view")
	require.Equal(t, []stack.Address{self, b, c, d}, ir.awaiting(self, nil, nil), "no view yet: everyone")

	ir.answered[b] = nil
	sus := map[stack.Address]bool{c: true, self: true}
	require.Equal(t, []stack.Address{self}, ir.awaiting(self, view, sus), "b answered, c suspected, self never skipped")
	require.Equal(t, []stack.Address{self}, ir.awaiting(self, view, sus))
	require.Equal(t, []stack.Address{c}, ir.skipped, "c skipped, once")

	merge := &initRound{merge: true, parts: []stack.Address{self, d}, answered: map[stack.Address]stack.Digest{self: nil}}
	require.Equal(t, []stack.Address{d}, merge.awaiting(self, view, nil), "a merge awaits members of other views")
}

// TestMaxDigest checks the reconcile target: for a sender that takes part,
// the highest seqno anyone received, fetched from the sender itself; for
// one that does not, the highest anyone delivered, from the participant
// that delivered it (ties: the lower address), never what was received
// beyond a gap.
func TestMaxDigest(t *testing.T) {
	lo, mid, gone := sorted3()
	e := func(m stack.Address, del, rcv uint64) stack.DigestEntry {
		return stack.DigestEntry{Member: m, HighestDelivered: del, HighestReceived: rcv}
	}
	ds := map[stack.Address]stack.Digest{
		lo:  {e(lo, 10, 10), e(mid, 5, 9), e(gone, 7, 12)},
		mid: {e(lo, 8, 11), e(mid, 9, 9), e(gone, 7, 7)},
	}
	rc := maxDigest(ds)
	got := map[stack.Address][2]any{}
	for i, te := range rc.Target {
		require.Equal(t, te.HighestDelivered, te.HighestReceived)
		got[te.Member] = [2]any{te.HighestDelivered, rc.From[i]}
	}
	require.Equal(t, map[stack.Address][2]any{
		lo:   {uint64(11), lo}, // mid received 11 of lo's: lo has it
		mid:  {uint64(9), mid}, // received by lo beyond what it delivered, mid sent it
		gone: {uint64(7), lo},  // not a participant: delivered by both, lo is lower; 12 was beyond a gap
	}, got)
	require.Len(t, rc.Target, 3)
}

// TestOnStop checks a participant's answer to a STOP_FLUSH or ABORT: only
// its own round's (or, while joining, any) ends its block; a stop naming a
// view it does not have yet waits for that view (so it never sends in the
// old view what the others deliver in the new one); an abandoned view
// change lets it send but not deliver.
func TestOnStop(t *testing.T) {
	init, other := stack.NewAddress(), stack.NewAddress()
	id := RoundID{Initiator: init, N: 3}
	view5 := stack.NewView(init, 5, init, other)
	stop := func(r RoundID, viewSeq uint64) *Header {
		return &Header{Type: typeStop, Round: r, View: stack.ViewID{Creator: init, Seq: viewSeq}}
	}
	abort := &Header{Type: typeAbort, Round: id}
	app, vc := &partRound{id: id}, &partRound{id: id, vc: true}
	cases := []struct {
		name    string
		h       *Header
		cur     *partRound
		joining bool
		view    *stack.View
		want    stopAction
	}{
		{"another round's stop", stop(RoundID{Initiator: other, N: 1}, 0), app, false, view5, stopIgnore},
		{"no round and not joining", stop(id, 0), nil, false, view5, stopIgnore},
		{"the round's stop", stop(id, 0), app, false, view5, stopUnblock},
		{"a stop naming the view this member has", stop(id, 5), vc, false, view5, stopUnblock},
		{"a stop naming a view this member lacks", stop(id, 6), vc, false, view5, stopAwaitView},
		{"a joiner's stop before its first view", stop(id, 6), nil, true, nil, stopAwaitView},
		{"a joiner's stop with its view", stop(id, 5), nil, true, view5, stopUnblock},
		{"an application round aborted", abort, app, false, view5, stopUnblock},
		{"a view change aborted", abort, vc, false, view5, stopAbortViewChange},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, onStop(tc.h, tc.cur, tc.joining, tc.view))
		})
	}
}
