package flush

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// TestParticipant drives the participant's state machine through whole
// rounds, input by input, and checks what it asks FLUSH to do after each
// (log lines left out): when it blocks and calls Block, what it answers,
// when a view change's hold on the senders ends, when it unblocks and calls
// Unblock, and what the safety valve does as time passes.
func TestParticipant(t *testing.T) {
	self, a, b := stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	v1 := stack.NewView(a, 1, a, self, b)
	v2 := stack.NewView(a, 2, a, self, b)
	v2NoB := stack.NewView(a, 2, a, self)
	const timeout = 8 * time.Second

	rid := func(init stack.Address, n uint64) RoundID { return RoundID{Initiator: init, N: n} }
	start := func(init stack.Address, n uint64, vc bool, parts ...stack.Address) *Header {
		return &Header{Type: typeStart, Round: rid(init, n), ViewChange: vc, Participants: parts}
	}
	stop := func(init stack.Address, n uint64, view *stack.View) *Header {
		h := &Header{Type: typeStop, Round: rid(init, n)}
		if view != nil {
			h.View = view.ID
		}
		return h
	}
	abort := func(init stack.Address, n uint64) *Header { return &Header{Type: typeAbort, Round: rid(init, n)} }
	rec := &Header{Type: typeReconcile, Round: rid(a, 1)}
	answer := func(init stack.Address, n uint64, hold bool) effect {
		return answerCompleted{to: init, round: rid(init, n), hold: hold}
	}
	refuse := func(init stack.Address, n uint64) effect {
		return sendMsg{to: init, h: &Header{Type: typeNotCompleted, Round: rid(init, n)}}
	}
	unblocked := func(init stack.Address, n uint64) effect {
		return sendMsg{to: init, h: &Header{Type: typeUnblocked, Round: rid(init, n)}}
	}

	type in func(p *participant, now time.Time) []effect
	onStart := func(h *Header) in {
		return func(p *participant, now time.Time) []effect { return p.start(h.Round.Initiator, h, now) }
	}
	onStop := func(h *Header) in {
		return func(p *participant, now time.Time) []effect { return p.stop(h.Round.Initiator, h, now) }
	}
	// forged: the same message from a member that is not its round's
	// initiator.
	forged := func(h *Header) in {
		return func(p *participant, now time.Time) []effect {
			return append(append(p.start(b, h, now), p.reconcile(b, h)...), p.stop(b, h, now)...)
		}
	}
	view := func(v *stack.View) in { return func(p *participant, _ time.Time) []effect { p.view = v; return nil } }
	delivered := func(v *stack.View) in {
		return func(p *participant, now time.Time) []effect { return p.viewDelivered(v, self, now) }
	}
	tick := func(p *participant, now time.Time) []effect { return p.tick(now) }

	type step struct {
		at   time.Duration
		in   in
		want []effect
	}
	cases := []struct {
		name  string
		steps []step
		check func(t *testing.T, c *counters)
	}{
		{"a round: block once, answer again when asked, fetch, unblock, ignore its late start and forgeries", []step{
			{0, view(v1), nil},
			{0, onStart(start(a, 1, false)), []effect{blockGate{call: true}, answer(a, 1, false)}},
			{1, onStart(start(a, 1, false)), []effect{answer(a, 1, false)}},
			{2, forged(rec), nil},
			{2, forged(start(a, 2, true)), nil},
			{2, forged(stop(a, 1, nil)), nil},
			{2, forged(abort(a, 1)), nil},
			{2, func(p *participant, _ time.Time) []effect { return p.reconcile(a, rec) }, []effect{fetchMissing{to: a, h: rec}}},
			{2, func(p *participant, _ time.Time) []effect {
				return p.reconcile(a, &Header{Type: typeReconcile, Round: rid(a, 2)})
			}, nil},
			{time.Second, onStop(stop(a, 1, nil)), []effect{releaseHold{}, openGate{call: true}, unblocked(a, 1)}},
			{time.Second, onStart(start(a, 1, false)), nil},
		}, func(t *testing.T, c *counters) {
			require.EqualValues(t, 1, c.lateStarts.Load())
			require.EqualValues(t, time.Second, c.blockedNanos.Load(), "blocked from the start to the stop")
		}},
		{"a view change supersedes an application's round; Block is called once", []step{
			{0, onStart(start(b, 1, false)), []effect{blockGate{call: true}, answer(b, 1, false)}},
			{time.Second, onStart(start(a, 1, true, a, self, b)), []effect{refuse(b, 1), blockGate{call: false}, answer(a, 1, true)}},
			{time.Second, onStart(start(b, 2, false)), []effect{refuse(b, 2)}},
			{time.Second, onStop(stop(b, 1, nil)), []effect{unblocked(b, 1)}},
			{2 * time.Second, onStop(stop(a, 1, nil)), []effect{releaseHold{}, openGate{call: true}, unblocked(a, 1)}},
		}, func(t *testing.T, c *counters) {
			require.EqualValues(t, 1, c.superseded.Load())
			require.EqualValues(t, 2*time.Second, c.blockedNanos.Load(), "one blocked period, from the first round's start")
		}},
		{"a STOP_FLUSH before its view waits until the view is delivered", []step{
			{0, view(v1), nil},
			{0, onStart(start(a, 1, true)), []effect{blockGate{call: true}, answer(a, 1, true)}},
			{0, onStop(stop(a, 1, v2)), nil},
			{0, delivered(v1), nil},
			{0, view(v2), nil},
			{0, delivered(v2), []effect{releaseHold{}, openGate{call: true}, unblocked(a, 1)}},
		}, func(t *testing.T, c *counters) { require.EqualValues(t, 1, c.stopsDeferred.Load()) }},
		{"an aborted view change: sends again, holds deliveries until the timeout", []step{
			{0, onStart(start(a, 1, true)), []effect{blockGate{call: true}, answer(a, 1, true)}},
			{time.Second, onStop(abort(a, 1)), []effect{openGate{call: true}, unblocked(a, 1)}},
			{timeout, tick, nil},
			{time.Second + timeout + 1, tick, []effect{releaseHold{}}},
			{2 * timeout, tick, nil},
		}, func(t *testing.T, c *counters) { require.EqualValues(t, 1, c.safetyUnblocks.Load()) }},
		{"an aborted view change: holds deliveries until a view", []step{
			{0, onStart(start(a, 1, true)), []effect{blockGate{call: true}, answer(a, 1, true)}},
			{0, onStop(abort(a, 1)), []effect{openGate{call: true}, unblocked(a, 1)}},
			{0, view(v2), nil},
			{0, delivered(v2), []effect{releaseHold{}}},
			{2 * timeout, tick, nil},
		}, nil},
		{"a leaving coordinator never releases what its round held", []step{
			{0, onStart(start(self, 1, true)), []effect{blockGate{call: true}, answer(self, 1, true)}},
			{0, func(p *participant, _ time.Time) []effect { p.left = true; return nil }, nil},
			{0, onStop(stop(self, 1, nil)), []effect{openGate{call: true}, unblocked(self, 1)}},
		}, nil},
		{"the safety valve unblocks an application's round after the timeout", []step{
			{0, view(v1), nil},
			{0, onStart(start(a, 1, false)), []effect{blockGate{call: true}, answer(a, 1, false)}},
			{timeout, tick, nil},
			{timeout + 1, tick, []effect{releaseHold{}, openGate{call: true}}},
			{timeout + 2, onStop(stop(a, 1, nil)), []effect{unblocked(a, 1)}},
		}, func(t *testing.T, c *counters) { require.EqualValues(t, 1, c.safetyUnblocks.Load()) }},
		{"a view change whose view has not come stays blocked past the timeout, warned once, asking its initiator every timeout", []step{
			{0, view(v1), nil},
			{0, onStart(start(a, 1, true)), []effect{blockGate{call: true}, answer(a, 1, true)}},
			{timeout + 1, tick, []effect{answer(a, 1, false)}},
			{2 * timeout, tick, nil},
			{2*timeout + 1, tick, []effect{answer(a, 1, false)}},
			{3 * timeout, tick, nil},
			{3 * timeout, view(v2), nil},
			{3*timeout + 1, tick, []effect{releaseHold{}, openGate{call: true}}},
		}, func(t *testing.T, c *counters) {
			require.EqualValues(t, 1, c.viewWaits.Load())
			require.EqualValues(t, 1, c.safetyUnblocks.Load())
		}},
		{"a late start of a round that ended without this member: the initiator's ABORT, told again when asked, ends it", []step{
			{0, view(v1), nil},
			{0, onStart(start(b, 1, true, a, self, b)), []effect{blockGate{call: true}, answer(b, 1, true)}},
			{timeout + 1, tick, []effect{answer(b, 1, false)}},
			{timeout + 2, onStop(abort(b, 1)), []effect{openGate{call: true}, unblocked(b, 1)}},
			{timeout + 3, onStart(start(a, 1, true, a, self, b)), []effect{blockGate{call: true}, answer(a, 1, true)}},
		}, nil},
		{"a joiner is blocked from Connect until the STOP_FLUSH of its join", []step{
			{0, func(p *participant, now time.Time) []effect { return p.connect(now) }, []effect{blockGate{call: true}}},
			{0, onStop(stop(a, 1, nil)), []effect{releaseHold{}, openGate{call: true, joined: true}, unblocked(a, 1)}},
		}, nil},
		{"a round whose initiator left ends when the view is delivered", []step{
			{0, view(v1), nil},
			{0, onStart(start(b, 1, false)), []effect{blockGate{call: true}, answer(b, 1, false)}},
			{0, view(v2NoB), nil},
			{0, delivered(v2NoB), []effect{releaseHold{}, openGate{call: true}}},
		}, nil},
		{"disconnect opens the gate but keeps a view change's hold", []step{
			{0, onStart(start(a, 1, true)), []effect{blockGate{call: true}, answer(a, 1, true)}},
			{0, func(p *participant, now time.Time) []effect { return p.disconnect(now) }, []effect{openGate{call: true}}},
		}, nil},
	}
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c counters
			p := newParticipant(timeout, &c)
			for i, s := range tc.steps {
				var got []effect
				for _, e := range s.in(&p, t0.Add(s.at)) {
					if _, ok := e.(logLine); !ok {
						got = append(got, e)
					}
				}
				require.Equal(t, s.want, got, "step %d", i)
			}
			if tc.check != nil {
				tc.check(t, &c)
			}
		})
	}
}
