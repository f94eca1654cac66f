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
	"fmt"
	"maps"
	"slices"
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

	started, completed, failed, refusals, lateStarts, superseded, safetyUnblocks, stopsDeferred, blockedNanos, viewWaits, wentWithout atomic.Int64
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
		f.notify(stack.EvBlock)
	}
	f.gate.Close()
	// A sender past the gate that waits below for flow-control credits
	// would make the drain wait for credits (which a member blocked the
	// same way may never return): it gives its message back and waits at
	// the gate.
	_, _ = f.PassDownEvent(context.Background(), stack.Ev(stack.EvRecallSenders, nil))
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
func (f *FLUSH) notify(t stack.EventType) {
	f.callbacks.Do(&f.Base, func() { _, _ = f.PassUpEvent(stack.Ev(t, nil)) })
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
		_, _ = f.PassDownEvent(context.Background(), stack.Ev(stack.EvReleaseHold, nil))
	}
	_, _ = f.PassDownEvent(context.Background(), stack.Ev(stack.EvReleaseSenders, nil))
	f.gate.Open()
	if call {
		f.notify(stack.EvUnblock)
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
		_, _ = f.PassDownEvent(context.Background(), stack.Ev(stack.EvReleaseHold, nil))
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

// ---- messages

func (f *FLUSH) send(dest stack.Address, h *Header) {
	if dest == f.LocalAddress() {
		f.handle(dest, h)
		return
	}
	flags := stack.Internal | stack.OOB
	f.mu.Lock()
	if f.regularStop && (h.Type == typeStop || h.Type == typeUnblocked) {
		flags = 0
	}
	f.mu.Unlock()
	m := stack.NewMessage(dest, nil).Set(flags)
	m.PutHeader(f.ID(), h)
	if err := f.PassDown(context.Background(), m); err != nil && !errors.Is(err, stack.ErrClosed) {
		f.Log().Debug("flush: send failed", "type", h.Kind(), "to", dest, "error", err)
	}
}

// Up handles flush messages; others pass.
func (f *FLUSH) Up(m *stack.Message) {
	h, ok := m.Header(f.ID()).(*Header)
	if !ok {
		f.PassUp(m)
		return
	}
	f.handle(m.Src, h)
}

func (f *FLUSH) handle(src stack.Address, h *Header) {
	switch h.Type {
	case typeStart:
		f.handleStart(src, h)
	case typeReconcile:
		f.handleReconcile(src, h)
	case typeStop, typeAbort:
		f.handleStop(src, h)
	case typeCompleted, typeReconcileOK, typeUnblocked:
		f.answer(src, h)
	case typeStateDone:
		f.mu.Lock()
		f.stateDone[src] = true
		f.mu.Unlock()
		select {
		case f.stateWake <- struct{}{}:
		default:
		}
	case typeNotCompleted:
		f.mu.Lock()
		if ir := f.run; ir != nil && ir.id == h.Round && ir.phase == typeCompleted {
			ir.refused = true
			ir.kick()
		}
		f.mu.Unlock()
		f.refusals.Add(1)
	}
}

// supersedes reports whether round n takes the place of cur at a
// participant: a newer round of the same initiator; a view-change round
// over an application's round, or over a view-change round whose initiator
// it leaves out (the coordinator crashed or left); between two application
// rounds, the initiator with the lower address wins, so colliding
// initiators never livelock.
func supersedes(n *Header, cur *partRound) bool {
	switch {
	case n.Round.Initiator == cur.id.Initiator:
		return n.Round.N > cur.id.N
	case n.ViewChange && !cur.vc:
		return true
	case n.ViewChange && cur.vc:
		return !slices.Contains(n.Participants, cur.id.Initiator)
	case !n.ViewChange && !cur.vc:
		return n.Round.Initiator.Compare(cur.id.Initiator) < 0
	}
	return false
}

func (f *FLUSH) handleStart(src stack.Address, h *Header) {
	if src != h.Round.Initiator {
		return
	}
	f.pmu.Lock()
	defer f.pmu.Unlock()
	f.mu.Lock()
	if h.Round.N <= f.done[src] {
		// Its STOP_FLUSH (or ABORT) overtook it: the round is over.
		f.mu.Unlock()
		f.lateStarts.Add(1)
		return
	}
	var old *partRound
	switch cur := f.cur; {
	case cur == nil:
	case cur.id == h.Round:
		f.mu.Unlock()
		f.send(src, &Header{Type: typeCompleted, Round: h.Round, Digest: f.digest(cur)})
		return
	case supersedes(h, cur):
		old = cur
	default:
		f.mu.Unlock()
		f.send(src, &Header{Type: typeNotCompleted, Round: h.Round})
		return
	}
	cur := &partRound{id: h.Round, vc: h.ViewChange, parts: h.Participants}
	if f.view != nil {
		cur.from = f.view.ID
	}
	f.cur = cur
	f.mu.Unlock()
	if old != nil {
		f.superseded.Add(1)
		f.send(old.id.Initiator, &Header{Type: typeNotCompleted, Round: old.id})
	}
	f.block()
	d := f.digest(cur)
	f.Log().Debug("flush: completed", "round", h.Round, "digest", d)
	f.send(src, &Header{Type: typeCompleted, Round: h.Round, Digest: d})
}

func (f *FLUSH) handleReconcile(src stack.Address, h *Header) {
	f.mu.Lock()
	cur := f.cur
	f.mu.Unlock()
	if cur == nil || cur.id != h.Round {
		return
	}
	f.Go(func(<-chan struct{}) {
		ctx, cancel := context.WithTimeout(f.Context(), f.cfg.StartTimeout) // ends at Stop too
		defer cancel()
		if _, err := f.PassDownEvent(ctx, stack.Ev(stack.EvReconcile, stack.Reconcile{Target: h.Digest, From: h.From})); err != nil {
			f.Log().Info("flush: could not fetch every message of the round in time", "round", h.Round, "error", err)
			return
		}
		f.Log().Debug("flush: reconciled", "round", h.Round)
		f.send(src, &Header{Type: typeReconcileOK, Round: h.Round})
	})
}

type stopWait struct {
	src stack.Address
	h   *Header
}

func (f *FLUSH) handleStop(src stack.Address, h *Header) {
	if src != h.Round.Initiator {
		return
	}
	f.pmu.Lock()
	f.mu.Lock()
	if h.Round.N > f.done[src] {
		f.done[src] = h.Round.N
	}
	mine := f.cur != nil && f.cur.id == h.Round
	joiner := f.cur == nil && f.joining
	if (mine || joiner) && h.Type == typeStop && h.View.Seq > 0 && (f.view == nil || f.view.ID.Seq < h.View.Seq) {
		// The view this round installed has not reached this member yet
		// (its copy was lost): unblocked now, it would send in the old view
		// what the others deliver in the new one. It unblocks when the view
		// comes (the safety valve bounds the wait).
		f.stopWait = &stopWait{src: src, h: h}
		f.mu.Unlock()
		f.pmu.Unlock()
		f.stopsDeferred.Add(1)
		return
	}
	abortVC := mine && h.Type == typeAbort && f.cur.vc
	if abortVC {
		f.heldSince = time.Now()
	}
	f.mu.Unlock()
	switch {
	case abortVC:
		// The initiator gave up on this attempt and may go on without
		// this member, which is then not in the next view. It may send
		// again, but delivers nothing beyond what it had delivered until
		// a view comes (or timeout passes): what the others send now
		// belongs to a view it may not be in.
		f.open(false)
	case mine || joiner:
		f.unblock()
	}
	f.pmu.Unlock()
	f.send(src, &Header{Type: typeUnblocked, Round: h.Round})
}

func (f *FLUSH) answer(src stack.Address, h *Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ir := f.run
	if ir == nil || ir.id != h.Round || ir.phase != h.Type {
		return
	}
	ir.answered[src] = h.Digest
	ir.kick()
}

// digest returns this member's digest for the round; before a view change
// it also holds every sender at what this member delivered until the round
// ends (see stack.EvHold).
func (f *FLUSH) digest(r *partRound) stack.Digest {
	ev := stack.EvGetDigest
	if r != nil && r.vc {
		ev = stack.EvHold
	}
	v, err := f.PassDownEvent(context.Background(), stack.Ev(ev, nil))
	if err != nil {
		return nil
	}
	d, _ := v.(stack.Digest)
	return d
}

// ---- the initiator

// StartFlush runs a round over the participants (nil: the view) and
// returns when they are all blocked and have delivered the same messages.
// It retries a refused or timed-out round up to max_attempts times.
func (f *FLUSH) StartFlush(ctx context.Context, req stack.FlushRequest) error {
	_, err := f.startFlush(ctx, req)
	return err
}

// startFlush is StartFlush that also says which participants a view-change
// round went on without.
func (f *FLUSH) startFlush(ctx context.Context, req stack.FlushRequest) (stack.FlushResult, error) {
	var res stack.FlushResult
	select {
	case f.owner <- struct{}{}:
	case <-ctx.Done():
		return res, ctx.Err()
	case <-f.Done():
		return res, stack.ErrClosed
	}
	var err error
	for attempt := 1; ; attempt++ {
		var skipped []stack.Address
		if skipped, err = f.attempt(ctx, req); err == nil {
			f.completed.Add(1)
			if req.ViewChange {
				// Suspected participants the round stopped waiting for
				// are not in the cut either.
				for _, a := range skipped {
					if !slices.Contains(res.Without, a) {
						res.Without = append(res.Without, a)
					}
				}
			}
			return res, nil
		}
		if attempt >= f.cfg.MaxAttempts || ctx.Err() != nil {
			break
		}
		// Before a view change, a participant that does not answer (it
		// crashed, or left while the round ran) must not stop the others
		// from agreeing on what they delivered: go on without it at once.
		var na *noAnswer
		if req.ViewChange && errors.As(err, &na) {
			if req.Participants == nil {
				f.mu.Lock()
				if f.view != nil {
					req.Participants = f.view.Members
				}
				f.mu.Unlock()
			}
			req.Participants = slices.DeleteFunc(slices.Clone(req.Participants), func(a stack.Address) bool {
				return a != f.LocalAddress() && slices.Contains(na.missing, a)
			})
			// Those left out are unblocked (the round was aborted) and
			// take no part in the cut: the view must not contain them.
			for _, a := range na.missing {
				if a != f.LocalAddress() && !slices.Contains(res.Without, a) {
					res.Without = append(res.Without, a)
				}
			}
			f.wentWithout.Add(int64(len(na.missing)))
			f.Log().Info("flush: going on without the participants that did not answer", "missing", na.missing)
			continue
		}
		backoff := f.cfg.RetryTimeout/2 + f.Rand().Duration(f.cfg.RetryTimeout/2+1)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-f.Done():
		}
		t.Stop()
	}
	f.failed.Add(1)
	<-f.owner
	return res, fmt.Errorf("%w: %w", ErrFlushFailed, err)
}

