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
	"errors"
	"fmt"
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

// GROUPFC is the GROUPFC protocol.
type GROUPFC struct {
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

var _ stack.Protocol = (*GROUPFC)(nil)

// New returns a GROUPFC layer.
func New(cfg Config) *GROUPFC {
	return &GROUPFC{cfg: cfg, wakeCh: make(chan struct{}), rr: map[uint64]int{}, downs: map[stack.Address]bool{}}
}

// ErrNoGroupFC is Of's error for a stack without GROUPFC.
var ErrNoGroupFC = errors.New(`groupfc: no GROUPFC layer in the stack (use configs/groupfc.toml, or add [[protocol]] type = "GROUPFC" above GMS)`)

// Of returns the GROUPFC layer of ch's stack, or ErrNoGroupFC.
func Of(ch *stack.Channel) (*GROUPFC, error) {
	if g, ok := stack.Find[*GROUPFC](stack.Of(ch)); ok {
		return g, nil
	}
	return nil, ErrNoGroupFC
}

// Name returns "GROUPFC".
func (p *GROUPFC) Name() string { return "GROUPFC" }

// Init validates the config.
func (p *GROUPFC) Init() error { return p.cfg.Validate() }

// Identity is who a member is in the group: its instance and what it
// receives (the config keys instance, loopback and member_events).
type Identity struct {
	Instance     uint64
	Loopback     bool // receive own broadcasts and multicasts
	MemberEvents bool // deliver member UP and DOWN events in message order
}

// SetIdentity sets this member's instance and flags; call it before
// Connect (it overrides the config).
func (p *GROUPFC) SetIdentity(id Identity) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.Instance, p.cfg.Loopback, p.cfg.MemberEvents = id.Instance, id.Loopback, id.MemberEvents
}

// ---- the outbox

func (p *GROUPFC) takeOut() []protoMsg {
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
func (p *GROUPFC) sendOut(out []protoMsg) {
	for _, o := range out {
		m := stack.NewMessage(o.to, nil).Set(stack.Internal)
		m.PutHeader(p.ID(), o.h)
		_ = p.PassDown(p.Context(), m)
	}
}

// ---- receiving

// Up runs group messages; others pass.
func (p *GROUPFC) Up(m *stack.Message) {
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
func (p *GROUPFC) afterLocked() {
	ready := p.g.nready
	p.g.nready = nil
	var start []*member
	for _, m := range ready {
		if !m.delivering && len(m.ready) > 0 && m.mayDeliver() {
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
func (p *GROUPFC) drain(m *member) {
	p.mu.Lock()
again:
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
	if p.g != nil {
		// The next incarnation of the same member, if it waited for
		// this one (its UP after this one's DOWN), goes on here.
		if n := p.g.delivered(m); n != nil && !n.delivering && len(n.ready) > 0 {
			n.delivering = true
			m = n
			goto again
		}
	}
	p.mu.Unlock()
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
	// NextBroadcast is the broadcast seqno expected from it next, and
	// Waiting the seqno the head of its deferred queue waits for (0: none):
	// a queue that does not move names the gap.
	NextBroadcast, Waiting uint64
}

// Members returns every known member, in address order.
func (p *GROUPFC) Members() []MemberInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.g == nil {
		return nil
	}
	var out []MemberInfo
	for _, m := range p.g.members {
		mi := MemberInfo{Addr: m.addr, Instance: m.instance, State: m.state, Window: m.window, Advertised: m.advertised, Deferred: len(m.deferred), NextBroadcast: m.bcRcvNxt}
		if len(m.deferred) > 0 {
			mi.Waiting = m.deferred[0].seqno
		}
		out = append(out, mi)
	}
	slices.SortFunc(out, func(a, b MemberInfo) int { return a.Addr.Compare(b.Addr) })
	return out
}

// Stats reports GROUPFC's counters.
func (p *GROUPFC) Stats() []stack.Stat {
	p.mu.Lock()
	var members, active, pending, deferred, small, reclaims, remits, acks int64
	var activePeak, unread, unreadPeak, overruns, overrunDrops, staleJoins int64
	if g := p.g; g != nil {
		members, active, pending, small = int64(len(g.members)), int64(g.activeCnt), int64(len(g.pending)), int64(len(g.smallWin))
		for _, m := range g.members {
			deferred += int64(len(m.deferred))
		}
		reclaims, remits, acks = g.reclaims, g.remits, g.acks
		activePeak, unread, unreadPeak, overruns = int64(g.activePeak), g.unreadBytes, g.unreadPeak, g.overruns
		overrunDrops, staleJoins = g.overrunDrops, g.staleJoins
	}
	p.mu.Unlock()
	return append(stack.CounterStats(p),
		stack.Stat{Name: "members", Value: members},
		stack.Stat{Name: "active_senders", Value: active},
		stack.Stat{Name: "pending_senders", Value: pending},
		stack.Stat{Name: "small_window_receivers", Value: small},
		stack.Stat{Name: "deferred", Value: deferred},
		stack.Stat{Name: "reclaims_sent", Value: reclaims, Counter: true},
		stack.Stat{Name: "remits_sent", Value: remits, Counter: true},
		stack.Stat{Name: "acks_received", Value: acks, Counter: true},
		stack.Stat{Name: "active_senders_peak", Value: activePeak},
		stack.Stat{Name: "unread_bytes", Value: unread},
		stack.Stat{Name: "unread_bytes_peak", Value: unreadPeak},
		stack.Stat{Name: "window_overruns", Value: overruns, Counter: true},
		stack.Stat{Name: "stale_joins", Value: staleJoins, Counter: true},
		stack.Stat{Name: "dropped_window_overrun", Value: overrunDrops, Counter: true},
		stack.Stat{Name: "blocked_ms", Value: p.blockedNanos.Load() / 1e6, Counter: true},
	)
}
