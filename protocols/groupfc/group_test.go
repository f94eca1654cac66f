package groupfc

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// A harness of group state machines joined by hand-driven links: each
// directed link has a FIFO unicast path (protocol messages, unicasts,
// replicasts) and a multicast path the test may reorder. After every step
// it checks the invariants of spec §9 on every member.

type pkt struct {
	h       *Header
	payload int
}

type hnode struct {
	name string
	g    *group
	got  []string // what the application was given, in order
	hold bool     // the application does not read (the delayed-read hook)
	held []*heldRead
}

type heldRead struct {
	m    *member
	size int
}

type harness struct {
	t     *testing.T
	nodes map[stack.Address]*hnode
	byNm  map[string]stack.Address
	uni   map[[2]stack.Address][]pkt
	mc    map[[2]stack.Address][]pkt
	prev  map[stack.Address]map[*member]State
}

func newHarness(t *testing.T, maxActive int, names ...string) *harness {
	h := &harness{t: t, nodes: map[stack.Address]*hnode{}, byNm: map[string]stack.Address{},
		uni: map[[2]stack.Address][]pkt{}, mc: map[[2]stack.Address][]pkt{}, prev: map[stack.Address]map[*member]State{}}
	for i, n := range names {
		a := stack.NewAddress()
		g := newGroup(a, uint64(i+1), false, true, maxActive)
		g.mandatory, g.joined = true, true
		h.nodes[a] = &hnode{name: n, g: g}
		h.byNm[n] = a
	}
	return h
}

func (h *harness) a(n string) stack.Address { return h.byNm[n] }
func (h *harness) n(n string) *hnode        { return h.nodes[h.byNm[n]] }
func (h *harness) m(at, of string) *member  { return h.n(at).g.members[h.a(of)] }
func (h *harness) name(a stack.Address) string {
	if n := h.nodes[a]; n != nil {
		return n.name
	}
	return a.String()
}

// publish makes every listed member see every other (a view of them).
func (h *harness) publish(names ...string) {
	for _, x := range names {
		for _, y := range names {
			if x != y {
				h.n(x).g.published(h.a(y))
				h.after(x)
			}
		}
	}
}

// after moves node x's outbox onto the links and delivers what is ready.
func (h *harness) after(x string) {
	nd := h.n(x)
	for _, o := range nd.g.out {
		k := [2]stack.Address{nd.g.self, o.to}
		h.uni[k] = append(h.uni[k], pkt{h: o.h})
	}
	nd.g.out = nil
	for _, m := range nd.g.nready {
		for len(m.ready) > 0 {
			it := m.ready[0]
			m.ready = m.ready[1:]
			if it.ev != nil {
				nd.got = append(nd.got, it.ev.String2(h))
				continue
			}
			p := it.m.Header(stack.IDGROUPFC).(*Header)
			nd.got = append(nd.got, fmt.Sprintf("%s:%s%d", h.name(m.addr), strings.ToLower(p.Kind()), p.Seqno))
			size := len(it.m.Payload)
			if nd.hold {
				nd.held = append(nd.held, &heldRead{m, size})
			} else {
				nd.g.read(m, size)
			}
		}
	}
	nd.g.nready = nil
	for _, o := range nd.g.out {
		k := [2]stack.Address{nd.g.self, o.to}
		h.uni[k] = append(h.uni[k], pkt{h: o.h})
	}
	nd.g.out = nil
	h.check()
}

// readHeld lets x's application read what it held back.
func (h *harness) readHeld(x string) {
	nd := h.n(x)
	held := nd.held
	nd.held, nd.hold = nil, false
	for _, r := range held {
		nd.g.read(r.m, r.size)
	}
	h.after(x)
}

// step delivers the next packet from x to y on the unicast (or multicast)
// path; it reports whether there was one.
func (h *harness) step(x, y string, mcast bool) bool {
	k := [2]stack.Address{h.a(x), h.a(y)}
	q := h.uni
	if mcast {
		q = h.mc
	}
	if len(q[k]) == 0 {
		return false
	}
	p := q[k][0]
	q[k] = q[k][1:]
	g := h.n(y).g
	if isData(p.h.Type) {
		g.data(h.a(x), p.h, stack.NewMessage(h.a(y), make([]byte, p.payload)).PutHeader(stack.IDGROUPFC, p.h))
	} else {
		g.handleProto(h.a(x), p.h)
	}
	h.after(y)
	return true
}

// settle delivers every queued packet, in any link order, until all links
// are empty.
func (h *harness) settle() {
	for moved := true; moved; {
		moved = false
		for _, x := range h.names() {
			for _, y := range h.names() {
				for h.step(x, y, false) || h.step(x, y, true) {
					moved = true
				}
			}
		}
	}
}

