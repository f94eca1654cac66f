// Package nakack is NAKACK: reliable, FIFO-per-sender multicast with
// negative acknowledgements, after JGroups' NAKACK2. Every member keeps a
// table per sender (its own included) of the messages not yet stable, so it
// can retransmit them for the sender and for a flush; STABLE purges them.
package nakack

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

// Config configures NAKACK.
type Config struct {
	XmitInterval time.Duration `toml:"xmit_interval" doc:"how often receivers ask again for missing messages, backing off (the first request goes xmit_interval/50 after the gap appears), and idle senders announce their highest seqno"`
	MaxXmitReq   int           `toml:"max_xmit_req" doc:"most missing seqnos asked for in one XMIT_REQ"`
	MaxBuffered  stack.Size    `toml:"max_buffered_bytes" doc:"payload bytes received from one sender and not yet delivered (above a gap, or held by a flush); more are dropped and counted, and fetched again once delivery moves on (0: no bound)"`
}

// DefaultConfig returns NAKACK's defaults.
func DefaultConfig() Config {
	return Config{XmitInterval: 500 * time.Millisecond, MaxXmitReq: 256, MaxBuffered: 16 << 20}
}

// firstXmit is how long a gap must stay before the first request for it,
// and how often gapWatch looks while there is one: on a LAN a lost datagram
// is repaired in about ten milliseconds, while the sender's flow-control
// credits wait for it, rather than after a whole xmit_interval.
func (c *Config) firstXmit() time.Duration { return max(c.XmitInterval/50, time.Millisecond) }

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.XmitInterval <= 0:
		return stack.BadKey("xmit_interval", "must be > 0, got %s", c.XmitInterval)
	case c.MaxXmitReq < 1 || c.MaxXmitReq > stack.MaxSeqnoList:
		return stack.BadKey("max_xmit_req", "must be 1..%d, got %d", stack.MaxSeqnoList, c.MaxXmitReq)
	case c.MaxBuffered < 0:
		return stack.BadKey("max_buffered_bytes", "must be >= 0, got %d", c.MaxBuffered)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "NAKACK", ID: stack.IDNAKACK,
		Provides: []stack.Service{stack.ServiceReliableMulticast},
		Doc:      "reliable FIFO multicast with negative acks, digests for joiners and flush (JGroups NAKACK2)",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
}

// NAKACK is the NAKACK protocol.
type NAKACK struct {
	stack.Base
	cfg Config

	mu       sync.Mutex
	tables   map[stack.Address]*table
	view     *stack.View
	seqno    uint64        // last seqno this member sent
	lastSent uint64        // seqno at the previous xmit run, for HIGHEST_SEQNO
	lastTick uint64        // seqno at the previous whole-interval run, for own messages whose loopback was lost
	gapKick  chan struct{} // a gap appeared: wakes gapWatch
	backoff  time.Duration
	lastHS   time.Time
	waiting  atomic.Int32  // goroutines in WaitDelivered (changed under mu)
	progress chan struct{} // closed (and replaced) when delivery moves on and someone waits

	st stats
}

type stats struct {
	sent, received, delivered, duplicates, nonMember, tooFar atomic.Int64
	bufferFull, bufferedPeak                                 atomic.Int64
	xmitReqSent, xmitReqRecv, xmits, gaps, highest           atomic.Int64
	purged, stableEvents, purgedAnswers, skipped             atomic.Int64
}

// table holds one sender's messages from low to hr; hd is the highest
// delivered.
type table struct {
	low, hd, hr uint64
	msgs        map[uint64]*entry
	bytes       int64
	buffered    int64 // payload bytes of messages not yet delivered (max_buffered_bytes)
	removing    bool
	// rc goes up with what the remover passes up; the channel marks it when
	// they reach the application, so a flush need not wait for the callback.
	rc      *stack.Receipt
	xmit    stack.Pacer
	asks    int    // requests since hd last moved
	askedAt uint64 // hd at the last request
	// held: a flush before a view change holds this sender (one that does
	// not take part in it) at limit, so that no member delivers more of its
	// messages than the round agreed on. Cleared when the flush ends.
	held  bool
	limit uint64
	// spare: the slice the remover gathers messages in, kept between
	// runs (only the remover touches it; the layers above do not keep a
	// batch's slice once they return).
	spare []*stack.Message
	slab  []entry // newEntry's
}

