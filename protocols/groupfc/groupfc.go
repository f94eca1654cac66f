// Package groupfc is GROUPFC: TIPC-style group communication and flow
// control above reliable unicast (UNICAST2) and multicast (NAKACK). Members
// join with an instance number; a member sends by broadcast (to all),
// multicast (to every member of an instance), anycast (to one member of an
// instance) or unicast, and each receiver rations every sender with a
// receive window in 1 KB blocks: an idle window (65 blocks, one largest
// message) for every member, a large one (780) for at most max_active
// members at a time, taken back from the least recently active with
// RECLAIM/REMIT. A sender's unicasts are never delivered ahead of its
// earlier broadcasts, and member UP/DOWN events come in order with the
// messages. reference/tipc-groups-spec.md is the specification; the fixes
// of the Linux commits in seeds/tipc-groups.txt are built in.
//
// Plain Channel.Send goes through the layer too (a multicast is a
// broadcast, a unicast a unicast), so a stack with GROUPFC is flow
// controlled end to end. Use Of(ch) for the other send modes.
package groupfc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

// Config configures GROUPFC.
type Config struct {
	Instance     uint64        `toml:"instance" doc:"this member's instance: its logical identity in the group, shared by members that serve the same role"`
	Loopback     bool          `toml:"loopback" doc:"receive own broadcasts and multicasts, and be a candidate for own anycasts"`
	MemberEvents bool          `toml:"member_events" doc:"deliver member UP and DOWN events to the application, in order with the messages"`
	MaxActive    int           `toml:"max_active" doc:"senders a receiver lets use the large window at once (0: TIPC's max(min((members+1)/8, 64), 16))"`
	LeaveTimeout time.Duration `toml:"leave_timeout" doc:"how long a member that left the view with its LEAVE may take to deliver what it sent before it is given up; a leaver that waits longer for the members to confirm its LEAVE says so (it waits until they do, leave the view, its context ends or max_leave_wait passes)"`
	MaxLeaveWait time.Duration `toml:"max_leave_wait" doc:"the longest a leaver waits for the members to confirm its LEAVE; bounds the wait for a member that stopped without a word when no failure detection removes it from the view"`
	MaxUnread    stack.Size    `toml:"max_unread_bytes" doc:"window bytes a sender may have unread at this member; a sender that goes beyond it ignores the windows, and its excess is dropped and counted (at least the largest window, 780 KB)"`
}

// DefaultConfig returns GROUPFC's defaults.
func DefaultConfig() Config {
	return Config{LeaveTimeout: 2 * time.Second, MaxLeaveWait: 30 * time.Second, MaxUnread: 4 * advActive * blockSize}
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.MaxActive < 0 || c.MaxActive > 4096:
		return stack.BadKey("max_active", "must be 0 (automatic) or 1..4096, got %d", c.MaxActive)
	case c.LeaveTimeout <= 0:
		return stack.BadKey("leave_timeout", "must be > 0, got %s", c.LeaveTimeout)
	case c.MaxLeaveWait < c.LeaveTimeout:
		return stack.BadKey("max_leave_wait", "must be >= leave_timeout (%s), got %s", c.LeaveTimeout, c.MaxLeaveWait)
	case c.MaxUnread < advActive*blockSize:
		return stack.BadKey("max_unread_bytes", "must be at least the largest window (%d), got %d", advActive*blockSize, c.MaxUnread)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "GROUPFC", ID: stack.IDGROUPFC,
		Requires: []stack.Service{stack.ServiceReliableMulticast, stack.ServiceReliableUnicast, stack.ServiceMembership},
		Doc:      "TIPC-style group send modes (broadcast, multicast, anycast, unicast) with receive-window flow control and ordered member events",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{ID: stack.IDGROUPFC, Name: "GROUPFC", Decode: decodeHeader, Samples: sampleHeaders})
}

