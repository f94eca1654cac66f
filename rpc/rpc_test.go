package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/grouptest"
	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/rpc"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// node is one member of a test group: its channel and collector (the
// application's receiver) and its Dispatcher.
type node struct {
	*grouptest.Member
	d *rpc.Dispatcher
}

// startGroup starts n members with the full membership stack on SIM, each
// with a Dispatcher answering with h(i) (i: the member's index in the
// view), and returns them in view order. Call it inside a synctest bubble.
func startGroup(t *testing.T, seed uint64, n int, h func(i int, self *node) rpc.Handler) (*grouptest.Lab, []*node) {
	t.Helper()
	return startLab(t, grouptest.New(t, seed), n, h)
}

// startLab is startGroup on a lab set up by the caller (layers on top).
func startLab(t *testing.T, l *grouptest.Lab, n int, h func(i int, self *node) rpc.Handler) (*grouptest.Lab, []*node) {
	t.Helper()
	ns := make([]*node, n)
	// The handler learns its index once the view is known.
	idx := make([]atomic.Int32, n)
	for i := range ns {
		m := l.Add()
		nd := &node{Member: m}
		var handler rpc.Handler
		if h != nil {
			var inner atomic.Pointer[rpc.Handler]
			handler = func(ctx context.Context, req *stack.Message) ([]byte, error) {
				return (*inner.Load())(ctx, req)
			}
			defer func() {
				f := h(int(idx[i].Load()), nd)
				inner.Store(&f)
			}()
		}
		d, err := rpc.New(m.Ch, handler, rpc.WithReceiver(m.Col))
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, d.Close()) })
		nd.d = d
		ns[i] = nd
	}
	l.ConnectAll(l.Members...)
	stacktest.WaitFor(t, time.Minute, func() bool { return grouptest.SameView(l.Members...) }, "all %d in one view", n)
	v := ns[0].Ch.View()
	slices.SortFunc(ns, func(a, b *node) int { return v.Index(a.Addr()) - v.Index(b.Addr()) })
	for i, nd := range ns {
		for j := range ns {
			if l.Members[j] == nd.Member {
				idx[j].Store(int32(i))
			}
		}
	}
	return l, ns
}

// echo answers "<index>:<payload>".
func echo(i int, _ *node) rpc.Handler {
	return func(_ context.Context, req *stack.Message) ([]byte, error) {
		return fmt.Appendf(nil, "%d:%s", i, req.Payload), nil
	}
}

func addrs(ns []*node) []stack.Address {
	out := make([]stack.Address, len(ns))
	for i, n := range ns {
		out[i] = n.Addr()
	}
	return out
}

func TestCallReturnsTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ns := startGroup(t, 1, 3, echo)
		for i, n := range ns {
			for j := range ns {
				rsp, err := n.d.Call(t.Context(), ns[j].Addr(), fmt.Appendf(nil, "from %d", i))
				require.NoError(t, err)
				require.Equal(t, fmt.Sprintf("%d:from %d", j, i), string(rsp), "member %d calls %d (itself too)", i, j)
			}
		}
		rsp, err := ns[0].d.Call(t.Context(), ns[1].Addr(), []byte("x"), rpc.OOB())
		require.NoError(t, err)
		require.Equal(t, "1:x", string(rsp))
		require.Zero(t, ns[0].d.Stats().Pending)
	})
}

