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
		require.Equal(t, []effect{stopFlush{stack.EvStopFlush{Participants: []stack.Address{j}, AwaitState: []stack.Address{j}, View: want, ViewChange: true}}}, r.finish())
	})

	t.Run("a failed flush: the view anyway, no round to stop", func(t *testing.T) {
		var n counters
		nv := stack.NewView(self, 4, self, b)
		r := newCast(self, &n, cfg, cur, nv, nil, nil, nil)
		require.Equal(t, []stack.Address{self, b}, r.parts, "suspected members take no part")
		require.NotEmpty(t, r.flushDone(nil, errors.New("flush: failed")))
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
		require.Equal(t, []effect{sendMsg{h: &Header{Type: typeView, View: nv}}}, r.announce(nil, t0))
		out, over := r.tick(t0.Add(maxWait))
		require.True(t, over)
		require.Empty(t, noLogs(out))
		require.Equal(t, []effect{stopFlush{stack.EvStopFlush{View: nv, ViewChange: true}}}, r.finish())
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
		require.Equal(t, []effect{stopFlush{stack.EvStopFlush{View: mv, ViewChange: true}}}, r.finish())
	})
}