// Errors of the send calls.
var (
	// ErrWouldBlock: a Try call found the destination's window too small.
	ErrWouldBlock = errors.New("groupfc: the receive window is full")
	// ErrHostUnreachable: no member (of that instance) to send to.
	ErrHostUnreachable = errors.New("groupfc: no such member")
	// ErrNotJoined: the member has no view yet.
	ErrNotJoined = errors.New("groupfc: not joined")
	// ErrTooLarge: a message above MaxMessageSize could never fit an idle
	// window (TIPC's EMSGSIZE).
	ErrTooLarge = fmt.Errorf("groupfc: message larger than %d bytes", MaxMessageSize)
)

// MaxMessageSize is the largest payload GROUPFC sends (TIPC's
// TIPC_MAX_USER_MSG_SIZE): it costs 65 blocks, the idle window, so a member
// with an idle window can always take it.
const MaxMessageSize = 66000

// Event is a membership event, delivered as a message (see EventOf) in
// order with the member's messages: UP before its first broadcast, DOWN
// after its last.
type Event struct {
	Member   stack.Address
	Instance uint64
	Up       bool // MemberUp; otherwise MemberDown
	Graceful bool // DOWN: the member left (LEAVE); otherwise it was lost
}

func (e Event) String() string {
	switch {
	case e.Up:
		return fmt.Sprintf("UP %s (instance %d)", e.Member, e.Instance)
	case e.Graceful:
		return fmt.Sprintf("DOWN %s (instance %d, left)", e.Member, e.Instance)
	}
	return fmt.Sprintf("DOWN %s (instance %d, lost)", e.Member, e.Instance)
}

// delivered is the header a message delivered by GROUPFC carries up: who
// sent it as which instance, and the event if it is one.
type delivered struct {
	Header
	instance uint64
	ev       *Event
}

// EventOf returns the membership event m carries, if it is one (with
// member_events on, events come to Receiver.Receive as messages with no
// payload).
func EventOf(m *stack.Message) (Event, bool) {
	if d, ok := m.Header(stack.IDGROUPFC).(*delivered); ok && d.ev != nil {
		return *d.ev, true
	}
	return Event{}, false
}

// SenderInstance returns the instance of the member that sent m.
func SenderInstance(m *stack.Message) (uint64, bool) {
	if d, ok := m.Header(stack.IDGROUPFC).(*delivered); ok {
		return d.instance, true
	}
	return 0, false
}

// GroupFC is the GROUPFC protocol.
type GroupFC struct {
	stack.Base
	cfg Config

	sendMu sync.Mutex // one send at a time goes down, in seqno order
	mu     sync.Mutex
	g      *group
	view   *stack.View
	downs  map[stack.Address]bool // suspected: their node is down
	// leaveWait: the members whose LEAVE_ACK this leaving member awaits;
	// leaveDone is closed when none is left.
	leaveWait map[stack.Address]bool
	leaveDone chan struct{}
	wakeCh    chan struct{}
	rr        map[uint64]int // anycast round-robin position per instance

	blockedSends atomic.Int64 `stat:"blocked_sends"`
	wouldBlock   atomic.Int64 `stat:"would_block"`
	unreachable  atomic.Int64 `stat:"unreachable"`
	dropped      atomic.Int64 `stat:"dropped"`
	delivered_   atomic.Int64 `stat:"delivered"`
	leaveUnacked atomic.Int64 `stat:"leaves_unacknowledged"`
	leaveSlow    atomic.Int64 `stat:"leaves_slow"`
	blockedNanos atomic.Int64
}

var _ stack.Protocol = (*GroupFC)(nil)

// New returns a GROUPFC layer.
func New(cfg Config) *GroupFC {
	return &GroupFC{cfg: cfg, wakeCh: make(chan struct{}), rr: map[uint64]int{}, downs: map[stack.Address]bool{}}
}

// ErrNoGroupFC is Of's error for a stack without GROUPFC.
var ErrNoGroupFC = errors.New(`groupfc: no GROUPFC layer in the stack (use configs/groupfc.toml, or add [[protocol]] type = "GROUPFC" above GMS)`)