func (f *FLUSH) attempt(ctx context.Context, req stack.FlushRequest) ([]stack.Address, error) {
	self := f.LocalAddress()
	parts := req.Participants
	f.mu.Lock()
	if parts == nil && f.view != nil {
		parts = f.view.Members
	}
	if len(parts) == 0 {
		parts = []stack.Address{self}
	}
	f.n++
	ir := &initRound{id: RoundID{Initiator: self, N: f.n}, vc: req.ViewChange, merge: req.Merge, parts: slices.Clone(parts),
		phase: typeCompleted, answered: map[stack.Address]stack.Digest{}, wake: make(chan struct{}, 1)}
	f.run = ir
	f.mu.Unlock()
	f.started.Add(1)
	start := &Header{Type: typeStart, Round: ir.id, ViewChange: ir.vc, Participants: ir.parts}
	for _, p := range ir.parts {
		f.send(p, start)
	}
	err := f.await(ctx, ir, f.cfg.StartTimeout, func(p stack.Address) { f.send(p, start) })
	if err == nil {
		// Every participant fetches and delivers what anyone received.
		f.mu.Lock()
		target := maxDigest(ir.answered) // late duplicate answers still write to it
		ir.phase, ir.answered = typeReconcileOK, map[stack.Address]stack.Digest{}
		f.mu.Unlock()
		f.Log().Debug("flush: reconcile", "round", ir.id, "target", target.Target)
		rec := &Header{Type: typeReconcile, Round: ir.id, Digest: target.Target, From: target.From}
		for _, p := range ir.parts {
			f.send(p, rec)
		}
		err = f.await(ctx, ir, f.cfg.StartTimeout, func(p stack.Address) { f.send(p, rec) })
	}
	if err != nil {
		for _, p := range ir.parts {
			f.send(p, &Header{Type: typeAbort, Round: ir.id})
		}
		f.mu.Lock()
		f.run = nil
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(ir.skipped), nil
}

// maxDigest is what every participant must deliver before the round ends,
// and per sender a participant that holds those messages. For a sender that
// takes part, the highest seqno anyone received, held by the sender itself.
// For a sender that does not (it crashed or was excluded), the highest seqno
// any participant delivered, held by that participant; a message received
// beyond a gap nobody can fill is delivered by no one in the view.
func maxDigest(ds map[stack.Address]stack.Digest) stack.Reconcile {
	type best struct {
		hi   uint64
		from stack.Address
	}
	bs := map[stack.Address]best{}
	for p, d := range ds {
		for _, e := range d {
			b := best{hi: e.HighestDelivered, from: p}
			if _, ok := ds[e.Member]; ok {
				b = best{hi: max(e.HighestDelivered, e.HighestReceived), from: e.Member}
			}
			cur, ok := bs[e.Member]
			switch {
			case !ok:
				bs[e.Member] = b
			case b.from == e.Member: // the sender itself holds them all
				bs[e.Member] = best{hi: max(b.hi, cur.hi), from: e.Member}
			case b.hi > cur.hi || b.hi == cur.hi && b.from.Compare(cur.from) < 0:
				bs[e.Member] = b
			}
		}
	}
	members := slices.SortedFunc(maps.Keys(bs), stack.Address.Compare)
	rc := stack.Reconcile{Target: make(stack.Digest, 0, len(bs)), From: make([]stack.Address, 0, len(bs))}
	for _, a := range members {
		b := bs[a]
		rc.Target = append(rc.Target, stack.DigestEntry{Member: a, HighestDelivered: b.hi, HighestReceived: b.hi})
		rc.From = append(rc.From, b.from)
	}
	return rc
}

// noAnswer is await's error when participants did not answer in time.
type noAnswer struct {
	round   RoundID
	phase   uint8
	missing []stack.Address
	timeout time.Duration
}

func (e *noAnswer) Error() string {
	return fmt.Sprintf("round %s: no %s from %v within %s", e.round, typeNames[e.phase], e.missing, e.timeout)
}

// await waits until every participant still in the view has answered the
// current phase, the round is refused, or timeout passes. Every quarter of
// the timeout it sends the phase's message again to those that have not
// answered: participants take duplicates in their stride, and a lost or
// slow copy then never costs the whole timeout.
func (f *FLUSH) await(ctx context.Context, ir *initRound, timeout time.Duration, again func(p stack.Address)) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	resend := time.NewTicker(timeout / 4)
	defer resend.Stop()
	for {
		f.mu.Lock()
		refused := ir.refused
		var missing []stack.Address
		for _, p := range ir.parts {
			_, ok := ir.answered[p]
			switch {
			case ok:
			case f.suspects[p] && p != f.LocalAddress():
				if !slices.Contains(ir.skipped, p) {
					ir.skipped = append(ir.skipped, p)
				}
			case ir.merge || f.view == nil || f.view.Contains(p) || p == f.LocalAddress():
				missing = append(missing, p)
			}
		}
		phase := ir.phase
		f.mu.Unlock()
		switch {
		case refused:
			return fmt.Errorf("round %s refused by a participant in another round", ir.id)
		case len(missing) == 0:
			return nil
		}
		select {
		case <-ir.wake:
		case <-resend.C:
			for _, p := range missing {
				again(p)
			}
		case <-t.C:
			f.Log().Warn("flush: participants did not answer in time", "round", ir.id, "awaiting", typeNames[phase], "missing", missing, "timeout", timeout)
			return &noAnswer{round: ir.id, phase: phase, missing: missing, timeout: timeout}
		case <-ctx.Done():
			return ctx.Err()
		case <-f.Done():
			return stack.ErrClosed
		}
	}
}

