package gms

import "github.com/strata-go/strata/stack"

// JoinReq returns a JOIN_REQ header, for tests that send one from a member
// already in the view (a joiner whose answer was lost asks again).
func JoinReq() *Header { return &Header{Type: typeJoinReq} }

// SetLeaving marks g as leaving, as Disconnect does first, without the
// leave that follows.
func SetLeaving(g *GMS) {
	g.mu.Lock()
	g.leaving = true
	g.mu.Unlock()
}

// RunMerge runs g's part as merge leader with coords, as MERGE3's EvMerge
// does, and returns when it is over.
func RunMerge(g *GMS, coords []stack.Address) { g.runMerge(coords) }
