// Package gms is GMS, group membership: it turns discovery, suspicions and
// join, leave and merge requests into views that every member installs in
// the same order.
//
// The first member of a view is its coordinator. A joiner finds the
// coordinator through discovery and asks it to join; the coordinator
// bundles the joins, leaves and suspicions that arrive close together into
// one new view, installs it, multicasts it, answers each joiner with the
// view and the reliable-multicast digest, and waits until every member has
// acknowledged it (sending it again every view_ack_timeout to the members
// that have not, until they do, are suspected, or max_view_ack_wait ends).
// If the coordinator leaves or is suspected, the next member of the view
// takes over. MERGE3 below reports
// other subgroups after a partition; the merge leader gathers their views
// and digests and installs one merge view on every member.
package gms

import (
	"cmp"
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

// Config configures GMS.
type Config struct {
	JoinTimeout      time.Duration `toml:"join_timeout" doc:"how long one join attempt waits for the coordinator's answer"`
	MaxJoinAttempts  int           `toml:"max_join_attempts" doc:"join attempts before the member gives up and starts a group of its own (0: never)"`
	ViewAckTimeout   time.Duration `toml:"view_ack_timeout" doc:"how long the coordinator waits for a view's acknowledgements before it sends the view again to the members that have not acknowledged it"`
	MaxViewAckWait   time.Duration `toml:"max_view_ack_wait" doc:"longest the coordinator waits for every member to acknowledge a view; a member suspected meanwhile is no longer awaited"`
	LeaveTimeout     time.Duration `toml:"leave_timeout" doc:"how long a leaving member waits for the coordinator to confirm"`
	MaxBundlingTime  time.Duration `toml:"max_bundling_time" doc:"requests arriving within this time of each other go into one view change"`
	MergeTimeout     time.Duration `toml:"merge_timeout" doc:"how long a merge leader waits for the other coordinators' views"`
	PrintLocalAddr   bool          `toml:"print_local_addr" doc:"log the member's address and view when it has joined"`
	DiscoveryTimeout time.Duration `toml:"discovery_timeout" doc:"how long a join's discovery round lasts (0: the discovery protocol's timeout)"`
}

// DefaultConfig returns GMS's defaults (JGroups' udp.xml where it has them).
func DefaultConfig() Config {
	return Config{
		JoinTimeout: 2 * time.Second, MaxJoinAttempts: 10, ViewAckTimeout: 2 * time.Second, MaxViewAckWait: 30 * time.Second,
		LeaveTimeout: time.Second, MaxBundlingTime: 50 * time.Millisecond, MergeTimeout: 5 * time.Second,
		PrintLocalAddr: true,
	}
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.JoinTimeout <= 0:
		return stack.BadKey("join_timeout", "must be > 0, got %s", c.JoinTimeout)
	case c.MaxJoinAttempts < 0:
		return stack.BadKey("max_join_attempts", "must be >= 0 (0: never give up), got %d", c.MaxJoinAttempts)
	case c.ViewAckTimeout <= 0:
		return stack.BadKey("view_ack_timeout", "must be > 0, got %s", c.ViewAckTimeout)
	case c.MaxViewAckWait < c.ViewAckTimeout:
		return stack.BadKey("max_view_ack_wait", "(%s) must be at least view_ack_timeout (%s)", c.MaxViewAckWait, c.ViewAckTimeout)
	case c.LeaveTimeout <= 0:
		return stack.BadKey("leave_timeout", "must be > 0, got %s", c.LeaveTimeout)
	case c.MaxBundlingTime < 0:
		return stack.BadKey("max_bundling_time", "must be >= 0, got %s", c.MaxBundlingTime)
	case c.MergeTimeout <= 0:
		return stack.BadKey("merge_timeout", "must be > 0, got %s", c.MergeTimeout)
	case c.DiscoveryTimeout < 0:
		return stack.BadKey("discovery_timeout", "must be >= 0, got %s", c.DiscoveryTimeout)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "GMS", ID: stack.IDGMS,
		Provides: []stack.Service{stack.ServiceMembership},
		Requires: []stack.Service{stack.ServiceDiscovery, stack.ServiceReliableMulticast, stack.ServiceReliableUnicast},
		Doc:      "group membership: joins, leaves, suspicions and merges become views installed everywhere in the same order",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{ID: stack.IDGMS, Name: "GMS", Decode: decodeHeader, Samples: sampleHeaders})
}

// ErrLeft is returned by calls that need a view after the member left.
var ErrLeft = errors.New("gms: not a member")

type reqKind uint8

const (
	reqJoin reqKind = iota + 1
	reqLeave
	reqSuspect
	reqMerge
	reqRefresh // a new view of the same members, above a view id another member holds
)

type request struct {
	kind   reqKind
	addr   stack.Address
	coords []stack.Address // reqMerge
	state  bool            // reqJoin: the joiner fetches the state in the view's flush
	above  uint64          // reqRefresh: the new view's number goes above this
}

// ackWait collects the acknowledgements of one view.
type ackWait struct {
	id      stack.ViewID
	missing map[stack.Address]bool
	done    chan struct{}
}

// mergeState is a coordinator's part in one merge.
type mergeState struct {
	id    MergeID
	until time.Time
	rsps  chan *mergeRsp         // the leader's; nil for a participant
	asked map[stack.Address]bool // the leader's: coordinators yet to answer; guarded by GMS.mu
}

type mergeRsp struct {
	from stack.Address
	h    *Header
}