// StopFlush ends the round this member started: STOP_FLUSH to the
// participants and it returns when every one of them still in the view has
// said it is unblocked (or after end_flush_timeout). Joiners (extra) get
// their STOP_FLUSH only after that, so a joiner's Connect returns into a
// group where everyone can send.
func (f *FLUSH) StopFlush(ctx context.Context, extra []stack.Address) error {
	return f.stopFlush(ctx, stack.FlushRequest{Participants: extra})
}

func (f *FLUSH) stopFlush(ctx context.Context, req stack.FlushRequest) error {
	extra := req.Participants
	f.mu.Lock()
	ir := f.run
	if ir == nil || ir.phase == typeUnblocked || ir.vc != req.ViewChange {
		// Only the owner ends its round: GMS's stop never ends the
		// application's round (GMS's own start may have failed), nor the
		// application's GMS's.
		f.mu.Unlock()
		return nil
	}
	if req.View != nil {
		ir.view = req.View.ID
		f.left = !req.View.Contains(f.LocalAddress())
	}
	f.mu.Unlock()
	f.awaitStates(ctx, req.AwaitState)
	f.mu.Lock()
	var joiners []stack.Address
	for _, a := range extra {
		if !slices.Contains(ir.parts, a) {
			joiners = append(joiners, a)
		}
	}
	f.mu.Unlock()
	err := f.stopPhase(ctx, ir, slices.Clone(ir.parts))
	if len(joiners) > 0 && !errors.Is(err, stack.ErrClosed) {
		f.mu.Lock()
		ir.parts = append(ir.parts, joiners...)
		f.mu.Unlock()
		err = f.stopPhase(ctx, ir, joiners)
	}
	f.mu.Lock()
	if f.run == ir {
		f.run = nil
	}
	f.mu.Unlock()
	<-f.owner
	if err != nil {
		// Logged by await; the members unblock themselves at the latest
		// after timeout.
		return fmt.Errorf("flush: stop: %w", err)
	}
	return nil
}

