// Package flowcontrol is the credit-based flow control that UFC (unicasts)
// and MFC (multicasts) share, with JGroups' semantics: a sender holds
// credits per receiver (max_credits bytes), spends them by payload bytes and
// blocks without them; a receiver returns the bytes it has processed (its
// application's Receive returned) once they reach min_threshold of
// max_credits. A sender blocked for max_block_time asks for credits again.
// Messages marked INTERNAL or NO_FC pass without credits, so control
// traffic is never held behind application traffic.
//
// Unlike JGroups, max_credits is an upper bound: over a transport whose
// receive buffer is bounded (stack.ReceiveBufferSizer: UDP's sockets), a
// sender gets at most its share of that buffer, the buffer divided by the
// other members of the view (counting at most fitMembers), since all of
// them may send into it at once; for MFC the member itself too when its
// own multicasts reach its buffer (stack.OwnMulticastReceiver). Credits
// that overflow the buffer are not a brake: the kernel drops, and NAKACK
// and UNICAST2 retransmit.
package flowcontrol

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures UFC and MFC.
type Config struct {
	MaxCredits   stack.Size    `toml:"max_credits" doc:"bytes a sender may have outstanding at one receiver before that receiver returns credits"`
	MinThreshold float64       `toml:"min_threshold" doc:"fraction of max_credits a receiver processes from a sender before it returns them"`
	MaxBlockTime time.Duration `toml:"max_block_time" doc:"how long a sender without credits waits before it asks its receivers for them (and again every max_block_time)"`
	StallTime    time.Duration `toml:"stall_threshold" doc:"a sender blocked this long is a stall: logged once (Warn, with the members whose credits it waits for) and counted in stalls; checked every max_block_time; 0: off"`
	FitBuffer    bool          `toml:"fit_receive_buffer" doc:"with a transport whose receive buffer is bounded (UDP), give each sender at most its share of that buffer as granted by the kernel: buffer / the members that send into it (the others, and for MFC the member itself when its own multicasts reach its buffer), counting at most 8, so that senders within their credits never overflow it"`
}

// fitMembers is the most senders fit_receive_buffer divides a receive
// buffer among: in a larger group not all members send at full speed at
// once, and smaller shares would throttle one sender.
const fitMembers = 8

// DefaultConfig returns the defaults of JGroups' udp.xml (max_credits 4M,
// min_threshold 0.4); max_block_time is shorter than JGroups' 5s so that
// credits lost with a connection that was reset are asked for soon; credits
// fit the transport's receive buffer.
func DefaultConfig() Config {
	return Config{MaxCredits: 4_000_000, MinThreshold: 0.4, MaxBlockTime: time.Second, StallTime: 5 * time.Second, FitBuffer: true}
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.MaxCredits <= 0:
		return stack.BadKey("max_credits", "must be > 0, got %d", c.MaxCredits)
	case !(c.MinThreshold > 0 && c.MinThreshold <= 1):
		return stack.BadKey("min_threshold", "must be in (0, 1], got %g", c.MinThreshold)
	case c.MaxBlockTime <= 0:
		return stack.BadKey("max_block_time", "must be > 0, got %s", c.MaxBlockTime)
	case c.StallTime < 0:
		return stack.BadKey("stall_threshold", "must not be negative (0: off), got %s", c.StallTime)
	}
	return nil
}

// Header types.
const (
	TypeCredit        uint8 = 1 // credits returned to a sender (JGroups' REPLENISH)
	TypeCreditRequest uint8 = 2 // a blocked sender asks for credits
)

// Header is a flow-control message: credits returned, or credits asked for.
type Header struct {
	Type    uint8
	Credits uint64
}

// Size returns the encoded length.
func (h *Header) Size() int { return 1 + wire.UvarintSize(h.Credits) }

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	return wire.AppendUvarint(append(b, h.Type), h.Credits)
}

// DecodeHeader reads a Header; unknown types are an error.
func DecodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Type: r.Uint8(), Credits: r.Uvarint()}
	if err := r.Err(); err != nil {
		return nil, err
	}
	if h.Type != TypeCredit && h.Type != TypeCreditRequest {
		return nil, fmt.Errorf("%w: flow control: unknown header type %d", stack.ErrMalformed, h.Type)
	}
	return h, nil
}

// Samples are headers for the codec's round-trip and fuzz tests.
func Samples() []stack.Header {
	return []stack.Header{&Header{Type: TypeCredit, Credits: 1_600_000}, &Header{Type: TypeCreditRequest, Credits: 1}}
}

