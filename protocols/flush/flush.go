// Package flush is FLUSH: it quiesces the group so that every member has
// delivered the same messages, around view changes (virtual synchrony) and
// state transfer.
//
// A round: the initiator sends START_FLUSH to the participants; each calls
// Receiver.Block once, blocks the application's multicasts (unicasts and
// INTERNAL messages pass), and answers FLUSH_COMPLETED with its NAKACK
// digest. The initiator then sends every participant the highest seqno
// anyone received from each sender; each fetches and delivers what it lacks
// and answers. The work is done (a view installed, a state transferred);
// then STOP_FLUSH unblocks everyone, and the initiator returns only when
// every participant (and joiner) has said it is unblocked.
//
// Every flush message travels on the internal lane, out of band, so a
// STOP_FLUSH is never queued behind an application message that is itself
// blocked in FLUSH (the two hangs of JGroups' FLUSH). Out-of-band messages
// may overtake each other, so every message carries its round id: a
// participant remembers, per initiator, the last round that ended, ignores a
// START_FLUSH that arrives after its own STOP_FLUSH, and a STOP_FLUSH ends
// only its own round, never a newer one.
package flush

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

// Config configures FLUSH.
type Config struct {
	Timeout      time.Duration `toml:"timeout" doc:"longest a member stays blocked; then it unblocks itself with a warning"`
	StartTimeout time.Duration `toml:"start_flush_timeout" doc:"how long the initiator waits for every participant in each phase of a round"`
	EndTimeout   time.Duration `toml:"end_flush_timeout" doc:"how long a stop waits for every participant to say it is unblocked"`
	RetryTimeout time.Duration `toml:"retry_timeout" doc:"most a refused or timed-out round waits (randomly) before it is tried again"`
	MaxAttempts  int           `toml:"max_attempts" doc:"attempts of one flush before it fails"`
}

// DefaultConfig returns FLUSH's defaults (JGroups' where it has them).
func DefaultConfig() Config {
	return Config{Timeout: 8 * time.Second, StartTimeout: 2 * time.Second, EndTimeout: 2 * time.Second, RetryTimeout: 2 * time.Second, MaxAttempts: 4}
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.Timeout <= 0:
		return stack.BadKey("timeout", "must be > 0, got %s", c.Timeout)
	case c.StartTimeout <= 0:
		return stack.BadKey("start_flush_timeout", "must be > 0, got %s", c.StartTimeout)
	case c.EndTimeout <= 0:
		return stack.BadKey("end_flush_timeout", "must be > 0, got %s", c.EndTimeout)
	case c.RetryTimeout <= 0:
		return stack.BadKey("retry_timeout", "must be > 0, got %s", c.RetryTimeout)
	case c.MaxAttempts < 1:
		return stack.BadKey("max_attempts", "must be >= 1, got %d", c.MaxAttempts)
	case c.Timeout < 2*c.StartTimeout:
		return stack.BadKey("timeout", "(%s) must be at least twice start_flush_timeout (%s), or members unblock themselves in the middle of a round", c.Timeout, c.StartTimeout)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "FLUSH", ID: stack.IDFLUSH,
		Requires: []stack.Service{stack.ServiceMembership},
		Doc:      "virtual synchrony: blocks multicasts and reconciles deliveries around view changes and state transfer",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{ID: stack.IDFLUSH, Name: "FLUSH", Decode: decodeHeader, Samples: sampleHeaders})
}

// ErrFlushFailed is returned when a flush could not complete in
// max_attempts (collisions with other rounds, or silent participants).
var ErrFlushFailed = errors.New("flush: failed")

// partRound is the round a participant is blocked for.
type partRound struct {
	id     RoundID
	vc     bool
	parts  []stack.Address
	from   stack.ViewID // this member's view when the round started
	warned bool         // the safety valve said it waits for the view
}

// initRound is a round this member initiated.
type initRound struct {
	id       RoundID
	vc       bool
	merge    bool         // participants from several views: all are awaited
	view     stack.ViewID // the view the round installed (GMS's stop), if known
	parts    []stack.Address
	phase    uint8 // typeCompleted, typeReconcileOK, typeUnblocked: the answers awaited
	answered map[stack.Address]stack.Digest
	refused  bool
	skipped  []stack.Address // suspected participants no longer awaited
	wake     chan struct{}
}

func (ir *initRound) kick() {
	select {
	case ir.wake <- struct{}{}:
	default:
	}
}

