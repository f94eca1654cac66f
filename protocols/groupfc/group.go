package groupfc

import (
	"slices"

	"github.com/strata-go/strata/stack"
)

// Flow-control constants of TIPC groups (reference/tipc-groups-spec.md §1).
const (
	blockSize  = 1024 // bytes per window block
	hdrSize    = 44   // what a data message's header is charged (TIPC's GROUP_H_SIZE)
	advUnit    = 65   // blocks of the largest message: (66060+60)/1024 + 1
	advIdle    = advUnit
	advActive  = 12 * advUnit
	advRefresh = advActive * 3 / 4 // an ACTIVE member is re-advertised at or below this
)

// blocks is what a message of n payload bytes costs: (44+n)/1024 + 1, TIPC's
// integer division (1024 bytes cost 2).
func blocks(n int) int { return (hdrSize+n)/blockSize + 1 }

// State is a member's state as seen by this member (spec §4).
type State uint8

// Member states. PENDING..REMITTED describe how this member rations the
// peer's sending to it; the sending side uses only the window.
const (
	Joining    State = iota + 1 // JOIN came, the peer is not in the view yet
	Published                   // in the view, no JOIN yet
	Joined                      // both: idle window
	Pending                     // wants to send, waits for an active slot
	Active                      // large window
	Reclaiming                  // asked to give back its large window
	Remitted                    // gave it back; messages still unread
	Leaving                     // LEAVE came or it left the view; never changes again
)

var stateNames = [...]string{"?", "JOINING", "PUBLISHED", "JOINED", "PENDING", "ACTIVE", "RECLAIMING", "REMITTED", "LEAVING"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "?"
}

// item is an entry of a member's deferred queue: a data message or a
// membership event, each with the broadcast seqno it waits for.
type item struct {
	typ   uint8 // typeBcast, typeMcast, typeUcast, or 0 for an event
	seqno uint64
	m     *stack.Message
	ack   bool // BCAST/MCAST with ack request
	ev    *Event
}

// member is one peer (or this member itself, with loopback).
type member struct {
	addr     stack.Address
	instance uint64
	state    State

	// Receiving side.
	advertised int    // blocks granted minus blocks read
	unread     int    // blocks received and not yet read (never above advertised)
	bcRcvNxt   uint64 // next broadcast seqno expected
	bcSyncpt   uint64 // from JOIN, then from LEAVE
	deferred   []*item
	ready      []*item // taken off the deferred queue, to be delivered in order
	delivering bool    // a goroutine is delivering ready
	leave      bool    // LEAVE received (graceful)
	downQueued bool
	skipGaps   bool // lost: the gaps in deferred will never be filled
	upPassed   bool // its UP event went to the application: a DOWN may follow
	// early: data that came before the member was UP here. Its JOIN
	// (unicast) and its broadcasts (multicast) travel on different
	// reliable channels, so a broadcast can overtake the JOIN, or the
	// view; it is taken in when the member is UP (below the JOIN's sync
	// point it is dropped then, as always).
	early   []earlyData
	deleted bool
	// rejoin: a JOIN that came while this incarnation was leaving; the
	// member joined again (a merge brought it back, or it reconnected).
	// The next incarnation starts with it once this one is gone.
	rejoin *Header
	// prev: the incarnation before this one, while it still delivers; this
	// one's queue waits for it (its DOWN comes before this one's UP).
	prev *member
	// inc numbers this member's incarnations of the peer (sent in its
	// JOINs); peerInc is the peer's incarnation of this member that this
	// one is paired with (0: no JOIN yet). A JOIN with a higher number is
	// a new incarnation, the same number a late or crossing JOIN of this
	// one, a lower number stale.
	inc, peerInc uint64

	// Sending side.
	window     int // blocks we may still send to it
	ackPending bool
	inSmall    bool
	list       listKind
}

type listKind uint8

const (
	inNone listKind = iota
	inActive
	inPending
)

// isReceiver: we may send to it (PUBLISHED counts, with window 0).
func (m *member) isReceiver() bool { return m.state != Joining && m.state != Leaving }

// isSender: we accept its data (LEAVING counts).
func (m *member) isSender() bool { return m.state != Joining && m.state != Published }