// TestCastModes: member i answers after i*10ms, so the answers come in
// view order and each mode returns with exactly as many as it asks for.
func TestCastModes(t *testing.T) {
	slow := func(i int, _ *node) rpc.Handler {
		return func(ctx context.Context, req *stack.Message) ([]byte, error) {
			time.Sleep(time.Duration(i) * 10 * time.Millisecond)
			return fmt.Appendf(nil, "%d", i), nil
		}
	}
	for _, tc := range []struct {
		mode rpc.Mode
		want int // answers received when the Cast returns
	}{
		{rpc.ModeAll, 5}, {rpc.ModeFirst, 1}, {rpc.ModeMajority, 3}, {rpc.ModeN(2), 2}, {rpc.ModeN(9), 5},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, ns := startGroup(t, 1, 5, slow)
				for _, opts := range [][]rpc.CallOption{{rpc.WithMode(tc.mode)}, {rpc.WithMode(tc.mode), rpc.OOB()}} {
					rsps, err := ns[0].d.Cast(t.Context(), nil, []byte("q"), opts...)
					require.NoError(t, err)
					require.Len(t, rsps, 5)
					got := rsps.Received()
					require.Len(t, got, tc.want)
					for k, r := range got {
						require.Equal(t, fmt.Sprint(k), string(r.Value), "the fastest answers, in order")
					}
					for _, r := range rsps[tc.want:] {
						require.Equal(t, rpc.NotReceived, r.Status)
					}
					// The rest still come, and are dropped and counted.
					stacktest.WaitFor(t, time.Minute, func() bool {
						s := ns[0].d.Stats()
						return s.Responses+s.LateResponses == 5*s.Requests
					}, "every answer arrives")
				}
				require.EqualValues(t, 2*(5-tc.want), ns[0].d.Stats().LateResponses)
			})
		})
	}
	t.Run("none", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var ran atomic.Int32
			_, ns := startGroup(t, 1, 5, func(i int, _ *node) rpc.Handler {
				return func(ctx context.Context, req *stack.Message) ([]byte, error) {
					ran.Add(1)
					return []byte("ignored"), nil
				}
			})
			rsps, err := ns[0].d.Cast(t.Context(), nil, []byte("q"), rpc.WithMode(rpc.ModeNone))
			require.NoError(t, err)
			require.Len(t, rsps, 5)
			stacktest.WaitFor(t, time.Minute, func() bool { return ran.Load() == 5 }, "every member ran the handler")
			synctest.Wait()
			for _, n := range ns {
				require.Zero(t, n.d.Stats().Responses+n.d.Stats().LateResponses, "no answers are sent")
			}
			rsp, err := ns[0].d.Call(t.Context(), ns[1].Addr(), nil, rpc.WithMode(rpc.ModeNone))
			require.NoError(t, err)
			require.Nil(t, rsp)
		})
	})
}

// TestAnycastSendsOneUnicastPerMember: a Cast to two of four members
// reaches only them (a multicast would have reached D too).
func TestAnycastSendsOneUnicastPerMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, ns := startGroup(t, 1, 4, echo)
		var mcasts atomic.Int32
		l.Net.SetDefault(sim.Rule{DropIf: func(m *stack.Message) bool {
			if m.Header(stack.IDRPC) != nil && m.Dest.IsZero() {
				mcasts.Add(1)
			}
			return false
		}})
		rsps, err := ns[0].d.Cast(t.Context(), []stack.Address{ns[1].Addr(), ns[2].Addr()}, []byte("q"))
		require.NoError(t, err)
		require.Len(t, rsps.Received(), 2)
		synctest.Wait()
		require.Zero(t, ns[3].d.Stats().Handled, "D was not asked and got nothing")
		require.Zero(t, mcasts.Load())
		// The whole view: one multicast; the caller answers itself locally.
		rsps, err = ns[0].d.Cast(t.Context(), nil, []byte("q"))
		require.NoError(t, err)
		require.Len(t, rsps.Received(), 4)
		require.EqualValues(t, 3, mcasts.Load(), "one multicast (SIM counts it on each of 3 links)")
		// Excluding one member: unicasts again.
		rsps, err = ns[0].d.Cast(t.Context(), nil, []byte("q"), rpc.Exclude(ns[3].Addr()))
		require.NoError(t, err)
		require.Len(t, rsps, 3)
		require.Len(t, rsps.Received(), 3)
		require.EqualValues(t, 3, mcasts.Load())
	})
}

func TestHandlerErrorAndPanicReachTheCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ns := startGroup(t, 1, 3, func(i int, _ *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				switch string(req.Payload) {
				case "fail":
					return nil, fmt.Errorf("member %d refuses", i)
				case "panic":
					panic(fmt.Sprintf("member %d blew up", i))
				}
				return []byte("ok"), nil
			}
		})
		_, err := ns[0].d.Call(t.Context(), ns[1].Addr(), []byte("fail"))
		var re *rpc.RemoteError
		require.ErrorAs(t, err, &re)
		require.ErrorIs(t, err, rpc.ErrRemote)
		require.NotErrorIs(t, err, rpc.ErrHandlerPanic)
		require.Equal(t, "member 1 refuses", re.Text)
		require.Equal(t, ns[1].Addr(), re.Member)

		for _, oob := range []bool{false, true} {
			var opts []rpc.CallOption
			if oob {
				opts = append(opts, rpc.OOB())
			}
			_, err = ns[0].d.Call(t.Context(), ns[2].Addr(), []byte("panic"), opts...)
			require.ErrorIs(t, err, rpc.ErrHandlerPanic)
			require.ErrorIs(t, err, rpc.ErrRemote)
			require.Contains(t, err.Error(), "member 2 blew up")
			// The member lives on and answers.
			rsp, err := ns[0].d.Call(t.Context(), ns[2].Addr(), []byte("again"), opts...)
			require.NoError(t, err)
			require.Equal(t, "ok", string(rsp))
		}
		require.EqualValues(t, 2, ns[2].d.Stats().HandlerPanics)

		rsps, err := ns[1].d.Cast(t.Context(), nil, []byte("panic"))
		require.NoError(t, err)
		for i, r := range rsps {
			require.Equal(t, rpc.Failed, r.Status)
			require.ErrorIs(t, r.Err, rpc.ErrHandlerPanic, "member %d, the caller itself too", i)
		}
	})
}

func TestMemberWithoutHandlerAnswersErrNoHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ns := startGroup(t, 1, 2, nil)
		_, err := ns[0].d.Call(t.Context(), ns[1].Addr(), nil)
		require.ErrorIs(t, err, rpc.ErrNoHandler)
	})
}

// TestCastEndsWhenAMemberCrashes: a Cast to all waits for a member whose
// link is cut; it returns with that member marked once the failure
// detector suspects it (or the view drops it), long before its context.
func TestCastEndsWhenAMemberCrashes(t *testing.T) {
	grouptest.Seeds(t, func(t *testing.T, seed uint64) {
		l, ns := startGroup(t, seed, 4, func(i int, _ *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				if i == 2 {
					<-ctx.Done() // never answers
				}
				return []byte("ok"), nil
			}
		})
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		start := time.Now()
		for _, mode := range []rpc.Mode{rpc.ModeAll, rpc.ModeN(4)} {
			f := ns[0].d.CastAsync(ctx, nil, []byte("q"), rpc.WithMode(mode))
			if mode == rpc.ModeAll {
				synctest.Wait()
				l.Net.Cut(ns[2].Addr())
			}
			rsps, err := f.Wait(t.Context())
			require.NoError(t, err)
			r, _ := rsps.Get(ns[2].Addr())
			require.Contains(t, []rpc.Status{rpc.Suspected, rpc.Left}, r.Status, "%v", r)
			require.True(t, errors.Is(r.Err, rpc.ErrSuspected) || errors.Is(r.Err, rpc.ErrLeft), "%v", r.Err)
			require.Len(t, rsps.Received(), 3)
			t.Logf("mode %s: crashed member %s after %s", mode, r.Status, time.Since(start))
		}
		require.Less(t, time.Since(start), time.Minute, "ended by the failure detector, not the context")
		_, err := ns[0].d.Call(ctx, ns[2].Addr(), nil)
		require.ErrorIs(t, err, rpc.ErrLeft, "a call to a member no longer in the view fails at once")
	})
}

