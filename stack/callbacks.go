package stack

import (
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// callbacks hands a channel's notices (views, Block, Unblock) to the
// application one at a time, in order, on a goroutine of the channel's own.
// The protocol that raises a notice only queues it: GMS installs a view, and
// FLUSH blocks the group, without waiting for what the application does
// with it, and with none of their locks held when the application runs.
//
// Views and messages keep their order as the application sees it, as if
// the view callback ran on the delivering goroutine: a message that
// reaches the channel after a view waits until that view's ViewAccepted
// has returned, and a ViewAccepted waits until every message that reached
// the channel before its view has been handed to Receive, and, for at
// most slowReceive, until those Receive calls have returned. Deliveries
// are counted per epoch (the time between two views) for that. A Receive
// that runs longer lets the view go: it holds up only its own sender's
// later messages (on their per-sender lane, behind it; those of the same
// view then come after the view), not every sender's, as JGroups delivers.
type callbacks struct {
	mu      sync.Mutex
	idle    *sync.Cond // signalled when a view callback ends or an epoch drains
	queue   []item
	running bool
	// Deliveries queued behind a view callback: later ones of the same or
	// a later epoch queue too, to keep each sender's order. heldBy counts
	// them by their epoch's view number (under mu).
	held   atomic.Int64
	heldBy map[uint64]int
	// Channel calls in progress on the callback goroutine (see calls).
	calling atomic.Int32
	active  atomic.Bool // running, read without the lock
	// Views queued and views whose callback has returned, counted since the
	// channel was made.
	queued, done atomic.Uint64
	cur          atomic.Pointer[epoch]
	wg           sync.WaitGroup
}

// item is a queued callback: view is the number of the view it belongs to
// (a ViewAccepted, or a delivery that came after that view).
type item struct {
	f     func()
	view  uint64
	isMsg bool
}

// slowReceive is how long a view waits for Receive calls of the view
// before it that are still running (the messages themselves were handed
// over): long enough that an application's ordinary Receive finishes and
// the view comes after it, short enough that one blocked Receive does not
// hold every other sender up behind the view.
const slowReceive = time.Second

// epoch counts the deliveries that reached the channel after view q-1 was
// queued and before view q.
type epoch struct {
	q      uint64 // views queued before it began
	active atomic.Int64
	// inApp: of active, those inside the application's Receive, or held
	// behind one (a batch admitted with the message Receive has).
	inApp  atomic.Int64
	closed atomic.Bool // view q has been queued, or a drain began
	// prev: the epoch a drain closed, while that drain still waits for it
	// (a view queued meanwhile waits for it too).
	prev atomic.Pointer[epoch]
	// older: the epochs before this one that may still have deliveries
	// out, newest first (under cb.mu): a drain waits for them too.
	older *epoch
}

// pendingLocked returns the chain from e of the epochs that may still have
// deliveries out, dropping those that have none: a closed epoch whose
// count is back at zero stays there (only the current epoch admits new
// deliveries). Callers hold cb.mu.
func pendingLocked(e *epoch) *epoch {
	for e != nil && e.active.Load() == 0 {
		e = e.older
	}
	if e != nil {
		e.older = pendingLocked(e.older)
	}
	return e
}

// waitFor returns once e's deliveries, and those of the epoch a drain is
// still waiting for, are back; callers hold cb.mu. With grace, a Receive
// that has run for grace while every other delivery is back (or behind
// it) is not waited for any longer.
func (cb *callbacks) waitFor(e *epoch, grace time.Duration) {
	var since time.Time
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for ; e != nil; e = e.prev.Load() {
		for e.active.Load() > 0 {
			if grace > 0 && e.active.Load() == e.inApp.Load() {
				now := time.Now()
				if since.IsZero() {
					since = now
					t = time.AfterFunc(grace, func() {
						cb.mu.Lock()
						cb.idle.Broadcast()
						cb.mu.Unlock()
					})
				}
				if now.Sub(since) >= grace {
					break
				}
			} else if !since.IsZero() {
				since = time.Time{} // a delivery moved: the grace starts again
				t.Stop()
			}
			cb.idle.Wait()
		}
	}
}

func newCallbacks() *callbacks {
	cb := &callbacks{}
	cb.idle = sync.NewCond(&cb.mu)
	cb.cur.Store(&epoch{})
	return cb
}

// do queues f. A view's f runs once the deliveries before it are back.
func (cb *callbacks) do(f func(), view bool) {
	cb.mu.Lock()
	it := item{f: f, view: cb.queued.Load()}
	if view {
		before := cb.cur.Load()
		q := cb.queued.Add(1)
		next := &epoch{q: q}
		cb.cur.Store(next)
		before.closed.Store(true)
		next.older = pendingLocked(before)
		it.view = q
		it.f = func() {
			cb.mu.Lock()
			cb.waitFor(before, slowReceive)
			cb.mu.Unlock()
			f()
		}
	}
	cb.queue = append(cb.queue, it)
	cb.startLocked()
}

// startLocked starts the goroutine if it is not running, and unlocks.
func (cb *callbacks) startLocked() {
	if cb.running {
		cb.mu.Unlock()
		return
	}
	cb.running = true
	cb.active.Store(true)
	cb.wg.Add(1)
	cb.mu.Unlock()
	go cb.run()
}

// gated reports whether a delivery counted in epoch e must wait: a view
// callback it must follow is pending, or deliveries of e or an earlier
// epoch are queued behind one. (Those of later epochs are not waited for:
// a delivery admitted into an earlier epoch, which a later view's callback
// waits for, goes before them.)
func (cb *callbacks) gated(e *epoch) bool {
	if cb.done.Load() < e.q {
		return true
	}
	if cb.held.Load() == 0 {
		return false
	}
	cb.mu.Lock()
	defer cb.mu.Unlock()
	return cb.heldUpToLocked(e.q)
}

// gatedLocked is gated for callers that hold cb.mu.
func (cb *callbacks) gatedLocked(e *epoch) bool {
	return cb.done.Load() < e.q || cb.held.Load() > 0 && cb.heldUpToLocked(e.q)
}

// heldUpToLocked reports whether deliveries of epochs up to view q are
// queued; callers hold cb.mu.
func (cb *callbacks) heldUpToLocked(q uint64) bool {
	for v, n := range cb.heldBy {
		if v <= q && n > 0 {
			return true
		}
	}
	return false
}

// enterWith counts a delivery of a message carrying rc: in the epoch rc
// was admitted to while that admission lasts, else in the current one.
func (cb *callbacks) enterWith(rc *Receipt) *epoch {
	if rc != nil {
		if e := rc.ep.Load(); e != nil {
			e.active.Add(1)
			if rc.ep.Load() == e {
				return e // the admission holds e open until it is released
			}
			cb.leave(e)
		}
	}
	return cb.enter()
}

// hold delivers f, a delivery counted in epoch e (and admitted with rc)
// that was gated. Normally
// the caller waits until the view callbacks before it have returned, so
// that the layers below count the message as processed only once the
// application has it (flow control returns credits for it then). But
// while the callback goroutine is itself inside a channel call (a send, a
// flush), which may need this member's deliveries to move, f is queued in
// order on the callback goroutine instead, and the caller goes on.
func (cb *callbacks) hold(e *epoch, rc *Receipt, f func()) {
	cb.mu.Lock()
	for cb.gatedLocked(e) && cb.calling.Load() == 0 {
		cb.idle.Wait()
	}
	if !cb.gatedLocked(e) {
		cb.mu.Unlock()
		defer cb.inApp(e, rc)()
		f()
		return
	}
	cb.held.Add(1)
	if cb.heldBy == nil {
		cb.heldBy = map[uint64]int{}
	}
	cb.heldBy[e.q]++
	q := e.q
	it := item{f: func() { defer cb.unhold(q); f() }, view: e.q, isMsg: true}
	// Before any view queued after the delivery's epoch began (one may
	// have come in since).
	i := len(cb.queue)
	for i > 0 && !cb.queue[i-1].isMsg && cb.queue[i-1].view > e.q {
		i--
	}
	cb.queue = slices.Insert(cb.queue, i, it)
	cb.startLocked()
}

func (cb *callbacks) unhold(q uint64) {
	cb.mu.Lock()
	if cb.heldBy[q]--; cb.heldBy[q] <= 0 {
		delete(cb.heldBy, q)
	}
	if cb.held.Add(-1) == 0 {
		cb.idle.Broadcast()
	}
	cb.mu.Unlock()
}

// calls marks a channel call made by the application; if it runs on the
// callback goroutine, deliveries behind a view callback are queued rather
// than waited for until end is called. It reads the caller's stack only
// while the callback goroutine exists (a notice is being delivered).
func (cb *callbacks) calls() (end func()) {
	if !cb.active.Load() || !onStack(runFrame) {
		return func() {}
	}
	cb.mu.Lock()
	cb.calling.Add(1)
	cb.idle.Broadcast()
	cb.mu.Unlock()
	return func() { cb.calling.Add(-1) }
}

func (cb *callbacks) run() {
	defer cb.wg.Done()
	for {
		cb.mu.Lock()
		if len(cb.queue) == 0 {
			cb.running = false
			cb.active.Store(false)
			cb.mu.Unlock()
			return
		}
		it := cb.queue[0]
		cb.queue[0] = item{}
		cb.queue = cb.queue[1:]
		cb.mu.Unlock()
		it.f()
	}
}

// stats reports the callbacks' state: views queued and done (a gap that
// stays means a ViewAccepted that does not return, or one waiting for a
// delivery that does not come back), deliveries held behind a view, and
// notices queued.
func (cb *callbacks) stats() []Stat {
	cb.mu.Lock()
	queued := int64(len(cb.queue))
	cb.mu.Unlock()
	return []Stat{
		{Name: "views_queued", Value: int64(cb.queued.Load()), Counter: true},
		{Name: "views_done", Value: int64(cb.done.Load()), Counter: true},
		{Name: "deliveries_held", Value: cb.held.Load()},
		{Name: "callbacks_queued", Value: queued},
	}
}

// viewDone marks the end of a ViewAccepted; the messages behind it go.
func (cb *callbacks) viewDone() {
	cb.mu.Lock()
	cb.done.Add(1)
	cb.idle.Broadcast()
	cb.mu.Unlock()
}

// enter counts a delivery in the current epoch, until leave: the next
// view's callback waits for it. It costs a few atomic operations.
func (cb *callbacks) enter() *epoch {
	for {
		e := cb.cur.Load()
		e.active.Add(1)
		if cb.cur.Load() == e {
			return e
		}
		cb.leave(e) // a view came in between: the delivery is after it
	}
}

// inApp marks, around the application's Receive of a delivery counted in
// e (and of one whose admission rc holds), that the delivery has been
// handed over: a view waits for it only up to slowReceive (waitFor). The
// returned func ends the mark.
func (cb *callbacks) inApp(e *epoch, rc *Receipt) (end func()) {
	var pe *epoch
	if rc != nil {
		if pe = rc.ep.Load(); pe != nil {
			pe.inApp.Add(1)
		}
	}
	e.inApp.Add(1)
	if e.closed.Load() && e.active.Load() == e.inApp.Load() || pe != nil && pe.closed.Load() && pe.active.Load() == pe.inApp.Load() {
		// A view waiting for this epoch (it is closed) may start its
		// grace now; with none, the delivery path takes no lock here.
		cb.mu.Lock()
		cb.idle.Broadcast()
		cb.mu.Unlock()
	}
	return func() {
		e.inApp.Add(-1)
		if pe != nil {
			pe.inApp.Add(-1)
		}
	}
}

// leave ends a delivery admitted by enter.
func (cb *callbacks) leave(e *epoch) {
	if e.active.Add(-1) == 0 && e.closed.Load() {
		cb.mu.Lock()
		cb.idle.Broadcast()
		cb.mu.Unlock()
	}
}

// drain returns once every delivery that reached the channel before it has
// come back from Receive, those counted in the epochs of earlier views too
// (a view queued since they arrived does not wait for a slow Receive, but
// a state must include them); later deliveries are counted apart (a new
// epoch of the same view) and not waited for.
func (cb *callbacks) drain() {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	before := cb.cur.Load()
	next := &epoch{q: before.q}
	next.prev.Store(before)
	cb.cur.Store(next)
	before.closed.Store(true)
	next.older = pendingLocked(before)
	// waitFor lets go of cb.mu while it waits: a view queued meanwhile may
	// drop drained epochs from the chain, never one with deliveries out.
	for e := next.older; e != nil; e = e.older {
		cb.waitFor(e, 0)
	}
	next.older = nil
	next.prev.Store(nil)
}

// wait returns once the queue is empty and its goroutine gone.
func (cb *callbacks) wait() {
	cb.wg.Wait()
}

// Names of the functions through which every application callback runs; a
// goroutine with one of them on its stack is inside a callback.
var callbackFrames = []string{
	"github.com/strata-go/strata/stack.(*Channel).receive",
	"github.com/strata-go/strata/stack.(*Channel).receiveBatch",
	"github.com/strata-go/strata/stack.(*Channel).upEvent",
	"github.com/strata-go/strata/stack.(*callbacks).run",
}

// runFrame is the callback goroutine's function.
const runFrame = "github.com/strata-go/strata/stack.(*callbacks).run"

// stateFrame is the function through which GetState and SetState run.
const stateFrame = "github.com/strata-go/strata/stack.(*Channel).stateCallback"

// inCallback reports whether the calling goroutine is running one of the
// channel's callbacks into the application (Receive, ViewAccepted, Block,
// Unblock, GetState, SetState). Go gives goroutines no identity, so it reads
// the caller's stack; it is called only by Disconnect, Close and Connect, so
// the delivery path pays nothing for it.
func inCallback() bool { return onStack(callbackFrames...) }

// onStack reports whether one of the named functions is on the calling
// goroutine's stack.
func onStack(names ...string) bool {
	pcs := make([]uintptr, 256)
	n := runtime.Callers(2, pcs)
	for n == len(pcs) {
		pcs = make([]uintptr, 2*len(pcs))
		n = runtime.Callers(2, pcs)
	}
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		for _, name := range names {
			if f.Function == name || strings.HasPrefix(f.Function, name+".") {
				return true
			}
		}
		if !more {
			return false
		}
	}
}
