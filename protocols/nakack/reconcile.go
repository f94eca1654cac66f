package nakack

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/strata-go/strata/stack"
)

// hold implements EvHold: it returns the digest and holds every sender at
// what has been delivered from it. A reconcile lets each go up to its
// target; the rest (what its sender sent in the next view) waits until the
// flush ends (EvReleaseHold), which FLUSH does only after this member has
// installed the new view. So no member delivers in the old view what was
// sent in the new one, however late its copy of the view is, and a member
// that leaves delivers nothing of a view it is not in. Internal messages
// pass a hold (the new view is one of them), in their seqno order.
func (n *NAKACK) hold() stack.Digest {
	self := n.LocalAddress()
	n.mu.Lock()
	for src, t := range n.tables {
		// Not this member's own: what it sent before it blocked belongs
		// to this view, and it delivers its own copy here and now.
		if !t.held && src != self {
			t.held, t.limit = true, t.w.HighestDelivered()
		}
	}
	n.mu.Unlock()
	return n.Digest()
}

// release ends every hold.
func (n *NAKACK) release() {
	var resume []stack.Address
	n.mu.Lock()
	for src, t := range n.tables {
		if t.held {
			t.held = false
			resume = append(resume, src)
		}
	}
	n.mu.Unlock()
	n.Log().Debug("nakack: holds released", "senders", resume)
	// Not on the caller's goroutine: FLUSH ends a hold with its
	// participant lock held, and what is delivered now reaches the
	// application, whose Receive may block. (A state provider's GetState
	// waits for deliveries on their way to the application, so the state
	// still covers them.)
	n.deliverAsync(resume)
}

// WaitDelivered returns once this member has delivered (and the layers
// above have taken) every message of each listed sender up to the entry's
// highest received seqno, fetching the ones it lacks; or with ctx's error.
// Senders it has no table for are skipped. FLUSH uses it to make every
// member deliver the same messages before a view change.
func (n *NAKACK) WaitDelivered(ctx context.Context, target stack.Digest) error {
	return n.reconcile(ctx, stack.EvReconcile{Target: target})
}

func (n *NAKACK) reconcile(ctx context.Context, rc stack.EvReconcile) error {
	self := n.LocalAddress()
	var lifted []stack.Address
	n.mu.Lock()
	for _, e := range rc.Target {
		if t := n.tables[e.Member]; t != nil && t.held && e.HighestDelivered > t.limit {
			t.limit = e.HighestDelivered
			lifted = append(lifted, e.Member)
		}
	}
	n.mu.Unlock()
	if len(lifted) > 0 {
		n.Log().Debug("nakack: hold lifted", "senders", lifted)
	}
	// The lifted messages belong to the view the flush ends: delivered
	// here, before the reconcile answers (a Receive that blocks holds up
	// only this reconcile, bounded by its context, not FLUSH's locks).
	for _, src := range lifted {
		n.deliverFrom(src)
	}
	tick := time.NewTicker(n.cfg.XmitInterval)
	defer tick.Stop()
	ask, tries := true, 0
	n.mu.Lock()
	defer n.mu.Unlock()
	for {
		ready := true
		var reqs []struct {
			to stack.Address
			h  *Header
		}
		for i, e := range rc.Target {
			t := n.tables[e.Member]
			if t == nil {
				continue
			}
			goal := max(e.HighestReceived, e.HighestDelivered)
			if goal > t.w.HighestReceived() && e.Member != self {
				t.w.Raise(goal) // the retransmission task asks for the gap
				n.watchLocked(e.Member, t)
				n.kickGaps()
			}
			if t.w.HighestDelivered() < goal || t.w.Removing() && (t.rc == nil || !t.rc.Taken()) {
				// Delivered up to goal, and what is on its way up the
				// stack has reached the channel (not necessarily come
				// back from the application: that may wait for the
				// flush to end).
				ready = false
			}
			if !ask || i >= len(rc.From) || rc.From[i] == self || rc.From[i].IsZero() || t.w.HighestDelivered() >= goal {
				continue
			}
			from := rc.From[i]
			if tries%2 == 1 {
				// The member named may be gone (a leaver that left in the
				// middle of the round): every other try asks another
				// member of the view, which may have fetched them by now.
				if o := n.otherMember(from); !o.IsZero() {
					from = o
				}
			}
			if missing := t.w.Missing(goal, n.cfg.MaxXmitReq); len(missing) > 0 {
				reqs = append(reqs, struct {
					to stack.Address
					h  *Header
				}{from, &Header{Type: typeXmitReq, Sender: e.Member, Missing: missing}})
			}
		}
		if ready {
			return nil
		}
		if ask {
			tries++
		}
		if len(reqs) > 0 {
			n.mu.Unlock()
			for _, r := range reqs {
				n.sendXmitReq(r.to, r.h)
			}
			n.mu.Lock()
			ask = false
			continue // re-check: answers may have come in meanwhile
		}
		ask = false
		if n.progress == nil {
			n.progress = make(chan struct{})
		}
		n.waiting.Add(1)
		ch := n.progress
		n.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-tick.C:
			ask = true
		case <-ctx.Done():
			err = ctx.Err()
		case <-n.Done():
			err = stack.ErrClosed
		}
		n.mu.Lock()
		n.waiting.Add(-1)
		if err != nil {
			var behind []string
			for _, e := range rc.Target {
				if t := n.tables[e.Member]; t != nil && t.w.HighestDelivered() < e.HighestDelivered {
					behind = append(behind, fmt.Sprintf("%s at %d of %d", e.Member, t.w.HighestDelivered(), e.HighestDelivered))
				}
			}
			return fmt.Errorf("%w (behind: %s)", err, strings.Join(behind, ", "))
		}
	}
}
