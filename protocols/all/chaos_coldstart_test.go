package all_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/strata-go/strata/protocols/sim"
)

// TestChaosColdStart is scenario D: 8 to 12 members (the seed decides) of
// udp.toml or flush.toml call Connect at the same moment under 20% loss,
// 10% duplication and reordering, as when a deployment restarts every pod
// at once. They must end in one view (never two overlapping ones: a member
// in two views, or a member whose view names members that are in another
// view) within the time MERGE3 needs, and deliver everything sent after
// that with the suite's invariants. The time from the start to one view
// is logged (STRATA_CHAOS_LOG=dir keeps it per seed).
//
// A stall report includes FLUSH's and the channel's callback state.
func TestChaosColdStart(t *testing.T) {
	skipShort(t)
	for _, file := range []string{"udp.toml", "flush.toml"} {
		t.Run(file, func(t *testing.T) {
			for _, seed := range chaosSeeds(t, "1-100") {
				t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) { scenarioD(t, file, seed) })
				})
			}
			t.Log(coldStartTimes.summary(file))
		})
	}
}

func scenarioD(t *testing.T, file string, seed uint64) {
	r := newChaosRun(t, file, seed)
	n := 8 + r.rng.IntN(5)
	for range n {
		r.add()
	}
	defer r.close()
	r.net.SetDefault(sim.Rule{Drop: 0.2, Duplicate: 0.1, Reorder: 0.1, ReorderWindow: 5 * time.Millisecond})
	start := time.Now()
	errs := make(chan error, n)
	for _, ch := range r.chs {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			errs <- ch.Connect(ctx, "chaos")
		}()
	}
	for range n {
		err := <-errs
		r.require(err == nil, "Connect: %v", err)
	}
	all := r.alive()
	r.require(waitUntil(10*time.Minute, func() bool { return r.sameView(all) }), "%d members that started together are not in one view after 10 minutes", n)
	took := time.Since(start)
	t.Logf("seed %d: %d members in one view after %s", seed, n, took)
	coldStartTimes.add(file, took)

	var wg sync.WaitGroup
	defer wg.Wait()
	defer r.stopAll()
	for _, i := range all {
		r.traffic(i, &wg)
	}
	time.Sleep(2 * time.Second)
	r.stopAll()
	wg.Wait()
	r.net.SetDefault(sim.Rule{})
	r.settle()
	r.check()
	if file == "flush.toml" {
		r.checkVirtualSynchrony()
	}
}

// coldStartTimes collects scenario D's times to one view, printed at the
// end of the run (median and worst per config).
var coldStartTimes = &startTimes{by: map[string][]time.Duration{}}

type startTimes struct {
	mu sync.Mutex
	by map[string][]time.Duration
}

func (s *startTimes) add(file string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.by[file] = append(s.by[file], d)
}

func (s *startTimes) summary(file string) string {
	s.mu.Lock()
	ds := slices.Clone(s.by[file])
	s.mu.Unlock()
	if len(ds) == 0 {
		return file + ": no run reached one view"
	}
	slices.Sort(ds)
	return fmt.Sprintf("%s: %d runs, to one view median %s, p90 %s, worst %s", file, len(ds), ds[len(ds)/2], ds[len(ds)*9/10], ds[len(ds)-1])
}