// addBuffered counts d bytes more (or less) not yet delivered, and keeps
// the peak; callers hold n.mu.
func (t *table) addBuffered(d int64, st *stats) {
	t.buffered += d
	if t.buffered > st.bufferedPeak.Load() {
		st.bufferedPeak.Store(t.buffered)
	}
}

// maxXmitBytes caps the payload one retransmission request is answered
// with; the requester asks again for the rest.
const maxXmitBytes = 1 << 20

type entry struct {
	m         *stack.Message
	delivered bool // passed up already (OOB), or never to be (DontLoopback own message)
	arrived   bool // for own messages: the loopback copy arrived (delivery may proceed)
	// hdr is the header of an own message, allocated with its entry (one
	// allocation per message sent instead of two).
	hdr Header
}

var _ stack.Protocol = (*NAKACK)(nil)

// New returns a NAKACK layer.
func New(cfg Config) *NAKACK {
	return &NAKACK{cfg: cfg, tables: map[stack.Address]*table{}, gapKick: make(chan struct{}, 1)}
}

// Name returns "NAKACK".
func (n *NAKACK) Name() string { return "NAKACK" }

// Init validates the config.
func (n *NAKACK) Init() error { return n.cfg.Validate() }

// Start starts the retransmission task.
func (n *NAKACK) Start() error {
	n.mu.Lock()
	n.tables = map[stack.Address]*table{n.LocalAddress(): newTable(0)}
	n.seqno, n.lastSent, n.lastTick, n.view = 0, 0, 0, nil
	n.mu.Unlock()
	n.GoEvery(n.cfg.XmitInterval, func() { n.xmitTask(true) })
	n.Go(n.gapWatch)
	return nil
}

// kickGaps wakes gapWatch: a gap appeared.
func (n *NAKACK) kickGaps() {
	select {
	case n.gapKick <- struct{}{}:
	default:
	}
}

// gapWatch asks for missing messages every firstXmit while some sender's
// table has a gap, and sleeps while none has: a datagram lost in a full
// socket buffer holds up its sender's later messages, and with them the
// flow-control credits the sender waits for, so it is asked for within
// tens of milliseconds, not at the next xmit_interval. addLocked wakes it
// when a gap appears.
func (n *NAKACK) gapWatch(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-n.gapKick:
		}
		t := time.NewTicker(n.cfg.firstXmit())
		for gaps := true; gaps; gaps = n.xmitTask(false) {
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
			}
		}
		t.Stop()
	}
}

func newTable(hd uint64) *table {
	return &table{low: hd + 1, hd: hd, hr: hd, msgs: map[uint64]*entry{}}
}

// entrySlab is how many table entries are allocated at once.
const entrySlab = 64

// newEntry returns a zero entry from the table's slab (one allocation per
// entrySlab messages instead of one per message; a slab lives while one
// of its entries is kept). Callers hold n.mu.
func (t *table) newEntry() *entry {
	if len(t.slab) == 0 {
		t.slab = make([]entry, entrySlab)
	}
	e := &t.slab[0]
	t.slab = t.slab[1:]
	return e
}

// Down numbers multicasts and keeps them in this member's own table.
func (n *NAKACK) Down(ctx context.Context, m *stack.Message) error {
	if !m.IsMulticast() || m.Has(stack.NoReliability) {
		return n.PassDown(ctx, m)
	}
	self := n.LocalAddress()
	if m.Src.IsZero() {
		m.Src = self
	}
	n.mu.Lock()
	t := n.tables[self]
	n.seqno++
	seq := n.seqno
	e := t.newEntry()
	*e = entry{m: m, delivered: m.HasTransient(stack.DontLoopback), hdr: Header{Type: typeMsg, Seqno: seq}}
	m.PutHeader(n.ID(), &e.hdr)
	t.msgs[seq] = e
	t.hr = max(t.hr, seq)
	t.bytes += int64(len(m.Payload))
	n.mu.Unlock()
	n.st.sent.Add(1)
	if err := n.PassDown(ctx, m); err != nil {
		return err
	}
	if m.HasTransient(stack.DontLoopback) {
		n.deliverFrom(self) // nothing to deliver, but the cursor moves past it
	}
	return nil
}

