// Package unicast2 is UNICAST2: reliable, FIFO-per-sender unicast with
// negative acknowledgements, after JGroups' UNICAST2, with the
// unilateral-close bug JGRP-1873 fixed.
//
// The fix has three parts. A receiver that closes a connection keeps a
// tombstone of it (connection id, highest delivered) for conn_close_timeout,
// so a resync on the same connection continues after what was delivered
// instead of delivering it again. Every STABLE and SEND_FIRST_SEQNO carries
// a per-receiver timestamp, and a sender ignores any that is older than the
// newest it has seen from that receiver (JGroups JGRP-1875), so a STABLE
// produced before a resync can never purge messages the new receive window
// needs. And a receiver sends its pending STABLE before it closes a
// connection. SEND_FIRST_SEQNO is rate-limited per peer (JGRP-1874).
package unicast2

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/internal/window"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures UNICAST2.
type Config struct {
	XmitInterval     time.Duration `toml:"xmit_interval" doc:"how often receivers ask again for missing messages, backing off (the first request goes xmit_interval/10 after the gap appears), and senders resend unacknowledged ones"`
	StableInterval   time.Duration `toml:"stable_interval" doc:"how often a receiver sends STABLE (highest delivered, highest received) to each sender"`
	MaxStableMsgs    int           `toml:"max_stable_msgs" doc:"periodic STABLEs sent with unchanged values before a receiver stops repeating them"`
	MaxBytes         stack.Size    `toml:"max_bytes" doc:"bytes received from a sender after which a STABLE is sent at once"`
	MaxXmitReq       int           `toml:"max_xmit_req" doc:"most missing seqnos asked for in one XMIT_REQ"`
	ConnExpiry       time.Duration `toml:"conn_expiry_timeout" doc:"idle connections are closed after this long (0: never)"`
	ConnCloseTimeout time.Duration `toml:"conn_close_timeout" doc:"how long a receiver remembers a closed connection, so a resync does not deliver twice"`
	SyncMinInterval  time.Duration `toml:"sync_min_interval" doc:"least time between two SEND_FIRST_SEQNO requests to the same sender"`
	MaxBuffered      stack.Size    `toml:"max_buffered_bytes" doc:"payload bytes received from one sender and not yet delivered (above a gap); more are dropped and counted, and fetched again once delivery moves on (0: no bound)"`
}

// DefaultConfig returns UNICAST2's defaults.
func DefaultConfig() Config {
	return Config{
		XmitInterval: 500 * time.Millisecond, StableInterval: 5 * time.Second, MaxStableMsgs: 5,
		MaxBytes: 10_000_000, MaxXmitReq: 256,
		ConnExpiry: 2 * time.Minute, ConnCloseTimeout: 4 * time.Minute, SyncMinInterval: 2 * time.Second,
		MaxBuffered: 16 << 20,
	}
}

// firstXmit is how long a gap must stay before the first request for it,
// and how often xmitTask runs: a datagram lost in a full socket buffer is
// repaired in tens of milliseconds, while the sender's credits wait for it.
func (c *Config) firstXmit() time.Duration { return max(c.XmitInterval/10, time.Millisecond) }

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.XmitInterval <= 0:
		return stack.BadKey("xmit_interval", "must be > 0, got %s", c.XmitInterval)
	case c.StableInterval <= 0:
		return stack.BadKey("stable_interval", "must be > 0, got %s", c.StableInterval)
	case c.MaxStableMsgs < 1:
		return stack.BadKey("max_stable_msgs", "must be >= 1, got %d", c.MaxStableMsgs)
	case c.MaxBytes <= 0:
		return stack.BadKey("max_bytes", "must be > 0, got %d", c.MaxBytes)
	case c.MaxXmitReq < 1 || c.MaxXmitReq > wire.MaxSeqnoList:
		return stack.BadKey("max_xmit_req", "must be 1..%d, got %d", wire.MaxSeqnoList, c.MaxXmitReq)
	case c.ConnExpiry < 0:
		return stack.BadKey("conn_expiry_timeout", "must not be negative (0 disables), got %s", c.ConnExpiry)
	case c.ConnCloseTimeout <= 0:
		return stack.BadKey("conn_close_timeout", "must be > 0, got %s", c.ConnCloseTimeout)
	case c.SyncMinInterval < 0:
		return stack.BadKey("sync_min_interval", "must not be negative, got %s", c.SyncMinInterval)
	case c.MaxBuffered < 0:
		return stack.BadKey("max_buffered_bytes", "must be >= 0, got %d", c.MaxBuffered)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "UNICAST2", ID: stack.IDUNICAST2,
		Provides: []stack.Service{stack.ServiceReliableUnicast},
		Doc:      "reliable FIFO unicast with negative acks (JGroups UNICAST2, JGRP-1873 fixed)",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
}