// TestCastEndsWhenAMemberLeaves: the member leaves gracefully while its
// handler still holds the request; the caller's wait on it ends with the
// new view.
func TestCastEndsWhenAMemberLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var entered atomic.Bool
		_, ns := startGroup(t, 1, 3, func(i int, _ *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				if i == 1 {
					entered.Store(true)
					select {
					case <-release:
					case <-ctx.Done():
					}
				}
				return []byte("ok"), nil
			}
		})
		f := ns[0].d.CastAsync(t.Context(), nil, []byte("q"))
		stacktest.WaitFor(t, time.Minute, entered.Load, "B is in its handler")
		left := make(chan error, 1)
		go func() { left <- ns[1].Ch.Disconnect(context.Background()) }()
		rsps, err := f.Wait(t.Context())
		require.NoError(t, err)
		r, _ := rsps.Get(ns[1].Addr())
		require.Equal(t, rpc.Left, r.Status, "%v", r)
		require.ErrorIs(t, r.Err, rpc.ErrLeft)
		require.Len(t, rsps.Received(), 2)
		close(release)
		require.NoError(t, <-left)
	})
}

func TestFilterAcceptsAndEndsTheCast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Members answer in view order, 10ms apart; only odd ones say yes.
		_, ns := startGroup(t, 1, 5, func(i int, _ *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				time.Sleep(time.Duration(i) * 10 * time.Millisecond)
				if i%2 == 1 {
					return []byte("yes"), nil
				}
				return []byte("no"), nil
			}
		})
		yes := 0
		f := rpc.FilterFuncs{
			AcceptFunc: func(r rpc.Response) bool {
				if string(r.Value) == "yes" {
					yes++
					return true
				}
				return false
			},
			NeedMoreFunc: func() bool { return yes < 2 },
		}
		rsps, err := ns[0].d.Cast(t.Context(), nil, []byte("q"), rpc.WithFilter(f))
		require.NoError(t, err)
		var st []rpc.Status
		for _, r := range rsps {
			st = append(st, r.Status)
		}
		require.Equal(t, []rpc.Status{rpc.Rejected, rpc.Received, rpc.Rejected, rpc.Received, rpc.NotReceived}, st,
			"the filter rejected the no's and stopped at the second yes")
		require.ErrorIs(t, rsps[0].Err, rpc.ErrRejected)

		// With a mode: the first accepted answer is enough.
		rsps, err = ns[0].d.Cast(t.Context(), nil, []byte("q"), rpc.WithMode(rpc.ModeFirst),
			rpc.WithFilter(rpc.FilterFuncs{AcceptFunc: func(r rpc.Response) bool { return string(r.Value) == "yes" }}))
		require.NoError(t, err)
		require.Len(t, rsps.Received(), 1)
		require.Equal(t, ns[1].Addr(), rsps.Received()[0].Member)
	})
}

// TestContextEndMarksTheSilentMembers: the Cast returns when ctx ends, with
// those that did not answer marked TimedOut and an error wrapping ctx's.
func TestContextEndMarksTheSilentMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ns := startGroup(t, 1, 3, func(i int, _ *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				if i == 2 {
					time.Sleep(time.Second)
				}
				return []byte("ok"), nil
			}
		})
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		rsps, err := ns[0].d.Cast(ctx, nil, []byte("q"), rpc.OOB())
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Len(t, rsps.Received(), 2)
		r, _ := rsps.Get(ns[2].Addr())
		require.Equal(t, rpc.TimedOut, r.Status)
		require.ErrorIs(t, r.Err, context.DeadlineExceeded)
		_, err = ns[0].d.Call(ctx, ns[1].Addr(), nil)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		stacktest.WaitFor(t, time.Minute, func() bool { return ns[0].d.Stats().LateResponses == 1 }, "the late answer is dropped and counted")
	})
}