func (n *NAKACK) control(dest stack.Address, h *Header) {
	m := stack.NewMessage(dest, nil).Set(stack.Internal | stack.NoReliability)
	m.PutHeader(n.ID(), h)
	_ = n.PassDown(context.Background(), m)
}

// Up handles one message with a NAKACK header.
func (n *NAKACK) Up(m *stack.Message) {
	src, ok := n.handle(m)
	if ok {
		n.deliverFrom(src)
	}
}

// UpBatch adds the batch's messages to their tables under one lock and
// delivers what is in order, as batches; other messages go up as they are.
func (n *NAKACK) UpBatch(b *stack.Batch) {
	var srcs []stack.Address
	var oob []*stack.Message
	self := n.LocalAddress()
	var rest []*stack.Message
	n.mu.Lock()
	b.Keep(func(m *stack.Message) bool {
		h, ok := m.Header(n.ID()).(*Header)
		if !ok {
			return true
		}
		if h.Type != typeMsg && h.Type != typeXmitRsp {
			rest = append(rest, m) // control messages, handled after the lock
			return false
		}
		n.normalise(m, h)
		added, o := n.addLocked(m, h.Seqno, self)
		if o != nil {
			oob = append(oob, o)
		}
		if added && !slices.Contains(srcs, m.Src) {
			srcs = append(srcs, m.Src)
		}
		return false
	})
	n.mu.Unlock()
	for _, m := range oob {
		n.st.delivered.Add(1)
		n.PassUp(m)
	}
	for _, m := range rest {
		if src, ok := n.handle(m); ok && !slices.Contains(srcs, src) {
			srcs = append(srcs, src)
		}
	}
	n.PassUpBatch(b)
	for _, s := range srcs {
		n.deliverFrom(s)
	}
}

// normalise turns a retransmitted copy (it came as a unicast) back into the
// multicast it is.
func (n *NAKACK) normalise(m *stack.Message, h *Header) {
	if h.Type == typeXmitRsp {
		m.Dest = stack.Address{}
		m.PutHeader(n.ID(), &Header{Type: typeMsg, Seqno: h.Seqno})
	}
}

// handle processes m; it reports the sender whose table may now deliver.
func (n *NAKACK) handle(m *stack.Message) (stack.Address, bool) {
	h, ok := m.Header(n.ID()).(*Header)
	if !ok {
		n.PassUp(m)
		return stack.Address{}, false
	}
	switch h.Type {
	case typeMsg, typeXmitRsp:
		n.normalise(m, h)
		return m.Src, n.add(m, h.Seqno)
	case typeXmitReq:
		n.handleXmitReq(m.Src, h)
	case typeHighestSeqno:
		n.st.highest.Add(1)
		n.mu.Lock()
		if t := n.tables[m.Src]; t != nil && h.Seqno > t.hr {
			if h.Seqno-t.hd > maxAhead {
				n.st.tooFar.Add(1)
			} else {
				t.hr = h.Seqno
				n.kickGaps()
			}
		}
		n.mu.Unlock()
	case typePurged:
		return m.Src, n.skipPurged(m.Src, h.Seqno)
	}
	return stack.Address{}, false
}

// skipPurged takes a sender's word that it purged its messages up to upto:
// every member of a view it sent them in has delivered them (STABLE), so
// this member was not in that view. It happens after a merge, when the
// other subgroup's STABLE purged past the digest the merge view carried.
// Without it the receiver would ask for them for ever and deliver nothing
// more from that sender. Placeholders mark the seqnos that will never
// come; what this member holds in between is still delivered, in order.
func (n *NAKACK) skipPurged(src stack.Address, upto uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.tables[src]
	if t == nil || src == n.LocalAddress() || upto <= t.hd || upto-t.hd > maxAhead {
		return false
	}
	skipped := int64(0)
	for s := t.hd + 1; s <= upto; s++ {
		if t.msgs[s] == nil {
			e := t.newEntry()
			e.delivered, e.arrived = true, true
			t.msgs[s] = e
			skipped++
		}
	}
	t.hr = max(t.hr, upto)
	n.st.skipped.Add(skipped)
	return skipped > 0
}