// FlowControl is the UFC or MFC layer.
type FlowControl struct {
	stack.Base
	name  string
	mcast bool
	cfg   Config

	mu      sync.Mutex
	view    *stack.View
	credits map[stack.Address]int64 // sender: bytes it may still send to each member (less spent)
	// MFC spends without walking credits per message: spent is owed by
	// every member's entry, and least is the smallest entry while leastOK.
	// settleLocked applies spent before anything else reads or changes
	// credits.
	spent   int64
	least   int64
	leastOK bool
	changed chan struct{} // closed (and replaced) when credits grow or the view changes
	// recv: a receiver's account of each member that sent it controlled
	// messages (made on the first one, so a large view costs nothing for
	// the members that never send).
	recv     map[stack.Address]*recvState
	waiting  int   // senders blocked for credits right now
	recalled bool  // a layer above closed its gate: senders do not wait here (EvRecallSenders)
	rcvbuf   int64 // the transport's receive buffer for what this layer controls (0: not bounded or not known)
	ownIn    bool  // MFC: this member's own multicasts reach that buffer too
	max      int64 // max_credits in this view: at most the share of rcvbuf (fit_receive_buffer)

	blockings    atomic.Int64 `stat:"blockings"`
	blockedNanos atomic.Int64 `stat:"blocked_time_ns"`
	stalls       atomic.Int64 `stat:"stalls"` // blocked longer than stall_threshold
	requestsSent atomic.Int64 `stat:"credit_requests_sent"`
	requestsRecv atomic.Int64 `stat:"credit_requests_received"`
	creditsSent  atomic.Int64 `stat:"credits_sent"`
	creditsRecv  atomic.Int64 `stat:"credits_received"`
	extraGrants  atomic.Int64 `stat:"credits_granted_on_request"`
	ignored      atomic.Int64 `stat:"credit_msgs_ignored"`
}

// recvState is a receiver's account of one sender.
type recvState struct {
	processed int64     // bytes processed and not yet returned
	inflight  int64     // bytes passed up whose delivery has not returned
	progress  time.Time // last time a delivery from this sender returned
}

var _ stack.Protocol = (*FlowControl)(nil)

// New returns a flow-control layer: name "UFC" with mcast false controls
// unicasts, "MFC" with mcast true multicasts.
func New(name string, mcast bool, cfg Config) *FlowControl {
	return &FlowControl{name: name, mcast: mcast, cfg: cfg, credits: map[stack.Address]int64{},
		changed: make(chan struct{}), recv: map[stack.Address]*recvState{}}
}

// Name returns "UFC" or "MFC".
func (f *FlowControl) Name() string { return f.name }

// Init validates the config.
func (f *FlowControl) Init() error { return f.cfg.Validate() }

// Start forgets what a previous run knew, and finds the transport's
// receive buffer (fit_receive_buffer).
func (f *FlowControl) Start() error {
	var rcvbuf int64
	var ownIn bool
	if f.cfg.FitBuffer {
		for _, p := range f.Stack().Protocols() { // bottom first: the transport
			if rb, ok := p.(stack.ReceiveBufferSizer); ok {
				rcvbuf = int64(rb.ReceiveBuffer(f.mcast))
				if or, ok := p.(stack.OwnMulticastReceiver); ok && f.mcast {
					ownIn = or.ReceivesOwnMulticasts()
				}
				break
			}
		}
	}
	f.mu.Lock()
	f.view = nil
	clear(f.credits)
	f.spent, f.leastOK = 0, false
	clear(f.recv)
	f.rcvbuf, f.ownIn, f.max = rcvbuf, ownIn, int64(f.cfg.MaxCredits)
	f.mu.Unlock()
	return nil
}

// maxFor returns max_credits for a view of n members: with a known receive
// buffer, at most its share, the buffer divided by the members that may
// send into it at once (at most fitMembers): the n-1 others, and for MFC
// this member too if its own multicasts come back to its socket. A member
// never sends its unicasts through its own socket, and UDP's filter drops
// its own multicasts before they are queued, so two members get the whole
// buffer each, not half.
func (f *FlowControl) maxFor(n int) int64 {
	m := int64(f.cfg.MaxCredits)
	if f.rcvbuf > 0 {
		senders := n - 1
		if f.ownIn {
			senders = n
		}
		m = min(m, max(f.rcvbuf/int64(min(max(senders, 1), fitMembers)), 1))
	}
	return m
}