func TestFutures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ns := startGroup(t, 1, 3, echo)
		f := ns[0].d.CallAsync(t.Context(), ns[1].Addr(), []byte("a"))
		g := ns[0].d.CastAsync(t.Context(), nil, []byte("b"))
		got := make(chan rpc.Responses, 1)
		g.OnDone(func(rs rpc.Responses, err error) {
			require.NoError(t, err)
			got <- rs
		})
		<-f.Done()
		v, err := f.Wait(t.Context())
		require.NoError(t, err)
		require.Equal(t, "1:a", string(v))
		rs := <-got
		require.Len(t, rs.Received(), 3)
		// OnDone after the fact runs too.
		again := make(chan []byte, 1)
		f.OnDone(func(v []byte, err error) { again <- v })
		require.Equal(t, "1:a", string(<-again))

	})
}

// TestNonRPCMessagesAndViewsReachTheApplication: the Dispatcher passes on
// what is not its own.
func TestNonRPCMessagesAndViewsReachTheApplication(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ns := startGroup(t, 1, 3, echo)
		for i, n := range ns {
			require.NoError(t, n.Ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, 0, 8))))
			_, err := n.d.Cast(t.Context(), nil, []byte("q"))
			require.NoError(t, err)
		}
		synctest.Wait()
		for _, n := range ns {
			require.Empty(t, n.Col.CheckExactlyOnce(addrs(ns), 1, true))
			require.Equal(t, 3, n.Col.Len(), "the app got the 3 multicasts and none of the rpc traffic")
			require.NotEmpty(t, n.Col.Views())
		}
	})
}

// TestLossEveryCallAnsweredExactlyOnce: with 10% of all packets lost,
// every Call and Cast is answered, and every handler runs exactly once per
// request (the reliable layers retransmit; nothing is handled twice).
func TestLossEveryCallAnsweredExactlyOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		seen := map[string]int{} // "member/payload" -> handler runs
		l, ns := startGroup(t, 1, 3, func(i int, _ *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				mu.Lock()
				seen[fmt.Sprintf("%d/%s", i, req.Payload)]++
				mu.Unlock()
				return fmt.Appendf(nil, "%d:%s", i, req.Payload), nil
			}
		})
		l.Net.SetDefault(sim.Rule{Drop: 0.1})
		const calls = 200
		var wg sync.WaitGroup
		for ci, n := range ns {
			wg.Go(func() {
				for k := range calls {
					p := fmt.Sprintf("c%d-%d", ci, k)
					var opts []rpc.CallOption
					if k%2 == 1 {
						opts = append(opts, rpc.OOB())
					}
					if k%5 == 0 {
						rsps, err := n.d.Cast(t.Context(), nil, []byte(p), opts...)
						require.NoError(t, err)
						for j, r := range rsps {
							require.Equal(t, rpc.Received, r.Status)
							require.Equal(t, fmt.Sprintf("%d:%s", j, p), string(r.Value))
						}
						continue
					}
					j := (ci + 1 + k%2) % len(ns)
					rsp, err := n.d.Call(t.Context(), ns[j].Addr(), []byte(p), opts...)
					require.NoError(t, err)
					require.Equal(t, fmt.Sprintf("%d:%s", j, p), string(rsp))
				}
			})
		}
		wg.Wait()
		l.Net.SetDefault(sim.Rule{})
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		want := len(ns) * (calls/5*len(ns) + calls*4/5)
		require.Len(t, seen, want)
		for k, c := range seen {
			require.Equal(t, 1, c, "request %s handled once", k)
		}
		for _, n := range ns {
			require.Zero(t, n.d.Stats().LateResponses, "no answer came twice")
		}
		require.Positive(t, l.Net.Dropped.Load())
	})
}