// maxAhead is how far past the highest delivered seqno of a sender a
// message or HIGHEST_SEQNO may be; one further is dropped and counted, so a
// forged seqno cannot leave a gap nobody can fill. A real message that far
// ahead is retransmitted once the gap closes.
const maxAhead = 1 << 20

// add puts m into its sender's table; OOB messages are delivered at once.
func (n *NAKACK) add(m *stack.Message, seq uint64) bool {
	self := n.LocalAddress()
	n.mu.Lock()
	ok, oob := n.addLocked(m, seq, self)
	n.mu.Unlock()
	if oob != nil {
		n.st.delivered.Add(1)
		n.PassUp(oob)
	}
	return ok
}

// addLocked adds m and returns whether it was new, and the message to pass
// up at once if it is an OOB message; callers hold n.mu.
func (n *NAKACK) addLocked(m *stack.Message, seq uint64, self stack.Address) (bool, *stack.Message) {
	n.st.received.Add(1)
	t := n.tables[m.Src]
	if t == nil {
		if n.view != nil && !n.view.Contains(m.Src) || n.view == nil && m.Src != self {
			n.st.nonMember.Add(1)
			return false, nil
		}
		t = newTable(0)
		n.tables[m.Src] = t
	}
	if seq <= t.hd || seq < t.low {
		n.st.duplicates.Add(1)
		return false, nil
	}
	if seq-t.hd > maxAhead {
		n.st.tooFar.Add(1) // forged or corrupt: no sender gets this far ahead
		return false, nil
	}
	e := t.msgs[seq]
	size := int64(len(m.Payload))
	if (e == nil || e.m == nil) && m.Src != self && seq != t.hd+1 && n.cfg.MaxBuffered > 0 && t.buffered+size > int64(n.cfg.MaxBuffered) {
		// Full (a sender beyond its credits, or a long gap): dropped and
		// fetched again later. The next seqno to deliver is always
		// taken, so delivery can move on and make room.
		n.st.bufferFull.Add(1)
		t.hr = max(t.hr, seq) // asked for again as a gap
		return false, nil
	}
	switch {
	case e == nil:
		e = t.newEntry()
		e.m, e.arrived = m, true
		t.msgs[seq] = e
		if seq > t.hr+1 && m.Src != self {
			n.kickGaps()
		}
		t.hr = max(t.hr, seq)
		t.bytes += size
		t.addBuffered(size, &n.st)
	case e.m == nil:
		// A seqno the sender said it purged (skipPurged) came after all,
		// before delivery passed it: deliver it.
		e.m, e.delivered = m, false
		t.bytes += size
		t.addBuffered(size, &n.st)
	case m.Src == self && !e.arrived:
		e.arrived = true // own message, looped back: deliver from the table
	default:
		n.st.duplicates.Add(1)
		return false, nil
	}
	if e.m.Has(stack.OOB) && !e.delivered && !(t.held && seq > t.limit && !e.m.Has(stack.Internal)) {
		// Out of band: delivered at once, unless a flush holds its sender
		// (it was sent in the next view); then in order, when the hold ends.
		e.delivered = true
		if m.Src != self {
			t.addBuffered(-size, &n.st)
		}
		return true, e.m
	}
	return true, nil
}

// receiptTaken wakes WaitDelivered callers when messages being delivered
// reach the application.
func (n *NAKACK) receiptTaken() {
	if n.waiting.Load() > 0 {
		n.mu.Lock()
		n.signalLocked()
		n.mu.Unlock()
	}
}

// signalLocked wakes WaitDelivered callers; callers hold n.mu.
func (n *NAKACK) signalLocked() {
	if n.waiting.Load() > 0 {
		close(n.progress)
		n.progress = make(chan struct{})
	}
}

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
			t.held, t.limit = true, t.hd
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
	return n.reconcile(ctx, stack.Reconcile{Target: target})
}