// awaitStates holds the stop until every joiner in js that is still in the
// view has fetched the state (ConnectWithState), or timeout passes: the
// group stays quiet while the state is read.
func (f *FLUSH) awaitStates(ctx context.Context, js []stack.Address) {
	if len(js) == 0 {
		return
	}
	t := time.NewTimer(f.cfg.Timeout)
	defer t.Stop()
	check := time.NewTicker(f.cfg.StartTimeout / 4)
	defer check.Stop()
	for {
		f.mu.Lock()
		var missing []stack.Address
		for _, j := range js {
			if !f.stateDone[j] && (f.view == nil || f.view.Contains(j)) {
				missing = append(missing, j)
			}
		}
		if len(missing) == 0 {
			for _, j := range js {
				delete(f.stateDone, j)
			}
		}
		f.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		select {
		case <-f.stateWake:
		case <-check.C:
		case <-t.C:
			f.Log().Warn("flush: joiners did not fetch the state in time; unblocking the group", "joiners", missing, "timeout", f.cfg.Timeout)
			return
		case <-ctx.Done():
			return
		case <-f.Done():
			return
		}
	}
}

func (f *FLUSH) stopPhase(ctx context.Context, ir *initRound, to []stack.Address) error {
	f.mu.Lock()
	ir.phase, ir.answered = typeUnblocked, map[stack.Address]stack.Digest{}
	// Only the members of this phase are awaited.
	for _, p := range ir.parts {
		if !slices.Contains(to, p) {
			ir.answered[p] = nil
		}
	}
	stop := &Header{Type: typeStop, Round: ir.id}
	switch {
	case !ir.view.Creator.IsZero():
		stop.View = ir.view // unblock in the view the round installed, not before it
	case ir.vc && !ir.merge && f.view != nil && f.view.Contains(f.LocalAddress()):
		// (A merge round without its view was cancelled: the other
		// subgroups' members are in views of their own.)
		stop.View = f.view.ID
	}
	f.mu.Unlock()
	for _, p := range to {
		f.send(p, stop)
	}
	return f.await(ctx, ir, f.cfg.EndTimeout, func(p stack.Address) { f.send(p, stop) })
}

