package merge3_test

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/merge3"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

var cfg = merge3.Config{MinInterval: time.Second, MaxInterval: 2 * time.Second, CheckInterval: 3 * time.Second}

// start4 starts four members of MERGE3 over SIM, each with a recorder of
// the events MERGE3 passes up.
func start4(t *testing.T) (*stacktest.Cluster, []*stacktest.EventRecorder) {
	recs := make([]*stacktest.EventRecorder, 4)
	c := stacktest.StartSIM(t, 4, 1, func(i int) []stack.Protocol {
		recs[i] = stacktest.NewEventRecorder()
		return []stack.Protocol{merge3.New(cfg), recs[i]}
	})
	return c, recs
}

func TestLowestCoordinatorLeadsTheMerge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, recs := start4(t)
		a := c.Addresses()
		// Two subgroups of two; whichever coordinator has the lower address
		// leads.
		v1, v2 := stack.NewView(a[0], 5, a[0], a[1]), stack.NewView(a[2], 7, a[2], a[3])
		stacktest.InjectView(t, v1, c.Channels[0], c.Channels[1])
		stacktest.InjectView(t, v2, c.Channels[2], c.Channels[3])
		leader, other := 0, 2
		if a[2].Compare(a[0]) < 0 {
			leader, other = 2, 0
		}
		stacktest.WaitFor(t, time.Minute, func() bool { return len(stacktest.Recorded[stack.EvMerge](recs[leader])) > 0 }, "the leader asks for a merge")
		coords := stacktest.Recorded[stack.EvMerge](recs[leader])[0].Coords
		require.Equal(t, a[leader], coords[0], "the leader first")
		require.ElementsMatch(t, []stack.Address{a[0], a[2]}, coords)
		time.Sleep(3 * cfg.CheckInterval)
		for i, r := range recs {
			if i != leader {
				require.Empty(t, stacktest.Recorded[stack.EvMerge](r), "member %d (the other coordinator is %d) leaves the merge to the leader", i, other)
			}
		}

		// One view again: no more merges.
		stacktest.InjectView(t, stack.NewView(a[leader], 8, a...), c.Channels...)
		time.Sleep(cfg.CheckInterval) // the check that may still see old announcements
		n := len(stacktest.Recorded[stack.EvMerge](recs[leader]))
		time.Sleep(3 * cfg.CheckInterval)
		require.Equal(t, n, len(stacktest.Recorded[stack.EvMerge](recs[leader])), "no merge within one view")
	})
}

// TestUnheardCoordinatorIsAskedToo: the leader hears the members of the
// other subgroup but none of its coordinator's announcements (all lost).
// Those members name a coordinator it never heard, so they are asked for
// a merge directly, and their coordinator is asked too: alive, it answers
// for its subgroup (its members alone refuse, as it is their coordinator),
// and the merge does not wait a whole check_interval for its next
// announcement to get through.
func TestUnheardCoordinatorIsAskedToo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, recs := start4(t)
		a := c.Addresses()
		leader, other := 0, 2
		if a[2].Compare(a[0]) < 0 {
			leader, other = 2, 0
		}
		c.Net.SetLink(a[other], a[leader], sim.Rule{DropIf: func(m *stack.Message) bool {
			_, ok := m.Header(stack.IDMERGE3).(*merge3.Header)
			return ok
		}})
		v1, v2 := stack.NewView(a[0], 5, a[0], a[1]), stack.NewView(a[2], 7, a[2], a[3])
		stacktest.InjectView(t, v1, c.Channels[0], c.Channels[1])
		stacktest.InjectView(t, v2, c.Channels[2], c.Channels[3])
		stacktest.WaitFor(t, time.Minute, func() bool { return len(stacktest.Recorded[stack.EvMerge](recs[leader])) > 0 }, "the leader asks for a merge")
		coords := stacktest.Recorded[stack.EvMerge](recs[leader])[0].Coords
		require.Equal(t, a[leader], coords[0], "the leader first")
		require.Contains(t, coords, a[other], "the coordinator it never heard")
		require.Contains(t, coords, a[other+1], "that coordinator's member, whose announcements it heard")
	})
}

// TestLeaderIsToldByASubgroupOfOne: a coordinator alone in its view, whose
// multicast announcements never reach the merge leader, hears the leader
// and tells it directly at its check; the leader merges at its next check.
// A subgroup of one has no members to name it to the leader, so without
// that the merge waits until one of its announcements gets through (seed
// 378 of the cold-start scenario: three check intervals).
func TestLeaderIsToldByASubgroupOfOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, recs := start4(t)
		a := c.Addresses()
		order := []int{0, 1, 2, 3}
		slices.SortFunc(order, func(i, j int) int { return a[i].Compare(a[j]) })
		leader, alone := order[0], order[3]
		c.Net.SetLink(a[alone], a[leader], sim.Rule{DropIf: func(m *stack.Message) bool {
			_, ok := m.Header(stack.IDMERGE3).(*merge3.Header)
			return ok && m.Dest.IsZero()
		}})
		stacktest.InjectView(t, stack.NewView(a[leader], 5, a[order[0]], a[order[1]], a[order[2]]), c.Channels[order[0]], c.Channels[order[1]], c.Channels[order[2]])
		stacktest.InjectView(t, stack.NewView(a[alone], 7, a[alone]), c.Channels[alone])
		stacktest.WaitFor(t, 3*cfg.CheckInterval, func() bool { return len(stacktest.Recorded[stack.EvMerge](recs[leader])) > 0 }, "the leader asks for a merge")
		coords := stacktest.Recorded[stack.EvMerge](recs[leader])[0].Coords
		require.Equal(t, []stack.Address{a[leader], a[alone]}, coords)
		require.Empty(t, stacktest.Recorded[stack.EvMerge](recs[alone]), "the other coordinator leaves the merge to the leader")
	})
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	for key, c := range map[string]merge3.Config{
		"min_interval":   {MinInterval: 0, MaxInterval: time.Second},
		"max_interval":   {MinInterval: 2 * time.Second, MaxInterval: time.Second},
		"check_interval": {MinInterval: time.Second, MaxInterval: 2 * time.Second, CheckInterval: time.Second},
	} {
		err := c.Validate()
		require.Error(t, err, key)
		require.Contains(t, err.Error(), key)
	}
	def := merge3.DefaultConfig()
	require.NoError(t, def.Validate())
}

// TestAnnouncementsOfTheSameViewAreNotKept: in one view every member
// hears every other member's announcements; a check passes those by, so
// nobody keeps them (in a group of N, N announcements at every member),
// while an announcement of another view is kept for the check.
func TestAnnouncementsOfTheSameViewAreNotKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := make([]*merge3.Merge3, 4)
		long := cfg
		long.CheckInterval = time.Hour // no check empties what was kept
		c := stacktest.StartSIM(t, 4, 1, func(i int) []stack.Protocol {
			ms[i] = merge3.New(long)
			return []stack.Protocol{ms[i]}
		})
		a := c.Addresses()
		stacktest.InjectView(t, stack.NewView(a[0], 5, a[:3]...), c.Channels[:3]...)
		stacktest.InjectView(t, stack.NewView(a[3], 2, a[3]), c.Channels[3])
		for i, m := range ms[:3] {
			stacktest.WaitFor(t, time.Minute, func() bool { return stacktest.Stat(t, m, "announcements_received") >= 6 }, "member %d hears the others", i)
			require.LessOrEqual(t, m.HeardForTest(), 1, "member %d keeps only D's announcement (another view)", i)
		}
	})
}
