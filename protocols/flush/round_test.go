package flush

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// sends returns the messages among effects, as type -> receivers, and
// fails on any other effect than a send or a log line.
func sends(t *testing.T, out []effect) map[uint8][]stack.Address {
	t.Helper()
	m := map[uint8][]stack.Address{}
	for _, e := range out {
		switch e := e.(type) {
		case sendMsg:
			m[e.h.Type] = append(m[e.h.Type], e.to)
		case logLine:
		default:
			t.Fatalf("unexpected effect %#v", e)
		}
	}
	return m
}

// TestInitRound drives an initiator's round through its phases with time
// passed in: each phase's message goes to the participants it awaits, is
// sent again every quarter of the timeout to those that have not answered
// (and only to them), answers of another phase or round do not count, the
// reconcile target is what anyone received, and a phase fails when it is
// refused or its time is up.
func TestInitRound(t *testing.T) {
	self, b, c, j := stack.NewAddress(), stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	view := stack.NewView(self, 4, self, b, c)
	const timeout = 2 * time.Second
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	id := RoundID{Initiator: self, N: 7}
	ans := func(typ uint8, d stack.Digest) *Header { return &Header{Type: typ, Round: id, Digest: d} }
	poll := func(ir *initRound, at time.Duration, sus ...stack.Address) (map[uint8][]stack.Address, bool, error) {
		s := map[stack.Address]bool{}
		for _, a := range sus {
			s[a] = true
		}
		out, done, err := ir.poll(self, view, s, t0.Add(at))
		return sends(t, out), done, err
	}

	t.Run("start, resend to the silent, reconcile, stop with a joiner", func(t *testing.T) {
		ir := newRound(id, flushReq{vc: true}, view.Members)
		require.Equal(t, map[uint8][]stack.Address{typeStart: {self, b, c}}, sends(t, ir.start(timeout, t0)))
		require.True(t, ir.answer(self, ans(typeCompleted, stack.Digest{{Member: self, HighestDelivered: 3, HighestReceived: 3}})))
		require.True(t, ir.answer(b, ans(typeCompleted, stack.Digest{{Member: self, HighestDelivered: 2, HighestReceived: 5}})))
		require.False(t, ir.answer(c, ans(typeReconcileOK, nil)), "an answer of another phase")
		require.False(t, ir.answer(c, &Header{Type: typeCompleted, Round: RoundID{Initiator: self, N: 6}}), "an answer of another round")

		got, done, err := poll(ir, timeout/4-1)
		require.NoError(t, err)
		require.False(t, done)
		require.Empty(t, got, "nothing due yet")
		got, done, _ = poll(ir, timeout/4)
		require.False(t, done)
		require.Equal(t, map[uint8][]stack.Address{typeStart: {c}}, got, "START again to the one that has not answered")
		got, _, _ = poll(ir, timeout/4+1)
		require.Empty(t, got, "once per quarter")

		require.True(t, ir.answer(c, ans(typeCompleted, nil)))
		_, done, err = poll(ir, timeout/2)
		require.True(t, done)
		require.NoError(t, err)

		out := ir.reconcile(timeout, t0.Add(timeout/2))
		require.Equal(t, map[uint8][]stack.Address{typeReconcile: {self, b, c}}, sends(t, out))
		require.Equal(t, stack.Digest{{Member: self, HighestDelivered: 5, HighestReceived: 5}}, ir.msg.Digest, "the highest seqno anyone received")
		for _, p := range []stack.Address{self, b, c} {
			require.True(t, ir.answer(p, ans(typeReconcileOK, nil)))
		}
		_, done, err = poll(ir, timeout/2)
		require.True(t, done)
		require.NoError(t, err)

		ir.view = stack.ViewID{Creator: self, Seq: 5}
		out = ir.stop(ir.parts, view, self, timeout, t0.Add(timeout))
		require.Equal(t, map[uint8][]stack.Address{typeStop: {self, b, c}}, sends(t, out))
		require.Equal(t, ir.view, ir.msg.View, "the stop names the view the round installed")
		for _, p := range []stack.Address{self, b, c} {
			ir.answer(p, ans(typeUnblocked, nil))
		}
		_, done, _ = poll(ir, timeout)
		require.True(t, done)

		ir.parts = append(ir.parts, j)
		out = ir.stop([]stack.Address{j}, view, self, timeout, t0.Add(timeout))
		require.Equal(t, map[uint8][]stack.Address{typeStop: {j}}, sends(t, out), "the joiners' stop goes to them alone")
		joined := stack.NewView(self, 5, self, b, c, j)
		_, done, _ = ir.poll(self, joined, nil, t0.Add(timeout))
		require.False(t, done, "the joiner is awaited")
		out, _, _ = ir.poll(self, joined, nil, t0.Add(timeout+timeout/4))
		require.Equal(t, map[uint8][]stack.Address{typeStop: {j}}, sends(t, out))
	})

	t.Run("the stop of a view change names the initiator's view", func(t *testing.T) {
		ir := newRound(id, flushReq{vc: true}, view.Members)
		ir.stop(ir.parts, view, self, timeout, t0)
		require.Equal(t, view.ID, ir.msg.View)
		merge := newRound(id, flushReq{EvStartViewChangeFlush: stack.EvStartViewChangeFlush{Merge: true}, vc: true}, view.Members)
		merge.stop(merge.parts, view, self, timeout, t0)
		require.Zero(t, merge.msg.View, "a merge round without its view names none")
	})

	t.Run("a suspected participant is not awaited", func(t *testing.T) {
		ir := newRound(id, flushReq{}, view.Members)
		ir.start(timeout, t0)
		ir.answer(self, ans(typeCompleted, nil))
		ir.answer(b, ans(typeCompleted, nil))
		_, done, err := poll(ir, time.Millisecond, c)
		require.True(t, done)
		require.NoError(t, err)
		require.Equal(t, []stack.Address{c}, ir.skipped)
	})

	t.Run("refused", func(t *testing.T) {
		ir := newRound(id, flushReq{}, view.Members)
		ir.start(timeout, t0)
		require.False(t, ir.refuse(&Header{Type: typeNotCompleted, Round: RoundID{Initiator: b, N: 7}}), "another round's")
		require.True(t, ir.refuse(&Header{Type: typeNotCompleted, Round: id}))
		_, done, err := poll(ir, 0)
		require.True(t, done)
		require.ErrorContains(t, err, "refused")
	})

	t.Run("no answer within the timeout", func(t *testing.T) {
		ir := newRound(id, flushReq{}, view.Members)
		ir.start(timeout, t0)
		ir.answer(self, ans(typeCompleted, nil))
		_, done, _ := poll(ir, timeout-1)
		require.False(t, done)
		_, done, err := poll(ir, timeout)
		require.True(t, done)
		var na *noAnswer
		require.True(t, errors.As(err, &na), "%v", err)
		require.Equal(t, []stack.Address{b, c}, na.missing)
	})
}