// Of returns the GROUPFC layer of ch's stack, or ErrNoGroupFC.
func Of(ch *stack.Channel) (*GroupFC, error) {
	if g, ok := stack.Find[*GroupFC](ch.Stack()); ok {
		return g, nil
	}
	return nil, ErrNoGroupFC
}

// Name returns "GROUPFC".
func (p *GroupFC) Name() string { return "GROUPFC" }

// Init validates the config.
func (p *GroupFC) Init() error { return p.cfg.Validate() }

// Identity is who a member is in the group: its instance and what it
// receives (the config keys instance, loopback and member_events).
type Identity struct {
	Instance     uint64
	Loopback     bool // receive own broadcasts and multicasts
	MemberEvents bool // deliver member UP and DOWN events in message order
}

// SetIdentity sets this member's instance and flags; call it before
// Connect (it overrides the config).
func (p *GroupFC) SetIdentity(id Identity) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.Instance, p.cfg.Loopback, p.cfg.MemberEvents = id.Instance, id.Loopback, id.MemberEvents
}

// ---- sending

// Broadcast sends payload to every member, waiting while a receiver's
// window is too small.
func (p *GroupFC) Broadcast(ctx context.Context, payload []byte) error {
	return p.broadcast(ctx, stack.NewMessage(stack.Address{}, payload), typeBcast, 0, true)
}

// TryBroadcast is Broadcast that returns ErrWouldBlock instead of waiting.
func (p *GroupFC) TryBroadcast(payload []byte) error {
	return p.broadcast(context.Background(), stack.NewMessage(stack.Address{}, payload), typeBcast, 0, false)
}

// Multicast sends payload to every member of instance inst (as a unicast
// if there is exactly one).
func (p *GroupFC) Multicast(ctx context.Context, inst uint64, payload []byte) error {
	return p.multicast(ctx, inst, payload, true)
}

// TryMulticast is Multicast that returns ErrWouldBlock instead of waiting.
func (p *GroupFC) TryMulticast(inst uint64, payload []byte) error {
	return p.multicast(context.Background(), inst, payload, false)
}

// Anycast sends payload to one member of instance inst: the next one,
// round robin, whose window takes it, or else waits for the first. It
// returns the member chosen.
func (p *GroupFC) Anycast(ctx context.Context, inst uint64, payload []byte) (stack.Address, error) {
	return p.anycast(ctx, inst, payload, true)
}

// TryAnycast is Anycast that returns ErrWouldBlock instead of waiting.
func (p *GroupFC) TryAnycast(inst uint64, payload []byte) (stack.Address, error) {
	return p.anycast(context.Background(), inst, payload, false)
}

// Unicast sends payload to member dest.
func (p *GroupFC) Unicast(ctx context.Context, dest stack.Address, payload []byte) error {
	return p.unicast(ctx, stack.NewMessage(dest, payload), true)
}

// TryUnicast is Unicast that returns ErrWouldBlock instead of waiting.
func (p *GroupFC) TryUnicast(dest stack.Address, payload []byte) error {
	return p.unicast(context.Background(), stack.NewMessage(dest, payload), false)
}

// Down sends the application's messages through the group: a multicast as
// a broadcast, a unicast as a unicast. Internal and NO_FC messages pass.
func (p *GroupFC) Down(ctx context.Context, m *stack.Message) error {
	if m.Has(stack.Internal) || m.Has(stack.NoFC) || m.Header(p.ID()) != nil {
		return p.PassDown(ctx, m)
	}
	if m.IsMulticast() {
		return p.broadcast(ctx, m, typeBcast, 0, true)
	}
	return p.unicast(ctx, m, true)
}

// wait blocks until the group state changes (or ctx ends); callers hold
// p.mu and sendMu, which it releases while waiting and takes again.
func (p *GroupFC) wait(ctx context.Context, block bool, since *time.Time) error {
	if !block {
		p.wouldBlock.Add(1)
		return ErrWouldBlock
	}
	if since.IsZero() {
		*since = time.Now()
		p.blockedSends.Add(1)
	}
	ch := p.wakeCh
	out := p.takeOut()
	p.mu.Unlock()
	p.sendMu.Unlock()
	p.sendOut(out)
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	case <-p.Done():
		err = stack.ErrClosed
	}
	p.sendMu.Lock()
	p.mu.Lock()
	return err
}