// earlyData is a data message held until its sender is UP.
type earlyData struct {
	h   *Header
	msg *stack.Message
}

// maxEarly bounds the data held from one member before it is UP.
const maxEarly = 4096

// protoMsg is a group protocol message to send once the lock is released.
type protoMsg struct {
	to stack.Address
	h  *Header
}

// group is the state machine of TIPC groups for one member, without
// goroutines or I/O: handlers change state and append to out (protocol
// messages to send) and to members' ready queues (what to deliver). The
// layer holds its mutex around every call.
type group struct {
	self      stack.Address
	instance  uint64
	loopback  bool
	events    bool
	maxActive int // 0: TIPC's formula
	maxUnread int // blocks a sender may have unread here; beyond, its data is dropped (0: no bound)

	members map[stack.Address]*member
	// incs: per peer, the number of this member's latest incarnation of
	// it; incSeen: per peer, the highest incarnation number its JOINs
	// carried (a lower one is stale: staleJoins).
	incs, incSeen map[stack.Address]uint64
	// bcDone: per peer, the next broadcast seqno its removed incarnations
	// had reached; a later incarnation starts there at the earliest.
	bcDone map[stack.Address]uint64
	// retired: members removed while their ready queue still delivers; a
	// next incarnation of the same address queues behind them (prev).
	retired   map[stack.Address]*member
	smallWin  []*member // receivers with window < advIdle, ascending
	active    []*member // LRU, oldest first
	pending   []*member // LRU, oldest first
	activeCnt int

	bcSndNxt  uint64
	bcAckers  int
	mandatory bool // the next broadcast goes by replicast with ack request
	joined    bool

	out  []protoMsg
	wake bool // a blocked sender may go on
	// trace, when set (debug logging on), is told of every decision that
	// changes what a peer's incarnation will deliver: JOINs, drops, ends.
	trace  func(msg string, args ...any)
	nready []*member

	reclaims, remits, acks  int64
	staleJoins              int64 // JOINs of an earlier incarnation, late
	overruns                int64 // data beyond what was advertised (a sender broke the window)
	overrunDrops            int64 // data dropped: beyond maxUnread
	activePeak              int
	unreadBytes, unreadPeak int64 // received from all members and not yet read
}

func newGroup(self stack.Address, instance uint64, loopback, events bool, maxActive int) *group {
	return &group{self: self, instance: instance, loopback: loopback, events: events, maxActive: maxActive,
		members: map[stack.Address]*member{}, retired: map[stack.Address]*member{}, incs: map[stack.Address]uint64{}, incSeen: map[stack.Address]uint64{}, bcDone: map[stack.Address]uint64{}, bcSndNxt: 1}
}

// limits returns max_active and the reclaim limit.
func (g *group) limits() (maxActive, reclaimLimit int) {
	maxActive = g.maxActive
	if maxActive == 0 {
		maxActive = max(min((len(g.members)+1)/8, 64), 16)
	}
	return maxActive, maxActive * 3 / 4
}

func (g *group) send(m *member, typ uint8) {
	h := &Header{Type: typ}
	switch typ {
	case typeJoin:
		h.Seqno, h.Instance, h.Inc = g.bcSndNxt, g.instance, m.inc
		h.N = uint64(g.advance(m))
	case typeLeave:
		h.Seqno = g.bcSndNxt
	case typeAdv:
		h.N = uint64(g.advance(m))
	case typeAck:
		h.N = m.bcRcvNxt
	case typeRemit:
		h.N = uint64(max(m.window, 0))
	}
	g.out = append(g.out, protoMsg{to: m.addr, h: h})
	if g.trace != nil && typ == typeJoin {
		g.trace("groupfc: JOIN sent", "to", m.addr, "seqno", h.Seqno, "inc", h.Inc)
	}
}

// advance is what to advertise to m now (its state's target minus what is
// outstanding, never negative), and counts it as advertised.
func (g *group) advance(m *member) int {
	target := 0
	switch m.state {
	case Active:
		target = advActive
	case Joined, Pending:
		target = advIdle
	}
	adv := max(target-m.advertised, 0)
	m.advertised += adv
	return adv
}