// GMS is the group membership protocol.
type GMS struct {
	stack.Base
	cfg Config

	installMu sync.Mutex // one view installed at a time, in order

	mu       sync.Mutex
	view     *stack.View
	leaving  bool
	suspects map[stack.Address]bool
	// joinDigests: the digest each joiner of view joinView was answered
	// with, for answering again a joiner whose answer was lost.
	joinDigests  map[stack.Address]stack.Digest
	joinView     stack.ViewID
	viewDigest   stack.Digest // the digest the current view came with (a merge), for members that missed it
	viewDigestID stack.ViewID
	// joinWithState: this member's JOIN_REQ asks to fetch the state in the
	// join's flush (Channel.ConnectWithState).
	joinWithState atomic.Bool
	reqs          []request
	acks          *ackWait
	merge         *mergeState
	mergeN        uint64
	joinRsp       chan *Header
	askedCoord    stack.Address // whom askToJoin waits for; guarded by mu
	leaveDone     chan struct{}
	wake          chan struct{}

	viewsInstalled, joinsHandled, leavesHandled, suspectsHandled, merges, mergesFailed,
	ackTimeouts, viewsIgnored, msgsIgnored, takeovers, flushFailures, flushExclusions, viewsResent atomic.Int64
}

var (
	_ stack.Protocol      = (*GMS)(nil)
	_ stack.ViewInstaller = (*GMS)(nil)
)

// New returns a GMS layer.
func New(cfg Config) *GMS { return &GMS{cfg: cfg} }

// Name returns "GMS".
func (g *GMS) Name() string { return "GMS" }

// Init validates the config.
func (g *GMS) Init() error { return g.cfg.Validate() }

// Start resets the membership state and starts the view handler.
func (g *GMS) Start() error {
	g.mu.Lock()
	g.view, g.leaving, g.acks, g.merge = nil, false, nil, nil
	g.suspects = map[stack.Address]bool{}
	g.reqs = nil
	g.joinRsp = make(chan *Header, 16)
	g.leaveDone = make(chan struct{})
	g.wake = make(chan struct{}, 1)
	g.mu.Unlock()
	g.Go(g.handler)
	return nil
}

// View returns the current view (nil before the first).
func (g *GMS) View() *stack.View {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.view
}

// IsCoordinator reports whether this member coordinates its view.
func (g *GMS) IsCoordinator() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.view != nil && g.coordLocked() == g.LocalAddress()
}

// coordLocked returns the first member of the view that is neither
// suspected nor leaving: the member that acts as coordinator.
func (g *GMS) coordLocked() stack.Address {
	for _, m := range g.view.Members {
		if !g.suspects[m] {
			return m
		}
	}
	return stack.Address{}
}

// ---- sending

func (g *GMS) send(dest stack.Address, h *Header) {
	flags := stack.Internal | stack.OOB
	if h.Type == typeView {
		// A view is ordered after the coordinator's earlier multicasts.
		flags = stack.Internal
	}
	m := stack.NewMessage(dest, nil).Set(flags)
	m.PutHeader(g.ID(), h)
	if err := g.PassDown(context.Background(), m); err != nil && !errors.Is(err, stack.ErrClosed) {
		g.Log().Debug("gms: send failed", "type", h.Kind(), "to", dest, "error", err)
	}
}

func (g *GMS) digest() stack.Digest {
	v, err := g.PassDownEvent(context.Background(), stack.Ev(stack.EvGetDigest, nil))
	if err != nil {
		return nil
	}
	d, _ := v.(stack.Digest)
	return d
}

// ---- installing views

// InstallView installs v on this member as if it came from a coordinator
// (tests inject views through it).
func (g *GMS) InstallView(ctx context.Context, v *stack.View) error {
	g.install(v, nil)
	return nil
}

// install applies v (and the digest entries of senders new to this member)
// unless it is not newer than the current view. It reports whether it did.
func (g *GMS) install(v *stack.View, d stack.Digest) bool {
	g.installMu.Lock()
	defer g.installMu.Unlock()
	g.mu.Lock()
	old := g.view
	if old != nil && !newer(v, old) {
		g.mu.Unlock()
		g.viewsIgnored.Add(1)
		return false
	}
	g.mu.Unlock()
	if d != nil {
		// Kept for members that miss this view and get it again later
		// (EvViewInconsistent): they need the same starting points.
		g.mu.Lock()
		g.viewDigest, g.viewDigestID = d, v.ID
		g.mu.Unlock()
		var fresh stack.Digest
		for _, e := range d {
			if !old.Contains(e.Member) && e.Member != g.LocalAddress() {
				fresh = append(fresh, e)
			}
		}
		if len(fresh) > 0 {
			_, _ = g.PassDownEvent(context.Background(), stack.Ev(stack.EvSetDigest, fresh))
		}
	}
	g.mu.Lock()
	g.view = v
	for a := range g.suspects {
		if !v.Contains(a) {
			delete(g.suspects, a)
		}
	}
	pending := len(g.reqs) > 0
	coord := g.coordLocked() == g.LocalAddress()
	g.mu.Unlock()
	g.viewsInstalled.Add(1)
	// Down to the layers below, then up through the layers above to the
	// channel: each layer sees the view once.
	_, _ = g.PassDownEvent(context.Background(), stack.Ev(stack.EvViewChange, v))
	_, _ = g.PassUpEvent(stack.Ev(stack.EvViewChange, v))
	if pending && coord {
		g.kick()
	}
	return true
}

// newer reports whether v replaces cur: views move forward only, in the
// order of their ids (sequence number, then creator). Two coordinators
// that made a view of the same number (one left, its last view lost on
// the other) are mended by a new view above both, when MERGE3 finds that
// members of one view hold different ids (EvViewInconsistent).
func newer(v, cur *stack.View) bool { return v.ID.Compare(cur.ID) > 0 }

// ---- the coordinator's view handler

func (g *GMS) enqueue(r request) {
	g.mu.Lock()
	g.reqs = append(g.reqs, r)
	g.mu.Unlock()
	g.kick()
}

func (g *GMS) kick() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// handler runs the coordinator's work: it bundles the requests that arrive
// within max_bundling_time into one view change.
func (g *GMS) handler(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-g.wake:
		}
		if g.cfg.MaxBundlingTime > 0 && !sleep(done, g.cfg.MaxBundlingTime) {
			return
		}
		if !g.waitMerge(done) {
			return
		}
		g.mu.Lock()
		reqs := g.reqs
		g.reqs = nil
		g.mu.Unlock()
		g.process(reqs)
	}
}