// acquire takes sendMu and mu and waits until ready says the send may go
// (true) or must fail (an error); it returns holding both locks when the
// send may go, and neither on an error.
func (p *GroupFC) acquire(ctx context.Context, block bool, since *time.Time, ready func() (bool, error)) error {
	p.sendMu.Lock()
	p.mu.Lock()
	for {
		ok, err := false, ErrNotJoined
		if p.g != nil && p.g.joined {
			ok, err = ready()
		}
		if ok {
			return nil
		}
		if err == nil {
			err = p.wait(ctx, block, since)
		}
		if err != nil {
			p.mu.Unlock()
			p.sendMu.Unlock()
			return err
		}
	}
}

func (p *GroupFC) endWait(since time.Time) {
	if !since.IsZero() {
		p.blockedNanos.Add(int64(time.Since(since)))
	}
}

func (p *GroupFC) broadcast(ctx context.Context, m *stack.Message, typ uint8, inst uint64, block bool) error {
	if len(m.Payload) > MaxMessageSize {
		return ErrTooLarge
	}
	blks := blocks(len(m.Payload))
	var since time.Time
	defer func() { p.endWait(since) }()
	if err := p.acquire(ctx, block, &since, func() (bool, error) { return !p.g.bcCong(blks), nil }); err != nil {
		return err
	}
	g := p.g
	ack := g.mandatory
	h := &Header{Type: typ, Seqno: g.bcSndNxt, AckReq: ack, Instance: inst}
	rs := g.sentBroadcast(blks, ack)
	var to []stack.Address
	if ack {
		for _, r := range rs {
			to = append(to, r.addr)
		}
	}
	self := g.loopback && (typ == typeBcast || inst == g.instance)
	out := p.takeOut()
	p.mu.Unlock()
	p.sendOut(out)
	var err error
	if ack {
		// The first broadcast after a unicast goes by the unicast path,
		// so it cannot overtake that unicast (spec §5).
		for _, a := range to {
			c := m.Copy()
			c.Dest = a
			c.PutHeader(p.ID(), h)
			err = errors.Join(err, p.PassDown(ctx, c))
		}
	} else {
		m.PutHeader(p.ID(), h)
		err = p.PassDown(ctx, m)
	}
	p.sendMu.Unlock()
	if self {
		p.deliverOwn(m)
	}
	return err
}

func (p *GroupFC) multicast(ctx context.Context, inst uint64, payload []byte, block bool) error {
	p.mu.Lock()
	if p.g == nil || !p.g.joined {
		p.mu.Unlock()
		return ErrNotJoined
	}
	rs := p.g.receivers(inst)
	p.mu.Unlock()
	switch len(rs) {
	case 0:
		p.unreachable.Add(1)
		return ErrHostUnreachable
	case 1:
		return p.unicast(ctx, stack.NewMessage(rs[0].addr, payload), block)
	}
	return p.broadcast(ctx, stack.NewMessage(stack.Address{}, payload), typeMcast, inst, block)
}

func (p *GroupFC) unicast(ctx context.Context, m *stack.Message, block bool) error {
	if len(m.Payload) > MaxMessageSize {
		return ErrTooLarge
	}
	blks := blocks(len(m.Payload))
	var since time.Time
	defer func() { p.endWait(since) }()
	var r *member
	err := p.acquire(ctx, block, &since, func() (bool, error) {
		r = p.g.members[m.Dest]
		if r == nil || !r.isReceiver() || (r.addr == p.g.self && !p.g.loopback) {
			p.unreachable.Add(1)
			return false, ErrHostUnreachable
		}
		return !p.g.cong(r, blks), nil
	})
	if err != nil {
		return err
	}
	return p.sendUnicastLocked(ctx, m, r, blks)
}