// fullyAdvertised: nothing more can be advertised to m in its state.
func fullyAdvertised(m *member) bool {
	switch m.state {
	case Joined, Pending:
		return m.advertised >= advIdle
	case Active:
		return m.advertised >= advActive
	}
	// PUBLISHED (no JOIN yet), RECLAIMING, REMITTED, LEAVING: nothing is
	// advertised in these states. (An ADV of 0 to a member that is
	// PUBLISHED here, and blocked on this one, came straight back as
	// another nudge: two such members nudged each other without end.)
	return true
}

// ---- lists

func (g *group) unlinkSmall(m *member) {
	if m.inSmall {
		g.smallWin = slices.DeleteFunc(g.smallWin, func(x *member) bool { return x == m })
		m.inSmall = false
	}
}

// updateMember charges m blks and keeps the small-window list exact: m is
// always taken out and put back in order (fix 1 of the spec: the old code
// left an already listed member where it was).
func (g *group) updateMember(m *member, blks int) {
	if !m.isReceiver() || m.addr == g.self {
		g.unlinkSmall(m)
		return
	}
	m.window -= blks
	if m.window >= advIdle && !m.inSmall {
		return
	}
	g.unlinkSmall(m)
	if m.window >= advIdle {
		return
	}
	i := len(g.smallWin)
	for j, x := range g.smallWin {
		if x.window > m.window {
			i = j
			break
		}
	}
	g.smallWin = slices.Insert(g.smallWin, i, m)
	m.inSmall = true
}

// open re-sorts m after its window grew, and wakes blocked senders.
func (g *group) open(m *member) {
	g.updateMember(m, 0)
	g.wake = true
}

func (g *group) unlinkList(m *member) {
	switch m.list {
	case inActive:
		g.active = slices.DeleteFunc(g.active, func(x *member) bool { return x == m })
	case inPending:
		g.pending = slices.DeleteFunc(g.pending, func(x *member) bool { return x == m })
	}
	m.list = inNone
}

func (g *group) appendList(m *member, k listKind) {
	g.unlinkList(m)
	if k == inActive {
		g.active = append(g.active, m)
	} else {
		g.pending = append(g.pending, m)
	}
	m.list = k
}

func (g *group) decrActive(m *member) {
	switch m.state {
	case Active, Reclaiming, Remitted:
		g.activeCnt--
	}
}

// ---- membership

// create adds a member in state st, after the incarnation of a that is
// still delivering, if any.
func (g *group) create(a stack.Address, st State) *member {
	g.incs[a]++
	m := &member{addr: a, state: st, inc: g.incs[a]}
	if r := g.retired[a]; r != nil {
		delete(g.retired, a)
		if r.delivering || len(r.ready) > 0 {
			m.prev = r
		}
	}
	g.members[a] = m
	return m
}

// published: a the peer appeared (it is in the view).
func (g *group) published(a stack.Address) {
	m := g.members[a]
	if m != nil && m.state == Leaving {
		// Back in the view while its earlier incarnation leaves (a merge
		// brought back a member a view had left out): that incarnation
		// ends now, DOWN after what it can still deliver, and a new one
		// begins (with the JOIN it may have sent already: remove takes it).
		g.lost(m)
		m = g.members[a]
	}
	switch {
	case m == nil:
		m = g.create(a, Published)
		g.updateMember(m, 0)
		g.send(m, typeJoin)
	case m.state == Joining:
		m.state = Joined
		g.open(m)
		g.send(m, typeJoin)
		g.queueEvent(m, true, false, m.bcSyncpt)
		g.admitEarly(m)
	}
}

// admitEarly takes in the data m sent before it was UP here.
func (g *group) admitEarly(m *member) {
	early := m.early
	m.early = nil
	for _, e := range early {
		g.data(m.addr, e.h, e.msg)
	}
}

// withdrawn: a left the view (TIPC's WITHDRAWN). It becomes LEAVING. If
// its node is down (it was suspected) and no LEAVE came, DOWN comes at once
// after what can still be delivered; otherwise its LEAVE is awaited, and
// DOWN waits for every broadcast below the LEAVE's sync point.
func (g *group) withdrawn(a stack.Address, nodeDown bool) {
	m := g.members[a]
	if m == nil || m.deleted {
		return
	}
	if m.state != Leaving {
		g.toLeaving(m)
	}
	if nodeDown && !m.leave {
		g.lost(m)
	}
}