// settleLocked applies what MFC spent to every member's credits and
// finds the smallest again; callers hold f.mu.
func (f *FlowControl) settleLocked() {
	if f.spent != 0 {
		for a := range f.credits {
			f.credits[a] -= f.spent
		}
		f.least -= f.spent
		f.spent = 0
	}
	if f.mcast && !f.leastOK {
		f.least, f.leastOK = 0, len(f.credits) > 0
		first := true
		for _, c := range f.credits {
			if first || c < f.least {
				f.least, first = c, false
			}
		}
	}
}

func (f *FlowControl) minCredits() int64 {
	return max(1, int64(float64(f.max)*f.cfg.MinThreshold))
}

// controlled reports whether m is subject to this layer's credits.
func (f *FlowControl) controlled(m *stack.Message) bool {
	if m.Flags&(stack.Internal|stack.NoFC) != 0 {
		return false
	}
	return m.Dest.IsZero() == f.mcast
}

// Down spends credits for the messages this layer controls, blocking until
// every receiver has enough (or ctx ends).
func (f *FlowControl) Down(ctx context.Context, m *stack.Message) error {
	if f.controlled(m) && m.Dest != f.LocalAddress() {
		if err := f.acquire(ctx, m.Dest, int64(len(m.Payload))); err != nil {
			return err
		}
	}
	return f.PassDown(ctx, m)
}

// lacking returns the receivers (dest, or every other member for a
// multicast) with fewer than need credits, and whether any receiver is
// known; callers hold f.mu.
func (f *FlowControl) lacking(dest stack.Address, need int64) (short []stack.Address, known bool) {
	if f.mcast {
		for a, c := range f.credits {
			known = true
			if c < need {
				short = append(short, a)
			}
		}
		return short, known
	}
	c, ok := f.credits[dest]
	if !ok && f.view.Contains(dest) {
		// UFC keeps credits for the members it sends to, from the first
		// message on: a large view costs nothing for the rest.
		c, ok = f.max, true
		f.credits[dest] = c
	}
	if ok && c < need {
		short = append(short, dest)
	}
	return short, ok
}

func (f *FlowControl) acquire(ctx context.Context, dest stack.Address, n int64) error {
	var start time.Time
	var timer *time.Timer
	stalled := false
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if !start.IsZero() {
			f.blockedNanos.Add(int64(time.Since(start)))
			f.mu.Lock()
			f.waiting--
			f.mu.Unlock()
		}
	}()
	f.mu.Lock()
	need := min(n, f.max) // a message larger than max_credits waits for all of them
	if f.mcast && f.leastOK && f.least-f.spent >= need {
		// Every member has enough: the common case, in O(1).
		f.spent += n
		f.mu.Unlock()
		return nil
	}
	for {
		f.settleLocked()
		need = min(n, f.max) // the view may have changed it
		short, known := f.lacking(dest, need)
		if len(short) == 0 {
			if known {
				if f.mcast {
					f.spent += n // leastOK: settleLocked found the smallest
				} else {
					f.credits[dest] -= n
				}
			}
			f.mu.Unlock()
			return nil
		}
		if f.recalled {
			f.mu.Unlock()
			return stack.ErrNotSent
		}
		ch := f.changed
		if start.IsZero() {
			f.waiting++
		}
		f.mu.Unlock()
		if start.IsZero() {
			start = time.Now()
			f.blockings.Add(1)
			timer = time.NewTimer(f.cfg.MaxBlockTime)
		}
		select {
		case <-ch:
		case <-timer.C:
			// Credits may be late, or lost with a connection that was
			// reset: ask for them.
			f.mu.Lock()
			f.settleLocked()
			short, _ = f.lacking(dest, need)
			reqs := make([]int64, len(short))
			for i, a := range short {
				reqs[i] = f.max - f.credits[a]
			}
			f.mu.Unlock()
			if !stalled && f.cfg.StallTime > 0 && time.Since(start) >= f.cfg.StallTime && len(short) > 0 {
				stalled = true
				f.stalls.Add(1)
				f.Log().Warn("flow control: a sender is stalled, waiting for credits", "members", short, "blocked", time.Since(start).Round(time.Millisecond), "view", f.viewID())
			}
			for i, a := range short {
				f.requestsSent.Add(1)
				f.send(a, &Header{Type: TypeCreditRequest, Credits: uint64(max(reqs[i], 0))})
			}
			timer.Reset(f.cfg.MaxBlockTime)
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting for credits: %w", f.name, ctx.Err())
		case <-f.Done():
			return stack.ErrClosed
		}
		f.mu.Lock()
	}
}