// TestThousandConcurrentCallsFromEightGoroutines: ids never collide while
// calls are pending; every answer reaches its own call.
func TestThousandConcurrentCallsFromEightGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, ns := startGroup(t, 1, 3, func(i int, _ *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				time.Sleep(time.Millisecond) // keep many calls pending at once
				return fmt.Appendf(nil, "%d:%s", i, req.Payload), nil
			}
		})
		var idMu sync.Mutex
		ids := map[uint64]int{}
		l.Net.SetDefault(sim.Rule{DropIf: func(m *stack.Message) bool {
			if h, ok := m.Header(stack.IDRPC).(*rpc.Header); ok && h.Kind == 1 && m.Src == ns[0].Addr() {
				idMu.Lock()
				ids[h.ID]++
				idMu.Unlock()
			}
			return false
		}})
		var maxPending atomic.Int64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				var fs []*rpc.Future[[]byte]
				for k := range 125 {
					j := 1 + (g+k)%2
					var opts []rpc.CallOption
					if k%2 == 0 {
						opts = append(opts, rpc.OOB())
					}
					fs = append(fs, ns[0].d.CallAsync(t.Context(), ns[j].Addr(), fmt.Appendf(nil, "%d-%d", g, k), opts...))
					if p := ns[0].d.Stats().Pending; p > maxPending.Load() {
						maxPending.Store(p)
					}
				}
				for k, f := range fs {
					v, err := f.Wait(t.Context())
					require.NoError(t, err)
					require.Equal(t, fmt.Sprintf("%d:%d-%d", 1+(g+k)%2, g, k), string(v))
				}
			})
		}
		wg.Wait()
		s := ns[0].d.Stats()
		require.EqualValues(t, 1000, s.Requests)
		require.EqualValues(t, 1000, s.Responses)
		require.Zero(t, s.Pending)
		require.Zero(t, s.LateResponses)
		idMu.Lock()
		require.Len(t, ids, 1000, "1000 requests, 1000 ids")
		idMu.Unlock()
		t.Logf("up to %d calls pending at once", maxPending.Load())
		require.Greater(t, maxPending.Load(), int64(100))
	})
}

// TestHandlerCallsBackIntoTheGroup: A calls B; B's handler casts to the
// whole group (A and B itself included) and answers with what it got.
// And a cycle on the regular lanes, A -> B -> A -> B, where each handler
// waits for the next: it would deadlock if a nested request queued behind
// the handler waiting for it.
func TestHandlerCallsBackIntoTheGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var group []stack.Address
		_, ns := startGroup(t, 1, 3, func(i int, self *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				p := string(req.Payload)
				switch {
				case p == "gather":
					rsps, err := self.d.Cast(ctx, nil, []byte("leaf"))
					if err != nil {
						return nil, err
					}
					var out []byte
					for _, r := range rsps {
						out = append(out, r.Value...)
					}
					return out, nil
				case len(p) > 0 && p[0] == '>':
					// ">>>": pass it on to the next in the chain, one '>' less.
					if len(p) == 1 {
						return []byte("end"), nil
					}
					next := group[(i+1)%2] // between A and B
					return self.d.Call(ctx, next, []byte(p[1:]))
				}
				return fmt.Appendf(nil, "%d", i), nil
			}
		})
		group = addrs(ns)
		rsp, err := ns[0].d.Call(t.Context(), ns[1].Addr(), []byte("gather"))
		require.NoError(t, err)
		require.Equal(t, "012", string(rsp))

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		rsp, err = ns[0].d.Call(ctx, ns[1].Addr(), []byte(">>>>>"))
		require.NoError(t, err, "A -> B -> A -> B -> A -> B")
		require.Equal(t, "end", string(rsp))
	})
}

func TestCloseFailsPendingCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, ns := startGroup(t, 1, 2, func(i int, _ *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}
		})
		f := ns[0].d.CallAsync(t.Context(), ns[1].Addr(), nil, rpc.OOB())
		synctest.Wait()
		require.NoError(t, ns[0].d.Close())
		_, err := f.Wait(t.Context())
		require.ErrorIs(t, err, rpc.ErrClosed)
		_, err = ns[0].d.Call(t.Context(), ns[1].Addr(), nil)
		require.ErrorIs(t, err, rpc.ErrClosed)
	})
}

func TestHeaderSizes(t *testing.T) { stacktest.CheckHeaderSizes(t) }