// TestRoundEnds: an initiator tells a participant that asks about one of
// its rounds how it ended: the round's own STOP_FLUSH or ABORT while it is
// remembered, an ABORT once it is long gone, nothing for a round that has
// not ended or never began.
func TestRoundEnds(t *testing.T) {
	self := stack.NewAddress()
	r := func(n uint64) RoundID { return RoundID{Initiator: self, N: n} }
	var e roundEnds
	stop := &Header{Type: typeStop, Round: r(1), View: stack.ViewID{Creator: self, Seq: 3}}
	abort := &Header{Type: typeAbort, Round: r(2)}
	e.ended(stop)
	e.ended(abort)
	require.Same(t, stop, e.end(r(1), 3))
	require.Same(t, abort, e.end(r(2), 3))
	require.Nil(t, e.end(r(3), 3), "round 3 has not ended")
	require.Nil(t, e.end(r(4), 3), "round 4 never began")
	require.Nil(t, e.end(r(0), 3))
	for n := uint64(3); n <= 20; n++ {
		e.ended(&Header{Type: typeStop, Round: r(n)})
	}
	require.Equal(t, &Header{Type: typeAbort, Round: r(1)}, e.end(r(1), 20), "forgotten: an ABORT")
	require.Equal(t, typeStop, e.end(r(20), 20).Type)
}
