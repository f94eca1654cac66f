package stack

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Protocol is one layer of a stack. Messages travel Down (towards the wire)
// and Up (towards the application), singly or, upwards, as batches; control
// events travel DownEvent and UpEvent, and a query's answer comes back as an
// Answer (see Query, Reply, Ask).
//
// Every protocol embeds Base (or TransportBase), which forwards everything,
// so a protocol implements only the methods for what it adds. To forward,
// call the Pass* methods of Base.
type Protocol interface {
	// Name is the protocol's type name, as in configs ("UNICAST2").
	Name() string

	// Init validates and allocates; it runs once, after the stack is linked.
	Init() error
	// Start runs on every Connect, bottom first; goroutines started with
	// Base.Go from here on are stopped by the stack.
	Start() error
	// Stop runs on every Disconnect, top first, after the layer's Done
	// channel is closed; the stack then waits for the layer's goroutines.
	Stop()
	// Close releases what Init allocated; it runs once.
	Close() error

	Down(ctx context.Context, m *Message) error
	Up(m *Message)
	UpBatch(b *Batch)
	DownEvent(ctx context.Context, ev Event) (Answer, error)
	UpEvent(ev Event) (Answer, error)

	base() *Base
}

// StatsReporter is implemented by protocols that expose counters.
type StatsReporter interface {
	Stats() []Stat
}

// Stat is one named counter or gauge of a protocol. Counter marks a count
// that only grows (exported as a Prometheus counter); otherwise the value
// is a gauge: a size, a level or a peak, which may go down.
type Stat struct {
	Name    string
	Value   int64
	Counter bool
}

// Errors returned by the core.
var (
	// ErrClosed: the channel or stack is closed.
	ErrClosed = errors.New("strata: closed")
	// ErrNotConnected: the channel is not connected to a cluster.
	ErrNotConnected = errors.New("strata: not connected")
	// ErrNotSent: a layer gave a message back unsent, because a layer above
	// recalled the senders waiting below it (EvRecallSenders); that layer
	// sends it again.
	ErrNotSent = errors.New("strata: not sent (recalled)")
	// ErrNoTransport: a message reached the bottom of a stack with no transport.
	ErrNoTransport = errors.New("strata: no transport below")
	// ErrNotSupported: a layer cannot do what an event asks (for example
	// EvSendToPhysical on a transport without network addresses).
	ErrNotSupported = errors.New("strata: not supported by this stack")
	// ErrWouldDeadlock: a call from inside a callback waits for something
	// only that callback's return can bring about, so it is refused rather
	// than left to hang.
	ErrWouldDeadlock = errors.New("strata: would deadlock: called from a callback that it would wait for")
	// ErrAuthFailed: the group refused this member's proof that it knows
	// the group secret (AUTH).
	ErrAuthFailed = errors.New("authentication failed")
)

type link struct{ p Protocol }

// Base is embedded by every protocol. It links the layer to its neighbours,
// forwards every message and event by default, owns the layer's goroutines
// and gives access to the stack (local address, cluster, logger).
type Base struct {
	self      Protocol
	preserves bool // self is a BatchPreserver or a Transport: see PassUpBatch
	id        uint16
	st        *Stack
	up        atomic.Pointer[link]
	down      atomic.Pointer[link]
	log       *slog.Logger
	view      atomic.Pointer[View] // see View
	gmu       sync.Mutex
	done      chan struct{}
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	stopd     bool
	built     *builtFrom // the registered type and config it was built from
}

// builtFrom records the registered type and the config a layer was built
// from, for Settings.
type builtFrom struct {
	t   *ProtocolType
	cfg any // pointer to the config struct
}

func (b *Base) base() *Base { return b }

// ID returns the protocol's id (its header key), from the registry; zero for
// unregistered protocols.
func (b *Base) ID() uint16 { return b.id }

// Stack returns the stack the layer is in (nil before it is linked).
func (b *Base) Stack() *Stack { return b.st }

// LocalAddress returns the address of the member this stack belongs to.
func (b *Base) LocalAddress() Address { return b.st.LocalAddress() }

// Rand returns the stack's source of random choices (seeded with
// WithSeed, so a run replays).
func (b *Base) Rand() *Rand { return b.st.Rand() }

// Log returns the layer's logger (the stack's, with the protocol name).
func (b *Base) Log() *slog.Logger {
	if b.log == nil {
		return discardLogger
	}
	return b.log
}

// Init does nothing; protocols override it.
func (b *Base) Init() error { return nil }