// FLUSH is the FLUSH protocol.
type FLUSH struct {
	stack.Base
	cfg Config

	gate      stack.Gate
	callbacks stack.Serial // Block and Unblock, in order, off FLUSH's locks
	inflight  sync.RWMutex // multicasts past the gate on their way down
	pmu       sync.Mutex   // participant transitions, one at a time
	owner     chan struct{}

	mu   sync.Mutex
	view *stack.View
	cur  *partRound // round this member is blocked for
	// stopWait: a STOP_FLUSH that came before the view its round installed;
	// it takes effect when that view is delivered.
	stopWait *stopWait
	// stateDone: joiners that said they fetched the state in their join's
	// round (ConnectWithState); stateWake wakes the stop waiting for them.
	stateDone   map[stack.Address]bool
	stateWake   chan struct{}
	joining     bool // blocked since Connect, until the flush that installs the view stops
	joinDone    chan struct{}
	since       time.Time // blocked since
	heldSince   time.Time // an aborted view-change round left NAKACK's hold on, since
	blockCalled bool
	done        map[stack.Address]uint64 // per initiator: its rounds up to N have ended
	n           uint64
	run         *initRound // round this member initiated and has not stopped
	regularStop bool       // test hook: STOP_FLUSH and UNBLOCKED as regular messages
	// left: this member is not in the view its last round installed (it is
	// a leaving coordinator); what the round held is never released.
	left bool
	// suspects: members failure detection suspects; a round no longer
	// waits for them (as in JGroups), and a view-change round reports
	// them as left out.
	suspects map[stack.Address]bool

	started        atomic.Int64 `stat:"rounds_started"`
	completed      atomic.Int64 `stat:"flushes_completed"`
	failed         atomic.Int64 `stat:"flushes_failed"`
	refusals       atomic.Int64 `stat:"refusals_received"`
	lateStarts     atomic.Int64 `stat:"late_starts_ignored"`
	superseded     atomic.Int64 `stat:"rounds_superseded"`
	safetyUnblocks atomic.Int64 `stat:"safety_unblocks"`
	stopsDeferred  atomic.Int64 `stat:"stops_deferred_to_view"`
	blockedNanos   atomic.Int64 `stat:"blocked_time_ns"`
	viewWaits      atomic.Int64 `stat:"safety_waits_for_view"`
	wentWithout    atomic.Int64 `stat:"participants_left_out"`
}

var _ stack.Protocol = (*FLUSH)(nil)

// New returns a FLUSH layer.
func New(cfg Config) *FLUSH {
	f := &FLUSH{cfg: cfg, owner: make(chan struct{}, 1), done: map[stack.Address]uint64{},
		stateDone: map[stack.Address]bool{}, stateWake: make(chan struct{}, 1), suspects: map[stack.Address]bool{}}
	return f
}

// Name returns "FLUSH".
func (f *FLUSH) Name() string { return "FLUSH" }

// FlushesGroup marks FLUSH as the stack's stack.Flusher.
func (f *FLUSH) FlushesGroup() {}

var _ stack.Flusher = (*FLUSH)(nil)

// Init validates the config.
func (f *FLUSH) Init() error { return f.cfg.Validate() }

// Start starts the safety valve that unblocks a member blocked too long.
func (f *FLUSH) Start() error {
	f.mu.Lock()
	f.view, f.cur, f.joining, f.run, f.blockCalled, f.left = nil, nil, false, nil, false, false
	clear(f.suspects)
	clear(f.done)
	f.mu.Unlock()
	f.gate.Open()
	f.GoEvery(f.cfg.Timeout/4, f.safetyValve)
	return nil
}

// Blocked reports whether this member's multicasts are blocked.
func (f *FLUSH) Blocked() bool { return f.gate.IsClosed() }

// ---- the application's sends

// Down holds multicasts back while the member is blocked; unicasts and
// INTERNAL messages always pass.
func (f *FLUSH) Down(ctx context.Context, m *stack.Message) error {
	if !m.IsMulticast() || m.Flags&stack.Internal != 0 {
		return f.PassDown(ctx, m)
	}
	for {
		if err := f.gate.Wait(ctx, m); err != nil {
			return err
		}
		f.inflight.RLock()
		if f.gate.IsClosed() {
			f.inflight.RUnlock()
			continue
		}
		err := f.PassDown(ctx, m)
		f.inflight.RUnlock()
		if errors.Is(err, stack.ErrNotSent) && ctx.Err() == nil {
			continue // it waited for credits below when the gate closed
		}
		return err
	}
}

// block calls Receiver.Block (once per blocked period) and closes the gate;
// it returns when no multicast is still on its way down past the gate, so
// the digest taken next covers every multicast this member sent.
func (f *FLUSH) block() {
	f.mu.Lock()
	f.Log().Debug("flush: blocking", "round", f.cur.String())
	call := !f.blockCalled
	f.blockCalled = true
	if f.since.IsZero() {
		f.since = time.Now()
	}
	f.mu.Unlock()
	if call {
		f.notify(stack.EvBlock{})
	}
	f.gate.Close()
	// A sender past the gate that waits below for flow-control credits
	// would make the drain wait for credits (which a member blocked the
	// same way may never return): it gives its message back and waits at
	// the gate.
	_, _ = f.PassDownEvent(f.Context(), stack.EvRecallSenders{})
	// Taking the write lock waits for every sender already past the gate.
	f.inflight.Lock()
	//lint:ignore SA2001 the empty critical section is the point: it drains in-flight senders
	f.inflight.Unlock()
}

