package gms_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/fdall"
	"github.com/strata-go/strata/protocols/frag"
	"github.com/strata-go/strata/protocols/gms"
	"github.com/strata-go/strata/protocols/merge3"
	"github.com/strata-go/strata/protocols/nakack"
	"github.com/strata-go/strata/protocols/ping"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/protocols/stable"
	"github.com/strata-go/strata/protocols/unicast2"
	"github.com/strata-go/strata/protocols/verifysuspect"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// Test timings (virtual time): what the scenarios' bounds are made of.
const (
	fdInterval    = time.Second
	fdTimeout     = 5 * time.Second
	fdCheck       = 500 * time.Millisecond
	verifyTimeout = 1500 * time.Millisecond
	joinTimeout   = 2 * time.Second
	mergeMax      = 3 * time.Second
	mergeCheck    = 5 * time.Second
)

type member struct {
	ch     *stack.Channel
	col    *stacktest.Collector
	gms    *gms.GMS
	verify *verifysuspect.VerifySuspect
	fd     *fdall.FDAll
	log    *syncBuffer
}

func (m *member) addr() stack.Address { return m.ch.Address() }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type lab struct {
	t       *testing.T
	net     *sim.Network
	members []*member
	gmsCfg  gms.Config
}

func newLab(t *testing.T, seed uint64) *lab {
	l := &lab{t: t, net: stacktest.NewNetwork(t, seed), gmsCfg: gms.DefaultConfig()}
	l.gmsCfg.JoinTimeout = joinTimeout
	return l
}

// add builds a member (not connected) with the full membership stack.
func (l *lab) add() *member {
	l.t.Helper()
	i := len(l.members)
	simCfg := sim.DefaultConfig()
	simCfg.Network = l.net.Name()
	pingCfg := ping.DefaultConfig()
	pingCfg.Timeout = 500 * time.Millisecond
	fdCfg := fdall.Config{Interval: fdInterval, Timeout: fdTimeout, CheckInterval: fdCheck}
	vsCfg := verifysuspect.Config{Timeout: verifyTimeout, NumMsgs: 2}
	mCfg := merge3.Config{MinInterval: time.Second, MaxInterval: mergeMax, CheckInterval: mergeCheck}
	nakCfg := nakack.DefaultConfig()
	nakCfg.XmitInterval = 200 * time.Millisecond
	stCfg := stable.DefaultConfig()
	stCfg.Interval = 5 * time.Second
	m := &member{col: stacktest.NewCollector(), log: &syncBuffer{},
		gms: gms.New(l.gmsCfg), verify: verifysuspect.New(vsCfg), fd: fdall.New(fdCfg)}
	protos := []stack.Protocol{
		sim.New(simCfg), ping.New(pingCfg), merge3.New(mCfg), m.fd, m.verify,
		nakack.New(nakCfg), unicast2.New(unicast2.DefaultConfig()), stable.New(stCfg), m.gms, frag.New(frag.DefaultConfig()),
	}
	logger := slog.New(slog.NewTextHandler(m.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ch, err := stack.NewChannel(protos, stack.WithName(stacktest.Names[i]), stack.WithReceiver(m.col), stack.WithLogger(logger))
	require.NoError(l.t, err)
	l.t.Cleanup(func() {
		if l.t.Failed() {
			l.t.Logf("log of %s (%s):\n%s", stacktest.Names[i], ch.Address(), m.log.String())
		}
	})
	l.t.Cleanup(func() { _ = ch.Close() })
	m.ch = ch
	l.members = append(l.members, m)
	return m
}

// start adds n members, connects them all at once, waits until they are
// in one view and returns them in the view's order.
func (l *lab) start(n int) []*member {
	l.t.Helper()
	ms := make([]*member, n)
	for i := range ms {
		ms[i] = l.add()
	}
	l.connectAll(ms...)
	stacktest.WaitFor(l.t, time.Minute, func() bool { return sameView(ms...) }, "all %d in one view", n)
	return byView(ms)
}

func (l *lab) connectAll(ms ...*member) {
	l.t.Helper()
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = m.ch.Connect(context.Background(), "test") })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(l.t, err, "member %d connects", i)
	}
}