func (g *group) toLeaving(m *member) {
	g.unlinkList(m)
	g.decrActive(m)
	m.state = Leaving
	g.unlinkSmall(m)
	if m.ackPending {
		// It will not ack: leave it out of the broadcast accounting.
		m.ackPending = false
		g.bcAckers--
	}
	g.wake = true
}

// lost delivers what m's queue holds in order, skipping the gaps that will
// never be filled, then DOWN (graceful if its LEAVE came), and deletes m.
func (g *group) lost(m *member) {
	if m.deleted {
		return
	}
	hi := m.bcRcvNxt
	for _, it := range m.deferred {
		hi = max(hi, it.seqno)
	}
	// Nobody will fill the gaps: filter steps over each one. (Not by
	// setting the next seqno to hi: each broadcast held below hi would
	// then count on top of it, and the next incarnation, which starts at
	// bcDone, would begin past broadcasts not yet sent.)
	m.skipGaps = true
	if m.downQueued {
		g.filter(m)
		return
	}
	g.queueEvent(m, false, m.leave, hi)
}

func (g *group) queueEvent(m *member, up, graceful bool, seqno uint64) {
	if !up {
		m.downQueued = true
	}
	ev := &Event{Member: m.addr, Instance: m.instance, Up: up, Graceful: graceful}
	m.deferred = append(m.deferred, &item{seqno: seqno, ev: ev})
	g.filter(m)
}

// ---- receiving

