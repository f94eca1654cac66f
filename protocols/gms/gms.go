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
//
// Views and digests grow with the group, and GMS sits below FRAG: a
// message larger than one datagram goes in parts through the reliable
// layers below and is put back together at the receiver (parts.go says
// why this way), so no group size meets the datagram's limit.
package gms

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/internal/parts"
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

// ackWait collects the acknowledgements of one view: the tracker (plan.go,
// time passed in) and a channel closed when it is complete.
type ackWait struct {
	*viewAcks
	done chan struct{}
}

// newAckWait wraps the acknowledgements a view change awaits.
func newAckWait(acks *viewAcks) *ackWait {
	aw := &ackWait{viewAcks: acks, done: make(chan struct{})}
	if aw.complete() {
		close(aw.done)
	}
	return aw
}

// settle closes done when the last acknowledgement came; callers hold
// g.mu and pass what the tracker reported.
func (aw *ackWait) settle(completed bool) {
	if completed {
		close(aw.done)
	}
}

// mergeState is a coordinator's part in one merge.
type mergeState struct {
	id     MergeID
	until  time.Time
	leader bool          // this coordinator leads the merge
	ask    *mergeAsk     // the leader's current request; guarded by GMS.mu
	wake   chan struct{} // the leader's: an answer came
}

// counters are GMS's statistics.
type counters struct {
	viewsInstalled  atomic.Int64 `stat:"views_installed"`
	joinsHandled    atomic.Int64 `stat:"joins_handled"`
	leavesHandled   atomic.Int64 `stat:"leaves_handled"`
	suspectsHandled atomic.Int64 `stat:"suspicions_handled"`
	merges          atomic.Int64 `stat:"merges"`
	mergesFailed    atomic.Int64 `stat:"merges_failed"`
	ackTimeouts     atomic.Int64 `stat:"view_ack_timeouts"`
	viewsIgnored    atomic.Int64 `stat:"views_ignored"`
	msgsIgnored     atomic.Int64 `stat:"messages_ignored"`
	takeovers       atomic.Int64 `stat:"takeovers"`
	flushFailures   atomic.Int64 `stat:"flush_failures"`
	flushExclusions atomic.Int64 `stat:"flush_exclusions"`
	viewsResent     atomic.Int64 `stat:"views_resent"`
	joinsDeclined   atomic.Int64 `stat:"late_join_answers_declined"`
	deltasSent      atomic.Int64 `stat:"delta_views_sent"`
	deltasApplied   atomic.Int64 `stat:"delta_views_applied"`
	deltasMissed    atomic.Int64 `stat:"delta_views_without_previous"` // a full view asked for (GET_VIEW)
	partsSent       atomic.Int64 `stat:"parts_sent"`
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
	// announced is the last regular view this member sent as coordinator,
	// for members that ask for it in full (GET_VIEW): a leaving
	// coordinator does not install it.
	announced *stack.View
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
	parts         *parts.Reassembler
	count         counters
}

var (
	_ stack.Protocol      = (*GMS)(nil)
	_ stack.ViewInstaller = (*GMS)(nil)
)

// New returns a GMS layer.
func New(cfg Config) *GMS { return &GMS{cfg: cfg, parts: parts.NewReassembler(partLimits)} }

// Name returns "GMS".
func (g *GMS) Name() string { return "GMS" }

// Init validates the config.
func (g *GMS) Init() error { return g.cfg.Validate() }

// Start resets the membership state and starts the view handler.
func (g *GMS) Start() error {
	if lim := g.Stack().ControlLimit(); lim < minControlLimit {
		return fmt.Errorf("gms: the transport's datagrams leave %d bytes for a control message, and GMS needs at least %d (a larger max_bundle_size)", lim, minControlLimit)
	}
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

// View returns the current view (nil before the first and once the member
// has left). It is GMS's one view: the field its logic reads under g.mu
// with the suspects and the leave. It overrides stack.Base.View, and the
// stack keeps no view in GMS's Base (ViewInstaller layers make their own).
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
	if limit := g.Stack().ControlLimit(); h.Size() > limit {
		g.sendParts(dest, h, flags, limit)
		return
	}
	g.sendMsg(stack.NewMessage(dest, nil).Set(flags), h)
}

// sendParts sends h, too large for one datagram, in parts of at most limit
// bytes with the same flags (see parts.go).
func (g *GMS) sendParts(dest stack.Address, h *Header, flags stack.Flags, limit int) {
	b := h.AppendTo(make([]byte, 0, h.Size()))
	chunks := parts.Split(b, limit-maxPartHeader)
	id := parts.ID(b)
	g.count.partsSent.Add(int64(len(chunks)))
	for i, c := range chunks {
		g.sendMsg(stack.NewMessage(dest, c).Set(flags), &Header{Type: typePart, Part: Part{Of: h.Type, ID: id, Index: uint32(i), Count: uint32(len(chunks))}})
	}
}

func (g *GMS) sendMsg(m *stack.Message, h *Header) {
	m.PutHeader(g.ID(), h)
	if err := g.PassDown(g.Context(), m); err != nil && !errors.Is(err, stack.ErrClosed) {
		g.Log().Debug("gms: send failed", "type", h.Kind(), "to", m.Dest, "error", err)
	}
}

func (g *GMS) digest() stack.Digest {
	d, _ := stack.Ask(g.Context(), g, stack.EvGetDigest{})
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
func (g *GMS) install(v *stack.View, d stack.Digest) bool { return g.installFrom(v, d, false) }

// installJoined installs v, the view of a join answer, whatever view this
// member has; every member of d is new to it.
func (g *GMS) installJoined(v *stack.View, d stack.Digest) { g.installFrom(v, d, true) }

func (g *GMS) installFrom(v *stack.View, d stack.Digest, joined bool) bool {
	g.installMu.Lock()
	defer g.installMu.Unlock()
	g.mu.Lock()
	old := g.view
	if joined {
		old = nil
	}
	if old != nil && !newer(v, old) {
		g.mu.Unlock()
		g.count.viewsIgnored.Add(1)
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
		known := old.Lookup(len(d)) // a merge view's digest names every member
		for _, e := range d {
			if !known(e.Member) && e.Member != g.LocalAddress() {
				fresh = append(fresh, e)
			}
		}
		if len(fresh) > 0 {
			_, _ = g.PassDownEvent(g.Context(), stack.EvSetDigest{Digest: fresh})
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
	g.count.viewsInstalled.Add(1)
	// Down to the layers below, then up through the layers above to the
	// channel: each layer sees the view once.
	_, _ = g.PassDownEvent(g.Context(), stack.EvViewChange{View: v})
	_, _ = g.PassUpEvent(stack.EvViewChange{View: v})
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

func (g *GMS) Stats() []stack.Stat {
	g.mu.Lock()
	size := int64(g.view.Size())
	g.mu.Unlock()
	return append(stack.CounterStats(&g.count),
		stack.Stat{Name: "view_size", Value: size},
		stack.Stat{Name: "parts_messages_completed", Value: g.parts.Completed.Load(), Counter: true},
		stack.Stat{Name: "parts_dropped", Value: g.parts.Dropped.Load(), Counter: true},
	)
}

func (g *GMS) String() string { return fmt.Sprintf("GMS(%s)", g.LocalAddress()) }