func sleep(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}

// waitMerge holds the handler while this member takes part in another
// leader's merge (until the merge view comes or the merge times out).
func (g *GMS) waitMerge(done <-chan struct{}) bool {
	for {
		g.mu.Lock()
		ms := g.merge
		if ms != nil && ms.rsps == nil && !time.Now().Before(ms.until) {
			g.merge, ms = nil, nil
		}
		g.mu.Unlock()
		if ms == nil || ms.rsps != nil {
			return true
		}
		if !sleep(done, time.Until(ms.until)+time.Millisecond) {
			return false
		}
	}
}

func (g *GMS) process(reqs []request) {
	self := g.LocalAddress()
	g.mu.Lock()
	v := g.view
	if v == nil || g.coordLocked() != self {
		g.mu.Unlock()
		return
	}
	if v.Coordinator() != self {
		g.takeovers.Add(1)
		g.Log().Info("taking over as coordinator", "view", v, "suspected", v.Coordinator())
	}
	var joiners, leavers, merges []request
	var above uint64 // a member holds a view of this number that this coordinator never installed
	refresh := false
	for _, r := range reqs {
		switch r.kind {
		case reqRefresh:
			refresh, above = true, max(above, r.above)
		case reqJoin:
			joiners = append(joiners, r)
		case reqLeave:
			leavers = append(leavers, r)
		case reqMerge:
			merges = append(merges, r)
		}
	}
	gone := map[stack.Address]bool{}
	for a := range g.suspects {
		gone[a] = true
	}
	var leaving []stack.Address // graceful leavers, not crashed ones
	for _, r := range leavers {
		gone[r.addr] = true
		if !g.suspects[r.addr] && v.Contains(r.addr) {
			leaving = append(leaving, r.addr)
		}
	}
	var members []stack.Address
	for _, m := range v.Members {
		if !gone[m] {
			members = append(members, m)
		}
	}
	var newJoiners, rejoiners, stateJoiners []stack.Address
	for _, r := range joiners {
		switch {
		case v.Contains(r.addr) && !gone[r.addr]:
			rejoiners = append(rejoiners, r.addr)
		case !slices.Contains(members, r.addr) && !gone[r.addr]:
			members = append(members, r.addr)
			newJoiners = append(newJoiners, r.addr)
			if r.state {
				stateJoiners = append(stateJoiners, r.addr)
			}
		}
	}
	g.mu.Unlock()
	g.joinsHandled.Add(int64(len(joiners)))
	g.leavesHandled.Add(int64(len(leavers)))

	if len(members) != len(v.Members) || len(newJoiners) > 0 || refresh {
		nv := stack.NewView(self, max(v.ID.Seq, above)+1, members...)
		g.cast(nv, newJoiners, leaving, stateJoiners)
	}
	if len(rejoiners) > 0 {
		// Already members (the coordinator that took them in crashed before
		// it answered): answer with the view they are in.
		// A joiner whose answer was lost gets the digest of the view it
		// joined in, not today's: it must deliver what was sent since.
		cur, d := g.View(), g.digest()
		for _, a := range rejoiners {
			g.mu.Lock()
			jd, ok := g.joinDigests[a]
			g.mu.Unlock()
			if !ok || cur.ID != g.joinView {
				jd = d
			}
			g.send(a, &Header{Type: typeJoinRsp, View: cur, Digest: jd})
		}
	}
	for _, r := range leavers {
		if r.addr != self {
			g.send(r.addr, &Header{Type: typeLeaveRsp})
		} else {
			g.leftGroup()
		}
	}
	if len(merges) > 0 {
		g.runMerge(merges[len(merges)-1].coords)
	}
}

// cast installs nv here (unless this coordinator is leaving it), multicasts
// it, answers the joiners, and waits for every member's acknowledgement.
// Graceful leavers take part in the flush before the view that drops them;
// the flush stops only when the state joiners have fetched the state.
func (g *GMS) cast(nv *stack.View, joiners, leaving, stateJoiners []stack.Address) {
	self := g.LocalAddress()
	// With FLUSH above, the members that stay block and deliver the same
	// messages before the view changes (without it the event reaches the
	// channel, which ignores it). A leaver blocks too, so that what it sent
	// in this view reaches all or none of those that stay.
	var parts []stack.Address
	for _, m := range g.View().Members {
		if nv.Contains(m) || slices.Contains(leaving, m) {
			parts = append(parts, m)
		}
	}
	res, err := g.PassUpEvent(stack.Ev(stack.EvStartFlush, stack.FlushRequest{Participants: parts, ViewChange: true}))
	if err != nil {
		g.flushFailures.Add(1)
		g.Log().Warn("installing the view without a completed flush", "view", nv, "error", err)
	}
	var excluded []stack.Address
	if fr, ok := res.(stack.FlushResult); ok && len(fr.Without) > 0 {
		// The flush went on without members that did not answer: they were
		// unblocked, may have sent since, and are not in the cut the others
		// agreed on. Keeping them would let the others deliver those
		// messages in the new view; they are excluded, and merge back.
		members := slices.DeleteFunc(slices.Clone(nv.Members), func(a stack.Address) bool {
			if slices.Contains(fr.Without, a) {
				excluded = append(excluded, a)
				return true
			}
			return false
		})
		if len(members) != len(nv.Members) {
			g.Log().Warn("excluding members the flush went on without", "view", nv, "excluded", fr.Without)
			g.flushExclusions.Add(int64(len(nv.Members) - len(members)))
			nv = stack.NewView(nv.ID.Creator, nv.ID.Seq, members...)
		}
	}
	defer func() {
		if err == nil { // a failed start left no round of GMS's to stop
			_, _ = g.PassUpEvent(stack.Ev(stack.EvStopFlush, stack.FlushRequest{Participants: joiners, AwaitState: stateJoiners, View: nv, ViewChange: true}))
		}
	}()
	expect := map[stack.Address]bool{}
	for _, m := range nv.Members {
		if m != self {
			expect[m] = true
		}
	}
	// An excluded member is told too, as reliably as the members: until it
	// knows, its NAKACK holds the others' next messages, which it could
	// only deliver in the old view. It acknowledges and goes on alone.
	for _, m := range excluded {
		expect[m] = true
	}
	aw := &ackWait{id: nv.ID, missing: expect, done: make(chan struct{})}
	g.mu.Lock()
	g.acks = aw
	if len(expect) == 0 {
		close(aw.done)
	}
	g.mu.Unlock()
	if nv.Contains(self) {
		g.install(nv, nil)
	}
	vh := &Header{Type: typeView, View: nv}
	g.send(stack.Address{}, vh)
	if len(joiners) > 0 {
		d := g.digest()
		g.mu.Lock()
		g.joinDigests, g.joinView = map[stack.Address]stack.Digest{}, nv.ID
		for _, j := range joiners {
			g.joinDigests[j] = d
		}
		g.mu.Unlock()
		for _, j := range joiners {
			g.send(j, &Header{Type: typeJoinRsp, View: nv, Digest: d})
		}
	}
	g.waitAcks(aw, func(a stack.Address) {
		// A joiner ignores views until it has joined: it gets its answer
		// again, with the digest of the view it joined in.
		if slices.Contains(joiners, a) {
			g.mu.Lock()
			d := g.joinDigests[a]
			g.mu.Unlock()
			g.send(a, &Header{Type: typeJoinRsp, View: nv, Digest: d})
			return
		}
		g.send(a, vh)
	})
}