// sendUnicastLocked sends m to r; callers hold sendMu and mu, which it
// releases.
func (p *GroupFC) sendUnicastLocked(ctx context.Context, m *stack.Message, r *member, blks int) error {
	if r.addr == p.g.self {
		p.mu.Unlock()
		p.sendMu.Unlock()
		p.deliverOwn(m)
		return nil
	}
	h := &Header{Type: typeUcast, Seqno: p.g.bcSndNxt}
	p.g.sentUnicast(r, blks)
	out := p.takeOut()
	p.mu.Unlock()
	p.sendOut(out)
	m.Dest = r.addr
	m.PutHeader(p.ID(), h)
	err := p.PassDown(ctx, m)
	p.sendMu.Unlock()
	return err
}

func (p *GroupFC) anycast(ctx context.Context, inst uint64, payload []byte, block bool) (stack.Address, error) {
	if len(payload) > MaxMessageSize {
		return stack.Address{}, ErrTooLarge
	}
	blks := blocks(len(payload))
	var since time.Time
	defer func() { p.endWait(since) }()
	var pick *member
	err := p.acquire(ctx, block, &since, func() (bool, error) {
		rs := p.g.receivers(inst)
		if len(rs) == 0 {
			p.unreachable.Add(1)
			return false, ErrHostUnreachable
		}
		start := p.rr[inst] % len(rs)
		for i := range rs {
			if c := rs[(start+i)%len(rs)]; c.addr == p.g.self || c.window >= blks {
				pick, p.rr[inst] = c, start+i+1
				return true, nil
			}
		}
		p.g.cong(rs[start], blks) // nudge the one we wait for
		return false, nil
	})
	if err != nil {
		return stack.Address{}, err
	}
	return pick.addr, p.sendUnicastLocked(ctx, stack.NewMessage(pick.addr, payload), pick, blks)
}

// deliverOwn passes up this member's own message (loopback).
func (p *GroupFC) deliverOwn(m *stack.Message) {
	c := m.Copy()
	c.Src = p.LocalAddress()
	p.mu.Lock()
	inst := p.cfg.Instance
	p.mu.Unlock()
	c.PutHeader(p.ID(), &delivered{instance: inst})
	p.delivered_.Add(1)
	p.PassUp(c)
}

// ---- the outbox

func (p *GroupFC) takeOut() []protoMsg {
	g := p.g
	if g == nil {
		return nil
	}
	if g.wake {
		g.wake = false
		close(p.wakeCh)
		p.wakeCh = make(chan struct{})
	}
	out := g.out
	g.out = nil
	return out
}

// sendOut sends group protocol messages: INTERNAL, so they never wait in
// a lane behind application messages, but not OOB: UNICAST2 still delivers
// them in order with the data this member sent before them (a REMIT
// must come after the data it accounts for, a LEAVE after the leaver's
// last unicast), as TIPC's link does. Never reflected to their sender.
func (p *GroupFC) sendOut(out []protoMsg) {
	for _, o := range out {
		m := stack.NewMessage(o.to, nil).Set(stack.Internal)
		m.PutHeader(p.ID(), o.h)
		_ = p.PassDown(p.Context(), m)
	}
}

// ---- receiving

// Up runs group messages; others pass.
func (p *GroupFC) Up(m *stack.Message) {
	h, ok := m.Header(p.ID()).(*Header)
	if !ok {
		p.PassUp(m)
		return
	}
	self := p.LocalAddress()
	if m.Src == self {
		return // own messages are delivered at the source (loopback)
	}
	p.mu.Lock()
	if h.Type == typeLeaveAck {
		p.unawait(m.Src)
		p.mu.Unlock()
		return
	}
	if p.g == nil {
		if h.Type == typeLeave {
			// Leaving too: confirm, or two members that leave at once
			// wait for each other; and stop waiting for the other's
			// confirmation, which may have stopped once it had ours.
			p.unawait(m.Src)
			p.mu.Unlock()
			p.sendOut([]protoMsg{{to: m.Src, h: &Header{Type: typeLeaveAck}}})
			return
		}
		p.mu.Unlock()
		p.dropped.Add(1)
		return
	}
	if h.Type == typeLeave {
		p.g.out = append(p.g.out, protoMsg{to: m.Src, h: &Header{Type: typeLeaveAck}})
	}
	if isData(h.Type) {
		if !p.g.data(m.Src, h, m) {
			p.dropped.Add(1)
		}
	} else {
		p.g.handleProto(m.Src, h)
	}
	p.afterLocked()
}

