package unicast2

import (
	"time"

	"github.com/strata-go/strata/internal/window"
	"github.com/strata-go/strata/stack"
)

// ---- receiving ----

// Up handles one message carrying a UNICAST2 header.
func (u *UNICAST2) Up(m *stack.Message) {
	if u.handle(m) {
		u.deliverFrom(m.Src)
	}
}

// PreservesBatches marks UNICAST2 as a stack.BatchPreserver: its UpBatch only
// removes messages.
func (*UNICAST2) PreservesBatches() {}

// UpBatch handles the batch's UNICAST2 messages under one pass and delivers
// in-order messages as batches; other messages go up as they are.
func (u *UNICAST2) UpBatch(b *stack.Batch) {
	if !b.MayHave(u.ID()) {
		u.PassUpBatch(b)
		return
	}
	srcs := map[stack.Address]bool{}
	b.Keep(func(m *stack.Message) bool {
		if m.Header(u.ID()) == nil {
			return true
		}
		if u.handle(m) {
			srcs[m.Src] = true
		}
		return false
	})
	u.PassUpBatch(b)
	for s := range srcs {
		u.deliverFrom(s)
	}
}

// handle processes m and reports whether messages from m.Src may now be
// deliverable in order.
func (u *UNICAST2) handle(m *stack.Message) bool {
	h, ok := m.Header(u.ID()).(*Header)
	if !ok {
		u.PassUp(m)
		return false
	}
	switch h.Type {
	case typeData:
		return u.handleData(m, h)
	case typeStable:
		u.handleStable(m.Src, h)
	case typeSendFirstSeqno:
		u.handleSendFirstSeqno(m.Src, h)
	case typeXmitReq:
		u.handleXmitReq(m.Src, h)
	}
	return false
}

func (u *UNICAST2) handleData(m *stack.Message, h *Header) bool {
	u.st.received.Add(1)
	if h.Seqno == 0 {
		u.st.impossible.Add(1) // seqnos start at 1
		return false
	}
	src := m.Src
	u.mu.Lock()
	e := u.recv[src]
	if e == nil || e.connID != h.ConnID {
		if !h.First {
			ask := u.mayAskFirst(src, time.Now())
			u.mu.Unlock()
			if u.trace != nil {
				u.trace("unicast2: data dropped: not the first of an open connection", "from", src, "conn", h.ConnID, "seqno", h.Seqno, "ask_first", ask)
			}
			u.st.firstDropped.Add(1)
			if ask {
				u.askFirst(src)
			}
			return false
		}
		start := h.Seqno
		t, fromTomb := u.tombs[src]
		fromTomb = fromTomb && !u.fixOff && t.connID == h.ConnID
		if fromTomb && t.hd >= start {
			start = t.hd + 1 // continue after what the closed connection delivered
		}
		u.Log().Debug("unicast2: receive connection opened", "from", src, "conn", h.ConnID, "first", h.Seqno, "start", start, "tomb", u.tombs[src])
		delete(u.tombs, src)
		e = &recvEntry{connID: h.ConnID, w: window.New(start-1, false), used: time.Now()}
		if fromTomb {
			// And the OOB messages it delivered above a gap: not again.
			for _, s := range t.oob {
				e.w.Add(s, nil, true, 0) // those below start are refused
			}
		}
		u.recv[src] = e
	}
	oob := m.Has(stack.OOB)
	limit := int64(u.cfg.MaxBuffered)
	if oob {
		limit = 0 // not kept: delivered at once
	}
	res := e.w.Add(h.Seqno, m, oob, limit)
	if res != window.TooFar {
		e.busy = true
	}
	switch res {
	case window.TooFar:
		// Forged or corrupt: a real one is resent once the gap closes.
		u.mu.Unlock()
		u.st.impossible.Add(1)
		return false
	case window.Duplicate:
		e.dup = true // answered with a STABLE by the xmit task
		hd := e.w.HighestDelivered()
		u.mu.Unlock()
		u.st.duplicates.Add(1)
		if u.trace != nil {
			u.trace("unicast2: duplicate", "from", src, "conn", h.ConnID, "seqno", h.Seqno, "delivered", hd)
		}
		return false
	case window.Full:
		// Full (a sender beyond its credits, or a long gap): dropped and
		// fetched again later (the window counts it as a gap). The next
		// seqno to deliver is always taken, so delivery can move on and
		// make room.
		u.mu.Unlock()
		u.st.bufferFull.Add(1)
		return false
	}
	if b := e.w.Buffered(); !oob && b > u.st.bufferedPeak.Load() {
		u.st.bufferedPeak.Store(b)
	}
	e.bytes += int64(len(m.Payload))
	stableNow := e.bytes >= int64(u.cfg.MaxBytes)
	var sh *Header
	if stableNow {
		sh = u.stableHeader(e)
	}
	u.mu.Unlock()
	if sh != nil {
		u.sendStable(src, sh)
	}
	if oob && m.SetTransientIfAbsent(stack.OOBDelivered) {
		u.st.delivered.Add(1)
		u.PassUp(m)
	}
	return true
}

// deliverFrom passes up, in order, what can be delivered from src. One
// goroutine at a time delivers per source (the window's remover); others
// leave their messages to it.
func (u *UNICAST2) deliverFrom(src stack.Address) {
	u.mu.Lock()
	e := u.recv[src]
	if e == nil {
		u.mu.Unlock()
		return
	}
	e.w.Deliver(&u.mu, &window.Remover{
		// Closed meanwhile: its messages are not delivered.
		Open: func() bool { return u.recv[src] == e },
		Up: func(msgs []*stack.Message) {
			u.st.delivered.Add(int64(len(msgs)))
			if len(msgs) == 1 {
				u.PassUp(msgs[0])
			} else {
				u.PassUpBatch(&stack.Batch{Src: src, Dest: u.LocalAddress(), Lane: stack.LaneRegular, Msgs: msgs})
			}
		},
	})
}

// mayAskFirst applies the SEND_FIRST_SEQNO rate limit; callers hold u.mu.
func (u *UNICAST2) mayAskFirst(src stack.Address, now time.Time) bool {
	if last, ok := u.syncSent[src]; ok && now.Sub(last) < u.cfg.SyncMinInterval {
		return false
	}
	u.syncSent[src] = now
	return true
}

func (u *UNICAST2) askFirst(src stack.Address) {
	u.st.firstSent.Add(1)
	u.control(src, &Header{Type: typeSendFirstSeqno, Timestamp: u.clock.Add(1)})
}