// UNICAST2 is the UNICAST2 protocol.
type UNICAST2 struct {
	stack.Base
	cfg Config

	mu       sync.Mutex
	send     map[stack.Address]*sendEntry
	recv     map[stack.Address]*recvEntry
	tombs    map[stack.Address]tombstone
	syncSent map[stack.Address]time.Time
	nextConn uint16

	clock atomic.Uint32 // this member's timestamps, as a receiver

	fixOff bool // tests only: behave like JGroups' UNICAST2 (no tombstones, no timestamps, no final STABLE)
	// trace, when set (debug logging on), is told of resends, duplicates
	// and data that no connection takes: what a lost message's story needs.
	trace func(msg string, args ...any)

	st stats
}

type stats struct {
	sent         atomic.Int64 `stat:"msgs_sent"`
	received     atomic.Int64 `stat:"msgs_received"`
	delivered    atomic.Int64 `stat:"msgs_delivered"`
	duplicates   atomic.Int64 `stat:"duplicates"`
	xmitReqSent  atomic.Int64 `stat:"xmit_reqs_sent"`
	xmitReqRecv  atomic.Int64 `stat:"xmit_reqs_received"`
	xmits        atomic.Int64 `stat:"retransmissions"`
	xmitMissing  atomic.Int64 `stat:"xmit_reqs_for_purged"`
	firstSent    atomic.Int64 `stat:"send_first_seqno_sent"`
	firstRecv    atomic.Int64 `stat:"send_first_seqno_received"`
	firstStale   atomic.Int64 `stat:"send_first_seqno_stale"`
	firstDropped atomic.Int64 `stat:"dropped_unknown_connection"`
	impossible   atomic.Int64 `stat:"dropped_impossible_seqno"`
	stableSent   atomic.Int64 `stat:"stables_sent"`
	stableRecv   atomic.Int64 `stat:"stables_received"`
	stableStale  atomic.Int64 `stat:"stale_stables_ignored"`
	resends      atomic.Int64 `stat:"resends_of_unacked"`
	closed       atomic.Int64 `stat:"connections_closed"`
	reaped       atomic.Int64 `stat:"connections_reaped"`
	bufferFull   atomic.Int64 `stat:"dropped_buffer_full"`
	bufferedPeak atomic.Int64 `stat:"buffered_bytes_peak,gauge"`
}

// sendEntry is the send window to one destination: seqnos low..next-1 are
// not yet stable and kept for retransmission.
type sendEntry struct {
	connID uint16
	low    uint64 // lowest unstable seqno
	next   uint64 // next seqno to send
	msgs   []*stack.Message
	lastTS uint32
	haveTS bool
	acked  bool // a STABLE for this connection has arrived
	// stableNext is next when the previous STABLE came (at stableAt):
	// what was sent before it has had that long to arrive.
	stableNext uint64
	stableAt   time.Time
	progress   time.Time     // last STABLE that advanced, last send into an empty window, or last resend
	backoff    time.Duration // wait without progress before the next resend; doubles per resend
	// used is when the connection was last seen busy: the xmit task
	// sets it from busy, so a message costs no clock reading (a
	// reading per message was 6% of a two-member unicast run's CPU).
	used time.Time
	busy bool // a message went out since the xmit task last looked
	// hdrs: headers of the next messages, allocated a slab at a time (one
	// allocation per slab of messages instead of one per message).
	hdrs window.Slab[Header]
}

