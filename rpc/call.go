package rpc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/strata-go/strata/stack"
)

// Mode says how many answers a Cast waits for. ModeN(n) waits for n.
type Mode int

// Response modes (JGroups' GET_ALL, GET_FIRST, GET_MAJORITY, GET_NONE).
const (
	// ModeAll waits for every member's answer (the default).
	ModeAll Mode = 0
	// ModeFirst waits for the first answer.
	ModeFirst Mode = -1
	// ModeMajority waits for answers from a majority of the members asked.
	ModeMajority Mode = -2
	// ModeNone sends and returns at once (fire and forget): no answer is
	// sent back.
	ModeNone Mode = -3
)

// ModeN waits for n answers (at most as many as there are members asked).
func ModeN(n int) Mode { return Mode(max(n, 1)) }

// String names the mode.
func (m Mode) String() string {
	switch m {
	case ModeAll:
		return "all"
	case ModeFirst:
		return "first"
	case ModeMajority:
		return "majority"
	case ModeNone:
		return "none"
	}
	if m > 0 {
		return fmt.Sprint(int(m))
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// need is how many accepted answers of n members end a call in mode m.
func (m Mode) need(n int) int {
	switch {
	case m == ModeAll:
		return n
	case m == ModeFirst:
		return min(1, n)
	case m == ModeMajority:
		return n/2 + 1
	case m > 0:
		return min(int(m), n)
	}
	return n
}

// Filter looks at each answer of a Cast as it comes (JGroups' RspFilter):
// Accept says whether it counts towards the mode (a rejected answer is
// marked Rejected), NeedMore whether the Cast should go on waiting. Its
// methods are called one at a time.
type Filter interface {
	Accept(r Response) bool
	NeedMore() bool
}

// FilterFuncs adapts functions to Filter; a nil Accept accepts every
// answer, a nil NeedMore always wants more (the mode decides).
type FilterFuncs struct {
	AcceptFunc   func(r Response) bool
	NeedMoreFunc func() bool
}

// Accept calls AcceptFunc.
func (f FilterFuncs) Accept(r Response) bool { return f.AcceptFunc == nil || f.AcceptFunc(r) }

// NeedMore calls NeedMoreFunc.
func (f FilterFuncs) NeedMore() bool { return f.NeedMoreFunc == nil || f.NeedMoreFunc() }

// CallOption configures one Call or Cast.
type CallOption func(*callOptions)

type callOptions struct {
	mode    Mode
	filter  Filter
	exclude []stack.Address
	flags   stack.Flags
}

// WithMode sets the response mode of a Cast (Call waits for its one
// member, or with ModeNone for none).
func WithMode(m Mode) CallOption { return func(o *callOptions) { o.mode = m } }

// WithFilter sets a response filter.
func WithFilter(f Filter) CallOption { return func(o *callOptions) { o.filter = f } }

// Exclude leaves the members out of a Cast (for example the caller itself).
func Exclude(members ...stack.Address) CallOption {
	return func(o *callOptions) { o.exclude = append(o.exclude, members...) }
}

// WithFlags sets the request's message flags: stack.OOB has the handler
// run concurrently with others (not in order), stack.DontBundle and
// stack.NoFC are passed on to the stack (and to the response).
func WithFlags(f stack.Flags) CallOption { return func(o *callOptions) { o.flags |= f } }

// OOB is WithFlags(stack.OOB).
func OOB() CallOption { return WithFlags(stack.OOB) }

// Status is what became of one member's part in a call.
type Status uint8

// Statuses of a Response.
const (
	// NotReceived: no answer; the call ended first as its mode allowed.
	NotReceived Status = iota
	// Received: the handler answered; Value is its answer.
	Received
	// Failed: the handler returned an error or panicked (Err is a
	// *RemoteError), or the request could not be sent (Err says why).
	Failed
	// Rejected: the filter did not accept the answer (Value, Err as came).
	Rejected
	// Suspected: the member was suspected while the call waited (ErrSuspected).
	Suspected
	// Left: the member was not in the view, or left it while the call
	// waited (ErrLeft).
	Left
	// TimedOut: the call's context ended before the member answered (Err is
	// the context's error).
	TimedOut
)

var statusNames = [...]string{"not received", "received", "failed", "rejected", "suspected", "left", "timed out"}

// String names the status.
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", s)
}

// Response is one member's part in a call.
type Response struct {
	Member stack.Address
	Status Status
	Value  []byte
	Err    error // nil only if Received
}

// Responses are a Cast's result: one Response per member asked, in the
// order asked.
type Responses []Response

// Get returns the response of member a.
func (rs Responses) Get(a stack.Address) (Response, bool) {
	for _, r := range rs {
		if r.Member == a {
			return r, true
		}
	}
	return Response{}, false
}

// Received returns the responses with an answer (Status Received).
func (rs Responses) Received() Responses {
	var out Responses
	for _, r := range rs {
		if r.Status == Received {
			out = append(out, r)
		}
	}
	return out
}

// First returns the first answer received, if any.
func (rs Responses) First() (Response, bool) {
	for _, r := range rs {
		if r.Status == Received {
			return r, true
		}
	}
	return Response{}, false
}

// Call sends payload to member dest and waits for its answer, until ctx
// ends. A handler's error comes back as a *RemoteError; a member that is
// not in the view, leaves it or is suspected ends the call with ErrLeft or
// ErrSuspected. With WithMode(ModeNone) Call returns once the request is
// sent.
func (d *Dispatcher) Call(ctx context.Context, dest stack.Address, payload []byte, opts ...CallOption) ([]byte, error) {
	r := d.start(ctx, []stack.Address{dest}, true, payload, opts)
	<-r.done
	return r.single()
}

// Cast sends payload to dests (nil: the whole view) and waits as its mode
// says (ModeAll by default), until ctx ends. A Cast to the whole view goes
// as one multicast; a Cast to some members as one unicast to each (an
// anycast). The Responses say, per member, its answer or what became of it;
// the error is non-nil if the Cast could not be made (not connected,
// closed) or ctx ended before the mode was satisfied (then it wraps ctx's
// error, and the Responses say who answered and who did not).
func (d *Dispatcher) Cast(ctx context.Context, dests []stack.Address, payload []byte, opts ...CallOption) (Responses, error) {
	r := d.start(ctx, dests, false, payload, opts)
	<-r.done
	return r.result()
}

// CallAsync is Call returning at once with a Future of the answer.
func (d *Dispatcher) CallAsync(ctx context.Context, dest stack.Address, payload []byte, opts ...CallOption) *Future[[]byte] {
	return &Future[[]byte]{r: d.start(ctx, []stack.Address{dest}, true, payload, opts), get: (*request).single}
}

// CastAsync is Cast returning at once with a Future of the Responses.
func (d *Dispatcher) CastAsync(ctx context.Context, dests []stack.Address, payload []byte, opts ...CallOption) *Future[Responses] {
	return &Future[Responses]{r: d.start(ctx, dests, false, payload, opts), get: (*request).result}
}

// Future is the pending result of CallAsync or CastAsync. The call goes on
// until its mode is satisfied or the context given to it ends.
type Future[T any] struct {
	r   *request
	get func(*request) (T, error)
}

// Done is closed when the result is there.
func (f *Future[T]) Done() <-chan struct{} { return f.r.done }

// Wait returns the result once it is there, or ctx's error if ctx ends
// first (which only ends this wait, not the call).
func (f *Future[T]) Wait(ctx context.Context) (T, error) {
	select {
	case <-f.r.done:
		return f.get(f.r)
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// OnDone calls fn with the result once it is there, on a goroutine of the
// Dispatcher's (Close waits for it); at once if it is there already. If the
// Dispatcher is closed, fn runs on the caller's goroutine.
func (f *Future[T]) OnDone(fn func(T, error)) {
	run := func() {
		<-f.r.done
		fn(f.get(f.r))
	}
	if !f.r.d.goFunc(run) {
		run()
	}
}

// Cancel ends the call now, as if its context had ended (context.Canceled).
func (f *Future[T]) Cancel() { f.r.expire(context.Canceled) }

// request is one call waiting for answers.
type request struct {
	d      *Dispatcher
	id     uint64
	call   bool // a Call: one member, a plain error
	need   int
	filter Filter
	stop   func() bool // stops the context's AfterFunc

	mu       sync.Mutex
	rsps     Responses
	waiting  int // members not resolved yet
	accepted int
	finished bool
	err      error // the call's own error (ctx, closed, not connected)
	done     chan struct{}
}

// start sends the request and returns it, waiting or (on an error, or
// with nothing to wait for) done.
func (d *Dispatcher) start(ctx context.Context, dests []stack.Address, call bool, payload []byte, opts []CallOption) *request {
	var o callOptions
	for _, f := range opts {
		f(&o)
	}
	r := &request{d: d, call: call, filter: o.filter, done: make(chan struct{})}
	if err := ctx.Err(); err != nil {
		// Ended already: nothing is sent (an answer that came at once
		// would otherwise race with ctx).
		r.fail(err)
		return r
	}
	v := d.ch.View()
	if v == nil {
		r.fail(stack.ErrNotConnected)
		return r
	}
	self := d.ch.Address()
	whole := dests == nil
	if whole {
		dests = v.Members
	}
	targets := make([]stack.Address, 0, len(dests))
	for _, a := range dests {
		if a.IsZero() {
			r.fail(errors.New("rpc: zero address among the members to call"))
			return r
		}
		if !slices.Contains(o.exclude, a) && !slices.Contains(targets, a) {
			targets = append(targets, a)
		}
	}
	r.rsps = make(Responses, len(targets))
	for i, a := range targets {
		r.rsps[i] = Response{Member: a, Err: ErrNotAnswered}
	}
	r.waiting = len(targets)
	r.need = o.mode.need(len(targets))
	flags := o.flags
	if nested(ctx) && o.mode != ModeNone {
		flags |= stack.OOB
	}
	hdr := &Header{Kind: kindRequest}
	noReply := o.mode == ModeNone
	if noReply {
		hdr.Flags = flagNoReply
	}

	// Register before sending: an answer may come before Send returns.
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		r.fail(ErrClosed)
		return r
	}
	r.id = d.nextID.Add(1)
	hdr.ID = r.id
	members := d.members
	if !noReply && len(targets) > 0 {
		d.pending[r.id] = r
	}
	d.mu.Unlock()
	d.requests.Add(1)
	if noReply || len(targets) == 0 {
		r.mu.Lock()
		r.finishLocked(nil)
		r.mu.Unlock()
	} else {
		stop := context.AfterFunc(ctx, func() { r.expire(ctx.Err()) })
		r.mu.Lock()
		if r.finished {
			stop()
		} else {
			r.stop = stop
		}
		r.mu.Unlock()
	}
	if members == nil {
		members = map[stack.Address]bool{}
		for _, a := range v.Members {
			members[a] = true
		}
	}

	// One multicast if every other member is asked, else a unicast each.
	others := 0
	sendSelf := false
	for _, a := range targets {
		switch {
		case a == self:
			sendSelf = true
		case !members[a]:
			if !noReply {
				r.resolve(a, Left, nil, fmt.Errorf("rpc: %s: %w", a, ErrLeft))
			}
		default:
			others++
		}
	}
	msg := func(dest stack.Address) *stack.Message {
		m := stack.NewMessage(dest, payload).Set(flags)
		m.PutHeader(stack.IDRPC, hdr)
		return m
	}
	if whole && others >= 2 && others == len(v.Members)-1 && v.Contains(self) {
		m := msg(stack.Address{})
		m.SetTransient(stack.DontLoopback)
		if err := d.ch.Send(ctx, m); err != nil && !noReply {
			r.gone(func(a stack.Address) bool { return a != self }, Failed, err)
		}
	} else {
		for _, a := range targets {
			if a == self || !members[a] {
				continue
			}
			if err := d.ch.Send(ctx, msg(a)); err != nil && !noReply {
				r.resolve(a, Failed, nil, fmt.Errorf("rpc: send to %s: %w", a, err))
			}
		}
	}
	if sendSelf {
		m := msg(self)
		m.Src = self
		if noReply {
			d.local(nil, m)
		} else {
			d.local(r, m)
		}
	}
	return r
}

// fail ends a request that could not start.
func (r *request) fail(err error) {
	r.mu.Lock()
	r.finishLocked(err)
	r.mu.Unlock()
}

// index returns the position of member a, or -1.
func (r *request) index(a stack.Address) int {
	for i := range r.rsps {
		if r.rsps[i].Member == a {
			return i
		}
	}
	return -1
}

// answer records member src's answer; false if it was not expected (late,
// duplicate, or from a member not asked).
func (r *request) answer(src stack.Address, fl uint8, payload []byte) bool {
	switch {
	case fl&flagError != 0:
		return r.resolve(src, Failed, payload, &RemoteError{Member: src, Text: string(payload)})
	case fl&flagPanic != 0:
		return r.resolve(src, Failed, payload, &RemoteError{Member: src, Text: string(payload), Panic: true})
	case fl&flagNoHandler != 0:
		return r.resolve(src, Failed, nil, &RemoteError{Member: src, NoHandler: true})
	}
	return r.resolve(src, Received, payload, nil)
}

// resolve sets member a's outcome if it is still open; it reports whether
// it was.
func (r *request) resolve(a stack.Address, st Status, val []byte, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.index(a)
	if r.finished || i < 0 || r.rsps[i].Status != NotReceived {
		return false
	}
	r.resolveLocked(i, st, val, err)
	return true
}

func (r *request) resolveLocked(i int, st Status, val []byte, err error) {
	rsp := &r.rsps[i]
	rsp.Status, rsp.Value, rsp.Err = st, val, err
	r.waiting--
	if st == Received || st == Failed {
		if r.filter == nil || r.filter.Accept(*rsp) {
			r.accepted++
		} else {
			rsp.Status = Rejected
			if rsp.Err == nil {
				rsp.Err = ErrRejected
			}
		}
	}
	if r.accepted >= r.need || r.waiting == 0 || (r.filter != nil && !r.filter.NeedMore()) {
		r.finishLocked(nil)
	}
}

// gone resolves every open member for which which is true with st.
func (r *request) gone(which func(stack.Address) bool, st Status, sentinel error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.rsps {
		if r.finished {
			return
		}
		if a := r.rsps[i].Member; r.rsps[i].Status == NotReceived && which(a) {
			err := sentinel
			if st == Suspected || st == Left {
				err = fmt.Errorf("rpc: %s: %w", a, sentinel)
			}
			r.resolveLocked(i, st, nil, err)
		}
	}
}

// expire ends the call with err (its context ended, or Close): the
// members that have not answered are marked TimedOut.
func (r *request) expire(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return
	}
	for i := range r.rsps {
		if rsp := &r.rsps[i]; rsp.Status == NotReceived {
			rsp.Status, rsp.Err = TimedOut, err
		}
	}
	r.finishLocked(err)
}

// finishLocked ends the request; callers hold r.mu.
func (r *request) finishLocked(err error) {
	if r.finished {
		return
	}
	r.finished = true
	r.err = err
	close(r.done)
	if r.stop != nil {
		r.stop()
	}
	if r.id != 0 {
		r.d.mu.Lock()
		delete(r.d.pending, r.id)
		r.d.mu.Unlock()
	}
}

// result is a Cast's outcome.
func (r *request) result() (Responses, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if r.err != nil {
		err = fmt.Errorf("rpc: cast: %w", r.err)
	}
	return slices.Clone(r.rsps), err
}

// single is a Call's outcome.
func (r *request) single() ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.rsps) == 0 {
		if r.err != nil {
			return nil, fmt.Errorf("rpc: call: %w", r.err)
		}
		return nil, nil // ModeNone, or nobody to call
	}
	rsp := r.rsps[0]
	switch rsp.Status {
	case Received:
		return rsp.Value, nil
	case NotReceived:
		if r.err != nil {
			return nil, fmt.Errorf("rpc: call: %w", r.err)
		}
		return nil, nil // ModeNone
	case TimedOut:
		return nil, fmt.Errorf("rpc: call %s: %w", rsp.Member, rsp.Err)
	}
	return nil, rsp.Err
}