// waitAcks waits until every member of the view has acknowledged it. The
// members that have not get the view again (resend, by reliable unicast) every
// view_ack_timeout: a coordinator that went on without them would let the
// others unblock and send in the new view while they are still in the old
// one (and a leaving coordinator would leave them there for good). A member
// suspected meanwhile is no longer awaited; max_view_ack_wait bounds it all.
func (g *GMS) waitAcks(aw *ackWait, resend func(stack.Address)) {
	t := time.NewTicker(g.cfg.ViewAckTimeout)
	defer t.Stop()
	until := time.Now().Add(g.cfg.MaxViewAckWait)
	defer func() {
		g.mu.Lock()
		if g.acks == aw {
			g.acks = nil
		}
		g.mu.Unlock()
	}()
	for {
		select {
		case <-aw.done:
			return
		case <-g.Done():
			return
		case <-t.C:
		}
		g.mu.Lock()
		var missing []stack.Address
		for a := range aw.missing {
			missing = append(missing, a)
		}
		g.mu.Unlock()
		g.ackTimeouts.Add(1)
		if !time.Now().Before(until) {
			g.Log().Warn("view not acknowledged by every member within max_view_ack_wait", "view", aw.id, "missing", missing, "max_view_ack_wait", g.cfg.MaxViewAckWait)
			return
		}
		g.Log().Info("view not acknowledged within view_ack_timeout; sending it again", "view", aw.id, "missing", missing, "timeout", g.cfg.ViewAckTimeout)
		for _, a := range missing {
			g.viewsResent.Add(1)
			resend(a)
		}
	}
}

func (g *GMS) ack(from stack.Address, id stack.ViewID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	aw := g.acks
	if aw == nil || aw.id != id || !aw.missing[from] {
		return
	}
	delete(aw.missing, from)
	if len(aw.missing) == 0 {
		close(aw.done)
	}
}

// ---- receiving

// Up handles GMS messages; others pass.
func (g *GMS) Up(m *stack.Message) {
	h, ok := m.Header(g.ID()).(*Header)
	if !ok {
		g.PassUp(m)
		return
	}
	g.handle(m.Src, h)
}

func (g *GMS) handle(src stack.Address, h *Header) {
	self := g.LocalAddress()
	if src == self && h.Type != typeView {
		return
	}
	switch h.Type {
	case typeJoinReq:
		g.mu.Lock()
		v := g.view
		coord := stack.Address{}
		if v != nil {
			coord = g.coordLocked()
		}
		g.mu.Unlock()
		if v == nil {
			g.msgsIgnored.Add(1)
			return
		}
		if coord != self {
			g.send(src, &Header{Type: typeJoinRsp, Coord: coord, Fail: "not the coordinator"})
			return
		}
		g.enqueue(request{kind: reqJoin, addr: src, state: h.State})
	case typeJoinRsp:
		g.mu.Lock()
		asked := g.askedCoord
		g.mu.Unlock()
		if src != asked {
			g.msgsIgnored.Add(1) // not the member this one asked to join
			return
		}
		select {
		case g.joinRsp <- h:
		default:
		}
	case typeView:
		g.handleView(src, h.View, nil)
	case typeInstallView:
		g.handleView(src, h.View, h.Digest)
	case typeViewAck:
		g.ack(src, h.ViewID)
	case typeLeaveReq:
		g.enqueue(request{kind: reqLeave, addr: src})
	case typeLeaveRsp:
		g.leftGroup()
	case typeMergeReq:
		g.handleMergeReq(src, h)
	case typeMergeRsp:
		// One answer from each coordinator asked: any other is stray or
		// forged (merge ids are not secret).
		g.mu.Lock()
		ms := g.merge
		ok := ms != nil && ms.rsps != nil && ms.id == h.MergeID && ms.asked[src]
		if ok {
			delete(ms.asked, src)
		}
		g.mu.Unlock()
		g.Log().Debug("gms: merge response", "from", src, "merge", h.MergeID, "taken", ok)
		if !ok {
			g.msgsIgnored.Add(1)
			return
		}
		select {
		case ms.rsps <- &mergeRsp{from: src, h: h}:
		default:
		}
	case typeCancelMerge:
		g.mu.Lock()
		if g.merge != nil && g.merge.id == h.MergeID && g.merge.rsps == nil {
			g.merge = nil
		}
		g.mu.Unlock()
		g.kick()
	}
}