// sameView reports whether every member has the same view, of exactly them.
func sameView(ms ...*member) bool {
	v0 := ms[0].ch.View()
	if v0 == nil || v0.Size() != len(ms) {
		return false
	}
	for _, m := range ms {
		v := m.ch.View()
		if v == nil || v.ID != v0.ID || !v.Contains(m.addr()) {
			return false
		}
	}
	return true
}

// byView returns the members in the order of the first one's view.
func byView(ms []*member) []*member {
	v := ms[0].ch.View()
	out := slices.Clone(ms)
	slices.SortFunc(out, func(a, b *member) int { return v.Index(a.addr()) - v.Index(b.addr()) })
	return out
}

// checkViewHistories checks that every member saw views in increasing
// order, that a view id means the same members everywhere, and that any two
// members saw the views they both saw in the same order.
func checkViewHistories(t *testing.T, ms []*member) {
	t.Helper()
	byID := map[stack.ViewID]*stack.View{}
	pos := make([]map[stack.ViewID]int, len(ms))
	for i, m := range ms {
		pos[i] = map[stack.ViewID]int{}
		views := m.col.Views()
		for j, v := range views {
			if j > 0 {
				prev := views[j-1]
				require.True(t, v.ID.Seq > prev.ID.Seq || (v.ID.Seq == prev.ID.Seq && v.ID.Creator != prev.ID.Creator),
					"member %d: view %s after %s", i, v.ID, prev.ID)
			}
			if o, ok := byID[v.ID]; ok {
				require.Equal(t, o.Members, v.Members, "view %s has the same members everywhere", v.ID)
			}
			byID[v.ID] = v
			pos[i][v.ID] = j
		}
	}
	for i := range ms {
		for k := i + 1; k < len(ms); k++ {
			var common []stack.ViewID
			for id := range pos[i] {
				if _, ok := pos[k][id]; ok {
					common = append(common, id)
				}
			}
			slices.SortFunc(common, func(a, b stack.ViewID) int { return pos[i][a] - pos[i][b] })
			for j := 1; j < len(common); j++ {
				require.Less(t, pos[k][common[j-1]], pos[k][common[j]], "members %d and %d saw %s and %s in different orders", i, k, common[j-1], common[j])
			}
		}
	}
}

func seeds(t *testing.T, f func(t *testing.T, seed uint64)) {
	for seed := uint64(1); seed <= stacktest.Seeds(10); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { f(t, seed) })
		})
	}
}

func TestFiveConcurrentJoinersReachOneView(t *testing.T) {
	seeds(t, func(t *testing.T, seed uint64) {
		l := newLab(t, seed)
		ms := l.start(5)
		v := ms[0].ch.View()
		for _, m := range ms {
			require.True(t, v.Contains(m.addr()))
		}
		checkViewHistories(t, ms)
	})
}

func TestJoinersOneByOneGetViewsInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLab(t, 1)
		var ms []*member
		for range 4 {
			m := l.add()
			l.connectAll(m)
			ms = append(ms, m)
			require.True(t, m.ch.View().Contains(m.addr()), "Connect returns with a view that holds the member")
			stacktest.WaitFor(t, 10*time.Second, func() bool { return sameView(ms...) }, "%d members in one view", len(ms))
		}
		require.Equal(t, ms[0].addr(), ms[0].ch.View().Coordinator(), "the first member coordinates")
		require.Len(t, ms[0].col.Views(), 4, "the coordinator saw views of 1, 2, 3 and 4")
		checkViewHistories(t, ms)
	})
}

