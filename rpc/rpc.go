// Package rpc is request/response over a group: JGroups' MessageDispatcher
// for strata. A Dispatcher sits on a stack.Channel (it is not a layer of
// the stack): it runs the member's Handler for the requests that come in,
// and lets the member Call one member or Cast to many, waiting for the
// first answer, all of them, a majority, N, or none.
//
//	d, err := rpc.New(ch, func(ctx context.Context, req *stack.Message) ([]byte, error) {
//		return bytes.ToUpper(req.Payload), nil
//	}, rpc.WithReceiver(app))
//	...
//	rsp, err := d.Call(ctx, member, []byte("hi"))
//	rsps, err := d.Cast(ctx, nil, []byte("hi"), rpc.WithMode(rpc.ModeMajority))
//
// The Dispatcher becomes the channel's receiver and hands every message
// that is not rpc traffic, and every view, to the application's receiver
// (WithReceiver), as JGroups' dispatcher forwards to the listener behind it.
//
// Requests travel on the lane their flags choose: a regular request's
// handler runs on its sender's regular lane, so one sender's regular
// requests are handled in the order sent, after its earlier messages;
// OOB requests are handled concurrently. Responses always travel OOB, so
// an answer never waits behind a handler that blocks; a request a handler
// makes itself (with the context it was given) goes OOB too, so nested
// calls cannot deadlock on a lane (see Handler).
//
// A member that leaves the view, or that the failure detector suspects,
// ends every wait on it at once: the Dispatcher watches views and
// suspicions as they travel up the stack, not when the application's view
// callback runs (which may be held back behind a handler).
package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/strata-go/strata/stack"
)

// Handler answers one request: req is the request as received (Src is the
// caller, Payload what it sent). The bytes returned are the answer; an
// error reaches the caller as a *RemoteError carrying its text. A panic is
// recovered and reaches the caller as a *RemoteError too (ErrHandlerPanic);
// the member goes on.
//
// Handlers of regular requests from one sender run one at a time, in the
// order sent; handlers of OOB requests run concurrently. ctx ends when the
// Dispatcher closes. A handler may Call or Cast itself; it must pass ctx (or
// one derived from it) to do so: that marks the request as nested and sends
// it OOB, so that it cannot queue behind a handler that waits for it.
type Handler func(ctx context.Context, req *stack.Message) ([]byte, error)

// Errors of package rpc.
var (
	// ErrClosed: the Dispatcher is closed.
	ErrClosed = errors.New("rpc: dispatcher closed")
	// ErrSuspected: the failure detector suspected the member while the call
	// waited for it.
	ErrSuspected = errors.New("rpc: member suspected")
	// ErrLeft: the member is not in the view (it left, was excluded, or
	// never was in it).
	ErrLeft = errors.New("rpc: member not in the view")
	// ErrRemote is matched (errors.Is) by every error a handler returned.
	ErrRemote = errors.New("rpc: remote handler failed")
	// ErrHandlerPanic is matched by a RemoteError whose handler panicked.
	ErrHandlerPanic = errors.New("rpc: remote handler panicked")
	// ErrNoHandler is matched by a RemoteError from a member that has no
	// handler.
	ErrNoHandler = errors.New("rpc: no handler on the member")
	// ErrRejected: the response filter rejected the member's answer.
	ErrRejected = errors.New("rpc: answer rejected by the filter")
	// ErrNotAnswered: the call ended (its mode was satisfied) before the
	// member answered.
	ErrNotAnswered = errors.New("rpc: not answered")
)

// RemoteError is what a handler's error or panic becomes at the caller:
// the member it came from and the error's text.
type RemoteError struct {
	Member    stack.Address
	Text      string
	Panic     bool // the handler panicked; Text says with what
	NoHandler bool // the member has no handler
}

// Error returns "rpc: member: text".
func (e *RemoteError) Error() string {
	switch {
	case e.Panic:
		return fmt.Sprintf("rpc: %s: handler panicked: %s", e.Member, e.Text)
	case e.NoHandler:
		return fmt.Sprintf("rpc: %s: no handler", e.Member)
	}
	return fmt.Sprintf("rpc: %s: %s", e.Member, e.Text)
}

// Is matches ErrRemote, and ErrHandlerPanic or ErrNoHandler as the case
// may be.
func (e *RemoteError) Is(target error) bool {
	return target == ErrRemote || e.Panic && target == ErrHandlerPanic || e.NoHandler && target == ErrNoHandler
}

// Option configures New.
type Option func(*Dispatcher)

// WithReceiver sets the application's receiver: it gets every message
// that is not rpc traffic and every view. If it implements stack.Blocker,
// stack.StateHandler or stack.BatchReceiver, the Dispatcher passes those on.
func WithReceiver(r stack.Receiver) Option { return func(d *Dispatcher) { d.app = r } }

