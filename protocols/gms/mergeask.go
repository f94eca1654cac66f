package gms

import (
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/strata-go/strata/stack"
)

// mergeAsk is a merge leader's request to the other subgroups'
// coordinators for their views and digests, as a state machine. It says
// whom to ask, and whom to ask again every fifth of merge_timeout (a
// request or answer can be lost: the last message of a reliable unicast
// connection is not repaired until the next one; the same merge id gets
// the same answer), which answers count (one from each coordinator asked,
// under this id: merge ids are not secret), and when asking is over (all
// answered, or merge_timeout passed). merge.go does the I/O; TestMergeAsk
// drives it.
type mergeAsk struct {
	id      MergeID
	asked   map[stack.Address]bool // yet to answer
	n       int                    // coordinators asked
	subs    []mergeSub             // the leader's own first, then each answer accepted
	timeout time.Duration
	retry   stack.Retry
	over    bool
	busy    bool // a coordinator refused: busy with another merge
}

// newMergeAsk asks coords, at now, under id; own is the leader's subgroup.
func newMergeAsk(id MergeID, own mergeSub, coords []stack.Address, timeout time.Duration, now time.Time) (*mergeAsk, []effect) {
	a := &mergeAsk{id: id, asked: map[stack.Address]bool{}, subs: []mergeSub{own}, timeout: timeout, retry: stack.NewRetry(now, timeout/5, timeout)}
	var out []effect
	for _, c := range coords {
		if !a.asked[c] {
			a.asked[c] = true
			out = append(out, sendMsg{to: c, h: &Header{Type: typeMergeReq, MergeID: id, View: own.view}})
		}
	}
	a.n = len(a.asked)
	return a, out
}

// answer takes src's MERGE_RSP h; it reports whether the answer counts.
func (a *mergeAsk) answer(src stack.Address, h *Header) (bool, []effect) {
	if a.over || h.MergeID != a.id || !a.asked[src] {
		return false, nil
	}
	delete(a.asked, src)
	if h.Fail == failMergeBusy {
		a.busy = true
	}
	if h.Fail != "" || h.View == nil {
		return true, []effect{logLine{slog.LevelInfo, "merge refused", []any{"by", src, "reason", h.Fail}}}
	}
	a.subs = append(a.subs, mergeSub{h.View, h.Digest})
	return true, nil
}

// poll says at now whether asking is over (then subs is final) and whom
// to ask again; merge.go polls again at retry.Due or when an answer came.
func (a *mergeAsk) poll(now time.Time) (out []effect, over bool) {
	if len(a.asked) == 0 {
		a.over = true
		return nil, true
	}
	switch resend, expired := a.retry.At(now); {
	case expired:
		a.over = true
		return []effect{logLine{slog.LevelWarn, "merge: not every coordinator answered within merge_timeout", []any{"answered", len(a.subs) - 1, "asked", a.n}}}, true
	case resend:
		for _, c := range slices.SortedFunc(maps.Keys(a.asked), stack.Address.Compare) {
			out = append(out, sendMsg{to: c, h: &Header{Type: typeMergeReq, MergeID: a.id, View: a.subs[0].view}})
		}
	}
	return out, false
}