func (f *FlowControl) send(dest stack.Address, h *Header) {
	m := stack.NewMessage(dest, nil).Set(stack.Internal | stack.OOB | stack.NoFC)
	m.PutHeader(f.ID(), h)
	_ = f.PassDown(f.Context(), m)
}

// Up takes credit messages; a controlled message counts as processed once
// the layers above (and the application's Receive) have returned.
func (f *FlowControl) Up(m *stack.Message) {
	if h, ok := m.Header(f.ID()).(*Header); ok {
		f.handle(m.Src, h)
		return
	}
	if !f.counted(m) {
		f.PassUp(m)
		return
	}
	n := int64(len(m.Payload))
	f.arrived(m.Src, n)
	defer f.processed(m.Src, n) // also if a callback panics
	f.PassUp(m)
}

// PreservesBatches marks UFC and MFC as stack.BatchPreservers: their
// UpBatch only removes messages.
func (*FlowControl) PreservesBatches() {}

// UpBatch takes the batch's credit messages and counts the rest once the
// batch has been delivered.
func (f *FlowControl) UpBatch(b *stack.Batch) {
	var n int64
	switch {
	case !b.MayHave(f.ID()) && !b.MayHaveFlags(stack.Internal|stack.NoFC):
		// No credit message, and every message is controlled when the
		// batch's one destination is of this layer's kind.
		if b.Dest.IsZero() == f.mcast && b.Src != f.LocalAddress() {
			n = b.PayloadBytes()
		}
	default:
		b.Keep(f.keep(&n))
	}
	if n == 0 {
		f.PassUpBatch(b)
		return
	}
	src := b.Src
	f.arrived(src, n)
	defer f.processed(src, n)
	f.PassUpBatch(b)
}

// keep returns the Batch.Keep function of UpBatch: it handles credit
// messages and adds the bytes of controlled ones to *n.
func (f *FlowControl) keep(n *int64) func(*stack.Message) bool {
	return func(m *stack.Message) bool {
		if h, ok := m.Header(f.ID()).(*Header); ok {
			f.handle(m.Src, h)
			return false
		}
		if f.counted(m) {
			*n += int64(len(m.Payload))
		}
		return true
	}
}

// counted reports whether a received message was charged by its sender.
func (f *FlowControl) counted(m *stack.Message) bool {
	return f.controlled(m) && m.Src != f.LocalAddress()
}

func (f *FlowControl) arrived(src stack.Address, n int64) {
	f.mu.Lock()
	if r := f.recvLocked(src); r != nil {
		r.inflight += n
	}
	f.mu.Unlock()
}

// recvLocked returns src's account, made now if src is a member of the
// view that has none yet; nil for a non-member. Callers hold f.mu.
func (f *FlowControl) recvLocked(src stack.Address) *recvState {
	r := f.recv[src]
	if r == nil && src != f.LocalAddress() && f.view.Contains(src) {
		r = &recvState{progress: time.Now()}
		f.recv[src] = r
	}
	return r
}

// processed adds n bytes from src to what this receiver has processed and
// returns them to src once they reach min_threshold of max_credits.
func (f *FlowControl) processed(src stack.Address, n int64) {
	f.mu.Lock()
	r := f.recv[src]
	if r == nil { // not a member (any more): it holds no credits here
		f.mu.Unlock()
		return
	}
	r.inflight = max(0, r.inflight-n)
	r.processed += n
	r.progress = time.Now()
	var give int64
	if r.processed >= f.minCredits() {
		give, r.processed = r.processed, 0
	}
	f.mu.Unlock()
	if give > 0 {
		f.creditsSent.Add(1)
		f.send(src, &Header{Type: TypeCredit, Credits: uint64(give)})
	}
}