// WithLogger sets the logger (default: the channel's stack's).
func WithLogger(l *slog.Logger) Option { return func(d *Dispatcher) { d.log = l } }

// WithMaxConcurrentOOB bounds the handlers of OOB requests that run on
// goroutines of the Dispatcher's own (default 1024). Beyond it a handler
// runs on the stack's OOB worker that delivered the request, which slows
// the OOB lane down rather than grow without bound.
func WithMaxConcurrentOOB(n int) Option {
	return func(d *Dispatcher) {
		if n > 0 {
			d.oobSem = make(chan struct{}, n)
		}
	}
}

// Dispatcher sends requests and answers them on one channel. Create it with
// New before Connect (it can also be made later: it then starts from the
// current view); Close it before or after the channel.
type Dispatcher struct {
	ch     *stack.Channel
	h      Handler
	app    stack.Receiver
	log    *slog.Logger
	w      *watcher
	oobSem chan struct{}

	ctx    context.Context // the handlers' context, ended by Close
	hctx   context.Context // ctx marked as a handler's (nested calls)
	cancel context.CancelFunc
	wg     sync.WaitGroup // the Dispatcher's goroutines

	nextID atomic.Uint64

	mu          sync.Mutex
	pending     map[uint64]*request
	members     map[stack.Address]bool // of the latest view (nil: none)
	closed      bool
	selfQ       []func() // this member's regular requests to itself
	selfRunning bool

	requests, responses, late, handled, handlerErrs, panics atomic.Int64
}

// New makes a Dispatcher on ch that answers requests with h (nil: this
// member only calls; requests to it fail with ErrNoHandler). It becomes
// ch's receiver, passing what is not rpc traffic on to WithReceiver's, and
// puts a small observer (named "RPC") at the top of ch's stack that tells it
// of views and suspicions as they come up, without waiting for the view
// callback. One Dispatcher per channel.
func New(ch *stack.Channel, h Handler, opts ...Option) (*Dispatcher, error) {
	d := &Dispatcher{ch: ch, h: h, pending: map[uint64]*request{}}
	for _, o := range opts {
		o(d)
	}
	if d.log == nil {
		d.log = stack.Of(ch).Logger()
	}
	d.log = d.log.With("rpc", ch.Name())
	if d.oobSem == nil {
		d.oobSem = make(chan struct{}, 1024)
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.hctx = context.WithValue(d.ctx, nestedKey{}, true)
	d.w = &watcher{d: d}
	protos := stack.Of(ch).Protocols()
	if err := stack.Of(ch).InsertAbove(d.w, protos[len(protos)-1].Name()); err != nil {
		d.cancel()
		return nil, fmt.Errorf("rpc: %w", err)
	}
	if v := ch.View(); v != nil {
		d.viewChanged(v)
	}
	ch.SetReceiver(d.receiver())
	return d, nil
}

// Close fails the calls still waiting with ErrClosed, gives the channel
// back to the application's receiver, takes the observer out of the stack
// and returns once the Dispatcher's goroutines (handlers of OOB requests,
// OnDone callbacks) have ended. Handlers see their ctx end.
func (d *Dispatcher) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	reqs := make([]*request, 0, len(d.pending))
	for _, r := range d.pending {
		reqs = append(reqs, r)
	}
	d.mu.Unlock()
	d.cancel()
	for _, r := range reqs {
		r.expire(ErrClosed)
	}
	d.ch.SetReceiver(d.app)
	_, err := stack.Of(d.ch).Remove(d.w.Name())
	d.wg.Wait()
	if err != nil {
		return fmt.Errorf("rpc: close: %w", err)
	}
	return nil
}

// Stats are a Dispatcher's counters since New.
type Stats struct {
	Requests      int64 // requests sent (one per Call or Cast)
	Responses     int64 // responses received and matched to a waiting call
	LateResponses int64 // responses dropped: their call had ended (or never asked them)
	Handled       int64 // requests this member's handler ran (its own included)
	HandlerErrors int64 // of them, ended with an error
	HandlerPanics int64 // of them, ended with a panic
	Pending       int64 // calls waiting now
}

// Stats returns the counters (also listed in ch.Stats() under "RPC").
func (d *Dispatcher) Stats() Stats {
	d.mu.Lock()
	p := len(d.pending)
	d.mu.Unlock()
	return Stats{Requests: d.requests.Load(), Responses: d.responses.Load(), LateResponses: d.late.Load(),
		Handled: d.handled.Load(), HandlerErrors: d.handlerErrs.Load(), HandlerPanics: d.panics.Load(), Pending: int64(p)}
}