func TestCrashedMemberIsExcludedWithinTimeoutPlusVerify(t *testing.T) {
	// Suspicion comes at most timeout + one check after the last message;
	// verification takes verify_timeout; then bundling and installation.
	bound := fdTimeout + fdCheck + verifyTimeout + time.Second
	for _, which := range []string{"participant", "coordinator"} {
		t.Run(which, func(t *testing.T) {
			seeds(t, func(t *testing.T, seed uint64) {
				l := newLab(t, seed)
				ms := l.start(5)
				victim := 2
				if which == "coordinator" {
					victim = 0
				}
				rest := slices.Delete(slices.Clone(ms), victim, victim+1)
				start := time.Now()
				l.net.Cut(ms[victim].addr())
				stacktest.WaitFor(t, time.Minute, func() bool { return sameView(rest...) }, "the other 4 install a view without the crashed member")
				took := time.Since(start)
				require.LessOrEqual(t, took, bound, "new view within timeout + verify time")
				require.False(t, rest[0].ch.View().Contains(ms[victim].addr()))
				if which == "coordinator" {
					require.Equal(t, ms[1].addr(), rest[0].ch.View().Coordinator(), "the next member took over")
				}
				checkViewHistories(t, rest)
				t.Logf("crash to new view: %s (bound %s)", took, bound)
			})
		})
	}
}

func TestCoordinatorCrashDuringJoinIsCompletedByNextMember(t *testing.T) {
	seeds(t, func(t *testing.T, seed uint64) {
		l := newLab(t, seed)
		ms := l.start(3)
		a := ms[0]
		d := l.add()
		// A crashes the moment it answers D's join: its new view has gone
		// out to B and C, but D never hears back.
		l.net.SetLink(a.addr(), d.addr(), sim.Rule{DropIf: func(m *stack.Message) bool {
			if h, ok := m.Header(stack.IDGMS).(*gms.Header); ok && h.Kind() == "JOIN_RSP" {
				l.net.Cut(a.addr())
				return true
			}
			return false
		}})
		l.connectAll(d)
		rest := []*member{ms[1], ms[2], d}
		stacktest.WaitFor(t, time.Minute, func() bool { return sameView(rest...) }, "B, C and D in one view")
		v := d.ch.View()
		require.Equal(t, ms[1].addr(), v.Coordinator(), "B took over")
		require.False(t, v.Contains(a.addr()))
		checkViewHistories(t, rest)
	})
}

func TestPartitionHealsIntoOneMergeViewWithTwoSubgroups(t *testing.T) {
	seeds(t, func(t *testing.T, seed uint64) {
		l := newLab(t, seed)
		ms := l.start(5)
		left, right := ms[:3], ms[3:]
		addrs := func(ms []*member) []stack.Address {
			var out []stack.Address
			for _, m := range ms {
				out = append(out, m.addr())
			}
			return out
		}
		l.net.Partition(addrs(left), addrs(right))
		stacktest.WaitFor(t, time.Minute, func() bool { return sameView(left...) && sameView(right...) }, "two views, of 3 and of 2")
		l.net.Heal()
		stacktest.WaitFor(t, 2*time.Minute, func() bool { return sameView(ms...) }, "one view of all 5 after healing")
		v := ms[0].ch.View()
		require.True(t, v.IsMerge(), "the view after healing is a merge view: %s", v)
		require.Len(t, v.Subgroups, 2)
		var subs [][]stack.Address
		for _, s := range v.Subgroups {
			got := slices.Clone(s.Members)
			slices.SortFunc(got, stack.Address.Compare)
			subs = append(subs, got)
		}
		want := [][]stack.Address{addrs(left), addrs(right)}
		for _, w := range want {
			slices.SortFunc(w, stack.Address.Compare)
		}
		require.ElementsMatch(t, want, subs, "the subgroups are the two sides of the partition")
		for i, m := range ms {
			views := m.col.Views()
			require.True(t, views[len(views)-1].IsMerge(), "member %d was told of the merge view", i)
		}
		checkViewHistories(t, ms)
	})
}

func TestBriefSilenceShorterThanVerifyIsNotExcluded(t *testing.T) {
	seeds(t, func(t *testing.T, seed uint64) {
		l := newLab(t, seed)
		ms := l.start(4)
		before := ms[0].ch.View().ID
		x := ms[2]
		l.net.Cut(x.addr())
		// Wait until someone suspects x and is verifying it; then x comes back.
		stacktest.WaitFor(t, time.Minute, func() bool {
			return stacktest.Stat(t, ms[0].verify, "verifying") > 0
		}, "the coordinator verifies a suspicion of x")
		l.net.Restore(x.addr())
		// Far longer than any exclusion would take.
		time.Sleep(3 * (fdTimeout + verifyTimeout))
		require.True(t, sameView(ms...), "still one view of 4")
		require.Equal(t, before, ms[0].ch.View().ID, "no view change at all")
		require.Positive(t, stacktest.Stat(t, ms[0].verify, "suspicions_cleared"), "the suspicion was cleared by a sign of life")
	})
}

