// Package nakack is NAKACK: reliable, FIFO-per-sender multicast with
// negative acknowledgements, after JGroups' NAKACK2. Every member keeps a
// table per sender (its own included) of the messages not yet stable, so it
// can retransmit them for the sender and for a flush; STABLE purges them.
package nakack

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/internal/window"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
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
	case c.MaxXmitReq < 1 || c.MaxXmitReq > wire.MaxSeqnoList:
		return stack.BadKey("max_xmit_req", "must be 1..%d, got %d", wire.MaxSeqnoList, c.MaxXmitReq)
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
	lastA    stack.Address // whose table lastT is: a batch, or a run of own sends,
	lastT    *table        // names one member (nil: none; reset at every change of tables)
	view     *stack.View
	seqno    uint64        // last seqno this member sent
	lastSent uint64        // seqno at the previous xmit run, for HIGHEST_SEQNO
	lastTick uint64        // seqno at the previous whole-interval run, for own messages whose loopback was lost
	gapKick  chan struct{} // a gap appeared: wakes gapWatch
	// gappy lists the tables that may have a gap (messages above the
	// highest delivered), so that the retransmission task looks at those
	// and not at every sender of a large view twice a second. A table is
	// listed (table.listed) when it may have got one, and taken off by
	// the task once it has none or is no longer its sender's table.
	gappy    []gappyTable
	backoff  time.Duration
	lastHS   time.Time
	waiting  atomic.Int32  // goroutines in WaitDelivered (changed under mu)
	progress chan struct{} // closed (and replaced) when delivery moves on and someone waits
	// hdrs: headers of own messages, allocated a slab at a time (one
	// allocation per slab of messages sent instead of one per message).
	hdrs window.Slab[Header]

	st stats
}

type stats struct {
	sent          atomic.Int64 `stat:"msgs_sent"`
	received      atomic.Int64 `stat:"msgs_received"`
	delivered     atomic.Int64 `stat:"msgs_delivered"`
	duplicates    atomic.Int64 `stat:"duplicates"`
	nonMember     atomic.Int64 `stat:"dropped_non_member"`
	tooFar        atomic.Int64 `stat:"dropped_too_far_ahead"`
	bufferFull    atomic.Int64 `stat:"dropped_buffer_full"`
	bufferedPeak  atomic.Int64 `stat:"buffered_bytes_peak,gauge"`
	xmitReqSent   atomic.Int64 `stat:"xmit_reqs_sent"`
	xmitReqRecv   atomic.Int64 `stat:"xmit_reqs_received"`
	xmits         atomic.Int64 `stat:"retransmissions"`
	gaps          atomic.Int64 `stat:"gaps_seen"`
	highest       atomic.Int64 `stat:"highest_seqno_received,gauge"`
	purged        atomic.Int64 `stat:"msgs_purged"`
	stableEvents  atomic.Int64 `stat:"stable_events"`
	purgedAnswers atomic.Int64 `stat:"purged_answers_sent"`
	skipped       atomic.Int64 `stat:"msgs_skipped_purged"`
}

// table holds one sender's messages: its window keeps them, delivered or
// not, until STABLE purges them, so any member can retransmit them.
type table struct {
	w *window.Window
	// rc goes up with what the remover passes up; the channel marks it when
	// they reach the application, so a flush need not wait for the callback.
	rc      *stack.Receipt
	asks    int    // requests since hd last moved
	askedAt uint64 // hd at the last request
	// held: a flush before a view change holds this sender (one that does
	// not take part in it) at limit, so that no member delivers more of its
	// messages than the round agreed on. Cleared when the flush ends.
	held  bool
	limit uint64
	// listed: in NAKACK.gappy.
	listed bool
}

// gappyTable is an entry of NAKACK.gappy.
type gappyTable struct {
	src stack.Address
	t   *table
}

// watchLocked lists src's table t for the retransmission task if it has
// a gap now; callers hold n.mu, after anything that may have raised t's
// highest received seqno.
func (n *NAKACK) watchLocked(src stack.Address, t *table) {
	if !t.listed && t.w.Gap() {
		t.listed = true
		n.gappy = append(n.gappy, gappyTable{src, t})
	}
}

// notePeak keeps the peak of t's bytes not yet delivered; callers hold
// n.mu.
func (t *table) notePeak(st *stats) {
	if b := t.w.Buffered(); b > st.bufferedPeak.Load() {
		st.bufferedPeak.Store(b)
	}
}