func (g *GMS) handleView(src stack.Address, v *stack.View, d stack.Digest) {
	self := g.LocalAddress()
	if v == nil {
		return
	}
	g.mu.Lock()
	cur, leaving := g.view, g.leaving
	g.mu.Unlock()
	if cur == nil {
		// Still joining: the view comes with the join answer.
		g.msgsIgnored.Add(1)
		return
	}
	// A view comes from a member of the current view or of the view itself
	// (a merge leader); one that excludes this member only from a member of
	// the current view. Anything else is forged or stray.
	// A merge view that names this member's view as one of its subgroups
	// but leaves this member out (the merge's flush went on without it)
	// comes from a leader outside that view, and is this member's exclusion.
	named := v.IsMerge() && slices.ContainsFunc(v.Subgroups, func(s *stack.View) bool { return s.ID == cur.ID })
	if src != self && !cur.Contains(src) && (!v.Contains(src) || !v.Contains(self)) && !(named && !v.Contains(self)) {
		g.msgsIgnored.Add(1)
		return
	}
	if !v.Contains(self) {
		if !newer(v, cur) || src == self {
			return
		}
		if leaving {
			g.leftGroup()
			return
		}
		// Excluded (suspected while alive, or left out of a flush): say
		// so to the coordinator, which waits for it, and carry on alone;
		// MERGE3 brings this member back.
		if !v.IsMerge() {
			g.send(src, &Header{Type: typeViewAck, ViewID: v.ID})
		}
		g.Log().Warn("excluded from the view; continuing as a group of one until a merge", "view", v)
		g.install(stack.NewView(self, v.ID.Seq+1, self), nil)
		return
	}
	if src != self {
		g.install(v, d)
	}
	g.mu.Lock()
	now := g.view
	g.mu.Unlock()
	if now != nil && now.ID == v.ID && src != self {
		g.send(src, &Header{Type: typeViewAck, ViewID: v.ID})
	}
	if d != nil {
		g.mu.Lock()
		if g.merge != nil && g.merge.rsps == nil && g.merge.id.Leader == src {
			g.merge = nil
		}
		g.mu.Unlock()
	}
}

func (g *GMS) leftGroup() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.leaving {
		return
	}
	select {
	case <-g.leaveDone:
	default:
		close(g.leaveDone)
	}
}

// UpEvent takes suspicions and merge requests.
func (g *GMS) UpEvent(ev stack.Event) (any, error) {
	switch ev.Type {
	case stack.EvSuspect:
		as, _ := ev.Arg.([]stack.Address)
		g.suspect(as)
		// Layers above (GROUPFC) learn that these members' nodes are down.
		return g.PassUpEvent(ev)
	case stack.EvUnsuspect:
		if a, ok := ev.Arg.(stack.Address); ok {
			g.mu.Lock()
			delete(g.suspects, a)
			g.mu.Unlock()
		}
		return g.PassUpEvent(ev)
	case stack.EvJoinRefused:
		// A layer below (AUTH) says the coordinator refused this member
		// for good: the join ends with its reason.
		if r, ok := ev.Arg.(stack.JoinRefused); ok && r.Reason != nil {
			g.mu.Lock()
			asked := g.askedCoord
			g.mu.Unlock()
			if r.By == asked {
				select {
				case g.joinRsp <- &Header{Type: typeJoinRsp, Fail: r.Reason.Error(), refused: r.Reason}:
				default:
				}
			}
		}
		return nil, nil
	case stack.EvMerge:
		coords, _ := ev.Arg.([]stack.Address)
		if len(coords) > 1 {
			g.enqueue(request{kind: reqMerge, coords: coords})
		}
		return nil, nil
	case stack.EvViewInconsistent:
		inc, _ := ev.Arg.(stack.ViewInconsistency)
		g.mu.Lock()
		v := g.view
		g.mu.Unlock()
		if v == nil || v.Coordinator() != g.LocalAddress() {
			return nil, nil
		}
		// Members that missed a view get the current one by unicast
		// (reliable); a view this coordinator never installed is overtaken
		// by a new one above it.
		// A merge view goes again with the digest it came with: a member
		// that missed it must start the other subgroups' senders where the
		// others did, not at seqno 0, or it waits for ever for messages
		// purged long ago. Any other view goes as it went, bare: its new
		// members are joiners, whose messages start at seqno 1.
		g.mu.Lock()
		h := &Header{Type: typeView, View: v}
		if g.viewDigestID == v.ID {
			h = &Header{Type: typeInstallView, View: v, Digest: g.viewDigest}
		}
		g.mu.Unlock()
		for _, a := range inc.Behind {
			if v.Contains(a) && a != g.LocalAddress() {
				g.viewsResent.Add(1)
				g.send(a, h)
			}
		}
		if inc.Above >= v.ID.Seq {
			g.enqueue(request{kind: reqRefresh, above: inc.Above})
		}
		return nil, nil
	}
	return g.PassUpEvent(ev)
}

func (g *GMS) suspect(as []stack.Address) {
	self := g.LocalAddress()
	g.mu.Lock()
	added := false
	for _, a := range as {
		if a != self && g.view.Contains(a) && !g.suspects[a] {
			g.suspects[a] = true
			added = true
		}
		// A view's acknowledgement is no longer awaited from it.
		if aw := g.acks; aw != nil && aw.missing[a] {
			delete(aw.missing, a)
			if len(aw.missing) == 0 {
				close(aw.done)
			}
		}
	}
	coord := g.view != nil && g.coordLocked() == self
	g.mu.Unlock()
	if added {
		g.suspectsHandled.Add(1)
		g.Log().Info("members suspected", "members", as)
	}
	if added && coord {
		g.enqueue(request{kind: reqSuspect})
	}
}

// ---- joining and leaving