// recvEntry is the receive connection from one source. Its window drops
// what it delivers (the sender keeps messages until they are stable); an
// entry without a message above the highest delivered is an OOB message
// passed up already.
type recvEntry struct {
	connID     uint16
	w          *window.Window
	bytes      int64 // payload bytes received since the last STABLE (max_bytes)
	lastHD     uint64
	lastHR     uint64
	sameStable int
	used       time.Time // as sendEntry's
	busy       bool
	// dup: a message came again that this connection has already. Its
	// sender resends only what it has no STABLE for, so every STABLE for
	// it was lost (the repeats end after max_stable_msgs): the xmit task
	// answers with a STABLE, or the sender would resend its first message
	// for ever and never the ones after it.
	dup bool
}

// stableSeqnos returns the highest delivered and received seqnos, as a
// STABLE says them.
func (e *recvEntry) stableSeqnos() (hd, hr uint64) {
	hd = e.w.HighestDelivered()
	return hd, max(e.w.HighestReceived(), hd)
}

type tombstone struct {
	connID uint16
	hd     uint64
	oob    []uint64 // OOB messages above hd already delivered
	at     time.Time
}

var _ stack.Protocol = (*UNICAST2)(nil)

// New returns a UNICAST2 layer.
func New(cfg Config) *UNICAST2 {
	return &UNICAST2{
		cfg: cfg, send: map[stack.Address]*sendEntry{}, recv: map[stack.Address]*recvEntry{},
		tombs: map[stack.Address]tombstone{}, syncSent: map[stack.Address]time.Time{},
	}
}

// Name returns "UNICAST2".
func (u *UNICAST2) Name() string { return "UNICAST2" }

// Init validates the config.
func (u *UNICAST2) Init() error {
	u.nextConn = uint16(u.Rand().Uint64()) // connection ids differ across instances
	if u.Log().Enabled(context.Background(), slog.LevelDebug) {
		u.trace = u.Log().Debug
	}
	return u.cfg.Validate()
}

// Start forgets every connection (a reconnect is a new member) and starts
// the retransmission and stable timers. Connections are forgotten here and
// not in Stop: while the stack stops, messages still on their way up must
// meet the connections they belong to, or a resent first message would
// open a new one and be delivered again.
func (u *UNICAST2) Start() error {
	u.mu.Lock()
	clear(u.send)
	clear(u.recv)
	clear(u.tombs)
	clear(u.syncSent)
	u.mu.Unlock()
	u.GoEvery(u.cfg.firstXmit(), u.xmitTask)
	u.GoEvery(u.cfg.StableInterval, func() { u.sendStables(false) })
	return nil
}

// maxXmitBytes caps the payload one retransmission request is answered with.
const maxXmitBytes = 1 << 20

// newer reports whether timestamp a is after b, across wrap-around.
func newer(a, b uint32) bool { return int32(a-b) > 0 }

// ---- sending ----

// Down numbers unicasts and keeps them until they are stable. Multicasts,
// NO_RELIABILITY messages and unicasts to self pass untouched.
func (u *UNICAST2) Down(ctx context.Context, m *stack.Message) error {
	if m.IsMulticast() || m.Has(stack.NoReliability) || m.Dest == u.LocalAddress() {
		return u.PassDown(ctx, m)
	}
	// The source is set before m is in the table: a retransmission may copy
	// it from another goroutine while the transport sends the original.
	if m.Src.IsZero() {
		m.Src = u.LocalAddress()
	}
	u.mu.Lock()
	e := u.send[m.Dest]
	if e == nil {
		u.nextConn++
		now := time.Now()
		e = &sendEntry{connID: u.nextConn, low: 1, next: 1, progress: now, used: now}
		u.send[m.Dest] = e
	}
	seq := e.next
	e.next++
	if len(e.msgs) == 0 {
		e.progress = time.Now()
	}
	e.busy = true
	h := e.hdrs.New()
	*h = Header{Type: typeData, Seqno: seq, ConnID: e.connID, First: seq == 1}
	m.PutHeader(u.ID(), h)
	e.msgs = append(e.msgs, m)
	u.mu.Unlock()
	u.st.sent.Add(1)
	return u.PassDown(ctx, m)
}

