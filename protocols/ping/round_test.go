package ping

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// TestRoundKeepsAnAnswerOverALateRequest: a member's request without a
// view that arrives after its answer with a view (sent before it joined,
// delivered late) does not hide that it is in a view now.
func TestRoundKeepsAnAnswerOverALateRequest(t *testing.T) {
	r := &round{found: map[stack.Address]stack.MemberInfo{}, coord: make(chan struct{})}
	a := stack.NewAddress()
	r.add(stack.MemberInfo{Addr: a, IsServer: true, Coord: a})
	r.add(stack.MemberInfo{Addr: a})
	require.True(t, r.found[a].IsCoord(), "the coordinator's answer stands")
	b := stack.NewAddress()
	r.add(stack.MemberInfo{Addr: b})
	r.add(stack.MemberInfo{Addr: b, IsServer: true, Coord: a})
	require.Equal(t, a, r.found[b].Coord, "an answer with a view replaces a request without one")
}