// handleProto runs a group protocol message from src.
func (g *group) handleProto(src stack.Address, h *Header) {
	m := g.members[src]
	if g.trace != nil && h.Type == typeJoin {
		st, inc, peer := "none", uint64(0), uint64(0)
		if m != nil {
			st, inc, peer = m.state.String(), m.inc, m.peerInc
		}
		g.trace("groupfc: JOIN received", "from", src, "seqno", h.Seqno, "inc", h.Inc, "reply", h.Reply, "state", st, "my_inc", inc, "paired_inc", peer, "seen", g.incSeen[src], "done", g.bcDone[src])
	}
	if h.Type == typeJoin {
		if h.Inc < g.incSeen[src] || m != nil && h.Inc < m.peerInc {
			// A JOIN of an earlier incarnation of this member here, late
			// (its connection was repaired after a later one's). Taken,
			// it would start the member below broadcasts already
			// delivered, and its answer would start another.
			g.staleJoins++
			return
		}
		g.incSeen[src] = h.Inc
	}
	if m != nil && (m.deleted || m.state == Leaving) && h.Type == typeJoin {
		if h.Inc > m.peerInc {
			// Its next incarnation: kept until this one is gone.
			m.rejoin = h
		}
		return
	}
	if m != nil && (m.deleted || m.state == Leaving) && h.Type != typeLeave {
		return // from a member that is leaving or gone: never a state change
	}
	switch h.Type {
	case typeJoin:
		if m != nil && m.peerInc != 0 && h.Inc == m.peerInc {
			// Another JOIN of the incarnation this one is paired with: the
			// answer to this member's JOIN, or the JOIN itself overtaken
			// by that answer (INTERNAL messages run on parallel workers).
			// Its window counts, as an ADV's would.
			m.window += int(h.N)
			g.open(m)
			return
		}
		if m != nil && m.state != Joining && m.state != Published {
			// A JOIN of a new incarnation from a member joined here: a
			// view of its left this member out and it has come back (a
			// merge). Its earlier incarnation ended there, with what it
			// had not yet sent here; it ends here too (DOWN after what it
			// can still deliver), and a new one begins, in the view:
			// JOINED below, with a JOIN back.
			g.toLeaving(m)
			g.lost(m)
			m = g.create(src, Published)
			g.updateMember(m, 0)
		}
		if m == nil {
			m = g.create(src, Joining)
		}
		m.instance, m.peerInc = h.Instance, h.Inc
		// Not below what an earlier incarnation took: a broadcast sent
		// after this JOIN may have overtaken it (multicast against
		// unicast) and been delivered by the incarnation before this one.
		m.bcSyncpt = max(h.Seqno, g.bcDone[src])
		m.bcRcvNxt = m.bcSyncpt
		// Added, not set: an ADV sent after the JOIN may be handled first
		// (INTERNAL messages run on parallel workers).
		m.window += int(h.N)
		// Unconditionally re-sorted (fix 2: a JOIN with a full window must
		// take the member off the small-window list).
		g.updateMember(m, 0)
		if m.state != Published {
			return
		}
		m.state = Joined
		g.open(m)
		if h.Reply {
			g.send(m, typeAdv)
		} else {
			// Answered with a JOIN, marked as a reply, not an ADV: the
			// JOIN this member sent when the peer appeared may have gone
			// to an earlier incarnation of it (one that its view then
			// dropped), and this one would wait for a JOIN for ever.
			g.send(m, typeJoin)
			g.out[len(g.out)-1].h.Reply = true
		}
		g.queueEvent(m, true, false, m.bcSyncpt)
		g.admitEarly(m)
	case typeLeave:
		if m == nil || m.deleted || m.leave {
			return
		}
		m.leave = true
		m.bcSyncpt = h.Seqno
		if m.state != Leaving {
			g.toLeaving(m)
		}
		if !m.downQueued {
			g.queueEvent(m, false, true, m.bcSyncpt)
		}
	case typeAdv:
		if m == nil {
			return
		}
		m.window += int(h.N)
		g.open(m)
	case typeAck:
		if m == nil {
			return
		}
		// Only a counted receiver's first ACK counts (CVE-2026-31662:
		// duplicate or stale ACKs are no-ops).
		if m.ackPending {
			m.ackPending = false
			g.bcAckers--
			g.acks++
			if g.bcAckers == 0 {
				g.wake = true
			}
		}
	case typeReclaim:
		if m == nil {
			return
		}
		g.send(m, typeRemit)
		g.remits++
		m.window = advIdle
		g.open(m)
	case typeRemit:
		if m == nil || m.state != Reclaiming {
			return
		}
		remitted := int(h.N)
		if m.advertised > remitted {
			m.state = Remitted
			m.advertised = advIdle + (m.advertised - remitted)
			return
		}
		m.state = Joined
		g.activeCnt--
		m.advertised = advIdle
		g.activateOldestPending()
	}
}

// activateOldestPending makes the oldest PENDING member ACTIVE.
func (g *group) activateOldestPending() {
	if len(g.pending) == 0 {
		return
	}
	pm := g.pending[0]
	pm.state = Active
	g.appendList(pm, inActive)
	g.activeCnt++
	if pm.advertised <= advRefresh {
		g.send(pm, typeAdv)
	}
}

// data takes a data message from src into its deferred queue.
func (g *group) data(src stack.Address, h *Header, msg *stack.Message) bool {
	m := g.members[src]
	if m != nil && !m.deleted && (m.state == Joining || m.state == Published) {
		if len(m.early) >= maxEarly {
			return false
		}
		m.early = append(m.early, earlyData{h, msg})
		return true
	}
	if m == nil || m.deleted || !m.isSender() || m.state == Leaving && m.peerInc == 0 {
		// (LEAVING without a JOIN: it left the view before it joined
		// here, never UP; what it sends is for a later incarnation.)
		if g.trace != nil {
			st := "none"
			if m != nil {
				st = m.state.String()
			}
			g.trace("groupfc: data dropped: no incarnation takes it", "from", src, "type", h.Type, "seqno", h.Seqno, "ack", h.AckReq, "state", st)
		}
		return false
	}
	if (h.Type == typeBcast || h.Type == typeMcast) && h.Seqno < m.bcRcvNxt {
		if g.trace != nil {
			g.trace("groupfc: data dropped: below next", "from", src, "type", h.Type, "seqno", h.Seqno, "ack", h.AckReq, "next", m.bcRcvNxt)
		}
		return false // below the sync point, or a duplicate
	}
	blks := blocks(len(msg.Payload))
	if g.maxUnread > 0 && m.unread+blks > g.maxUnread {
		// Far beyond any window this member gave: a sender that ignores
		// the windows. Dropped (and counted by the caller), so it cannot
		// grow this member's queues.
		g.overrunDrops++
		return false
	}
	it := &item{typ: h.Type, seqno: h.Seqno, m: msg, ack: h.AckReq}
	m.unread += blks
	if m.unread > m.advertised && m.state != Leaving {
		g.overruns++
	}
	g.unreadBytes += int64(len(msg.Payload))
	g.unreadPeak = max(g.unreadPeak, g.unreadBytes)
	if h.Type == typeUcast {
		m.deferred = append(m.deferred, it)
	} else {
		i := len(m.deferred)
		for j, x := range m.deferred {
			if x.seqno > h.Seqno {
				i = j
				break
			}
		}
		m.deferred = slices.Insert(m.deferred, i, it)
	}
	g.filter(m)
	return true
}

