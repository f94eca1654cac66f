package stack_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// TestDiffOfLargeViewsMatchesSmallOnes checks Diff on views above the
// size where it uses sets (a delta view of a large group: some left, some
// joined) against the members named by hand.
func TestDiffOfLargeViewsMatchesSmallOnes(t *testing.T) {
	for _, n := range []int{4, 100} {
		var all []stack.Address
		for range n + 3 {
			all = append(all, stack.NewAddress())
		}
		old := stack.NewView(all[0], 1, all[:n]...)
		// Members 1 and n-1 leave, two join at the end.
		kept := append([]stack.Address{all[0]}, all[2:n-1]...)
		v := stack.NewView(all[0], 2, append(kept, all[n], all[n+1])...)
		joined, left := v.Diff(old)
		require.Equal(t, []stack.Address{all[n], all[n+1]}, joined, "n=%d", n)
		require.Equal(t, []stack.Address{all[1], all[n-1]}, left, "n=%d", n)
		joined, left = v.Diff(nil)
		require.Equal(t, v.Members, joined, "n=%d: against no view, all joined", n)
		require.Empty(t, left)
		require.Len(t, v.MemberSet(), v.Size())
		for _, k := range []int{1, 1000} {
			in := v.Lookup(k)
			require.True(t, in(all[n]), "n=%d, lookup for %d", n, k)
			require.False(t, in(all[1]), "n=%d, lookup for %d", n, k)
		}
		require.False(t, (*stack.View)(nil).Lookup(1000)(all[0]))
	}
}