func (n *NAKACK) reconcile(ctx context.Context, rc stack.Reconcile) error {
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
			if goal > t.hr && e.Member != self {
				t.hr = goal // the retransmission task asks for the gap
				n.kickGaps()
			}
			if t.hd < goal || t.removing && (t.rc == nil || !t.rc.Taken()) {
				// Delivered up to goal, and what is on its way up the
				// stack has reached the channel (not necessarily come
				// back from the application: that may wait for the
				// flush to end).
				ready = false
			}
			if !ask || i >= len(rc.From) || rc.From[i] == self || rc.From[i].IsZero() || t.hd >= goal {
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
			var missing []uint64
			for s := t.hd + 1; s <= goal && len(missing) < n.cfg.MaxXmitReq; s++ {
				if t.msgs[s] == nil {
					missing = append(missing, s)
				}
			}
			if len(missing) > 0 {
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
				n.st.xmitReqSent.Add(1)
				n.control(r.to, r.h)
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
				if t := n.tables[e.Member]; t != nil && t.hd < e.HighestDelivered {
					behind = append(behind, fmt.Sprintf("%s at %d of %d", e.Member, t.hd, e.HighestDelivered))
				}
			}
			return fmt.Errorf("%w (behind: %s)", err, strings.Join(behind, ", "))
		}
	}
}

// deliverAsync delivers what srcs' tables hold on a goroutine of NAKACK's
// own, one per sender; the hold or limit was already changed under n.mu,
// so a later hold still stops it in time.
func (n *NAKACK) deliverAsync(srcs []stack.Address) {
	for _, src := range srcs {
		n.Go(func(<-chan struct{}) { n.deliverFrom(src) })
	}
}

// deliverFrom passes up src's messages in seqno order; one goroutine at a
// time per sender.
func (n *NAKACK) deliverFrom(src stack.Address) {
	self := n.LocalAddress()
	n.mu.Lock()
	t := n.tables[src]
	if t == nil || t.removing {
		n.mu.Unlock()
		return
	}
	t.removing = true
	finished := false
	defer func() {
		if !finished {
			if t.rc != nil {
				t.rc.Release() // a layer above panicked mid-delivery
			}
			n.mu.Lock()
			t.removing = false
			n.signalLocked()
			n.mu.Unlock()
		}
	}()
	for {
		if n.tables[src] != t {
			t.removing, finished = false, true
			n.signalLocked()
			n.mu.Unlock()
			return
		}
		msgs := t.spare[:0]
		t.spare = nil
		for {
			e := t.msgs[t.hd+1]
			if e == nil || (src == self && !e.arrived && !e.delivered) || t.held && t.hd >= t.limit && e.m != nil && !e.m.Has(stack.Internal) {
				break
			}
			t.hd++
			if !e.delivered {
				e.delivered = true
				if src != self {
					t.buffered -= int64(len(e.m.Payload))
				}
				msgs = append(msgs, e.m)
			}
		}
		if len(msgs) == 0 {
			t.spare = msgs
			t.removing, finished = false, true
			n.signalLocked()
			n.mu.Unlock()
			return
		}
		if t.rc == nil {
			t.rc = stack.NewReceipt(n.Stack(), n.receiptTaken)
		}
		t.rc.Reset()
		for _, m := range msgs {
			m.SetReceipt(t.rc)
		}
		// Counted in the view of now, before the lock goes: a flush
		// that sees them delivered may install the next view as soon as
		// the first reaches the channel, and the rest must still come
		// before that view (a layer above may split the batch: FRAG).
		t.rc.Admit()
		n.mu.Unlock()
		n.st.delivered.Add(int64(len(msgs)))
		if len(msgs) == 1 {
			n.PassUp(msgs[0])
		} else {
			n.PassUpBatch(&stack.Batch{Src: src, Lane: stack.LaneRegular, Msgs: msgs})
		}
		t.rc.Release()
		clear(msgs)
		n.mu.Lock()
		t.spare = msgs[:0]
	}
}

