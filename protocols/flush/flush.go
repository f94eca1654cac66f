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

// FragmentedBelow says that FLUSH relies on FRAG below it: a header
// larger than maxInline goes in a payload for FRAG to split.
func (c *Config) FragmentedBelow() {}

var _ stack.FragmentedBelow = (*Config)(nil)

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

// counters are FLUSH's statistics.
type counters struct {
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
	endsAgain      atomic.Int64 `stat:"round_ends_sent_again"`
	malformed      atomic.Int64 `stat:"malformed_dropped"`
}

// FLUSH is the FLUSH protocol.
type FLUSH struct {
	stack.Base
	cfg   Config
	count counters

	gate      stack.Gate
	callbacks stack.Serial // Block and Unblock, in order, off FLUSH's locks
	// inflight counts the multicasts past the gate on their way down; the
	// block waits for them on inflightDone (under inflightMu), a durable
	// wait: under synctest a sender delayed below on a timer goes on,
	// where an RWMutex's writer stopped virtual time for good.
	inflight     atomic.Int64
	inflightMu   sync.Mutex
	inflightDone *sync.Cond
	// pmu: participant transitions and their effects, one at a time. A
	// channel, so that one waiting for a transition whose block waits for
	// senders (waitInflight) is durably blocked under synctest.
	pmu   chan struct{}
	owner chan struct{}

	mu sync.Mutex
	// part is this member as a participant; its view is FLUSH's.
	part participant
	// joinDone closes when the flush that installs a joiner's view stops.
	joinDone chan struct{}
	// stateDone: joiners that said they fetched the state in their join's
	// round (ConnectWithState); stateWake wakes the stop waiting for them.
	stateDone   map[stack.Address]bool
	stateWake   chan struct{}
	n           uint64
	run         *initRound // round this member initiated and has not stopped
	ends        roundEnds  // how its last rounds ended
	regularStop bool       // test hook: STOP_FLUSH and UNBLOCKED as regular messages
	// suspects: members failure detection suspects; a round no longer
	// waits for them (as in JGroups), and a view-change round reports
	// them as left out.
	suspects map[stack.Address]bool
}

var _ stack.Protocol = (*FLUSH)(nil)

// New returns a FLUSH layer.
func New(cfg Config) *FLUSH {
	f := &FLUSH{cfg: cfg, owner: make(chan struct{}, 1), pmu: make(chan struct{}, 1),
		stateDone: map[stack.Address]bool{}, stateWake: make(chan struct{}, 1), suspects: map[stack.Address]bool{}}
	f.part = newParticipant(cfg.Timeout, &f.count)
	f.inflightDone = sync.NewCond(&f.inflightMu)
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
	f.part.reset()
	f.run, f.joinDone = nil, nil
	clear(f.suspects)
	f.mu.Unlock()
	f.gate.Open()
	f.GoEvery(f.cfg.Timeout/4, func() { f.step(func(p *participant, now time.Time) []effect { return p.tick(now) }) })
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
		// Counted before the gate is looked at again, as the block closes
		// the gate before it looks at the count: one of them sees the other.
		f.inflight.Add(1)
		if f.gate.IsClosed() {
			f.leaveInflight()
			continue
		}
		err := f.PassDown(ctx, m)
		f.leaveInflight()
		if errors.Is(err, stack.ErrNotSent) && ctx.Err() == nil {
			continue // it waited for credits below when the gate closed
		}
		return err
	}
}

// leaveInflight ends a multicast's passage counted in inflight, waking a
// block that waits for the last one. Off a block it is two atomic
// operations (IsClosed is a load); the lock is taken only to wake one.
func (f *FLUSH) leaveInflight() {
	if f.inflight.Add(-1) == 0 && f.gate.IsClosed() {
		f.inflightMu.Lock()
		f.inflightDone.Broadcast()
		f.inflightMu.Unlock()
	}
}

// waitInflight returns once every multicast past the gate has gone down;
// the gate is closed.
func (f *FLUSH) waitInflight() {
	f.inflightMu.Lock()
	for f.inflight.Load() > 0 {
		f.inflightDone.Wait()
	}
	f.inflightMu.Unlock()
}

func (f *FLUSH) Stats() []stack.Stat {
	blocked := int64(0)
	if f.gate.IsClosed() {
		blocked = 1
	}
	return append(stack.CounterStats(&f.count),
		stack.Stat{Name: "blocked", Value: blocked},
	)
}