func TestGracefulLeavesAreImmediate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLab(t, 1)
		ms := l.start(4)
		// A participant leaves.
		start := time.Now()
		require.NoError(t, ms[3].ch.Disconnect(context.Background()))
		stacktest.WaitFor(t, time.Minute, func() bool { return sameView(ms[:3]...) }, "3 left")
		require.Less(t, time.Since(start), fdTimeout, "a leave does not wait for failure detection")
		// The coordinator leaves; the next member takes over.
		start = time.Now()
		require.NoError(t, ms[0].ch.Disconnect(context.Background()))
		stacktest.WaitFor(t, time.Minute, func() bool { return sameView(ms[1:3]...) }, "2 left")
		require.Less(t, time.Since(start), fdTimeout)
		require.Equal(t, ms[1].addr(), ms[1].ch.View().Coordinator())
		require.Nil(t, ms[0].ch.View(), "a member that left has no view")
		checkViewHistories(t, ms[1:3])
		// The one that left can come back, as a new member.
		require.NoError(t, ms[0].ch.Connect(context.Background(), "test"))
		stacktest.WaitFor(t, time.Minute, func() bool { return sameView(ms[0], ms[1], ms[2]) }, "3 again")
	})
}

func TestJoinerThatCannotReachTheCoordinatorStartsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLab(t, 1)
		l.gmsCfg.MaxJoinAttempts = 3
		a := l.start(1)[0]
		b := l.add()
		l.net.SetLink(b.addr(), a.addr(), sim.Rule{DropIf: func(m *stack.Message) bool {
			h, ok := m.Header(stack.IDGMS).(*gms.Header)
			return ok && h.Kind() == "JOIN_REQ"
		}})
		start := time.Now()
		l.connectAll(b)
		took := time.Since(start)
		require.Equal(t, 1, b.ch.View().Size(), "b starts a group of its own")
		require.GreaterOrEqual(t, took, 3*joinTimeout, "after max_join_attempts x join_timeout")
		require.Contains(t, b.log.String(), "could not join a coordinator", "and says so in the log")
	})
}

func TestMessagesFlowAfterJoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLab(t, 1)
		ms := l.start(3)
		const per = 100
		for i, m := range ms {
			for s := range per {
				require.NoError(t, m.ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, s, 32))))
			}
		}
		addrs := []stack.Address{ms[0].addr(), ms[1].addr(), ms[2].addr()}
		stacktest.WaitFor(t, time.Minute, func() bool {
			for _, m := range ms {
				if m.col.Len() < 3*per {
					return false
				}
			}
			return true
		}, "every multicast delivered everywhere")
		for i, m := range ms {
			require.Empty(t, m.col.CheckExactlyOnce(addrs, per, true), "member %d", i)
		}
	})
}

func TestConcurrentJoinsAndMessagesUnderLoss(t *testing.T) {
	seeds(t, func(t *testing.T, seed uint64) {
		l := newLab(t, seed)
		l.net.SetDefault(sim.Rule{Drop: 0.1, Reorder: 0.1, ReorderWindow: 5 * time.Millisecond})
		ms := l.start(5)
		checkViewHistories(t, ms)
		const per = 50
		for i, m := range ms {
			for s := range per {
				require.NoError(t, m.ch.Send(t.Context(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, s, 32))))
			}
		}
		var addrs []stack.Address
		for _, m := range ms {
			addrs = append(addrs, m.addr())
		}
		stacktest.WaitFor(t, 5*time.Minute, func() bool {
			for _, m := range ms {
				if m.col.Len() < len(ms)*per {
					return false
				}
			}
			return true
		}, "every multicast delivered everywhere")
		for i, m := range ms {
			require.Empty(t, m.col.CheckExactlyOnce(addrs, per, true), "member %d", i)
		}
	})
}