// control sends a UNICAST2 control message on the internal lane.
func (u *UNICAST2) control(dest stack.Address, h *Header) {
	m := stack.NewMessage(dest, nil).Set(stack.Internal)
	m.PutHeader(u.ID(), h)
	_ = u.PassDown(u.Context(), m)
}

func (u *UNICAST2) resend(m *stack.Message) {
	u.st.xmits.Add(1)
	_ = u.PassDown(u.Context(), m)
}

// asFirst returns a copy of m marked as the first message of its connection.
func (u *UNICAST2) asFirst(m *stack.Message) *stack.Message {
	h := *m.Header(u.ID()).(*Header)
	h.First = true
	c := m.Copy()
	c.PutHeader(u.ID(), &h)
	return c
}

// acceptTimestamp records ts from e's receiver and reports whether it is
// newer than any seen before: STABLEs and SEND_FIRST_SEQNOs produced before
// a resync are ignored (JGRP-1875). Callers hold u.mu.
func (u *UNICAST2) acceptTimestamp(e *sendEntry, ts uint32) bool {
	if u.fixOff {
		return true
	}
	if e.haveTS && !newer(ts, e.lastTS) {
		return false
	}
	e.lastTS, e.haveTS = ts, true
	return true
}

func (u *UNICAST2) handleStable(src stack.Address, h *Header) {
	u.st.stableRecv.Add(1)
	var resend []*stack.Message
	u.mu.Lock()
	e := u.send[src]
	if e == nil || e.connID != h.ConnID {
		u.mu.Unlock()
		return
	}
	if !u.acceptTimestamp(e, h.Timestamp) {
		u.mu.Unlock()
		u.st.stableStale.Add(1)
		return
	}
	e.acked = true
	if h.HD >= e.low {
		n := min(h.HD, e.next-1) - e.low + 1
		clear(e.msgs[:n])
		e.msgs = e.msgs[n:]
		e.low += n
		e.progress = time.Now()
		e.backoff = 0
	}
	// Resend what lies above what the receiver has and was sent at least
	// xmit_interval ago (before the previous STABLE came, that long ago):
	// a lost last message is recovered this way. Not what was sent since:
	// in a stream it is still on its way (up to the flow-control credits
	// of it), and resending all of it doubled the traffic.
	now := time.Now()
	if upto := min(e.stableNext, e.next); h.HR+1 < upto && now.Sub(e.stableAt) >= u.cfg.XmitInterval {
		for s := max(h.HR+1, e.low); s < upto; s++ {
			resend = append(resend, e.msgs[s-e.low])
		}
	}
	if u.trace != nil && len(resend) > 0 {
		u.trace("unicast2: resending above a STABLE", "to", src, "conn", e.connID, "hd", h.HD, "hr", h.HR, "msgs", len(resend))
	}
	e.stableNext, e.stableAt = e.next, now
	u.mu.Unlock()
	for _, m := range resend {
		u.resend(m)
	}
}

func (u *UNICAST2) handleSendFirstSeqno(src stack.Address, h *Header) {
	u.st.firstRecv.Add(1)
	u.mu.Lock()
	e := u.send[src]
	if e == nil {
		u.mu.Unlock()
		return
	}
	if !u.acceptTimestamp(e, h.Timestamp) {
		u.mu.Unlock()
		u.st.firstStale.Add(1)
		return
	}
	if len(e.msgs) == 0 {
		u.mu.Unlock()
		return
	}
	first := u.asFirst(e.msgs[0])
	rest := slices.Clone(e.msgs[1:])
	u.mu.Unlock()
	u.resend(first)
	for _, m := range rest {
		u.resend(m)
	}
}

func (u *UNICAST2) handleXmitReq(src stack.Address, h *Header) {
	u.st.xmitReqRecv.Add(1)
	var out []*stack.Message
	u.mu.Lock()
	e := u.send[src]
	if e == nil || e.connID != h.ConnID {
		u.mu.Unlock()
		return
	}
	bytes := 0
	for _, s := range h.Missing {
		switch {
		case s >= e.low && s < e.next:
			if bytes >= maxXmitBytes {
				continue // the receiver asks again for the rest
			}
			bytes += len(e.msgs[s-e.low].Payload)
			out = append(out, e.msgs[s-e.low])
		case s < e.low:
			u.st.xmitMissing.Add(1) // asked for a message this sender already purged
		}
	}
	u.mu.Unlock()
	for _, m := range out {
		u.resend(m)
	}
}