// filter moves what may be delivered from m's deferred queue to its ready
// queue (spec §6): the head goes when its seqno is not beyond bcRcvNxt.
func (g *group) filter(m *member) {
	for len(m.deferred) > 0 && !m.deleted {
		it := m.deferred[0]
		if it.seqno > m.bcRcvNxt {
			if !m.skipGaps {
				break
			}
			m.bcRcvNxt = it.seqno
		}
		m.deferred = m.deferred[1:]
		deliver, update := true, false
		switch it.typ {
		case typeMcast:
			if h, _ := it.m.Header(stack.IDGROUPFC).(*Header); h != nil && h.Instance != g.instance {
				deliver, update = false, true
			}
			m.bcRcvNxt++
		case typeBcast:
			m.bcRcvNxt++
		case 0:
			switch {
			case !g.events:
				deliver = false
			case it.ev.Up:
				m.upPassed = true
			case !m.upPassed:
				// Never UP here (its JOIN never came before it went):
				// no DOWN either, the application never knew it.
				deliver = false
			}
		}
		if deliver {
			m.ready = append(m.ready, it)
			g.nready = append(g.nready, m)
		}
		if it.ack {
			g.send(m, typeAck)
		}
		if it.ev != nil && !it.ev.Up {
			g.remove(m)
			return
		}
		if update {
			g.read(m, len(it.m.Payload))
		}
	}
}

// remove deletes m once its DOWN has left the deferred queue; what is
// queued behind the DOWN goes with it. A JOIN of its next incarnation that
// came meanwhile is taken now.
func (g *group) remove(m *member) {
	for _, it := range m.deferred {
		if it.m != nil {
			g.unreadBytes -= int64(len(it.m.Payload))
		}
	}
	m.deferred = nil
	if m.state != Leaving {
		g.toLeaving(m) // not awaited for acks, off every list
	}
	m.deleted = true
	delete(g.members, m.addr)
	g.bcDone[m.addr] = max(g.bcDone[m.addr], m.bcRcvNxt)
	if g.trace != nil {
		g.trace("groupfc: incarnation removed", "peer", m.addr, "inc", m.inc, "next", m.bcRcvNxt, "rejoin", m.rejoin != nil)
	}
	if m.delivering || len(m.ready) > 0 {
		g.retired[m.addr] = m
	}
	g.wake = true
	if j := m.rejoin; j != nil {
		m.rejoin = nil
		g.handleProto(m.addr, j)
	}
}

// delivered is called when m's ready queue is empty and nobody delivers
// it: a retired m is forgotten, and the incarnation after it may deliver.
func (g *group) delivered(m *member) (next *member) {
	if g.retired[m.addr] == m {
		delete(g.retired, m.addr)
	}
	if n := g.members[m.addr]; n != nil && n.prev == m {
		n.prev = nil
		return n
	}
	return nil
}

// mayDeliver reports whether m's ready queue may be delivered now: not
// while the incarnation before it still delivers.
func (m *member) mayDeliver() bool {
	return m.prev == nil || !m.prev.delivering && len(m.prev.ready) == 0
}