// maxXmitBytes caps the payload one retransmission request is answered
// with; the requester asks again for the rest.
const maxXmitBytes = 1 << 20

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
	n.lastT = nil
	n.gappy = nil
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
	return &table{w: window.New(hd, true)}
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
	t := n.table(self)
	n.seqno++
	seq := n.seqno
	// Kept for retransmission; an entry Delivered is never to be passed up
	// here (DontLoopback), and one Pending waits for its loopback copy.
	t.w.Put(seq, m, m.HasTransient(stack.DontLoopback))
	h := n.hdrs.New()
	*h = Header{Type: typeMsg, Seqno: seq}
	m.PutHeader(n.ID(), h)
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
	_ = n.PassDown(n.Context(), m)
}

// Up handles one message with a NAKACK header.
func (n *NAKACK) Up(m *stack.Message) {
	src, ok := n.handle(m)
	if ok {
		n.deliverFrom(src)
	}
}

// PreservesBatches marks NAKACK as a stack.BatchPreserver: its UpBatch only
// removes messages.
func (*NAKACK) PreservesBatches() {}

// UpBatch adds the batch's messages to their tables under one lock and
// delivers what is in order, as batches; other messages go up as they are.
func (n *NAKACK) UpBatch(b *stack.Batch) {
	if !b.MayHave(n.ID()) {
		n.PassUpBatch(b)
		return
	}
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

// table returns a's table or nil, remembering it for the next call; callers
// hold n.mu.
func (n *NAKACK) table(a stack.Address) *table {
	if n.lastT != nil && n.lastA == a {
		return n.lastT
	}
	t := n.tables[a]
	if t != nil {
		n.lastA, n.lastT = a, t
	}
	return t
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
		if t := n.tables[m.Src]; t != nil && h.Seqno > t.w.HighestReceived() {
			if h.Seqno-t.w.HighestDelivered() > window.MaxAhead {
				n.st.tooFar.Add(1)
			} else {
				t.w.Raise(h.Seqno)
				n.watchLocked(m.Src, t)
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
	if t == nil || src == n.LocalAddress() {
		return false
	}
	if hd := t.w.HighestDelivered(); upto <= hd || upto-hd > window.MaxAhead {
		return false
	}
	skipped := t.w.Skip(upto)
	n.watchLocked(src, t)
	n.st.skipped.Add(int64(skipped))
	return skipped > 0
}

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
	t := n.table(m.Src)
	if t == nil {
		if n.view != nil && !n.view.Contains(m.Src) || n.view == nil && m.Src != self {
			n.st.nonMember.Add(1)
			return false, nil
		}
		t = newTable(0)
		n.tables[m.Src] = t
		n.lastT = nil
	}
	limit := int64(n.cfg.MaxBuffered)
	if m.Src == self {
		limit = 0
	}
	gap := seq > t.w.HighestReceived()+1 && m.Src != self
	// A placeholder the window fills is a seqno the sender said it purged
	// (skipPurged) that came after all, before delivery passed it: it is
	// delivered.
	res := t.w.Add(seq, m, false, limit)
	n.watchLocked(m.Src, t)
	switch res {
	case window.Added:
		if gap {
			n.kickGaps()
		}
		if m.Src != self {
			t.notePeak(&n.st)
		}
	case window.TooFar:
		n.st.tooFar.Add(1) // forged or corrupt: no sender gets this far ahead
		return false, nil
	case window.Full:
		// Full (a sender beyond its credits, or a long gap): dropped and
		// fetched again later (the window counts it as a gap). The next
		// seqno to deliver is always taken, so delivery can move on and
		// make room.
		n.st.bufferFull.Add(1)
		return false, nil
	default:
		if m.Src != self || !t.w.Arrive(seq) {
			n.st.duplicates.Add(1)
			return false, nil
		}
		// Own message, looped back: delivered from the table.
	}
	if e, _ := t.w.Get(seq); e.Msg.Has(stack.OOB) && !e.Delivered && !(t.held && seq > t.limit && !e.Msg.Has(stack.Internal)) {
		// Out of band: delivered at once, unless a flush holds its sender
		// (it was sent in the next view); then in order, when the hold ends.
		t.w.MarkDelivered(seq)
		return true, e.Msg
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

// deliverAsync delivers what srcs' tables hold on a goroutine of NAKACK's
// own, one per sender; the hold or limit was already changed under n.mu,
// so a later hold still stops it in time.
func (n *NAKACK) deliverAsync(srcs []stack.Address) {
	for _, src := range srcs {
		n.Go(func(<-chan struct{}) { n.deliverFrom(src) })
	}
}

// deliverFrom passes up src's messages in seqno order; one goroutine at a
// time per sender (the window's remover).
func (n *NAKACK) deliverFrom(src stack.Address) {
	n.mu.Lock()
	t := n.tables[src]
	if t == nil {
		n.mu.Unlock()
		return
	}
	t.w.Deliver(&n.mu, &window.Remover{
		Open: func() bool { return n.tables[src] == t },
		Stop: func(e window.Entry) bool {
			return t.held && t.w.HighestDelivered() >= t.limit && e.Msg != nil && !e.Msg.Has(stack.Internal)
		},
		Ready: func(msgs []*stack.Message) {
			if t.rc == nil {
				t.rc = stack.NewReceipt(n.Stack(), n.receiptTaken)
			}
			t.rc.Reset()
			for _, m := range msgs {
				m.SetReceipt(t.rc)
			}
			// Counted in the view of now, before the lock goes: a flush
			// that sees them delivered may install the next view as soon
			// as the first reaches the channel, and the rest must still
			// come before that view (a layer above may split the batch:
			// FRAG).
			t.rc.Admit()
		},
		Up: func(msgs []*stack.Message) {
			n.st.delivered.Add(int64(len(msgs)))
			if len(msgs) == 1 {
				n.PassUp(msgs[0])
			} else {
				n.PassUpBatch(&stack.Batch{Src: src, Lane: stack.LaneRegular, Msgs: msgs})
			}
			t.rc.Release()
		},
		Done: n.signalLocked,
		Abort: func() {
			if t.rc != nil {
				t.rc.Release() // a layer above panicked mid-delivery
			}
		},
	})
}

// DownEvent handles views, digests and stability.
func (n *NAKACK) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvViewChange:
		if v := e.View; v != nil {
			n.viewChange(v)
		}
	case stack.EvGetDigest:
		return stack.Reply(e, n.Digest()), nil
	case stack.EvHold:
		return stack.Reply(e, n.hold()), nil
	case stack.EvReleaseHold:
		n.release()
		return stack.Answer{}, nil
	case stack.EvSetDigest:
		n.SetDigest(e.Digest)
		return stack.Answer{}, nil
	case stack.EvStable:
		n.stable(e.Digest)
		return stack.Answer{}, nil
	case stack.EvReconcile:
		return stack.Answer{}, n.reconcile(ctx, e)
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
	in := v.MemberSet() // Contains is linear: a set keeps a view change O(N)
	for a := range n.tables {
		if _, ok := in[a]; !ok && a != n.LocalAddress() {
			delete(n.tables, a)
			n.lastT = nil
		}
	}
	for _, a := range v.Members {
		if n.tables[a] == nil {
			n.tables[a] = newTable(0)
			n.lastT = nil
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
		hd := t.w.HighestDelivered()
		d = append(d, stack.DigestEntry{Member: a, HighestDelivered: hd, HighestReceived: max(t.w.HighestReceived(), hd)})
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
		if t := n.tables[e.Member]; t == nil || t.w.HighestDelivered() < e.HighestDelivered {
			nt := newTable(e.HighestDelivered)
			nt.w.Raise(e.HighestReceived)
			n.tables[e.Member] = nt
			n.lastT = nil
			n.watchLocked(e.Member, nt)
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
		n.st.purged.Add(int64(t.w.Purge(e.HighestDelivered)))
	}
}

// Stats reports NAKACK's counters.
func (n *NAKACK) Stats() []stack.Stat {
	n.mu.Lock()
	var held, bytes int64
	for _, t := range n.tables {
		held += int64(t.w.Len())
		bytes += t.w.Bytes()
	}
	tables := len(n.tables)
	n.mu.Unlock()
	s := &n.st
	return append(stack.CounterStats(s),
		stack.Stat{Name: "tables", Value: int64(tables)},
		stack.Stat{Name: "msgs_held", Value: held},
		stack.Stat{Name: "bytes_held", Value: bytes},
	)
}