// DownEvent joins on CONNECT and leaves on DISCONNECT.
func (g *GMS) DownEvent(ctx context.Context, ev stack.Event) (any, error) {
	switch ev.Type {
	case stack.EvConnect:
		if _, err := g.PassDownEvent(ctx, ev); err != nil {
			return nil, err
		}
		cr, _ := ev.Arg.(stack.ConnectRequest)
		g.joinWithState.Store(cr.State)
		return nil, g.join(ctx)
	case stack.EvDisconnect:
		g.leave(ctx)
	}
	return g.PassDownEvent(ctx, ev)
}

func (g *GMS) join(ctx context.Context) error {
	self := g.LocalAddress()
	attempts := 0
	giveUp := func(why string) bool {
		attempts++
		if g.cfg.MaxJoinAttempts > 0 && attempts >= g.cfg.MaxJoinAttempts {
			g.Log().Warn("could not join a coordinator; starting a group of one", "attempts", attempts, "reason", why)
			return true
		}
		return false
	}
	var coord stack.Address
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if g.Stopped() {
			return stack.ErrClosed
		}
		if coord.IsZero() {
			infos, err := g.discover(ctx)
			if err != nil {
				return err
			}
			var first bool
			coord, first = pickCoord(self, infos)
			if first {
				if len(infos) > 0 {
					g.Log().Info("no coordinator among the members found; this member has the lowest address and starts the group", "found", len(infos))
				}
				return g.becomeSingleton()
			}
			if coord.IsZero() {
				// Others are joining too and one of them will start the group.
				if giveUp("no coordinator answered") {
					return g.becomeSingleton()
				}
				if !sleep(ctx.Done(), g.backoff()) {
					return ctx.Err()
				}
				continue
			}
		}
		rsp, err := g.askToJoin(ctx, coord)
		if err != nil {
			return err
		}
		switch {
		case rsp == nil:
			g.Log().Info("join attempt timed out", "coordinator", coord, "join_timeout", g.cfg.JoinTimeout)
			coord = stack.Address{}
		case rsp.refused != nil:
			g.Log().Warn("join refused", "by", coord, "reason", rsp.refused)
			return fmt.Errorf("gms: join refused by %s: %w", coord, rsp.refused)
		case rsp.Fail != "":
			g.Log().Debug("join refused", "by", coord, "reason", rsp.Fail, "ask", rsp.Coord)
			coord = rsp.Coord
			if coord == self {
				coord = stack.Address{}
			}
			if coord.IsZero() && !sleep(ctx.Done(), g.backoff()) {
				return ctx.Err()
			}
		case rsp.View != nil && rsp.View.Contains(self):
			g.mu.Lock()
			g.view = nil
			g.mu.Unlock()
			g.install(rsp.View, rsp.Digest)
			g.send(rsp.View.ID.Creator, &Header{Type: typeViewAck, ViewID: rsp.View.ID})
			if rsp.View.ID.Creator != coord {
				g.send(coord, &Header{Type: typeViewAck, ViewID: rsp.View.ID})
			}
			g.printJoined(rsp.View)
			return nil
		default:
			coord = stack.Address{}
		}
		if coord.IsZero() && giveUp("no answer from a coordinator") {
			return g.becomeSingleton()
		}
	}
}

func (g *GMS) backoff() time.Duration {
	return g.cfg.JoinTimeout/10 + g.Rand().Duration(g.cfg.JoinTimeout/5+1)
}

func (g *GMS) discover(ctx context.Context) ([]stack.MemberInfo, error) {
	v, err := g.PassDownEvent(ctx, stack.Ev(stack.EvFindMembers, stack.FindMembers{Timeout: g.cfg.DiscoveryTimeout, BreakOnCoord: true}))
	if err != nil {
		return nil, err
	}
	infos, _ := v.([]stack.MemberInfo)
	return infos, nil
}

// pickCoord chooses whom to ask: the coordinator most members name,
// preferring members that say they are the coordinator. first reports that
// no member has a view and this member has the lowest address of all found,
// so it starts the group.
func pickCoord(self stack.Address, infos []stack.MemberInfo) (coord stack.Address, first bool) {
	votes := map[stack.Address]int{}
	claim := map[stack.Address]bool{}
	lowest := true
	for _, mi := range infos {
		if mi.Addr == self {
			continue
		}
		if mi.IsServer && !mi.Coord.IsZero() {
			votes[mi.Coord]++
			if mi.IsCoord() {
				claim[mi.Addr] = true
			}
		} else if mi.Addr.Compare(self) < 0 {
			lowest = false
		}
	}
	if len(votes) == 0 {
		return stack.Address{}, lowest
	}
	cands := make([]stack.Address, 0, len(votes))
	for a := range votes {
		if len(claim) == 0 || claim[a] {
			cands = append(cands, a)
		}
	}
	slices.SortFunc(cands, func(a, b stack.Address) int {
		if c := cmp.Compare(votes[b], votes[a]); c != 0 {
			return c
		}
		return a.Compare(b)
	})
	return cands[0], false
}

func (g *GMS) askToJoin(ctx context.Context, coord stack.Address) (*Header, error) {
	for {
		select {
		case <-g.joinRsp: // a stale answer of an earlier attempt
			continue
		default:
		}
		break
	}
	g.mu.Lock()
	g.askedCoord = coord
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.askedCoord = stack.Address{}
		g.mu.Unlock()
	}()
	g.send(coord, &Header{Type: typeJoinReq, State: g.joinWithState.Load()})
	t := time.NewTimer(g.cfg.JoinTimeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-g.Done():
			return nil, stack.ErrClosed
		case <-t.C:
			return nil, nil
		case rsp := <-g.joinRsp:
			if rsp.Fail == "" && (rsp.View == nil || !rsp.View.Contains(g.LocalAddress())) {
				continue
			}
			return rsp, nil
		}
	}
}

func (g *GMS) becomeSingleton() error {
	self := g.LocalAddress()
	v := stack.NewView(self, 1, self)
	g.install(v, nil)
	g.printJoined(v)
	return nil
}