// goFunc runs f on a goroutine Close waits for; false if closed.
func (d *Dispatcher) goFunc(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.wg.Go(f)
	return true
}

type nestedKey struct{}

// nested reports whether ctx is (derived from) a handler's.
func nested(ctx context.Context) bool { return ctx.Value(nestedKey{}) != nil }

// ---- views and suspicions

// viewChanged records v; every member a call waits for that is not in v
// ends that wait (ErrLeft).
func (d *Dispatcher) viewChanged(v *stack.View) {
	members := make(map[stack.Address]bool, len(v.Members))
	for _, a := range v.Members {
		members[a] = true
	}
	d.mu.Lock()
	d.members = members
	reqs := d.pendingLocked()
	d.mu.Unlock()
	for _, r := range reqs {
		r.gone(func(a stack.Address) bool { return !members[a] }, Left, ErrLeft)
	}
}

// suspected ends every wait on the members.
func (d *Dispatcher) suspected(as []stack.Address) {
	d.mu.Lock()
	reqs := d.pendingLocked()
	d.mu.Unlock()
	for _, r := range reqs {
		r.gone(func(a stack.Address) bool {
			for _, s := range as {
				if s == a {
					return true
				}
			}
			return false
		}, Suspected, ErrSuspected)
	}
}

// disconnected ends every wait: this member leaves the group.
func (d *Dispatcher) disconnected() {
	d.mu.Lock()
	d.members = nil
	reqs := d.pendingLocked()
	d.mu.Unlock()
	for _, r := range reqs {
		r.gone(func(stack.Address) bool { return true }, Left, stack.ErrNotConnected)
	}
}

func (d *Dispatcher) pendingLocked() []*request {
	reqs := make([]*request, 0, len(d.pending))
	for _, r := range d.pending {
		reqs = append(reqs, r)
	}
	return reqs
}

// watcher is the observer at the top of the stack: it passes everything
// through and tells the Dispatcher of views, suspicions and the member's
// leaving as they go by.
type watcher struct {
	stack.Base
	d *Dispatcher
}

func (w *watcher) Name() string { return "RPC" }

func (w *watcher) Up(m *stack.Message) { w.PassUp(m) }

func (w *watcher) UpBatch(b *stack.Batch) { w.PassUpBatch(b) }

func (w *watcher) UpEvent(ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvViewChange:
		if e.View != nil {
			w.d.viewChanged(e.View)
		}
	case stack.EvSuspect:
		w.d.suspected(e.Members)
	}
	return w.PassUpEvent(ev)
}

func (w *watcher) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if _, ok := ev.(stack.EvDisconnect); ok {
		w.d.disconnected()
	}
	return w.PassDownEvent(ctx, ev)
}

// Stats lists the Dispatcher's counters among the stack's.
func (w *watcher) Stats() []stack.Stat {
	s := w.d.Stats()
	return []stack.Stat{{Name: "requests", Value: s.Requests}, {Name: "responses", Value: s.Responses},
		{Name: "late_responses", Value: s.LateResponses}, {Name: "handled", Value: s.Handled},
		{Name: "handler_errors", Value: s.HandlerErrors}, {Name: "handler_panics", Value: s.HandlerPanics},
		{Name: "pending", Value: s.Pending}}
}

// ---- receiving

// receiver returns what the Dispatcher installs as the channel's receiver:
// it offers Block/Unblock and GetState/SetState only if the application's
// receiver does, so the channel sees the same capabilities as without it.
func (d *Dispatcher) receiver() stack.Receiver {
	r := recv{d}
	b, isB := d.app.(stack.Blocker)
	s, isS := d.app.(stack.StateHandler)
	switch {
	case isB && isS:
		return struct {
			recv
			stack.Blocker
			stack.StateHandler
		}{r, b, s}
	case isB:
		return struct {
			recv
			stack.Blocker
		}{r, b}
	case isS:
		return struct {
			recv
			stack.StateHandler
		}{r, s}
	}
	return r
}

type recv struct{ d *Dispatcher }

func (r recv) Receive(m *stack.Message) {
	if !r.d.handle(m) && r.d.app != nil {
		r.d.app.Receive(m)
	}
}

func (r recv) ViewAccepted(v *stack.View) {
	if r.d.app != nil {
		r.d.app.ViewAccepted(v)
	}
}