// Start does nothing; protocols override it.
func (b *Base) Start() error { return nil }

// Stop does nothing; protocols override it.
func (b *Base) Stop() {}

// Close does nothing; protocols override it.
func (b *Base) Close() error { return nil }

// Down forwards m to the layer below.
func (b *Base) Down(ctx context.Context, m *Message) error { return b.PassDown(ctx, m) }

// Up forwards m to the layer above.
func (b *Base) Up(m *Message) { b.PassUp(m) }

// UpBatch hands every message carrying this protocol's header to the
// protocol's Up and forwards the rest as batches, keeping the batch's order:
// whatever Up passes up for a message (a reassembled message, say) goes up
// after the messages that came before it and before those that came after.
// A protocol that acts on messages without its own header overrides
// UpBatch (UpBatchInOrder keeps its order too).
func (b *Base) UpBatch(bt *Batch) {
	if b.id == 0 || b.self == nil || !b.anyMine(bt) {
		// The common case, per layer and batch: nothing of this layer's,
		// so no closures and no split.
		b.passUpBatch(bt)
		return
	}
	b.UpBatchInOrder(bt, func(m *Message) bool { return m.Header(b.id) != nil }, b.self.Up)
}

func (b *Base) anyMine(bt *Batch) bool {
	if !bt.MayHave(b.id) {
		return false
	}
	for _, m := range bt.Msgs {
		if m.Header(b.id) != nil {
			return true
		}
	}
	return false
}

// UpBatchInOrder walks bt in order: each message for which mine reports
// true goes to handle, after the run of other messages before it has been
// passed up as a batch; the last run goes up as bt. So the order of a
// sender's messages survives the layer, whatever handle passes up. handle
// runs on the caller's goroutine.
func (b *Base) UpBatchInOrder(bt *Batch, mine func(*Message) bool, handle func(*Message)) {
	msgs, start := bt.Msgs, 0
	for i, m := range msgs {
		if !mine(m) {
			continue
		}
		if i > start {
			// Capped: a layer above that appends to its batch must not
			// write over the messages this loop has not reached.
			b.passUpBatch(&Batch{Src: bt.Src, Dest: bt.Dest, Lane: bt.Lane, Msgs: msgs[start:i:i]})
		}
		handle(m)
		start = i + 1
	}
	if start == 0 {
		b.passUpBatch(bt)
		return
	}
	if start < len(msgs) {
		bt.Msgs = msgs[start:]
		b.passUpBatch(bt)
	}
}

// DownEvent forwards ev to the layer below.
func (b *Base) DownEvent(ctx context.Context, ev Event) (Answer, error) {
	return b.PassDownEvent(ctx, ev)
}

// UpEvent forwards ev to the layer above.
func (b *Base) UpEvent(ev Event) (Answer, error) { return b.PassUpEvent(ev) }

// PassDown sends m to the layer below.
func (b *Base) PassDown(ctx context.Context, m *Message) error {
	if l := b.down.Load(); l != nil {
		return l.p.Down(ctx, m)
	}
	return ErrNoTransport
}

// PassUp sends m to the layer above.
func (b *Base) PassUp(m *Message) {
	if l := b.up.Load(); l != nil {
		l.p.Up(m)
	}
}

// PassUpBatch sends bt to the layer above; empty batches stop here. After
// a layer that is not a BatchPreserver, bt's summary (Batch.MayHave) is
// made again above it.
func (b *Base) PassUpBatch(bt *Batch) {
	if !b.preserves {
		bt.forget()
	}
	b.passUpBatch(bt)
}

// BatchPreserver is implemented by a protocol whose UpBatch passes up
// only messages it was given, without adding headers to them (it may
// remove messages with Batch.Keep, and remove headers): what a batch's
// summary says (Batch.MayHave) then holds above the layer too, and the
// layers above skip batches without their headers without reading them.
// Without it, the summary is made again above the layer (one more read of
// every message). Transports, and layers that do not override UpBatch, need
// not implement it.
type BatchPreserver interface {
	Protocol
	// PreservesBatches marks the protocol; it does nothing.
	PreservesBatches()
}

func (b *Base) passUpBatch(bt *Batch) {
	if len(bt.Msgs) == 0 {
		return
	}
	if l := b.up.Load(); l != nil {
		l.p.UpBatch(bt)
	}
}

// PassDownEvent sends ev to the layer below; at the bottom it returns no
// answer.
func (b *Base) PassDownEvent(ctx context.Context, ev Event) (Answer, error) {
	if l := b.down.Load(); l != nil {
		noteView(l.p, ev)
		return l.p.DownEvent(ctx, ev)
	}
	return Answer{}, nil
}