func (n *NAKACK) handleXmitReq(from stack.Address, h *Header) {
	n.st.xmitReqRecv.Add(1)
	var out []*stack.Message
	purged := uint64(0)
	n.mu.Lock()
	if t := n.tables[h.Sender]; t != nil {
		bytes := 0
		for _, s := range h.Missing {
			if s < t.low && h.Sender == n.LocalAddress() {
				purged = t.low - 1
			}
			if e := t.msgs[s]; e != nil && e.m != nil && bytes < maxXmitBytes {
				bytes += len(e.m.Payload)
				c := e.m.Copy()
				c.Dest = from
				c.PutHeader(n.ID(), &Header{Type: typeXmitRsp, Seqno: s})
				out = append(out, c)
			}
		}
	}
	n.mu.Unlock()
	for _, m := range out {
		n.st.xmits.Add(1)
		_ = n.PassDown(context.Background(), m)
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
	var others []stack.Address
	if n.view != nil {
		for _, m := range n.view.Members {
			if m != self {
				others = append(others, m)
			}
		}
	}
	for src, t := range n.tables {
		if src == self || t.hr <= t.hd {
			continue
		}
		gaps = true
		if !t.xmit.Due(now, t.hd, n.cfg.firstXmit(), n.cfg.XmitInterval) {
			continue
		}
		var missing []uint64
		for s := t.hd + 1; s <= t.hr && len(missing) < n.cfg.MaxXmitReq; s++ {
			if t.msgs[s] == nil {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 {
			continue
		}
		n.st.gaps.Add(int64(len(missing)))
		if t.hd == t.askedAt {
			t.asks++
		} else {
			t.asks, t.askedAt = 0, t.hd
		}
		to := src
		// A sender that left, or has not answered the last request (it may
		// have crashed), is not the only member that may hold the messages.
		if len(others) > 0 && (n.view != nil && !n.view.Contains(src) || t.asks%2 == 1) {
			to = others[n.Rand().IntN(len(others))]
		}
		reqs = append(reqs, req{to, &Header{Type: typeXmitReq, Sender: src, Missing: missing}})
	}
	recoverOwn := false
	if own := n.tables[self]; whole && own != nil {
		// Own messages are delivered when the transport loops them back;
		// one dropped on the way down (a lossy layer above the transport)
		// would hold up every later one, so after a whole interval deliver
		// it from here.
		for s := own.hd + 1; s <= n.lastTick; s++ {
			if e := own.msgs[s]; e != nil && !e.arrived {
				e.arrived, recoverOwn = true, true
			}
		}
		n.lastTick = n.seqno
		if n.seqno != n.lastSent {
			n.lastSent, n.backoff = n.seqno, 0
		} else if n.seqno > 0 && own.low <= n.seqno {
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
		n.st.xmitReqSent.Add(1)
		n.control(r.to, r.h)
	}
	if announce > 0 {
		n.control(stack.Address{}, &Header{Type: typeHighestSeqno, Seqno: announce})
	}
	if recoverOwn {
		n.deliverFrom(self)
	}
	return gaps
}

// DownEvent handles views, digests and stability.
func (n *NAKACK) DownEvent(ctx context.Context, ev stack.Event) (any, error) {
	switch ev.Type {
	case stack.EvViewChange:
		if v, ok := ev.Arg.(*stack.View); ok {
			n.viewChange(v)
		}
	case stack.EvGetDigest:
		return n.Digest(), nil
	case stack.EvHold:
		return n.hold(), nil
	case stack.EvReleaseHold:
		n.release()
		return nil, nil
	case stack.EvSetDigest:
		d, ok := ev.Arg.(stack.Digest)
		if !ok {
			return nil, fmt.Errorf("nakack: SET_DIGEST with %T", ev.Arg)
		}
		n.SetDigest(d)
		return nil, nil
	case stack.EvStable:
		d, ok := ev.Arg.(stack.Digest)
		if !ok {
			return nil, fmt.Errorf("nakack: STABLE with %T", ev.Arg)
		}
		n.stable(d)
		return nil, nil
	case stack.EvReconcile:
		rc, ok := ev.Arg.(stack.Reconcile)
		if !ok {
			return nil, fmt.Errorf("nakack: RECONCILE with %T", ev.Arg)
		}
		return nil, n.reconcile(ctx, rc)
	}
	return n.PassDownEvent(ctx, ev)
}

func (n *NAKACK) viewChange(v *stack.View) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.view = v
	// A flush's hold on a sender that stays stays until the flush ends
	// (an empty Reconcile): released here, its messages would reach the
	// application before the view that they were delivered in.
	for a := range n.tables {
		if !v.Contains(a) && a != n.LocalAddress() {
			delete(n.tables, a)
		}
	}
	for _, a := range v.Members {
		if n.tables[a] == nil {
			n.tables[a] = newTable(0)
		}
	}
	n.signalLocked()
}

// otherMember returns a random member of the view other than this member
// and not, or the zero address if there is none; callers hold n.mu.
func (n *NAKACK) otherMember(not stack.Address) stack.Address {
	if n.view == nil {
		return stack.Address{}
	}
	self := n.LocalAddress()
	var others []stack.Address
	for _, m := range n.view.Members {
		if m != self && m != not {
			others = append(others, m)
		}
	}
	if len(others) == 0 {
		return stack.Address{}
	}
	return others[n.Rand().IntN(len(others))]
}

// Digest returns, per sender, the highest seqno delivered and received.
func (n *NAKACK) Digest() stack.Digest {
	n.mu.Lock()
	defer n.mu.Unlock()
	d := make(stack.Digest, 0, len(n.tables))
	for a, t := range n.tables {
		d = append(d, stack.DigestEntry{Member: a, HighestDelivered: t.hd, HighestReceived: max(t.hr, t.hd)})
	}
	slices.SortFunc(d, func(x, y stack.DigestEntry) int { return x.Member.Compare(y.Member) })
	return d
}

// SetDigest makes this member start each listed sender's table after the
// digest's highest delivered seqno (a joiner, or after a flush).
func (n *NAKACK) SetDigest(d stack.Digest) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range d {
		if e.Member == n.LocalAddress() {
			continue
		}
		if t := n.tables[e.Member]; t == nil || t.hd < e.HighestDelivered {
			nt := newTable(e.HighestDelivered)
			nt.hr = max(e.HighestReceived, e.HighestDelivered)
			n.tables[e.Member] = nt
		}
	}
}

// stable purges, per sender, everything up to the digest's highest
// delivered seqno (every member has delivered it).
func (n *NAKACK) stable(d stack.Digest) {
	n.st.stableEvents.Add(1)
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range d {
		t := n.tables[e.Member]
		if t == nil {
			continue
		}
		upto := min(e.HighestDelivered, t.hd)
		for s := t.low; s <= upto; s++ {
			if en := t.msgs[s]; en != nil {
				if en.m != nil {
					t.bytes -= int64(len(en.m.Payload))
				}
				delete(t.msgs, s)
				n.st.purged.Add(1)
			}
		}
		t.low = max(t.low, upto+1)
	}
}

// Stats reports NAKACK's counters.
func (n *NAKACK) Stats() []stack.Stat {
	n.mu.Lock()
	var held, bytes int64
	for _, t := range n.tables {
		held += int64(len(t.msgs))
		bytes += t.bytes
	}
	tables := len(n.tables)
	n.mu.Unlock()
	s := &n.st
	return []stack.Stat{
		{Name: "msgs_sent", Value: s.sent.Load()},
		{Name: "msgs_received", Value: s.received.Load()},
		{Name: "msgs_delivered", Value: s.delivered.Load()},
		{Name: "duplicates", Value: s.duplicates.Load()},
		{Name: "dropped_non_member", Value: s.nonMember.Load()},
		{Name: "dropped_too_far_ahead", Value: s.tooFar.Load()},
		{Name: "dropped_buffer_full", Value: s.bufferFull.Load()},
		{Name: "buffered_bytes_peak", Value: s.bufferedPeak.Load()},
		{Name: "xmit_reqs_sent", Value: s.xmitReqSent.Load()},
		{Name: "xmit_reqs_received", Value: s.xmitReqRecv.Load()},
		{Name: "retransmissions", Value: s.xmits.Load()},
		{Name: "gaps_seen", Value: s.gaps.Load()},
		{Name: "highest_seqno_received", Value: s.highest.Load()},
		{Name: "tables", Value: int64(tables)},
		{Name: "msgs_held", Value: held},
		{Name: "bytes_held", Value: bytes},
		{Name: "msgs_purged", Value: s.purged.Load()},
		{Name: "purged_answers_sent", Value: s.purgedAnswers.Load()},
		{Name: "msgs_skipped_purged", Value: s.skipped.Load()},
		{Name: "stable_events", Value: s.stableEvents.Load()},
	}
}