// afterLocked sends the outbox and starts delivering what became ready;
// callers hold p.mu, which it releases. Delivery runs on a goroutine of
// this layer, one per member with something ready, never on the caller's:
// the caller is the lane that brings that member's ADV, ACK, REMIT and
// LEAVE, and a Receive that waits for a window (a reply sent from
// Receive) or is merely slow must not hold them back.
func (p *GroupFC) afterLocked() {
	ready := p.g.nready
	p.g.nready = nil
	var start []*member
	for _, m := range ready {
		if !m.delivering && len(m.ready) > 0 {
			m.delivering = true
			start = append(start, m)
		}
	}
	out := p.takeOut()
	p.mu.Unlock()
	p.sendOut(out)
	for _, m := range start {
		p.Go(func(<-chan struct{}) { p.drain(m) })
	}
}

// drain delivers m's ready queue in order; afterLocked set m.delivering,
// so one goroutine at a time delivers a member's queue. After the layer
// above has taken a data message, the receive window is updated (that is
// the "read").
func (p *GroupFC) drain(m *member) {
	p.mu.Lock()
	for len(m.ready) > 0 {
		it := m.ready[0]
		m.ready = m.ready[1:]
		inst := m.instance
		p.mu.Unlock()
		if it.ev != nil {
			ev := stack.NewMessage(p.LocalAddress(), nil)
			ev.Src = it.ev.Member
			ev.Set(stack.OOB)
			ev.PutHeader(p.ID(), &delivered{instance: it.ev.Instance, ev: it.ev})
			p.PassUp(ev)
		} else {
			h, _ := it.m.Header(p.ID()).(*Header)
			d := &delivered{instance: inst}
			if h != nil {
				d.Header = *h
			}
			// A copy: the layers below keep the message for retransmission.
			up := it.m.Copy()
			up.PutHeader(p.ID(), d)
			p.delivered_.Add(1)
			p.PassUp(up)
		}
		p.mu.Lock()
		if it.ev == nil && p.g != nil {
			p.g.read(m, len(it.m.Payload))
			out := p.takeOut()
			if len(out) > 0 {
				p.mu.Unlock()
				p.sendOut(out)
				p.mu.Lock()
			}
		}
	}
	m.delivering = false
	p.mu.Unlock()
}

// ---- membership

// unawait stops waiting for a's LEAVE_ACK; callers hold p.mu.
func (p *GroupFC) unawait(a stack.Address) {
	if p.leaveWait[a] {
		delete(p.leaveWait, a)
		if len(p.leaveWait) == 0 {
			close(p.leaveDone)
		}
	}
}

// awaited returns the members whose LEAVE_ACK this member still awaits.
func (p *GroupFC) awaited() []stack.Address {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.SortedFunc(maps.Keys(p.leaveWait), stack.Address.Compare)
}