// FuzzHeader: the decoder takes any input without panicking, and what it
// accepts encodes to bytes that decode to the same header.
func FuzzHeader(f *testing.F) {
	for _, h := range stack.HeaderSamples(stack.IDRPC) {
		f.Add(h.AppendTo(nil))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0xff, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := stack.DecodeHeader(stack.IDRPC, b)
		if err != nil {
			require.ErrorIs(t, err, stack.ErrMalformed)
			return
		}
		enc := h.AppendTo(nil)
		require.Equal(t, len(enc), h.Size())
		again, err := stack.DecodeHeader(stack.IDRPC, enc)
		require.NoError(t, err)
		require.Equal(t, h, again)
	})
}

// TestThroughGroupFC: with GROUPFC in the stack, requests and answers go
// through its windows (Channel.Send, which GROUPFC takes as its unicast or
// broadcast); Call, Cast to all (a broadcast) and to some (unicasts) work.
func TestThroughGroupFC(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := grouptest.New(t, 1)
		l.Top = func(int) []stack.Protocol { return []stack.Protocol{groupfc.New(groupfc.DefaultConfig())} }
		_, ns := startLab(t, l, 3, echo)
		stacktest.WaitFor(t, time.Minute, func() bool {
			for _, n := range ns {
				g, err := groupfc.Of(n.Ch)
				if err != nil || len(g.Members()) < 2 {
					return false
				}
			}
			return true
		}, "GROUPFC knows the others")
		for i, n := range ns {
			rsp, err := n.d.Call(t.Context(), ns[(i+1)%3].Addr(), []byte("x"))
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("%d:x", (i+1)%3), string(rsp))
			rsps, err := n.d.Cast(t.Context(), nil, []byte("y"))
			require.NoError(t, err)
			require.Len(t, rsps.Received(), 3)
			rsps, err = n.d.Cast(t.Context(), []stack.Address{ns[(i+1)%3].Addr(), ns[(i+2)%3].Addr()}, []byte("z"), rpc.OOB())
			require.NoError(t, err)
			require.Len(t, rsps.Received(), 2)
		}
		for _, n := range ns {
			require.Zero(t, n.d.Stats().LateResponses)
		}
	})
}

// TestRegularRequestsInOrderOOBConcurrently: one sender's regular requests
// are handled in the order sent, even when their handlers take varying
// time; OOB requests' handlers run at the same time (five of them wait
// for one another, which only works if all five run at once).
func TestRegularRequestsInOrderOOBConcurrently(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var order []int
		var inside atomic.Int32
		all := make(chan struct{})
		_, ns := startGroup(t, 1, 2, func(i int, _ *node) rpc.Handler {
			return func(ctx context.Context, req *stack.Message) ([]byte, error) {
				var k int
				if _, err := fmt.Sscanf(string(req.Payload), "r%d", &k); err == nil {
					time.Sleep(time.Duration(k%3) * time.Millisecond)
					mu.Lock()
					order = append(order, k)
					mu.Unlock()
					return nil, nil
				}
				if inside.Add(1) == 5 {
					close(all)
				}
				select {
				case <-all:
					return []byte("together"), nil
				case <-time.After(time.Minute):
					return nil, errors.New("alone")
				}
			}
		})
		var fs []*rpc.Future[[]byte]
		for k := range 100 {
			fs = append(fs, ns[0].d.CallAsync(t.Context(), ns[1].Addr(), fmt.Appendf(nil, "r%d", k)))
		}
		for _, f := range fs {
			_, err := f.Wait(t.Context())
			require.NoError(t, err)
		}
		require.True(t, slices.IsSorted(order), "handled in the order sent: %v", order)
		require.Len(t, order, 100)
		var oob []*rpc.Future[[]byte]
		for range 5 {
			oob = append(oob, ns[0].d.CallAsync(t.Context(), ns[1].Addr(), []byte("o"), rpc.OOB()))
		}
		for _, f := range oob {
			v, err := f.Wait(t.Context())
			require.NoError(t, err)
			require.Equal(t, "together", string(v))
		}
	})
}