// ReceiveBatch handles the batch's rpc messages and passes the others on
// (as a batch if the application takes batches), in their order: a request
// is handled after the messages before it have been delivered.
func (r recv) ReceiveBatch(b *stack.Batch) {
	d := r.d
	keep := b.Msgs[:0]
	for _, m := range b.Msgs {
		h, ok := m.Header(stack.IDRPC).(*Header)
		if !ok {
			keep = append(keep, m)
			continue
		}
		if h.Kind == kindRequest && len(keep) > 0 {
			d.deliver(b, keep)
			keep = b.Msgs[:0]
		}
		d.handleHeader(m, h)
	}
	d.deliver(b, keep)
}

func (d *Dispatcher) deliver(b *stack.Batch, ms []*stack.Message) {
	if len(ms) == 0 || d.app == nil {
		return
	}
	if br, ok := d.app.(stack.BatchReceiver); ok {
		sub := stack.Batch{Src: b.Src, Dest: b.Dest, Lane: b.Lane, Msgs: ms}
		br.ReceiveBatch(&sub)
		return
	}
	for _, m := range ms {
		d.app.Receive(m)
	}
}

// handle takes m if it is rpc traffic.
func (d *Dispatcher) handle(m *stack.Message) bool {
	h, ok := m.Header(stack.IDRPC).(*Header)
	if !ok {
		return false
	}
	d.handleHeader(m, h)
	return true
}

func (d *Dispatcher) handleHeader(m *stack.Message, h *Header) {
	if h.Kind == kindResponse {
		d.response(m.Src, h, m.Payload)
		return
	}
	if m.Src == d.ch.Address() {
		return // a multicast of our own; the caller ran it locally
	}
	if m.Has(stack.OOB) {
		select {
		case d.oobSem <- struct{}{}:
			if d.goFunc(func() {
				defer func() { <-d.oobSem }()
				d.serve(m, h)
			}) {
				return
			}
			<-d.oobSem
		default:
		}
	}
	d.serve(m, h)
}

// serve runs the handler for request m and sends the answer back, OOB.
func (d *Dispatcher) serve(m *stack.Message, h *Header) {
	val, fl := d.invoke(m)
	if h.Flags&flagNoReply != 0 {
		return
	}
	rsp := stack.NewMessage(m.Src, val).Set(stack.OOB | m.Flags&(stack.DontBundle|stack.NoFC))
	rsp.PutHeader(stack.IDRPC, &Header{Kind: kindResponse, Flags: fl, ID: h.ID})
	if err := d.ch.Send(d.ctx, rsp); err != nil {
		d.log.Debug("rpc: response not sent", "to", m.Src, "id", h.ID, "err", err)
	}
}

// invoke runs the handler, turning its error or panic into an answer.
func (d *Dispatcher) invoke(m *stack.Message) (val []byte, fl uint8) {
	d.handled.Add(1)
	if d.h == nil {
		return nil, flagNoHandler
	}
	defer func() {
		if p := recover(); p != nil {
			d.panics.Add(1)
			d.log.Error("rpc: handler panicked", "from", m.Src, "panic", p, "stack", string(debug.Stack()))
			val, fl = []byte(fmt.Sprint(p)), flagPanic
		}
	}()
	v, err := d.h(d.hctx, m)
	if err != nil {
		d.handlerErrs.Add(1)
		return []byte(err.Error()), flagError
	}
	return v, 0
}

// response matches an answer to its call.
func (d *Dispatcher) response(src stack.Address, h *Header, payload []byte) {
	d.mu.Lock()
	r := d.pending[h.ID]
	d.mu.Unlock()
	if r == nil || !r.answer(src, h.Flags, payload) {
		d.late.Add(1)
		return
	}
	d.responses.Add(1)
}

// local runs a request to this member itself without the network: OOB
// ones on a goroutine each, regular ones in order on one goroutine at a
// time (this member's own regular lane).
func (d *Dispatcher) local(r *request, m *stack.Message) {
	self := m.Src
	job := func() {
		val, fl := d.invoke(m)
		if r != nil {
			if r.answer(self, fl, val) {
				d.responses.Add(1)
			}
		}
	}
	if m.Has(stack.OOB) {
		if !d.goFunc(job) && r != nil {
			r.resolve(self, Failed, nil, ErrClosed)
		}
		return
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		if r != nil {
			r.resolve(self, Failed, nil, ErrClosed)
		}
		return
	}
	d.selfQ = append(d.selfQ, job)
	if d.selfRunning {
		d.mu.Unlock()
		return
	}
	d.selfRunning = true
	d.wg.Go(d.runSelf)
	d.mu.Unlock()
}

func (d *Dispatcher) runSelf() {
	for {
		d.mu.Lock()
		if len(d.selfQ) == 0 {
			d.selfRunning = false
			d.mu.Unlock()
			return
		}
		job := d.selfQ[0]
		d.selfQ[0] = nil
		d.selfQ = d.selfQ[1:]
		d.mu.Unlock()
		job()
	}
}