// DownEvent follows the view (members appear and disappear) and sends
// LEAVE to every member on disconnect.
func (p *GroupFC) DownEvent(ctx context.Context, ev stack.Event) (any, error) {
	switch e := ev.(type) {
	case stack.EvViewChange:
		if v := e.View; v != nil {
			p.viewChange(v)
		}
	case stack.EvDisconnect:
		p.mu.Lock()
		if p.g != nil {
			self := p.LocalAddress()
			p.leaveWait, p.leaveDone = map[stack.Address]bool{}, make(chan struct{})
			for a, m := range p.g.members {
				// Not a member that has left (its LEAVE came): it may
				// have stopped.
				if a != self && !m.deleted && !m.leave && (p.view == nil || p.view.Contains(a)) {
					p.leaveWait[a] = true
				}
			}
			if len(p.leaveWait) == 0 {
				close(p.leaveDone)
			}
			done := p.leaveDone
			p.g.leaveAll()
			out := p.takeOut()
			p.g = nil
			p.mu.Unlock()
			p.sendOut(out)
			// Stopped at once, the stack could no longer resend a LEAVE
			// that was lost, nor a message before it that a member still
			// misses: the members would not learn the sync point (and
			// that this member left rather than crashed). So the stack
			// stays up until every member has confirmed the LEAVE, which
			// it does once it has everything before it, or has gone from
			// the view (a crashed member is removed by failure
			// detection), or ctx ends, or max_leave_wait has passed (a
			// member that stopped is waited for no longer, also in a
			// stack without failure detection). Reliable unicast resends a lost
			// LEAVE only when it notices; this member sends it again
			// itself, every leave_timeout/8, to the members that have not
			// confirmed it. A leave that takes longer than leave_timeout
			// is counted (leaves_slow).
			t := time.NewTimer(p.cfg.LeaveTimeout)
			tick := time.NewTicker(p.cfg.LeaveTimeout / 8)
			limit := time.NewTimer(p.cfg.MaxLeaveWait)
			defer limit.Stop()
		wait:
			for {
				select {
				case <-done:
					break wait
				case <-t.C:
					p.leaveSlow.Add(1)
					p.Log().Info("groupfc: waiting for members to confirm the LEAVE", "members", p.awaited(), "leave_timeout", p.cfg.LeaveTimeout)
				case <-limit.C:
					p.leaveUnacked.Add(1)
					p.Log().Warn("groupfc: leaving without every member's confirmation", "members", p.awaited(), "max_leave_wait", p.cfg.MaxLeaveWait)
					break wait
				case <-ctx.Done():
					p.leaveUnacked.Add(1)
					break wait
				case <-tick.C:
					var again []protoMsg
					p.mu.Lock()
					for _, o := range out {
						if o.h.Type == typeLeave && p.leaveWait[o.to] {
							again = append(again, o)
						}
					}
					p.mu.Unlock()
					p.sendOut(again)
				}
			}
			t.Stop()
			tick.Stop()
		} else {
			p.mu.Unlock()
		}
	}
	return p.PassDownEvent(ctx, ev)
}

// Start makes the group: a peer's JOIN may come before this member's
// first view.
func (p *GroupFC) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	self := p.LocalAddress()
	p.g = newGroup(self, p.cfg.Instance, p.cfg.Loopback, p.cfg.MemberEvents, p.cfg.MaxActive)
	p.g.maxUnread = int(p.cfg.MaxUnread / blockSize)
	p.leaveWait, p.leaveDone = nil, nil
	p.g.mandatory = true
	if p.cfg.Loopback {
		me := p.g.create(self, Joined)
		me.instance = p.cfg.Instance
	}
	return nil
}

func (p *GroupFC) viewChange(v *stack.View) {
	self := p.LocalAddress()
	p.mu.Lock()
	if p.g == nil {
		// Leaving: a member that is no longer in the view will not
		// confirm the LEAVE.
		for a := range p.leaveWait {
			if !v.Contains(a) {
				p.unawait(a)
			}
		}
		p.mu.Unlock()
		return
	}
	p.g.joined = true
	p.view = v
	g := p.g
	for _, a := range v.Members {
		if a != self {
			g.published(a)
		}
	}
	var gone []*member
	for a, m := range g.members {
		if a != self && !v.Contains(a) {
			g.withdrawn(a, p.downs[a])
			delete(p.downs, a)
			if !m.deleted {
				gone = append(gone, m)
			}
		}
	}
	// Not delivered here (afterLocked never delivers on its caller): this
	// runs on GMS's view installation, which must never wait for the
	// application (a slow Receive held every later view behind it).
	p.afterLocked()
	for _, m := range gone {
		// A leaver delivers what it sent below its LEAVE's sync point; a
		// LEAVE or message that never comes is given up after
		// leave_timeout, and DOWN follows.
		p.Go(func(done <-chan struct{}) {
			t := time.NewTimer(p.cfg.LeaveTimeout)
			defer t.Stop()
			select {
			case <-t.C:
			case <-done:
				return
			}
			p.mu.Lock()
			if p.g == nil || m.deleted {
				p.mu.Unlock()
				return
			}
			p.g.lost(m)
			p.afterLocked()
		})
	}
}