// ---- events

// DownEvent runs flushes for the channel, blocks a joiner from the moment
// it asks to join, and tracks the view.
func (f *FLUSH) DownEvent(ctx context.Context, ev stack.Event) (any, error) {
	switch ev.Type {
	case stack.EvStartFlush:
		req, _ := ev.Arg.(stack.FlushRequest)
		return nil, f.StartFlush(ctx, req)
	case stack.EvStopFlush:
		req, _ := ev.Arg.(stack.FlushRequest)
		return nil, f.stopFlush(ctx, req)
	case stack.EvConnect:
		return nil, f.connect(ctx, ev)
	case stack.EvViewChange:
		if v, ok := ev.Arg.(*stack.View); ok {
			f.viewChange(v)
		}
	case stack.EvDisconnect:
		// Senders blocked at the gate return, but what a view-change round
		// holds stays held: it was sent in a view this member is leaving
		// (a leaving coordinator, say), and must not reach it.
		f.pmu.Lock()
		f.open(false)
		f.pmu.Unlock()
	}
	return f.PassDownEvent(ctx, ev)
}

// UpEvent runs GMS's flushes around view changes.
func (f *FLUSH) UpEvent(ev stack.Event) (any, error) {
	switch ev.Type {
	case stack.EvStartFlush:
		req, _ := ev.Arg.(stack.FlushRequest)
		ctx, cancel := context.WithTimeout(context.Background(), f.cfg.Timeout)
		defer cancel()
		return f.startFlush(ctx, req)
	case stack.EvStopFlush:
		req, _ := ev.Arg.(stack.FlushRequest)
		return nil, f.stopFlush(context.Background(), req)
	case stack.EvSuspect:
		as, _ := ev.Arg.([]stack.Address)
		f.mu.Lock()
		for _, a := range as {
			f.suspects[a] = true
		}
		if ir := f.run; ir != nil {
			ir.kick()
		}
		f.mu.Unlock()
	case stack.EvUnsuspect:
		if a, ok := ev.Arg.(stack.Address); ok {
			f.mu.Lock()
			delete(f.suspects, a)
			f.mu.Unlock()
		}
	case stack.EvViewChange:
		// Above the membership layer, which passes views up. After the
		// application has the view: a STOP_FLUSH that waited for it takes
		// effect.
		v, ok := ev.Arg.(*stack.View)
		if ok {
			f.viewChange(v)
		}
		res, err := f.PassUpEvent(ev)
		if ok {
			f.viewDelivered(v)
		}
		return res, err
	}
	return f.PassUpEvent(ev)
}

