package nakack

import (
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

func (n *NAKACK) handleXmitReq(from stack.Address, h *Header) {
	n.st.xmitReqRecv.Add(1)
	var out []*stack.Message
	purged := uint64(0)
	n.mu.Lock()
	if t := n.tables[h.Sender]; t != nil {
		bytes := 0
		for _, s := range h.Missing {
			if low := t.w.Low(); s < low && h.Sender == n.LocalAddress() {
				purged = low - 1
			}
			if e, _ := t.w.Get(s); e.Msg != nil && bytes < maxXmitBytes {
				bytes += len(e.Msg.Payload)
				c := e.Msg.Copy()
				c.Dest = from
				c.PutHeader(n.ID(), &Header{Type: typeXmitRsp, Seqno: s})
				out = append(out, c)
			}
		}
	}
	n.mu.Unlock()
	for _, m := range out {
		n.st.xmits.Add(1)
		_ = n.PassDown(n.Context(), m)
	}
	if purged > 0 {
		// Only the sender speaks for its own messages: another member's
		// table may start late (it joined), which says nothing about them.
		n.st.purgedAnswers.Add(1)
		n.control(from, &Header{Type: typePurged, Seqno: purged})
	}
}

// xmitTask asks for missing messages (from the original sender, or any
// member if it is gone), paced per sender; with whole (once per
// xmit_interval) it also lets receivers learn this member's highest seqno
// when it has not sent since the last run. It reports whether a gap is
// left.
func (n *NAKACK) xmitTask(whole bool) (gaps bool) {
	self := n.LocalAddress()
	type req struct {
		to stack.Address
		h  *Header
	}
	var reqs []req
	announce := uint64(0)
	now := time.Now()
	n.mu.Lock()
	kept := n.gappy[:0]
	for _, g := range n.gappy {
		src, t := g.src, g.t
		if n.tables[src] != t || src == self || !t.w.Gap() {
			t.listed = false
			continue
		}
		kept = append(kept, g)
		gaps = true
		if !t.w.Due(now, n.cfg.firstXmit(), n.cfg.XmitInterval) {
			continue
		}
		missing := t.w.Missing(t.w.HighestReceived(), n.cfg.MaxXmitReq)
		if len(missing) == 0 {
			continue
		}
		n.st.gaps.Add(int64(len(missing)))
		if hd := t.w.HighestDelivered(); hd == t.askedAt {
			t.asks++
		} else {
			t.asks, t.askedAt = 0, hd
		}
		to := src
		// A sender that left, or has not answered the last request (it may
		// have crashed), is not the only member that may hold the messages.
		if n.view != nil && (!n.view.Contains(src) || t.asks%2 == 1) {
			if o := n.randomOther(self); !o.IsZero() {
				to = o
			}
		}
		reqs = append(reqs, req{to, &Header{Type: typeXmitReq, Sender: src, Missing: missing}})
	}
	clear(n.gappy[len(kept):])
	n.gappy = kept
	recoverOwn := false
	if own := n.tables[self]; whole && own != nil {
		// Own messages are delivered when the transport loops them back;
		// one dropped on the way down (a lossy layer above the transport)
		// would hold up every later one, so after a whole interval deliver
		// it from here.
		for s := own.w.HighestDelivered() + 1; s <= n.lastTick; s++ {
			if own.w.Arrive(s) {
				recoverOwn = true
			}
		}
		n.lastTick = n.seqno
		if n.seqno != n.lastSent {
			n.lastSent, n.backoff = n.seqno, 0
		} else if n.seqno > 0 && own.w.Low() <= n.seqno {
			if n.backoff == 0 {
				n.backoff = n.cfg.XmitInterval
			}
			if now.Sub(n.lastHS) >= n.backoff {
				announce, n.lastHS = n.seqno, now
				n.backoff = min(2*n.backoff, 64*n.cfg.XmitInterval)
			}
		}
	}
	n.mu.Unlock()
	for _, r := range reqs {
		n.sendXmitReq(r.to, r.h)
	}
	if announce > 0 {
		n.control(stack.Address{}, &Header{Type: typeHighestSeqno, Seqno: announce})
	}
	if recoverOwn {
		n.deliverFrom(self)
	}
	return gaps
}

// sendXmitReq sends the retransmission request h to to, in as many
// requests as it takes for each to fit the stack's control budget (a
// list of max_xmit_req seqnos far apart can take 80 KB).
func (n *NAKACK) sendXmitReq(to stack.Address, h *Header) {
	limit := max(n.Stack().ControlLimit()-(1+stack.AddressSize), wire.MinSeqnoListLimit)
	for _, part := range wire.SplitSeqnoList(h.Missing, limit) {
		n.st.xmitReqSent.Add(1)
		n.control(to, &Header{Type: typeXmitReq, Sender: h.Sender, Missing: part})
	}
}

// randomOther returns a random member of the view other than self, or the
// zero address if there is none; callers hold n.mu. It picks in O(1), not
// by listing the others: it runs for every sender asked again.
func (n *NAKACK) randomOther(self stack.Address) stack.Address {
	ms := n.view.Members
	switch k := len(ms); {
	case k == 0 || k == 1 && ms[0] == self:
		return stack.Address{}
	case k == 1:
		return ms[0]
	default:
		i := n.Rand().IntN(k - 1)
		if ms[i] == self {
			return ms[k-1] // self's place goes to the last member
		}
		return ms[i]
	}
}