func (g *GMS) printJoined(v *stack.View) {
	if g.cfg.PrintLocalAddr {
		g.Log().Info("joined", "address", g.LocalAddress(), "view", v)
	}
}

// leave leaves the view gracefully: the coordinator installs a view without
// itself (the next member takes over); a participant asks the coordinator.
// Either way it waits at most leave_timeout.
func (g *GMS) leave(ctx context.Context) {
	self := g.LocalAddress()
	g.mu.Lock()
	v := g.view
	if v == nil || v.Size() < 2 || g.leaving {
		g.view = nil
		g.mu.Unlock()
		return
	}
	g.leaving = true
	coord := g.coordLocked()
	done := g.leaveDone
	g.mu.Unlock()
	if coord == self {
		g.enqueue(request{kind: reqLeave, addr: self})
	} else {
		g.send(coord, &Header{Type: typeLeaveReq})
	}
	timeout := g.cfg.LeaveTimeout
	if coord == self {
		// The coordinator leaves once every member has its last view (or
		// is suspected): gone earlier, it could no longer send the view
		// again, and a member that missed it would stay in the old view,
		// blocked by the flush, until MERGE3 finds it.
		timeout += g.cfg.MaxBundlingTime + g.cfg.MaxViewAckWait + 2*g.cfg.ViewAckTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		g.Log().Info("leaving without the coordinator's confirmation", "coordinator", coord, "leave_timeout", g.cfg.LeaveTimeout)
	case <-ctx.Done():
	}
	g.mu.Lock()
	g.view = nil
	g.mu.Unlock()
}

// ---- merging

// runMerge is the merge leader's part: it asks the other coordinators for
// their views and digests, and installs one merge view on every member.
func (g *GMS) runMerge(coords []stack.Address) {
	self := g.LocalAddress()
	g.mu.Lock()
	v := g.view
	if v == nil || g.coordLocked() != self || g.merge != nil {
		g.mu.Unlock()
		return
	}
	g.mergeN++
	ms := &mergeState{id: MergeID{Leader: self, N: g.mergeN}, until: time.Now().Add(g.cfg.MergeTimeout), rsps: make(chan *mergeRsp, len(coords))}
	g.merge = ms
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		if g.merge == ms {
			g.merge = nil
		}
		g.mu.Unlock()
	}()

	var others []stack.Address
	for _, c := range coords {
		if c != self && !v.Contains(c) && !slices.Contains(others, c) {
			others = append(others, c)
		}
	}
	if len(others) == 0 {
		return
	}
	g.merges.Add(1)
	g.Log().Info("merging subgroups", "coordinators", append([]stack.Address{self}, others...))
	subs, ok := g.collectMerge(ms, v, others)
	if !ok {
		return
	}
	if len(subs) < 2 {
		g.mergesFailed.Add(1)
		for _, c := range others {
			g.send(c, &Header{Type: typeCancelMerge, MergeID: ms.id})
		}
		return
	}
	// With FLUSH above, every member of every subgroup blocks and the
	// members of each subgroup deliver the same messages before the merge
	// view, as before any view change. The digests are asked for again
	// after the flush: they must start the other subgroups' senders where
	// the flush left them, or a member would deliver in the merge view what
	// the others delivered in their old one.
	var parts []stack.Address
	for _, s := range subs {
		for _, m := range s.view.Members {
			if !slices.Contains(parts, m) {
				parts = append(parts, m)
			}
		}
	}
	res, err := g.PassUpEvent(stack.Ev(stack.EvStartFlush, stack.FlushRequest{Participants: parts, ViewChange: true, Merge: true}))
	if err != nil {
		g.flushFailures.Add(1)
		g.mergesFailed.Add(1)
		g.Log().Warn("merge: cancelled, the flush failed", "error", err)
		for _, c := range others {
			g.send(c, &Header{Type: typeCancelMerge, MergeID: ms.id})
		}
		return
	}
	var mv *stack.View
	defer func() {
		// After every member acknowledged the merge view (or the merge
		// gave up): the group may send again.
		_, _ = g.PassUpEvent(stack.Ev(stack.EvStopFlush, stack.FlushRequest{View: mv, ViewChange: true}))
	}()
	var without []stack.Address
	if fr, ok := res.(stack.FlushResult); ok {
		without = fr.Without
		var answered []stack.Address
		for _, s := range subs[1:] {
			answered = append(answered, s.view.Coordinator())
		}
		again, ok := g.collectMerge(ms, g.View(), answered)
		if !ok {
			return
		}
		if len(again) != len(subs) {
			// Without every subgroup's digest after the flush, the merge
			// view would start some senders at the wrong place.
			g.mergesFailed.Add(1)
			g.Log().Warn("merge: cancelled, a coordinator did not answer after the flush")
			for _, c := range others {
				g.send(c, &Header{Type: typeCancelMerge, MergeID: ms.id})
			}
			return
		}
		subs = again
	}
	// The leader's subgroup first, then the others by coordinator; each
	// member once; the digest takes each sender's entry from its subgroup.
	slices.SortStableFunc(subs[1:], func(a, b mergeSub) int { return a.view.Coordinator().Compare(b.view.Coordinator()) })
	var members []stack.Address
	var views []*stack.View
	var digest stack.Digest
	seq := uint64(0)
	for _, s := range subs {
		views = append(views, s.view)
		seq = max(seq, s.view.ID.Seq)
		for _, m := range s.view.Members {
			if slices.Contains(members, m) || slices.Contains(without, m) {
				continue
			}
			members = append(members, m)
			if e, ok := s.digest.Get(m); ok {
				digest = append(digest, e)
			}
		}
	}
	if len(without) > 0 {
		g.Log().Warn("merge: excluding members the flush went on without", "excluded", without)
		g.flushExclusions.Add(int64(len(without)))
	}
	mv = stack.NewMergeView(self, seq+1, members, views)
	g.Log().Info("installing merge view", "view", mv)
	expect := map[stack.Address]bool{}
	for _, m := range members {
		if m != self {
			expect[m] = true
		}
	}
	aw := &ackWait{id: mv.ID, missing: expect, done: make(chan struct{})}
	g.mu.Lock()
	g.acks = aw
	g.mu.Unlock()
	g.install(mv, digest)
	ih := &Header{Type: typeInstallView, View: mv, Digest: digest, MergeID: ms.id}
	for _, m := range members {
		if m != self {
			g.send(m, ih)
		}
	}
	for _, w := range without {
		g.send(w, ih) // so that they know they are out, and merge back
	}
	g.waitAcks(aw, func(a stack.Address) { g.send(a, ih) })
}