func (f *FLUSH) connect(ctx context.Context, ev stack.Event) error {
	f.pmu.Lock()
	f.mu.Lock()
	f.joining, f.joinDone = true, make(chan struct{})
	joined := f.joinDone
	f.mu.Unlock()
	f.block()
	f.pmu.Unlock()
	if _, err := f.PassDownEvent(ctx, ev); err != nil {
		f.pmu.Lock()
		f.unblock()
		f.pmu.Unlock()
		return err
	}
	f.mu.Lock()
	alone := f.view.Size() <= 1
	f.mu.Unlock()
	if alone {
		f.pmu.Lock()
		f.unblock()
		f.pmu.Unlock()
		return nil
	}
	var stateErr error
	if cr, ok := ev.Arg.(stack.ConnectRequest); ok && cr.State {
		// Still blocked, as is the group: fetch the state, then let the
		// round's initiator (the view's creator) stop the flush.
		_, stateErr = f.PassDownEvent(ctx, stack.Ev(stack.EvGetState, cr.StateFrom))
		f.mu.Lock()
		coord := f.view.ID.Creator
		f.mu.Unlock()
		f.send(coord, &Header{Type: typeStateDone})
	}
	// Connect returns into a group where everyone can send: after the
	// STOP_FLUSH of the flush that installed this member's view.
	select {
	case <-joined:
		return stateErr
	case <-ctx.Done():
		return ctx.Err()
	case <-f.Done():
		return stack.ErrClosed
	}
}