// noteView records the view of a VIEW_CHANGE about to reach p, for View;
// a DISCONNECT about to reach p forgets it. The membership layer (a
// ViewInstaller) makes the views and keeps the one it has under its own
// lock, so Base records none for it: a second copy there, forgotten when
// the DISCONNECT arrives rather than when the member has left, could only
// disagree with it.
func noteView(p Protocol, ev Event) {
	switch e := ev.(type) {
	case EvViewChange:
		if _, vi := p.(ViewInstaller); e.View != nil && !vi {
			p.base().view.Store(e.View)
		}
	case EvDisconnect:
		p.base().view.Store(nil)
	}
}

// View returns the last view that reached this layer (down from the
// membership layer or up from it), or nil before the first and once a
// DISCONNECT has reached the layer (below the membership layer: once the
// member has left). Layers that only need to know the view read it here
// rather than keep a copy. The membership layer, which makes the views,
// answers View from its own state instead (GMS.View).
func (b *Base) View() *View { return b.view.Load() }

// PassUpEvent sends ev to the layer above; at the top it reaches the channel.
func (b *Base) PassUpEvent(ev Event) (Answer, error) {
	if l := b.up.Load(); l != nil {
		noteView(l.p, ev)
		return l.p.UpEvent(ev)
	}
	return Answer{}, nil
}

// Above returns the protocol above, or nil at the top.
func (b *Base) Above() Protocol {
	if l := b.up.Load(); l != nil {
		return l.p
	}
	return nil
}

// Below returns the protocol below, or nil at the bottom.
func (b *Base) Below() Protocol {
	if l := b.down.Load(); l != nil {
		return l.p
	}
	return nil
}

// Done is closed when the layer stops; goroutines of the layer select on it.
func (b *Base) Done() <-chan struct{} {
	b.gmu.Lock()
	defer b.gmu.Unlock()
	if b.done == nil {
		b.done = make(chan struct{})
	}
	return b.done
}

// Context returns a context that is cancelled when the layer stops, for
// the calls a layer's own goroutines make (a wait that must end at Stop).
func (b *Base) Context() context.Context {
	b.gmu.Lock()
	defer b.gmu.Unlock()
	b.ensureLocked()
	return b.ctx
}

// ensureLocked makes Done's channel and Context's context; callers hold
// gmu.
func (b *Base) ensureLocked() {
	if b.done == nil {
		b.done = make(chan struct{})
	}
	if b.ctx == nil {
		b.ctx, b.cancel = context.WithCancel(context.Background())
		if b.stopd {
			b.cancel()
		}
	}
}

// Go runs f on a goroutine owned by the layer: the stack closes Done and
// waits for f to return when the layer stops. Go after Stop runs nothing and
// returns false.
func (b *Base) Go(f func(done <-chan struct{})) bool {
	b.gmu.Lock()
	if b.stopd {
		b.gmu.Unlock()
		return false
	}
	if b.done == nil {
		b.done = make(chan struct{})
	}
	done := b.done
	b.wg.Add(1)
	b.gmu.Unlock()
	go func() {
		defer b.wg.Done()
		f(done)
	}()
	return true
}

// GoEvery runs f every d on a goroutine owned by the layer (see Go), until
// the layer stops.
func (b *Base) GoEvery(d time.Duration, f func()) bool {
	return b.Go(func(done <-chan struct{}) {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				f()
			}
		}
	})
}

// Stopped reports whether the layer has been stopped (and not restarted).
func (b *Base) Stopped() bool {
	b.gmu.Lock()
	defer b.gmu.Unlock()
	return b.stopd
}

func (b *Base) beginStart() {
	b.gmu.Lock()
	defer b.gmu.Unlock()
	if b.stopd || b.done == nil {
		b.done = make(chan struct{})
		b.ctx, b.cancel = nil, nil
	}
	b.stopd = false
	b.view.Store(nil) // a new incarnation starts without a view
}

func (b *Base) beginStop() {
	b.gmu.Lock()
	defer b.gmu.Unlock()
	if b.stopd {
		return
	}
	b.stopd = true
	if b.done == nil {
		b.done = make(chan struct{})
	}
	close(b.done)
	if b.cancel != nil {
		b.cancel()
	}
}

func (b *Base) waitGoroutines() { b.wg.Wait() }

var discardLogger = slog.New(slog.DiscardHandler)