// UpEvent notes suspected members: when the view drops them, their node is
// down and no LEAVE is awaited.
func (p *GroupFC) UpEvent(ev stack.Event) (any, error) {
	switch e := ev.(type) {
	case stack.EvViewChange:
		// Above the membership layer, which passes views up.
		if v := e.View; v != nil {
			p.viewChange(v)
		}
	case stack.EvSuspect:
		as := e.Members
		p.mu.Lock()
		for _, a := range as {
			p.downs[a] = true
		}
		p.mu.Unlock()
	case stack.EvUnsuspect:
		if a := e.Member; !a.IsZero() {
			p.mu.Lock()
			delete(p.downs, a)
			p.mu.Unlock()
		}
	}
	return p.PassUpEvent(ev)
}

// ---- introspection

// MemberInfo is one member's state as this member sees it.
type MemberInfo struct {
	Addr       stack.Address
	Instance   uint64
	State      State
	Window     int // blocks this member may still send to it
	Advertised int // blocks granted to it and not yet read
	Deferred   int // messages waiting in order
}

// Members returns every known member, in address order.
func (p *GroupFC) Members() []MemberInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.g == nil {
		return nil
	}
	var out []MemberInfo
	for _, m := range p.g.members {
		out = append(out, MemberInfo{Addr: m.addr, Instance: m.instance, State: m.state, Window: m.window, Advertised: m.advertised, Deferred: len(m.deferred)})
	}
	slices.SortFunc(out, func(a, b MemberInfo) int { return a.Addr.Compare(b.Addr) })
	return out
}

// Stats reports GROUPFC's counters.
func (p *GroupFC) Stats() []stack.Stat {
	p.mu.Lock()
	var members, active, pending, deferred, small, reclaims, remits, acks int64
	var activePeak, unread, unreadPeak, overruns, overrunDrops int64
	if g := p.g; g != nil {
		members, active, pending, small = int64(len(g.members)), int64(g.activeCnt), int64(len(g.pending)), int64(len(g.smallWin))
		for _, m := range g.members {
			deferred += int64(len(m.deferred))
		}
		reclaims, remits, acks = g.reclaims, g.remits, g.acks
		activePeak, unread, unreadPeak, overruns = int64(g.activePeak), g.unreadBytes, g.unreadPeak, g.overruns
		overrunDrops = g.overrunDrops
	}
	p.mu.Unlock()
	return append(stack.CounterStats(p),
		stack.Stat{Name: "members", Value: members},
		stack.Stat{Name: "active_senders", Value: active},
		stack.Stat{Name: "pending_senders", Value: pending},
		stack.Stat{Name: "small_window_receivers", Value: small},
		stack.Stat{Name: "deferred", Value: deferred},
		stack.Stat{Name: "reclaims_sent", Value: reclaims},
		stack.Stat{Name: "remits_sent", Value: remits},
		stack.Stat{Name: "acks_received", Value: acks},
		stack.Stat{Name: "active_senders_peak", Value: activePeak},
		stack.Stat{Name: "unread_bytes", Value: unread},
		stack.Stat{Name: "unread_bytes_peak", Value: unreadPeak},
		stack.Stat{Name: "window_overruns", Value: overruns},
		stack.Stat{Name: "dropped_window_overrun", Value: overrunDrops},
		stack.Stat{Name: "blocked_ms", Value: p.blockedNanos.Load() / 1e6},
	)
}