func (f *FLUSH) viewChange(v *stack.View) {
	f.mu.Lock()
	f.view = v
	for a := range f.suspects {
		if !v.Contains(a) {
			delete(f.suspects, a)
		}
	}
	if ir := f.run; ir != nil {
		ir.kick() // members that left are no longer awaited
	}
	f.mu.Unlock()
}

// viewDelivered runs once the application has v: a round whose initiator
// left the view ends here (not before, or what the members send in the new
// view could reach the application before the view does), and so does a
// STOP_FLUSH that waited for v.
func (f *FLUSH) viewDelivered(v *stack.View) {
	f.mu.Lock()
	cur := f.cur
	orphan := cur != nil && !v.Contains(cur.id.Initiator) && cur.id.Initiator != f.LocalAddress()
	sw := f.stopWait
	ready := sw != nil && f.view != nil && f.view.ID.Seq >= sw.h.View.Seq
	held := cur == nil && !f.heldSince.IsZero()
	f.mu.Unlock()
	if ready {
		f.handleStop(sw.src, sw.h)
	}
	if held {
		f.releaseHeld()
	}
	if orphan {
		f.Log().Info("flush: the round's initiator left the view; unblocking", "round", cur.id)
		f.pmu.Lock()
		f.mu.Lock()
		still := f.cur == cur
		f.mu.Unlock()
		if still {
			f.unblock()
		}
		f.pmu.Unlock()
	}
}

// Stats reports FLUSH's counters.
func (f *FLUSH) Stats() []stack.Stat {
	blocked := int64(0)
	if f.gate.IsClosed() {
		blocked = 1
	}
	return []stack.Stat{
		{Name: "blocked", Value: blocked},
		{Name: "blocked_time_ns", Value: f.blockedNanos.Load()},
		{Name: "rounds_started", Value: f.started.Load()},
		{Name: "flushes_completed", Value: f.completed.Load()},
		{Name: "flushes_failed", Value: f.failed.Load()},
		{Name: "refusals_received", Value: f.refusals.Load()},
		{Name: "rounds_superseded", Value: f.superseded.Load()},
		{Name: "late_starts_ignored", Value: f.lateStarts.Load()},
		{Name: "stops_deferred_to_view", Value: f.stopsDeferred.Load()},
		{Name: "safety_unblocks", Value: f.safetyUnblocks.Load()},
		{Name: "safety_waits_for_view", Value: f.viewWaits.Load()},
		{Name: "participants_left_out", Value: f.wentWithout.Load()},
	}
}

// String names the round, for logs.
func (r *partRound) String() string {
	if r == nil {
		return "none"
	}
	return r.id.String()
}