func (f *FlowControl) handle(src stack.Address, h *Header) {
	switch h.Type {
	case TypeCredit:
		f.creditsRecv.Add(1)
		f.mu.Lock()
		f.settleLocked()
		if c, ok := f.credits[src]; ok {
			f.credits[src] = min(c+int64(min(h.Credits, uint64(f.max))), f.max)
			f.leastOK = false
			close(f.changed)
			f.changed = make(chan struct{})
		} else {
			f.ignored.Add(1)
		}
		f.mu.Unlock()
	case TypeCreditRequest:
		f.requestsRecv.Add(1)
		f.mu.Lock()
		r := f.recvLocked(src)
		if r == nil {
			f.mu.Unlock()
			f.ignored.Add(1)
			return
		}
		give := r.processed
		r.processed = 0
		// The sender gets what it asked for when nothing of its is waiting
		// here (it lost credits, say with a connection that was reset), or
		// when its delivery here has not moved for max_block_time while a
		// sender of this member waits for credits itself: a Receive that
		// answers a request and waits for credits that only the other
		// side's Receive would return (JGroups' JGRP-465). A receiver that
		// is merely slow, or stuck on its own, returns only what it
		// processed, so its memory stays bounded.
		stuck := time.Since(r.progress) >= f.cfg.MaxBlockTime && f.waiting > 0
		if r.inflight == 0 || stuck {
			if asked := int64(min(h.Credits, uint64(f.max))); asked > give {
				give = asked
				f.extraGrants.Add(1)
			}
		}
		f.mu.Unlock()
		if give > 0 {
			f.creditsSent.Add(1)
			f.send(src, &Header{Type: TypeCredit, Credits: uint64(give)})
		}
	}
}

// DownEvent tracks the view: members that left release what they held,
// joiners get full credits.
func (f *FlowControl) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvViewChange:
		if e.View != nil {
			f.viewChange(e.View)
		}
	case stack.EvRecallSenders, stack.EvReleaseSenders:
		f.mu.Lock()
		_, f.recalled = ev.(stack.EvRecallSenders)
		close(f.changed) // waiting senders look again
		f.changed = make(chan struct{})
		f.mu.Unlock()
	}
	return f.PassDownEvent(ctx, ev)
}

// UpEvent tracks the view when this layer sits above the membership
// layer, which passes views up (DownEvent has it when below).
func (f *FlowControl) UpEvent(ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok && vc.View != nil {
		f.viewChange(vc.View)
	}
	return f.PassUpEvent(ev)
}

func (f *FlowControl) viewChange(v *stack.View) {
	self := f.LocalAddress()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.view = v
	f.settleLocked()
	f.leastOK = false
	old := f.max
	f.max = f.maxFor(len(v.Members))
	in := v.MemberSet() // Contains is linear: a set keeps a view change O(N)
	for a := range f.credits {
		if _, ok := in[a]; !ok {
			delete(f.credits, a)
		} else {
			// Another share: what is out still counts against it (the
			// credits may go below 0 until it comes back).
			f.credits[a] += f.max - old
		}
	}
	for a := range f.recv {
		if _, ok := in[a]; !ok {
			delete(f.recv, a)
		}
	}
	if f.mcast {
		// MFC needs every receiver's credits; UFC and the receivers'
		// accounts start with a member's first message (lacking,
		// recvLocked).
		for _, a := range v.Members {
			if _, ok := f.credits[a]; !ok && a != self {
				f.credits[a] = f.max
			}
		}
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// Credits returns this member's credits per receiver, for tests and tools.
func (f *FlowControl) Credits() map[stack.Address]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settleLocked()
	out := make(map[stack.Address]int64, len(f.credits))
	if f.view != nil && !f.mcast {
		// UFC holds credits only for the members it sent to: the others
		// have all of theirs.
		for _, m := range f.view.Members {
			if m != f.LocalAddress() {
				out[m] = f.max
			}
		}
	}
	for a, c := range f.credits {
		out[a] = c
	}
	return out
}

// Stats reports the layer's counters.
func (f *FlowControl) Stats() []stack.Stat {
	f.mu.Lock()
	f.settleLocked()
	least := int64(-1)
	for _, c := range f.credits {
		if least < 0 || c < least {
			least = c
		}
	}
	maxCredits, accounts := f.max, int64(len(f.recv))
	if least < 0 && !f.mcast {
		least = maxCredits // UFC has sent to nobody: every member has all
	}
	f.mu.Unlock()
	return append(stack.CounterStats(f),
		stack.Stat{Name: "min_credits_left", Value: max(least, 0)},
		stack.Stat{Name: "max_credits", Value: maxCredits},
		stack.Stat{Name: "senders_accounted", Value: accounts},
	)
}

// String names the layer, for logs.
func (f *FlowControl) String() string { return fmt.Sprintf("%s(%s)", f.name, f.LocalAddress()) }

// viewID is the current view's id for logs ("" before the first view).
func (f *FlowControl) viewID() string {
	if v := f.View(); v != nil {
		return v.ID.String()
	}
	return ""
}
