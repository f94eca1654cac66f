// Package grouptest starts groups of members with the full membership stack
// (discovery, failure detection, merging, NAKACK, UNICAST2, STABLE, GMS,
// FRAG and any layers above) on the in-memory network, for tests of GMS and
// of the protocols above it, and checks view invariants.
package grouptest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
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

// Timings of the lab's stacks (virtual time): what scenarios' bounds are
// made of.
const (
	FDInterval    = time.Second
	FDTimeout     = 5 * time.Second
	FDCheck       = 500 * time.Millisecond
	VerifyTimeout = 1500 * time.Millisecond
	JoinTimeout   = 2 * time.Second
	MergeMax      = 3 * time.Second
	MergeCheck    = 5 * time.Second
)

// Member is one member of a Lab: its channel, what it received, its
// membership layers and its log.
type Member struct {
	Ch     *stack.Channel
	Col    *stacktest.Collector
	GMS    *gms.GMS
	Verify *verifysuspect.VerifySuspect
	FD     *fdall.FDAll
	NAK    *nakack.NAKACK
	Top    []stack.Protocol // the layers Lab.Top put above GMS
	Log    *SyncBuffer
}

// Addr returns the member's address.
func (m *Member) Addr() stack.Address { return m.Ch.Address() }

// SyncBuffer is a bytes.Buffer safe for concurrent writes (a test logger's
// output).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Lab builds members with the full membership stack on one SIM network.
// Set GMS and Top before adding members.
type Lab struct {
	T       *testing.T
	Net     *sim.Network
	Members []*Member
	GMS     gms.Config
	// Top returns member i's layers above GMS (FRAG is always there).
	Top func(i int) []stack.Protocol
	// MaxDatagram is SIM's max_bundle_size (0: no bound): larger packets
	// are refused, as UDP refuses larger datagrams.
	MaxDatagram stack.Size
	// FragSize is FRAG's frag_size (0: FRAG's default), for small
	// datagrams.
	FragSize stack.Size
	// Receiver wraps member i's collector into its receiver (default: the
	// collector itself).
	Receiver func(i int, col *stacktest.Collector) stack.Receiver
}

// New returns a lab on a fresh SIM network with the fault seed.
func New(t *testing.T, seed uint64) *Lab {
	l := &Lab{T: t, Net: stacktest.NewNetwork(t, seed), GMS: gms.DefaultConfig()}
	l.GMS.JoinTimeout = JoinTimeout
	return l
}

// Add builds a member (not connected) with the full membership stack.
func (l *Lab) Add() *Member {
	l.T.Helper()
	i := len(l.Members)
	simCfg := sim.DefaultConfig()
	simCfg.Network = l.Net.Name()
	simCfg.BundleSize = l.MaxDatagram
	pingCfg := ping.DefaultConfig()
	pingCfg.Timeout = 500 * time.Millisecond
	fdCfg := fdall.Config{Interval: FDInterval, Timeout: FDTimeout, CheckInterval: FDCheck}
	vsCfg := verifysuspect.Config{Timeout: VerifyTimeout, NumMsgs: 2}
	mCfg := merge3.Config{MinInterval: time.Second, MaxInterval: MergeMax, CheckInterval: MergeCheck}
	nakCfg := nakack.DefaultConfig()
	nakCfg.XmitInterval = 200 * time.Millisecond
	stCfg := stable.DefaultConfig()
	stCfg.Interval = 5 * time.Second
	fragCfg := frag.DefaultConfig()
	if l.FragSize > 0 {
		fragCfg.FragSize = l.FragSize
	}
	m := &Member{Col: stacktest.NewCollector(), Log: &SyncBuffer{},
		GMS: gms.New(l.GMS), Verify: verifysuspect.New(vsCfg), FD: fdall.New(fdCfg), NAK: nakack.New(nakCfg)}
	protos := []stack.Protocol{
		sim.New(simCfg), ping.New(pingCfg), merge3.New(mCfg), m.FD, m.Verify,
		m.NAK, unicast2.New(unicast2.DefaultConfig()), stable.New(stCfg), m.GMS, frag.New(fragCfg),
	}
	if l.Top != nil {
		m.Top = l.Top(i)
		protos = append(protos, m.Top...)
	}
	var recv stack.Receiver = m.Col
	if l.Receiver != nil {
		recv = l.Receiver(i, m.Col)
	}
	level := slog.LevelInfo
	if os.Getenv("STRATA_DEBUG") != "" {
		level = slog.LevelDebug // a failing test's log tells the whole story
	}
	logger := slog.New(slog.NewTextHandler(m.Log, &slog.HandlerOptions{Level: level}))
	name := fmt.Sprint("M", i)
	if i < len(stacktest.Names) {
		name = stacktest.Names[i]
	}
	ch, err := stack.New(stack.FromProtocols(protos...), stack.WithName(name), stack.WithReceiver(recv), stack.WithLogger(logger))
	require.NoError(l.T, err)
	l.T.Cleanup(func() {
		if l.T.Failed() {
			l.T.Logf("log of %s (%s):\n%s", name, ch.Address(), m.Log.String())
		}
	})
	l.T.Cleanup(func() { _ = ch.Close() })
	m.Ch = ch
	l.Members = append(l.Members, m)
	return m
}