func (h *harness) names() []string {
	var ns []string
	for n := range h.byNm {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return ns
}

// bcast broadcasts size bytes from x if the windows allow it; it reports
// whether it went out. Replicasts go on the unicast paths.
func (h *harness) bcast(x string, size int) bool {
	g := h.n(x).g
	blks := blocks(size)
	if g.bcCong(blks) {
		h.after(x)
		return false
	}
	ack := g.mandatory
	hd := &Header{Type: typeBcast, Seqno: g.bcSndNxt, AckReq: ack}
	var to []*member
	for _, m := range g.members {
		if m.isReceiver() && m.addr != g.self {
			to = append(to, m)
		}
	}
	g.sentBroadcast(blks, ack)
	for _, r := range to {
		k := [2]stack.Address{g.self, r.addr}
		if ack {
			h.uni[k] = append(h.uni[k], pkt{h: hd, payload: size})
		} else {
			h.mc[k] = append(h.mc[k], pkt{h: hd, payload: size})
		}
	}
	h.after(x)
	return true
}

// ucast unicasts size bytes from x to y if y's window allows it.
func (h *harness) ucast(x, y string, size int) bool {
	g := h.n(x).g
	m := g.members[h.a(y)]
	blks := blocks(size)
	if m == nil || !m.isReceiver() || g.cong(m, blks) {
		h.after(x)
		return false
	}
	hd := &Header{Type: typeUcast, Seqno: g.bcSndNxt}
	g.sentUnicast(m, blks)
	k := [2]stack.Address{g.self, m.addr}
	h.uni[k] = append(h.uni[k], pkt{h: hd, payload: size})
	h.after(x)
	return true
}

// check asserts the invariants of spec §9 on every member.
func (h *harness) check() {
	h.t.Helper()
	for a, nd := range h.nodes {
		checkGroup(h.t, nd.g)
		// Per incarnation: a member that joins again is a new one.
		prev := h.prev[a]
		if prev == nil {
			prev = map[*member]State{}
			h.prev[a] = prev
		}
		for ma, m := range nd.g.members {
			if prev[m] == Leaving {
				require.Equal(h.t, Leaving, m.state, "%s: LEAVING member %s changed state", nd.name, h.name(ma))
			}
			prev[m] = m.state
		}
		for m := range prev {
			if nd.g.members[m.addr] != m {
				delete(prev, m)
			}
		}
	}
}

func checkGroup(t *testing.T, g *group) {
	t.Helper()
	require.True(t, slices.IsSortedFunc(g.smallWin, func(a, b *member) int { return a.window - b.window }), "small_win sorted")
	want := 0
	for _, m := range g.members {
		if m.isReceiver() && m.addr != g.self && m.window < advIdle {
			want++
			require.True(t, m.inSmall && slices.Contains(g.smallWin, m), "receiver with window %d on small_win", m.window)
		}
	}
	require.Len(t, g.smallWin, want, "small_win holds exactly the receivers below the idle window")
	cnt, ackers := 0, 0
	for _, m := range g.members {
		switch m.state {
		case Active:
			require.True(t, slices.Contains(g.active, m), "ACTIVE member on the active list")
		case Pending:
			require.True(t, slices.Contains(g.pending, m), "PENDING member on the pending list")
		}
		if m.state == Active || m.state == Reclaiming || m.state == Remitted {
			cnt++
		}
		if m.ackPending {
			ackers++
		}
	}
	for _, m := range g.active {
		require.Equal(t, Active, m.state)
		require.False(t, slices.Contains(g.pending, m), "active and pending disjoint")
	}
	for _, m := range g.pending {
		require.Equal(t, Pending, m.state)
	}
	for _, l := range [][]*member{g.smallWin, g.active, g.pending} {
		for _, m := range l {
			require.Same(t, m, g.members[m.addr], "no list references a deleted member")
		}
	}
	require.Equal(t, cnt, g.activeCnt, "active_cnt counts ACTIVE, RECLAIMING and REMITTED")
	require.Equal(t, ackers, g.bcAckers, "bc_ackers counts the receivers yet to ack")
	require.GreaterOrEqual(t, g.bcAckers, 0)
	require.Zero(t, g.overruns, "no sender went beyond the window it was given")
}

// String2 names an event with the harness's member names.
func (e *Event) String2(h *harness) string {
	switch {
	case e.Up:
		return "UP(" + h.name(e.Member) + ")"
	case e.Graceful:
		return "DOWN(" + h.name(e.Member) + ",left)"
	}
	return "DOWN(" + h.name(e.Member) + ",lost)"
}

// joinAll publishes the members to each other and runs the JOIN exchange.
func joinAll(h *harness, names ...string) {
	h.publish(names...)
	h.settle()
	for _, x := range names {
		for _, y := range names {
			if x != y {
				require.Equal(h.t, Joined, h.m(x, y).state, "%s sees %s joined", x, y)
			}
		}
		h.n(x).got = nil
	}
}

// ---- the scenarios of spec §9

// 1: update_member takes a listed member out before sorting it back in.
func TestSmallWindowListIsResortedAfterEveryCharge(t *testing.T) {
	h := newHarness(t, 0, "S", "B", "C")
	joinAll(h, "S", "B", "C")
	g := h.n("S").g
	b, c := h.m("S", "B"), h.m("S", "C")
	g.updateMember(b, b.window-60)
	g.updateMember(c, c.window-64)
	h.check()
	require.Equal(t, []*member{b, c}, g.smallWin)
	require.True(t, h.ucast("S", "C", 10*1024-hdrSize-1)) // 10 blocks
	require.Equal(t, 54, c.window)
	require.Equal(t, []*member{c, b}, g.smallWin, "C (54) before B (60)")
	require.True(t, g.bcCong(58), "a 58-block broadcast must wait for C")
	require.False(t, h.bcast("S", 58*1024-hdrSize-1))
}

// 2: a JOIN takes the member off the small-window list whatever it brings.
// The spec's order: S sees B first (B is PUBLISHED at S, window 0, on the
// small-window list) and sends its JOIN; B gets it before B sees S, so B's
// own JOIN, sent when B then sees S, carries a full idle window (65). At S
// that JOIN must take B off the list, or every broadcast waits on a window
// B already gave ("permanent false broadcast congestion").
func TestJoinWithFullWindowClearsBroadcastCongestion(t *testing.T) {
	h := newHarness(t, 0, "S", "B")
	h.n("S").g.published(h.a("B"))
	h.after("S")
	b := h.m("S", "B")
	require.Equal(t, Published, b.state)
	require.Equal(t, []*member{b}, h.n("S").g.smallWin, "a PUBLISHED member has window 0")
	require.True(t, h.step("S", "B", false), "S's JOIN reaches B before B sees S")
	require.Equal(t, Joining, h.m("B", "S").state)
	h.n("B").g.published(h.a("S"))
	h.after("B")
	k := [2]stack.Address{h.a("B"), h.a("S")}
	require.Equal(t, uint8(typeJoin), h.uni[k][0].h.Type)
	require.EqualValues(t, advIdle, h.uni[k][0].h.N, "B's JOIN carries a full idle window")
	require.True(t, h.step("B", "S", false), "B's JOIN reaches S")
	require.Equal(t, Joined, b.state)
	require.Empty(t, h.n("S").g.smallWin)
	require.False(t, h.n("S").g.bcCong(65), "no false broadcast congestion")
	h.settle()
}

// 3: a LEAVING member is off the active and pending lists, so it is never
// picked for reclaim, and its DOWN comes.
func TestLeavingMemberIsNeverReclaimed(t *testing.T) {
	h := newHarness(t, 4, "R", "L", "S1", "S2", "S3", "T")
	joinAll(h, "R", "L", "S1", "S2", "S3", "T")
	r := h.n("R").g
	for _, n := range []string{"L", "S1", "S2", "S3"} {
		m := h.m("R", n)
		m.state = Active
		r.appendList(m, inActive)
		r.activeCnt++
		m.advertised = advActive
	}
	h.check()
	// L, the oldest active member, leaves with a broadcast R has not had
	// yet (late on the multicast path): R holds L's DOWN for it, so L is
	// LEAVING at R while R next needs to reclaim.
	h.n("L").g.mandatory = false
	require.True(t, h.bcast("L", 10))
	h.n("L").g.leaveAll()
	h.after("L")
	for h.step("L", "R", false) {
	}
	require.Equal(t, Leaving, h.m("R", "L").state, "L is LEAVING at R, its DOWN waiting for its broadcast")
	require.Len(t, r.active, 3, "L is off the active list")
	require.Equal(t, 3, r.activeCnt)
	require.True(t, h.ucast("T", "R", 100))
	for h.step("T", "R", false) {
	}
	require.Equal(t, Active, h.m("R", "T").state, "T goes active")
	require.Equal(t, Reclaiming, h.m("R", "S1").state, "the victim is the oldest active member but L, S1")
	require.Equal(t, Leaving, h.m("R", "L").state, "L was not reclaimed")
	for h.step("L", "R", true) {
	}
	require.Nil(t, h.m("R", "L"), "L is deleted after its broadcast")
	downs := 0
	for _, s := range h.n("R").got {
		if strings.HasPrefix(s, "DOWN(L") {
			downs++
		}
	}
	require.Equal(t, 1, downs, "exactly one DOWN(L): %v", h.n("R").got)
}

// 4: protocol messages from a member that is leaving or gone change
// nothing.
func TestProtocolMessagesFromLeavingOrDeletedMembersAreIgnored(t *testing.T) {
	h := newHarness(t, 4, "A", "L")
	joinAll(h, "A", "L")
	a := h.n("A").g
	// L leaves with a broadcast A has not seen yet, so its DOWN waits and
	// L stays LEAVING.
	require.True(t, h.bcast("L", 10))
	h.uni[[2]stack.Address{h.a("L"), h.a("A")}] = nil // the replicast is late
	h.n("L").g.leaveAll()
	h.after("L")
	for h.step("L", "A", false) {
	}
	l := h.m("A", "L")
	require.Equal(t, Leaving, l.state)
	before := *l
	a.bcAckers, l.ackPending = 0, false
	for _, hd := range []*Header{{Type: typeAdv, N: 500}, {Type: typeAck, N: 9}, {Type: typeReclaim}, {Type: typeRemit, N: 3}} {
		a.handleProto(h.a("L"), hd)
		h.after("A")
	}
	require.Equal(t, Leaving, l.state)
	require.Equal(t, before.window, l.window)
	require.Empty(t, h.uni[[2]stack.Address{h.a("A"), h.a("L")}], "no REMIT or anything else sent back")
	require.Zero(t, a.bcAckers)
	// Deleted: no resurrection.
	a.lost(l)
	h.after("A")
	require.Nil(t, h.m("A", "L"))
	for _, hd := range []*Header{{Type: typeAdv, N: 500}, {Type: typeAck, N: 9}, {Type: typeReclaim}, {Type: typeRemit, N: 3}, {Type: typeLeave, Seqno: 4}} {
		a.handleProto(h.a("L"), hd)
		h.after("A")
	}
	require.Nil(t, h.m("A", "L"), "a deleted member does not come back")
	require.False(t, a.data(h.a("L"), &Header{Type: typeBcast, Seqno: 1}, stack.NewMessage(h.a("A"), nil)), "late data from a deleted member is dropped")
}

// 5a: a graceful leave, LEAVE and withdrawal in either order: exactly one
// DOWN, after every broadcast below the sync point.
func TestGracefulLeaveGivesOneDownAfterItsBroadcasts(t *testing.T) {
	for _, leaveFirst := range []bool{true, false} {
		t.Run(fmt.Sprint("leave_first=", leaveFirst), func(t *testing.T) {
			h := newHarness(t, 0, "A", "B")
			joinAll(h, "A", "B")
			require.True(t, h.bcast("B", 10)) // replicast
			h.settle()
			require.True(t, h.bcast("B", 10)) // multicast path, held back
			h.n("B").g.leaveAll()
			h.after("B")
			if !leaveFirst {
				h.n("A").g.withdrawn(h.a("B"), false)
				h.after("A")
			}
			for h.step("B", "A", false) {
			}
			if leaveFirst {
				h.n("A").g.withdrawn(h.a("B"), false)
				h.after("A")
			}
			require.Equal(t, []string{"UP(B)", "B:bcast1"}[1:], h.n("A").got[:1], "DOWN waits for broadcast 2")
			for h.step("B", "A", true) {
			}
			require.Equal(t, []string{"B:bcast1", "B:bcast2", "DOWN(B,left)"}, h.n("A").got)
			require.Nil(t, h.m("A", "B"))
		})
	}
}

// 5b: node loss: withdrawal without LEAVE gives DOWN at once; the member
// is out of broadcast accounting, and a rejoin creates a fresh member.
func TestLostMemberIsDownAtOnceAndRejoinsFresh(t *testing.T) {
	h := newHarness(t, 0, "A", "B", "C")
	joinAll(h, "A", "B", "C")
	a := h.n("A").g
	require.True(t, h.ucast("A", "B", 10))
	require.True(t, h.bcast("A", 10)) // replicast with ack request: B and C counted
	require.Equal(t, 2, a.bcAckers)
	h.uni[[2]stack.Address{h.a("A"), h.a("B")}] = nil // B's node is gone
	a.withdrawn(h.a("B"), true)
	h.after("A")
	require.Nil(t, h.m("A", "B"), "B deleted")
	require.Equal(t, []string{"DOWN(B,lost)"}, h.n("A").got)
	require.Equal(t, 1, a.bcAckers, "B left broadcast accounting")
	h.settle()
	require.False(t, a.bcCong(1))
	a.handleProto(h.a("B"), &Header{Type: typeJoin, Seqno: 1, Instance: 2, N: 65, Inc: 2})
	h.after("A")
	require.Equal(t, Joining, h.m("A", "B").state, "a rejoin is a fresh member")
}

// 6: only receivers that may ack are counted in bc_ackers.
func TestBroadcastAckersCountOnlyEnabledReceivers(t *testing.T) {
	for _, variant := range []string{"joining", "leaving"} {
		t.Run(variant, func(t *testing.T) {
			h := newHarness(t, 0, "A", "B", "C")
			joinAll(h, "A", "B")
			a := h.n("A").g
			if variant == "joining" {
				a.handleProto(h.a("C"), &Header{Type: typeJoin, Seqno: 1, Instance: 3, N: 65})
			} else {
				h.publish("A", "C")
				h.settle()
				a.handleProto(h.a("C"), &Header{Type: typeLeave, Seqno: 1})
			}
			h.after("A")
			require.True(t, h.ucast("A", "B", 10))
			require.True(t, h.bcast("A", 10))
			require.Equal(t, 1, a.bcAckers, "only B acks")
			h.settle()
			require.Zero(t, a.bcAckers)
			require.True(t, h.bcast("A", 10), "the next broadcast does not block")
		})
	}
}

// 7: DOWN is held until every broadcast below the LEAVE's sync point.
func TestDownWaitsForBroadcastsBelowLeaveSyncPoint(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	b := h.n("B").g
	b.bcSndNxt = 10
	h.m("A", "B").bcRcvNxt = 10
	b.mandatory = false
	require.True(t, h.bcast("B", 10))
	require.True(t, h.bcast("B", 10))
	b.leaveAll()
	h.after("B")
	k := [2]stack.Address{h.a("B"), h.a("A")}
	late := h.mc[k][1]
	h.mc[k] = h.mc[k][:1]
	h.settle()
	require.Equal(t, []string{"B:bcast10"}, h.n("A").got, "DOWN held behind broadcast 11")
	h.mc[k] = append(h.mc[k], late)
	h.settle()
	require.Equal(t, []string{"B:bcast10", "B:bcast11", "DOWN(B,left)"}, h.n("A").got)
}

// 8: a unicast is delivered after the broadcasts before it, and the
// broadcast after a unicast waits for every ack before the next one.
func TestUnicastAndBroadcastsKeepTheSendersOrder(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	b := h.n("B").g
	b.mandatory = false
	b.bcSndNxt = 5
	h.m("A", "B").bcRcvNxt = 5
	require.True(t, h.ucast("B", "A", 10)) // U(5)
	require.True(t, h.bcast("B", 10))      // B5: replicast with ack request
	require.False(t, h.bcast("B", 10), "B6 waits for the ack of B5")
	// B6 overtakes B5 at A: deliver B's unicast-path packets one by one,
	// with B6 injected between U(5) and B5.
	require.True(t, h.step("B", "A", false)) // U(5)
	b6 := &Header{Type: typeBcast, Seqno: 6}
	h.n("A").g.data(h.a("B"), b6, stack.NewMessage(h.a("A"), nil).PutHeader(stack.IDGROUPFC, b6))
	h.after("A")
	h.settle()
	require.Equal(t, []string{"B:ucast5", "B:bcast5", "B:bcast6"}, h.n("A").got)
	require.True(t, h.bcast("B", 10), "after the ack B may broadcast again")
}

// 9: broadcasts below the sync point are dropped; UP comes before the
// first one at or above it.
func TestUpComesBeforeTheFirstBroadcastAtTheSyncPoint(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	b := h.n("B").g
	b.bcSndNxt = 7
	joinAll(h, "A", "B")
	h.n("A").g.events = true
	old := &Header{Type: typeBcast, Seqno: 6}
	require.False(t, h.n("A").g.data(h.a("B"), old, stack.NewMessage(h.a("A"), nil).PutHeader(stack.IDGROUPFC, old)), "below the sync point")
	h2 := newHarness(t, 0, "A", "B")
	h2.n("B").g.bcSndNxt = 7
	h2.publish("A", "B")
	h2.settle()
	require.True(t, h2.bcast("B", 10))
	h2.settle()
	require.Equal(t, []string{"UP(B)", "B:bcast7"}, h2.n("A").got)
}

// 10: no use after delete: late messages after deletion are ignored, own
// leave purges every queue, a duplicate ACK counts once.
func TestNothingReachesADeletedMember(t *testing.T) {
	h := newHarness(t, 0, "A", "B", "C")
	joinAll(h, "A", "B", "C")
	a := h.n("A").g
	require.True(t, h.ucast("A", "B", 10))
	require.True(t, h.bcast("A", 10))
	require.Equal(t, 2, a.bcAckers)
	a.handleProto(h.a("B"), &Header{Type: typeAck, N: 2})
	a.handleProto(h.a("B"), &Header{Type: typeAck, N: 2})
	h.after("A")
	require.Equal(t, 1, a.bcAckers, "a duplicate ACK is a no-op")
	// C's broadcast sits in A's queue behind a gap; A leaves: all purged.
	hd := &Header{Type: typeBcast, Seqno: 5}
	require.True(t, a.data(h.a("C"), hd, stack.NewMessage(h.a("A"), nil).PutHeader(stack.IDGROUPFC, hd)))
	require.Len(t, h.m("A", "C").deferred, 1)
	c := h.m("A", "C")
	a.leaveAll()
	h.after("A")
	require.Empty(t, c.deferred, "own leave purges every deferred queue")
	require.Empty(t, a.members)
	a.handleProto(h.a("C"), &Header{Type: typeAdv, N: 65})
	a.handleProto(h.a("C"), &Header{Type: typeAck, N: 1})
	h.after("A")
	require.Empty(t, a.members)
}

// 11: many senders, one receiver: the JOINED path activates first and
// reclaims second; REMIT with messages unread gives REMITTED, then JOINED
// and the oldest PENDING goes ACTIVE; with nobody to reclaim from the
// oldest PENDING reverts to JOINED. Never more than max_active+1 active, and
// no window is overrun.
func TestManySendersOneReceiverReclaimAndRemit(t *testing.T) {
	names := []string{"R"}
	for i := range 8 {
		names = append(names, fmt.Sprint("S", i))
	}
	h := newHarness(t, 4, names...)
	joinAll(h, names...)
	r := h.n("R").g
	h.n("R").hold = true
	maxSeen := 0
	sent := map[string]int{}
	for round := range 30 {
		for _, s := range names[1:] {
			if h.ucast(s, "R", 1000) {
				sent[s]++
			}
		}
		h.settle()
		maxSeen = max(maxSeen, r.activeCnt)
		for _, m := range r.members {
			require.LessOrEqual(t, 0, m.advertised+advActive, "no window overrun")
		}
		for _, s := range names[1:] {
			require.GreaterOrEqual(t, h.m(s, "R").window, 0, "%s never overran R's window", s)
		}
		if round%3 == 2 {
			h.readHeld("R")
			h.n("R").hold = true
		}
	}
	h.readHeld("R")
	h.settle()
	require.LessOrEqual(t, maxSeen, 4+1, "at most max_active+1 active")
	require.Positive(t, r.reclaims, "R reclaimed")
	total := 0
	for _, n := range sent {
		total += n
	}
	require.Len(t, h.n("R").got, total, "every message delivered")
	for _, s := range names[1:] {
		require.Positive(t, sent[s], "%s got to send", s)
	}
}

// REMITTED, then JOINED with the oldest PENDING made ACTIVE (part of 11).
func TestRemitWithUnreadMessagesGoesRemittedThenJoined(t *testing.T) {
	h := newHarness(t, 4, "R", "V", "P")
	joinAll(h, "R", "V", "P")
	r := h.n("R").g
	v, p := h.m("R", "V"), h.m("R", "P")
	v.state, v.advertised = Reclaiming, 300
	r.activeCnt = 1
	p.state = Pending
	r.appendList(p, inPending)
	h.check()
	r.handleProto(h.a("V"), &Header{Type: typeRemit, N: 200})
	h.after("R")
	require.Equal(t, Remitted, v.state, "messages sent before the REMIT are unread")
	require.Equal(t, advIdle+100, v.advertised)
	r.read(v, 100*blockSize-hdrSize-1)
	h.after("R")
	require.Equal(t, Joined, v.state)
	require.Equal(t, Active, p.state, "the oldest pending member goes active")
	adv := h.uni[[2]stack.Address{h.a("R"), h.a("P")}]
	require.NotEmpty(t, adv)
	require.Equal(t, uint8(typeAdv), adv[len(adv)-1].h.Type)
}

// With nothing to reclaim from, the oldest PENDING reverts to JOINED with
// an ADV (part of 11).
func TestPendingRevertsToJoinedWhenNobodyCanBeReclaimed(t *testing.T) {
	h := newHarness(t, 1, "R", "A", "B", "C")
	joinAll(h, "R", "A", "B", "C")
	r := h.n("R").g
	a, b, c := h.m("R", "A"), h.m("R", "B"), h.m("R", "C")
	a.state = Reclaiming
	b.state = Remitted
	r.activeCnt = 2
	h.check()
	r.read(c, 1)
	h.after("R")
	require.Equal(t, Joined, c.state, "C could not go active and nobody is left to reclaim from")
	require.Empty(t, r.pending)
}

// A member that is in the view but whose JOIN never came (it crashed, or
// left, right after joining) was never UP at this member: its DOWN is not
// given to the application either (the chaos suite saw a lone DOWN).
func TestNoDownForAMemberThatWasNeverUp(t *testing.T) {
	h := newHarness(t, 0, "A", "B", "C")
	joinAll(h, "A", "B")
	a := h.n("A").g
	a.published(h.a("C")) // C is in A's view; its JOIN never comes
	h.after("A")
	a.withdrawn(h.a("C"), true) // and it crashes
	h.after("A")
	h.settle()
	for _, s := range h.n("A").got {
		require.NotContains(t, s, "(C", "A was told about C: %v", h.n("A").got)
	}
	require.Nil(t, h.m("A", "C"), "C is forgotten")
}

// A member's JOIN travels by reliable unicast and its broadcasts by
// reliable multicast, so a broadcast can come before the JOIN. It is held
// and delivered after the member's UP, not dropped (the chaos suite saw a
// late joiner's broadcast lost at one member).
func TestBroadcastAheadOfTheJoinIsDeliveredAfterUp(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	h.publish("A", "B") // the JOINs are on their way
	b := h.n("B").g
	// B's first broadcast after its JOIN to A (at the JOIN's sync point),
	// by multicast, comes to A before the JOIN.
	hd := &Header{Type: typeBcast, Seqno: b.bcSndNxt}
	a := h.n("A").g
	a.data(h.a("B"), hd, stack.NewMessage(h.a("A"), make([]byte, 10)).PutHeader(stack.IDGROUPFC, hd))
	h.after("A")
	h.settle()
	require.Equal(t, []string{"UP(B)", fmt.Sprintf("B:bcast%d", hd.Seqno)}, h.n("A").got)
}

// mcast multicasts size bytes from x to instance inst (as a broadcast that
// only inst's members deliver) if the windows allow it.
func (h *harness) mcast(x string, inst uint64, size int) bool {
	g := h.n(x).g
	blks := blocks(size)
	if g.bcCong(blks) {
		h.after(x)
		return false
	}
	hd := &Header{Type: typeMcast, Seqno: g.bcSndNxt, AckReq: g.mandatory, Instance: inst}
	for _, r := range g.sentBroadcast(blks, hd.AckReq) {
		k := [2]stack.Address{g.self, r.addr}
		h.uni[k] = append(h.uni[k], pkt{h: hd, payload: size})
	}
	if !hd.AckReq {
		for _, m := range g.members {
			if m.isReceiver() && m.addr != g.self {
				k := [2]stack.Address{g.self, m.addr}
				h.mc[k] = append(h.mc[k], pkt{h: hd, payload: size})
			}
		}
	}
	h.after(x)
	return true
}

// A multicast travels to every member as a broadcast and costs the
// sender's window at each. A member outside the instance does not deliver
// it but counts it as read, or it would never advertise again and the
// sender's broadcasts would block for good on its window.
func TestMulticastIsReadByMembersOutsideItsInstance(t *testing.T) {
	h := newHarness(t, 0, "S", "B", "C") // instances 1, 2, 3
	joinAll(h, "S", "B", "C")
	for i := range 200 {
		require.True(t, h.mcast("S", 2, 1000), "multicast %d to B's instance went out", i)
		h.settle()
	}
	require.Len(t, h.n("B").got, 200, "B delivered every multicast")
	require.Empty(t, h.n("C").got, "C delivered none")
	require.GreaterOrEqual(t, h.m("S", "C").window, advIdle, "C advertised again what it read")
}

// Two members each wait to send to the other, and neither has advertised
// to the other all it may (here both are PENDING at the other, whose reads
// there lower what was advertised and send no ADV). A blocked sender
// nudges the member it waits for with an ADV of its own receive window
// (spec §5, cong): each ADV unblocks the other side. Without the nudge
// both wait for good.
func TestBlockedSendersNudgeEachOtherWithAnAdv(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	for _, p := range [][2]string{{"A", "B"}, {"B", "A"}} {
		at, of := h.n(p[0]).g, h.m(p[0], p[1])
		of.state, of.advertised = Pending, 0
		at.appendList(of, inPending)
		peer := h.m(p[1], p[0])
		h.n(p[1]).g.updateMember(peer, peer.window) // it sent all it was given, and it was read
	}
	h.check()
	require.False(t, h.ucast("A", "B", 100), "A waits for B's window")
	require.False(t, h.ucast("B", "A", 100), "B waits for A's window")
	h.settle()
	require.True(t, h.ucast("A", "B", 100), "B's nudge gave A a window")
	require.True(t, h.ucast("B", "A", 100), "A's nudge gave B a window")
	h.settle()
}

// A member that leaves while A waits for its ACK of a broadcast is no
// longer waited for, though its DOWN is still held (for a broadcast of its
// own that A has not had yet): A's next broadcast does not block on it.
func TestMemberThatLeavesBeforeItsAckIsNotWaitedFor(t *testing.T) {
	h := newHarness(t, 0, "A", "B", "C")
	joinAll(h, "A", "B", "C")
	a := h.n("A").g
	c := h.n("C").g
	c.mandatory = false
	require.True(t, h.bcast("C", 10)) // late on the multicast path to A
	require.True(t, h.ucast("A", "B", 10))
	require.True(t, h.bcast("A", 10)) // a replicast with ack request
	require.Equal(t, 2, a.bcAckers)
	h.uni[[2]stack.Address{h.a("A"), h.a("C")}] = nil // C never gets it
	c.leaveAll()
	h.after("C")
	for h.step("C", "A", false) {
	}
	require.Equal(t, Leaving, h.m("A", "C").state, "C is LEAVING at A, its DOWN held")
	for h.step("A", "B", false) || h.step("B", "A", false) {
	}
	require.Zero(t, a.bcAckers, "B acked, C is not waited for")
	require.True(t, h.bcast("A", 10), "the next broadcast does not block")
}

// A sender that ignores the windows (B sends 2 MB of broadcasts that A
// never reads) cannot grow A's queues past max_unread_bytes: its excess
// is dropped and counted.
func TestSenderIgnoringTheWindowsIsDroppedBeyondMaxUnread(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	a := h.n("A").g
	a.maxUnread = 2 * advActive
	seq := h.n("B").g.bcSndNxt
	accepted := 0
	for range 2000 {
		hd := &Header{Type: typeBcast, Seqno: seq}
		if a.data(h.a("B"), hd, stack.NewMessage(h.a("A"), make([]byte, 1000)).PutHeader(stack.IDGROUPFC, hd)) {
			accepted++
			seq++
		}
	}
	require.Positive(t, a.overrunDrops, "the excess is dropped and counted")
	require.LessOrEqual(t, h.m("A", "B").unread, a.maxUnread, "unread blocks stay within the bound")
	require.Equal(t, 2*advActive/blocks(1000), accepted)
	require.LessOrEqual(t, a.unreadBytes, int64(a.maxUnread*blockSize))
}

// Members left out of each other's views (two subgroups at a cold start)
// and merged back: each side's earlier incarnation of the other ends with
// DOWN, after what it could still deliver, and a new one comes UP; a JOIN
// that arrives while the earlier incarnation is still LEAVING is kept for
// the next one. (Before, the JOIN was dropped as coming from a leaving
// member and the view's publish ignored a LEAVING member: the pair stayed
// PUBLISHED and LEAVING for ever, and a unicast failed with "no such
// member".)
func TestMembersMergedBackAreDownThenUpAgain(t *testing.T) {
	h := newHarness(t, 0, "B", "C")
	joinAll(h, "B", "C")
	require.True(t, h.ucast("C", "B", 10))
	h.settle()
	h.n("B").got = nil
	// Two subgroups: each view leaves the other out; no LEAVE comes.
	h.n("B").g.withdrawn(h.a("C"), false)
	h.after("B")
	h.n("C").g.withdrawn(h.a("B"), false)
	h.after("C")
	require.Equal(t, Leaving, h.m("B", "C").state)
	// The merge view reaches C first: its JOIN reaches B while B still
	// has C LEAVING.
	h.n("C").g.published(h.a("B"))
	h.after("C")
	require.True(t, h.step("C", "B", false))
	require.Equal(t, Leaving, h.m("B", "C").state, "the JOIN waits for the merge view at B")
	h.n("B").g.published(h.a("C"))
	h.after("B")
	h.settle()
	require.Equal(t, Joined, h.m("B", "C").state)
	require.Equal(t, Joined, h.m("C", "B").state)
	require.Equal(t, []string{"DOWN(C,lost)", "UP(C)"}, h.n("B").got)
	require.Equal(t, []string{"DOWN(B,lost)", "UP(B)"}, h.n("C").got)
	require.True(t, h.ucast("B", "C", 10), "B may send to C again")
	require.True(t, h.bcast("C", 10))
	h.settle()
	require.Equal(t, []string{"DOWN(C,lost)", "UP(C)", "C:bcast1"}, h.n("B").got)
	require.Equal(t, []string{"DOWN(B,lost)", "UP(B)", "B:ucast1"}, h.n("C").got)
}

// Only one side's view left the other out and brought it back: its JOIN
// reaches a member that still has it JOINED. That is its next incarnation:
// DOWN, then UP, and a JOIN back; the windows start afresh, not added to
// the old ones. (Before, the JOIN only grew the window: B saw A JOINED with
// an ever larger window, and A saw B PUBLISHED for ever.)
func TestJoinFromAJoinedMemberStartsItsNextIncarnation(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	h.n("A").g.withdrawn(h.a("B"), false)
	h.after("A")
	h.n("A").g.published(h.a("B"))
	h.after("A")
	h.settle()
	require.Equal(t, Joined, h.m("A", "B").state)
	require.Equal(t, Joined, h.m("B", "A").state)
	require.Equal(t, advIdle, h.m("B", "A").window, "the window of the new incarnation only")
	require.Equal(t, advIdle, h.m("A", "B").window)
	require.Equal(t, []string{"DOWN(B,lost)", "UP(B)"}, h.n("A").got)
	require.Equal(t, []string{"DOWN(A,lost)", "UP(A)"}, h.n("B").got)
	require.True(t, h.bcast("A", 10))
	h.settle()
	require.Equal(t, []string{"DOWN(A,lost)", "UP(A)", "A:bcast1"}, h.n("B").got)
}

// Two members that are PUBLISHED for each other (their JOINs are on the
// way) and both want to broadcast do not nudge each other with ADVs: an
// ADV of nothing only woke the other's sender, which nudged back, without
// end and in no time (a merge left pairs of members PUBLISHED while their
// JOINs were retransmitted; the chaos suite's virtual clock stood still).
func TestPublishedMembersDoNotNudgeEachOther(t *testing.T) {
	h := newHarness(t, 0, "X", "Y")
	h.publish("X", "Y")
	require.Equal(t, Published, h.m("X", "Y").state)
	require.False(t, h.bcast("X", 10), "blocked until Y's JOIN")
	require.False(t, h.ucast("X", "Y", 10), "blocked until Y's JOIN")
	require.Len(t, h.uni[[2]stack.Address{h.a("X"), h.a("Y")}], 1, "only the JOIN goes to Y: %v", h.uni[[2]stack.Address{h.a("X"), h.a("Y")}])
	h.settle()
	require.True(t, h.bcast("X", 10), "Y's JOIN opened the window")
}

// settleWithin is settle, failing the test after n packets: two members
// that answer each other for ever never settle.
func (h *harness) settleWithin(n int) {
	for moved := true; moved; {
		moved = false
		for _, x := range h.names() {
			for _, y := range h.names() {
				for h.step(x, y, false) || h.step(x, y, true) {
					moved = true
					if n--; n < 0 {
						h.t.Fatal("the members still send to each other: no end")
					}
				}
			}
		}
	}
}

// A JOIN of an earlier incarnation that comes late (its connection was
// repaired after a later one's) is ignored: its sync point is below the
// member's latest. Taken, it started a new incarnation below broadcasts
// already delivered, and its reply started the next, without end (seen in
// scenario E: A and D sent each other JOINs in no time, for ever).
func TestLateJoinOfAnEarlierIncarnationIsIgnored(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	for range 2 {
		require.True(t, h.bcast("A", 10))
		h.settle()
	}
	h.n("B").got = nil
	b := h.n("B").g
	before := h.m("B", "A")
	b.handleProto(h.a("A"), &Header{Type: typeJoin, Seqno: 1, Instance: 1, N: advIdle})
	h.after("B")
	h.settleWithin(100)
	require.Same(t, before, h.m("B", "A"), "the same incarnation")
	require.Empty(t, h.n("B").got, "no DOWN and UP for a stale JOIN")
	require.Equal(t, int64(1), b.staleJoins)
	require.True(t, h.bcast("A", 10))
	h.settleWithin(100)
	require.Equal(t, []string{"A:bcast3"}, h.n("B").got)
}

// A JOIN of the incarnation a member is paired with already (its
// reply, which crossed this member's, or the JOIN overtaken by the reply:
// INTERNAL messages run on parallel workers) adds its window and starts
// nothing; before incarnation numbers, a reply taken as a new incarnation
// was answered by another, without end.
func TestJoinOfTheSameIncarnationOnlyAddsItsWindow(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	b := h.n("B").g
	m := h.m("B", "A")
	w := m.window
	b.handleProto(h.a("A"), &Header{Type: typeJoin, Seqno: h.n("A").g.bcSndNxt, Instance: 1, N: 7, Reply: true, Inc: h.m("A", "B").inc})
	h.after("B")
	h.settleWithin(100)
	require.Same(t, m, h.m("B", "A"), "the same incarnation")
	require.Equal(t, w+7, m.window)
	require.Empty(t, h.n("B").got)
}

// A joins H; H's JOIN back is lost with its connection when H's view drops
// A, and H's next view has A again: H's new incarnation of A sends a new
// JOIN, to which A, which had H PUBLISHED all along (its own JOIN went to
// H's earlier incarnation), must answer with a JOIN, not an ADV, or H
// waits for one for ever (seen in scenario E: H saw A PUBLISHED, A saw H
// ACTIVE with window 0, and A's broadcasts stopped).
func TestJoinToAnEarlierIncarnationIsAnsweredAgain(t *testing.T) {
	h := newHarness(t, 0, "A", "H")
	a, hh := h.n("A").g, h.n("H").g
	a.published(h.a("H"))
	h.after("A")
	require.True(t, h.step("A", "H", false)) // H takes A's JOIN: JOINING
	hh.published(h.a("A"))                   // H's view has A: JOINED, JOIN back
	h.after("H")
	h.uni[[2]stack.Address{h.a("H"), h.a("A")}] = nil // lost with its connection
	hh.withdrawn(h.a("A"), false)
	h.after("H")
	hh.lost(h.m("H", "A")) // leave_timeout
	h.after("H")
	require.Nil(t, h.m("H", "A"))
	hh.published(h.a("A")) // back in H's view
	h.after("H")
	h.settleWithin(100)
	require.Equal(t, Joined, h.m("A", "H").state)
	require.Equal(t, Joined, h.m("H", "A").state, "H got a JOIN of A for its new incarnation")
	require.True(t, h.bcast("A", 10), "A may broadcast to H")
}

// A member that leaves the view before its JOIN came here was never UP:
// its data is not delivered, before or at its end (seen in scenario E: A
// delivered a message from D with no UP before it, when D's broadcast
// reached A after A's view had dropped D again).
func TestDataFromAMemberThatNeverJoinedIsNotDelivered(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	a := h.n("A").g
	a.published(h.a("B"))
	h.after("A")
	a.withdrawn(h.a("B"), false)
	h.after("A")
	msg := func(seq uint64) *stack.Message {
		hd := &Header{Type: typeBcast, Seqno: seq}
		return stack.NewMessage(h.a("A"), make([]byte, 10)).PutHeader(stack.IDGROUPFC, hd)
	}
	require.False(t, a.data(h.a("B"), msg(5).Header(stack.IDGROUPFC).(*Header), msg(5)), "not taken")
	a.lost(h.m("A", "B"))
	h.after("A")
	require.Empty(t, h.n("A").got)
}

// A's reply to B's JOIN of a new incarnation goes by unicast and A's next
// broadcast by multicast: the broadcast reaches B first and B's earlier
// incarnation of A delivers it. B's new incarnation of A must start after
// it, not at the reply's sync point, or it waits for it for ever (seen in
// scenario E: E saw A JOINED, its queue waiting for broadcast 41, which
// its previous incarnation of A had delivered).
func TestBroadcastThatOvertookAJoinIsNotAwaitedAgain(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	a := h.n("A").g
	// B's view dropped A and has it again: its new incarnation's JOIN.
	a.handleProto(h.a("B"), &Header{Type: typeJoin, Seqno: h.n("B").g.bcSndNxt, Instance: 2, N: advIdle, Inc: h.m("B", "A").inc + 1})
	h.after("A")
	require.Equal(t, Joined, h.m("A", "B").state)
	a.mandatory = false
	require.True(t, h.bcast("A", 10))
	require.True(t, h.step("A", "B", true), "the broadcast first")
	h.settleWithin(100)
	a.mandatory = false
	require.True(t, h.bcast("A", 10))
	h.settleWithin(100)
	require.Equal(t, []string{"A:bcast1", "DOWN(A,lost)", "UP(A)", "A:bcast2"}, h.n("B").got)
}

// A member lost with broadcasts held behind a gap delivers them, skipping
// the gap, and its next incarnation starts right after the last of them,
// not beyond. lost() used to set the next seqno to the highest held and
// then count every held broadcast on top of it: the next incarnation began
// past broadcasts not yet sent, dropped them as old and never acked the
// replicast among them, and the sender blocked for ever (scenario E, seed
// 91: A's 42 dropped at H, whose incarnation of A had reached 52).
func TestLostMemberEndsRightAfterItsLastBroadcast(t *testing.T) {
	h := newHarness(t, 0, "A", "B")
	joinAll(h, "A", "B")
	b := h.n("B").g
	b.mandatory = false
	for range 3 {
		require.True(t, h.bcast("B", 10))
	}
	k := [2]stack.Address{h.a("B"), h.a("A")}
	h.mc[k] = h.mc[k][1:] // the first never comes: a gap below the other two
	require.True(t, h.step("B", "A", true))
	require.True(t, h.step("B", "A", true))
	h.n("A").g.withdrawn(h.a("B"), true)
	h.after("A")
	require.Equal(t, []string{"B:bcast2", "B:bcast3", "DOWN(B,lost)"}, h.n("A").got)
	require.Equal(t, b.bcSndNxt, h.n("A").g.bcDone[h.a("B")], "the next incarnation starts at B's next broadcast")

	// B comes back: its JOIN carries its next broadcast's seqno, and that
	// broadcast (a replicast with ack request) is delivered and acked.
	h.n("A").got = nil
	h.n("A").g.handleProto(h.a("B"), &Header{Type: typeJoin, Seqno: b.bcSndNxt, Instance: 2, N: advIdle, Inc: 2})
	h.after("A")
	h.n("A").g.published(h.a("B"))
	h.after("A")
	b.mandatory = true
	require.True(t, h.bcast("B", 10))
	require.True(t, h.step("B", "A", false))
	require.Equal(t, []string{"UP(B)", "B:bcast4"}, h.n("A").got)
}