// stableHeader builds a STABLE for e and resets its byte count; callers
// hold u.mu.
func (u *UNICAST2) stableHeader(e *recvEntry) *Header {
	e.bytes, e.dup = 0, false
	hd, hr := e.stableSeqnos()
	if hd == e.lastHD && hr == e.lastHR {
		e.sameStable++
	} else {
		e.lastHD, e.lastHR, e.sameStable = hd, hr, 0
	}
	return &Header{Type: typeStable, ConnID: e.connID, HD: hd, HR: hr, Timestamp: u.clock.Add(1)}
}

func (u *UNICAST2) sendStable(dest stack.Address, h *Header) {
	u.st.stableSent.Add(1)
	u.control(dest, h)
}

// sendStables sends a STABLE to every sender (periodically, skipping those
// repeated max_stable_msgs times unchanged, unless all is set).
func (u *UNICAST2) sendStables(all bool) {
	type out struct {
		dest stack.Address
		h    *Header
	}
	var outs []out
	u.mu.Lock()
	for src, e := range u.recv {
		if hd, hr := e.stableSeqnos(); !all && e.sameStable >= u.cfg.MaxStableMsgs && hd == e.lastHD && hr == e.lastHR {
			continue
		}
		outs = append(outs, out{src, u.stableHeader(e)})
	}
	u.mu.Unlock()
	for _, o := range outs {
		u.sendStable(o.dest, o.h)
	}
}

// SendStables sends a STABLE to every sender now (JGroups'
// sendPendingAcks); tests use it to place STABLEs exactly.
func (u *UNICAST2) SendStables() { u.sendStables(true) }

// xmitTask asks senders for missing messages, resends the newest message of
// send windows that have made no progress, and reaps idle connections.
func (u *UNICAST2) xmitTask() {
	now := time.Now()
	type req struct {
		dest stack.Address
		h    *Header
	}
	var reqs, stables []req
	var resend []*stack.Message
	var closeRecv []stack.Address
	u.mu.Lock()
	for src, e := range u.recv {
		if e.busy {
			e.used, e.busy = now, false
		}
		if e.w.HighestDelivered() > e.lastHD || e.dup {
			// Delivered more since the last STABLE: say so now rather
			// than at the next stable_interval. The sender then learns
			// soon that its last message arrived, and resends a lost one
			// after xmit_interval instead of a backoff grown to seconds
			// (a request/response exchange, such as a state transfer,
			// otherwise waits seconds for each lost last message).
			// Or a duplicate came (see recvEntry.dup): also now.
			stables = append(stables, req{src, u.stableHeader(e)})
		}
		if e.w.Gap() && !e.w.Due(now, u.cfg.firstXmit(), u.cfg.XmitInterval) {
			continue
		}
		if missing := e.w.Missing(e.w.HighestReceived(), u.cfg.MaxXmitReq); len(missing) > 0 {
			reqs = append(reqs, req{src, &Header{Type: typeXmitReq, ConnID: e.connID, Missing: missing}})
		} else if u.cfg.ConnExpiry > 0 && now.Sub(e.used) > u.cfg.ConnExpiry {
			closeRecv = append(closeRecv, src)
		}
	}
	for dest, e := range u.send {
		if e.busy {
			e.used, e.busy = now, false
		}
		if len(e.msgs) == 0 {
			if u.cfg.ConnExpiry > 0 && now.Sub(e.used) > u.cfg.ConnExpiry {
				delete(u.send, dest)
				u.st.reaped.Add(1)
			}
			continue
		}
		if e.backoff == 0 {
			e.backoff = 2 * u.cfg.XmitInterval
		}
		if now.Sub(e.progress) >= e.backoff {
			// No STABLE for a while: the last message (or the only, first
			// one) may be lost. Back off so an idle receiver whose STABLEs
			// are slow costs only a few resends per stable_interval.
			e.progress = now
			e.backoff = min(2*e.backoff, 2*u.cfg.StableInterval)
			if e.acked {
				resend = append(resend, e.msgs[len(e.msgs)-1])
			} else {
				resend = append(resend, u.asFirst(e.msgs[0]))
			}
			if u.trace != nil {
				u.trace("unicast2: no STABLE for a while, resending", "to", dest, "conn", e.connID, "low", e.low, "next", e.next, "acked", e.acked, "backoff", e.backoff)
			}
		}
	}
	for src, t := range u.tombs {
		if now.Sub(t.at) > u.cfg.ConnCloseTimeout {
			delete(u.tombs, src)
		}
	}
	for src, at := range u.syncSent {
		if now.Sub(at) > u.cfg.SyncMinInterval {
			delete(u.syncSent, src)
		}
	}
	u.mu.Unlock()
	for _, r := range stables {
		u.sendStable(r.dest, r.h)
	}
	for _, r := range reqs {
		// In as many requests as it takes for each to fit the stack's
		// control budget (type, connection id and flags: 4 bytes).
		limit := max(u.Stack().ControlLimit()-4, wire.MinSeqnoListLimit)
		for _, part := range wire.SplitSeqnoList(r.h.Missing, limit) {
			u.st.xmitReqSent.Add(1)
			u.control(r.dest, &Header{Type: typeXmitReq, ConnID: r.h.ConnID, Missing: part})
		}
	}
	for _, m := range resend {
		u.st.resends.Add(1)
		u.resend(m)
	}
	for _, src := range closeRecv {
		u.st.reaped.Add(1)
		u.CloseReceiveConnection(src)
	}
}