// Start adds n members, connects them all at once, waits until they are
// in one view and returns them in the view's order.
func (l *Lab) Start(n int) []*Member {
	l.T.Helper()
	ms := make([]*Member, n)
	for i := range ms {
		ms[i] = l.Add()
	}
	l.ConnectAll(ms...)
	stacktest.WaitFor(l.T, time.Minute, func() bool { return SameView(ms...) }, "all %d in one view", n)
	return ByView(ms)
}

// ConnectAll connects the members at once and fails the test if any fails.
func (l *Lab) ConnectAll(ms ...*Member) {
	l.T.Helper()
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = m.Ch.Connect(context.Background(), "test") })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(l.T, err, "member %d connects", i)
	}
}

// KeepApart keeps member i out of the group of cut and near: nothing
// passes between i and cut, and nothing between i and near until open is
// called; after it everything but discovery and MERGE3 does, so i and
// near exchange GMS messages and heartbeats but never merge.
func (l *Lab) KeepApart(i, cut, near *Member) (open func()) {
	var opened atomic.Bool
	cutOff := sim.Rule{DropIf: func(m *stack.Message) bool { return true }}
	noMerge := sim.Rule{DropIf: func(m *stack.Message) bool {
		return !opened.Load() || m.Header(stack.IDMERGE3) != nil || m.Header(stack.IDPING) != nil
	}}
	l.Net.SetLink(cut.Addr(), i.Addr(), cutOff)
	l.Net.SetLink(i.Addr(), cut.Addr(), cutOff)
	l.Net.SetLink(near.Addr(), i.Addr(), noMerge)
	l.Net.SetLink(i.Addr(), near.Addr(), noMerge)
	return func() { opened.Store(true) }
}

// Addrs returns the members' addresses, for SIM's partitions.
func Addrs(ms ...*Member) []stack.Address {
	out := make([]stack.Address, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Addr())
	}
	return out
}

// SameView reports whether every member has the same view, of exactly them.
func SameView(ms ...*Member) bool {
	v0 := ms[0].Ch.View()
	if v0 == nil || v0.Size() != len(ms) {
		return false
	}
	for _, m := range ms {
		v := m.Ch.View()
		if v == nil || v.ID != v0.ID || !v.Contains(m.Addr()) {
			return false
		}
	}
	return true
}

// ByView returns the members in the order of the first one's view.
func ByView(ms []*Member) []*Member {
	v := ms[0].Ch.View()
	out := slices.Clone(ms)
	slices.SortFunc(out, func(a, b *Member) int { return v.Index(a.Addr()) - v.Index(b.Addr()) })
	return out
}

// CheckViewHistories checks that every member saw views in increasing
// order, that a view id means the same members everywhere, and that any two
// members saw the views they both saw in the same order.
func CheckViewHistories(t *testing.T, ms []*Member) {
	t.Helper()
	byID := map[stack.ViewID]*stack.View{}
	pos := make([]map[stack.ViewID]int, len(ms))
	for i, m := range ms {
		pos[i] = map[stack.ViewID]int{}
		views := m.Col.Views()
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

// Seeds runs f in a synctest bubble once per seed, 1..STRATA_SEEDS (10).
func Seeds(t *testing.T, f func(t *testing.T, seed uint64)) {
	for seed := uint64(1); seed <= stacktest.Seeds(10); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { f(t, seed) })
		})
	}
}