// mergeSub is one subgroup of a merge: its view and its coordinator's digest.
type mergeSub struct {
	view   *stack.View
	digest stack.Digest
}

// collectMerge asks the coordinators for their views and digests (again,
// after the flush: the same merge id) and returns the leader's subgroup
// first, then those that accepted, within merge_timeout. ok is false when
// the stack stops.
func (g *GMS) collectMerge(ms *mergeState, own *stack.View, coords []stack.Address) (subs []mergeSub, ok bool) {
	g.mu.Lock()
	if ms.asked != nil {
		// Asking again (after the flush): a new id, so that no answer to
		// the earlier request, with a digest from before the flush, counts.
		g.mergeN++
		ms.id = MergeID{Leader: ms.id.Leader, N: g.mergeN}
	}
	for len(ms.rsps) > 0 { // answers to an earlier request
		<-ms.rsps
	}
	ms.asked = map[stack.Address]bool{}
	for _, c := range coords {
		ms.asked[c] = true
	}
	g.mu.Unlock()
	for _, c := range coords {
		g.send(c, &Header{Type: typeMergeReq, MergeID: ms.id})
	}
	subs = []mergeSub{{own, g.digest()}}
	t := time.NewTimer(g.cfg.MergeTimeout)
	defer t.Stop()
	// A request or answer can be lost (the last message of a reliable
	// unicast connection is not repaired until the next one): ask again
	// those that have not answered. The same merge id gets the same answer.
	again := time.NewTicker(g.cfg.MergeTimeout / 5)
	defer again.Stop()
	for waiting := len(coords); waiting > 0; {
		select {
		case <-again.C:
			g.mu.Lock()
			missing := slices.Collect(maps.Keys(ms.asked))
			g.mu.Unlock()
			for _, c := range missing {
				g.send(c, &Header{Type: typeMergeReq, MergeID: ms.id})
			}
		case r := <-ms.rsps:
			waiting--
			if r.h.Fail != "" || r.h.View == nil {
				g.Log().Info("merge refused", "by", r.from, "reason", r.h.Fail)
				continue
			}
			subs = append(subs, mergeSub{r.h.View, r.h.Digest})
		case <-t.C:
			g.Log().Warn("merge: not every coordinator answered within merge_timeout", "answered", len(subs)-1, "asked", len(coords))
			waiting = 0
		case <-g.Done():
			return nil, false
		}
	}
	return subs, true
}

// handleMergeReq is a subgroup coordinator's part: it answers with its view
// and digest and holds its own view changes until the merge view comes or
// merge_timeout passes.
func (g *GMS) handleMergeReq(src stack.Address, h *Header) {
	self := g.LocalAddress()
	g.mu.Lock()
	v := g.view
	fail := ""
	switch {
	case v == nil || g.coordLocked() != self:
		fail = "not a coordinator"
	case g.merge != nil && g.merge.id.Leader == h.MergeID.Leader && h.MergeID.N < g.merge.id.N:
		// A late copy of the leader's earlier request: it asks again with a
		// new id after its flush, and only that answer counts.
		g.mu.Unlock()
		g.msgsIgnored.Add(1)
		return
	case g.merge != nil && g.merge.id.Leader != h.MergeID.Leader && time.Now().Before(g.merge.until):
		fail = "busy with another merge"
	case v.Contains(src):
		fail = "already in one view"
	default:
		g.merge = &mergeState{id: h.MergeID, until: time.Now().Add(g.cfg.MergeTimeout)}
	}
	g.mu.Unlock()
	g.Log().Debug("gms: merge request", "from", src, "merge", h.MergeID, "fail", fail)
	if fail != "" {
		g.send(src, &Header{Type: typeMergeRsp, MergeID: h.MergeID, Fail: fail})
		return
	}
	g.send(src, &Header{Type: typeMergeRsp, MergeID: h.MergeID, View: v, Digest: g.digest()})
}

// Stats reports GMS's counters.
func (g *GMS) Stats() []stack.Stat {
	g.mu.Lock()
	size := int64(g.view.Size())
	g.mu.Unlock()
	return []stack.Stat{
		{Name: "view_size", Value: size},
		{Name: "views_installed", Value: g.viewsInstalled.Load()},
		{Name: "views_ignored", Value: g.viewsIgnored.Load()},
		{Name: "joins_handled", Value: g.joinsHandled.Load()},
		{Name: "leaves_handled", Value: g.leavesHandled.Load()},
		{Name: "suspicions_handled", Value: g.suspectsHandled.Load()},
		{Name: "takeovers", Value: g.takeovers.Load()},
		{Name: "merges", Value: g.merges.Load()},
		{Name: "merges_failed", Value: g.mergesFailed.Load()},
		{Name: "view_ack_timeouts", Value: g.ackTimeouts.Load()},
		{Name: "messages_ignored", Value: g.msgsIgnored.Load()},
		{Name: "views_resent", Value: g.viewsResent.Load()},
		{Name: "flush_failures", Value: g.flushFailures.Load()},
		{Name: "flush_exclusions", Value: g.flushExclusions.Load()},
	}
}

func (g *GMS) String() string { return fmt.Sprintf("GMS(%s)", g.LocalAddress()) }