// CloseReceiveConnection closes the receive window from src, as when src
// leaves the view: it sends the pending STABLE first and remembers the
// connection, so a resync continues after what was delivered.
func (u *UNICAST2) CloseReceiveConnection(src stack.Address) {
	u.mu.Lock()
	e := u.recv[src]
	if e == nil {
		u.mu.Unlock()
		return
	}
	delete(u.recv, src)
	u.Log().Debug("unicast2: receive connection closed", "from", src, "conn", e.connID, "delivered", e.w.HighestDelivered())
	var sh *Header
	if !u.fixOff {
		sh = u.stableHeader(e)
		u.tombs[src] = tombstone{connID: e.connID, hd: e.w.HighestDelivered(), oob: e.w.DeliveredAbove(), at: time.Now()}
	}
	u.mu.Unlock()
	u.st.closed.Add(1)
	if sh != nil {
		u.sendStable(src, sh)
	}
}

// CloseSendConnection drops the send window to dest; the next message to
// dest opens a new connection.
func (u *UNICAST2) CloseSendConnection(dest stack.Address) {
	u.mu.Lock()
	delete(u.send, dest)
	u.mu.Unlock()
}

// DownEvent closes the connections of members that left the view.
func (u *UNICAST2) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok {
		if v := vc.View; v != nil {
			u.viewChange(v)
		}
	}
	return u.PassDownEvent(ctx, ev)
}

func (u *UNICAST2) viewChange(v *stack.View) {
	var gone []stack.Address
	u.mu.Lock()
	in := v.Lookup(len(u.recv) + len(u.send)) // a coordinator talks to every member
	for a := range u.recv {
		if !in(a) {
			gone = append(gone, a)
		}
	}
	for a := range u.send {
		if !in(a) {
			delete(u.send, a)
		}
	}
	u.mu.Unlock()
	for _, a := range gone {
		u.CloseReceiveConnection(a)
	}
}

// Stats reports UNICAST2's counters.
func (u *UNICAST2) Stats() []stack.Stat {
	u.mu.Lock()
	nsend, nrecv, ntomb := len(u.send), len(u.recv), len(u.tombs)
	var held int64
	for _, e := range u.send {
		held += int64(len(e.msgs))
	}
	u.mu.Unlock()
	s := &u.st
	return append(stack.CounterStats(s),
		stack.Stat{Name: "send_connections", Value: int64(nsend)},
		stack.Stat{Name: "receive_connections", Value: int64(nrecv)},
		stack.Stat{Name: "closed_connections_remembered", Value: int64(ntomb)},
		stack.Stat{Name: "msgs_held_for_retransmission", Value: held},
	)
}