// notify passes BLOCK or UNBLOCK up, in order, on FLUSH's callback
// goroutine: the application's Block and Unblock run while FLUSH holds
// none of its locks, and a Block that waits (or starts a flush of its own)
// holds up neither this round nor the safety valve. The gate, not the
// callback, stops the member's multicasts.
func (f *FLUSH) notify(ev stack.Event) {
	f.callbacks.Do(&f.Base, func() { _, _ = f.PassUpEvent(ev) })
}

// unblock ends this member's part in a round: it lets the senders a
// view-change round held go and opens the gate. Callers hold pmu.
func (f *FLUSH) unblock() { f.open(true) }

// open opens the gate and calls Receiver.Unblock if Block was called; with
// release, it also ends NAKACK's hold of a view-change round. Callers hold
// pmu.
func (f *FLUSH) open(release bool) {
	f.mu.Lock()
	release = release && !f.left
	f.Log().Debug("flush: unblocking", "round", f.cur.String(), "release", release)
	call := f.blockCalled
	f.blockCalled = false
	f.cur, f.stopWait = nil, nil
	var joined chan struct{}
	if f.joining {
		f.joining, joined = false, f.joinDone
	}
	if !f.since.IsZero() {
		f.blockedNanos.Add(int64(time.Since(f.since)))
		f.since = time.Time{}
	}
	if release {
		f.heldSince = time.Time{}
	}
	f.mu.Unlock()
	if release {
		// A view-change round's hold on every sender ends here.
		_, _ = f.PassDownEvent(f.Context(), stack.EvReleaseHold{})
	}
	_, _ = f.PassDownEvent(f.Context(), stack.EvReleaseSenders{})
	f.gate.Open()
	if call {
		f.notify(stack.EvUnblock{})
	}
	if joined != nil {
		close(joined) // the joiner's Connect returns into an open gate
	}
}

// releaseHeld ends the hold an aborted view-change round left, unless a
// round has begun since (its end releases it).
func (f *FLUSH) releaseHeld() {
	f.pmu.Lock()
	defer f.pmu.Unlock()
	f.mu.Lock()
	held := f.cur == nil && !f.heldSince.IsZero()
	f.heldSince = time.Time{}
	f.mu.Unlock()
	if held {
		_, _ = f.PassDownEvent(f.Context(), stack.EvReleaseHold{})
	}
}

func (f *FLUSH) safetyValve() {
	f.mu.Lock()
	if f.cur == nil && !f.heldSince.IsZero() && time.Since(f.heldSince) > f.cfg.Timeout {
		f.mu.Unlock()
		f.safetyUnblocks.Add(1)
		f.Log().Warn("flush: no view within timeout after an aborted view-change round; delivering again", "timeout", f.cfg.Timeout)
		f.releaseHeld()
		f.mu.Lock()
	}
	stuck := (f.cur != nil || f.joining) && !f.since.IsZero() && time.Since(f.since) > f.cfg.Timeout
	cur := f.cur
	// A view-change round whose view has not come: unblocked, this member
	// would send in the old view what the others deliver in the new one,
	// and deliver theirs in the old. It waits for the view (its initiator
	// resends it, or MERGE3 finds this member behind); the view ends the
	// round (STOP_FLUSH, or the initiator is not in it), or a newer round
	// takes its place.
	waitView := stuck && cur != nil && cur.vc && f.view != nil && f.view.ID == cur.from
	warn := waitView && !cur.warned
	if waitView {
		cur.warned = true
	}
	f.mu.Unlock()
	if waitView {
		if warn {
			f.viewWaits.Add(1)
			f.Log().Warn("flush: blocked for longer than timeout, but the round's view has not come; staying blocked until it does", "round", cur.id, "timeout", f.cfg.Timeout)
		}
		return
	}
	if !stuck {
		return
	}
	f.pmu.Lock()
	defer f.pmu.Unlock()
	f.safetyUnblocks.Add(1)
	if cur != nil {
		f.Log().Warn("flush: blocked for longer than timeout without a STOP_FLUSH; unblocking", "round", cur.id, "timeout", f.cfg.Timeout)
	} else {
		f.Log().Warn("flush: joined but no STOP_FLUSH within timeout (is FLUSH in every member's stack?); unblocking", "timeout", f.cfg.Timeout)
	}
	f.unblock()
}

func (f *FLUSH) Stats() []stack.Stat {
	blocked := int64(0)
	if f.gate.IsClosed() {
		blocked = 1
	}
	return append(stack.CounterStats(f),
		stack.Stat{Name: "blocked", Value: blocked},
	)
}

// String names the round, for logs.
func (r *partRound) String() string {
	if r == nil {
		return "none"
	}
	return r.id.String()
}