// read is the application taking a message of size bytes from m (spec
// §4, update_rcv_win).
func (g *group) read(m *member, size int) {
	g.unreadBytes -= int64(size)
	if m.deleted {
		return
	}
	blks := blocks(size)
	maxActive, reclaimLimit := g.limits()
	activeCnt := g.activeCnt
	m.advertised -= blks
	m.unread -= blks
	defer func() { g.activePeak = max(g.activePeak, g.activeCnt) }()
	switch m.state {
	case Joined:
		if activeCnt <= maxActive {
			m.state = Active
			g.appendList(m, inActive)
			g.activeCnt++
			g.send(m, typeAdv)
		} else {
			m.state = Pending
			g.appendList(m, inPending)
		}
		if activeCnt < reclaimLimit {
			return
		}
		if len(g.active) > 0 {
			rm := g.active[0]
			rm.state = Reclaiming
			g.unlinkList(rm)
			g.send(rm, typeReclaim)
			g.reclaims++
			return
		}
		pm := g.pending[0]
		g.unlinkList(pm)
		pm.state = Joined
		g.send(pm, typeAdv)
	case Active:
		if n := len(g.active); n == 0 || g.active[n-1] != m {
			g.appendList(m, inActive) // to the tail: most recently active
		}
		if m.advertised <= advRefresh {
			g.send(m, typeAdv)
		}
	case Remitted:
		if m.advertised > advIdle {
			return
		}
		m.state = Joined
		g.activeCnt--
		if m.advertised < advIdle {
			g.send(m, typeAdv)
		}
		g.activateOldestPending()
	}
}

// ---- sending

// cong reports whether a message of blks blocks to m must wait, nudging m
// with an ADV (two members blocked on each other never read, so would never
// advertise otherwise).
func (g *group) cong(m *member, blks int) bool {
	if m.window >= blks || m.addr == g.self {
		return false
	}
	if !fullyAdvertised(m) {
		g.send(m, typeAdv)
	}
	return true
}

// bcCong reports whether a broadcast of blks blocks must wait.
func (g *group) bcCong(blks int) bool {
	if g.bcAckers > 0 {
		return true
	}
	if len(g.smallWin) == 0 || g.smallWin[0].window >= blks {
		return false
	}
	return g.cong(g.smallWin[0], blks)
}

// sentUnicast charges m and makes the next broadcast a replicast with ack
// request, so it cannot overtake this unicast.
func (g *group) sentUnicast(m *member, blks int) {
	g.updateMember(m, blks)
	g.mandatory = true
}

// sentBroadcast charges every receiver; with ack it counts them as ackers
// and returns them (the replicast's destinations).
func (g *group) sentBroadcast(blks int, ack bool) []*member {
	var rs []*member
	for _, m := range g.members {
		if !m.isReceiver() || m.addr == g.self {
			continue
		}
		g.updateMember(m, blks)
		if ack {
			m.ackPending = true
			rs = append(rs, m)
		}
	}
	if ack {
		g.bcAckers = len(rs)
	}
	if g.trace != nil {
		var to []stack.Address
		for _, r := range rs {
			to = append(to, r.addr)
		}
		g.trace("groupfc: broadcast", "seqno", g.bcSndNxt, "ack", ack, "to", to)
	}
	g.bcSndNxt++
	g.mandatory = false
	return rs
}

// receivers returns the members with instance inst we may send to (self
// only with loopback), in address order.
func (g *group) receivers(inst uint64) []*member {
	var rs []*member
	for _, m := range g.members {
		if m.instance == inst && m.isReceiver() && (m.addr != g.self || g.loopback) {
			rs = append(rs, m)
		}
	}
	slices.SortFunc(rs, func(a, b *member) int { return a.addr.Compare(b.addr) })
	return rs
}

// leaveAll is this member's own leave: LEAVE to every member, every queue
// purged.
func (g *group) leaveAll() {
	for _, m := range g.members {
		if m.addr != g.self && !m.deleted {
			g.send(m, typeLeave)
		}
		m.deferred, m.ready = nil, nil
	}
	g.members = map[stack.Address]*member{}
	g.smallWin, g.active, g.pending = nil, nil, nil
	g.activeCnt, g.bcAckers = 0, 0
	g.joined = false
	g.wake = true
}
