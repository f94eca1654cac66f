package stack

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
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
// the channel before its view has come back from Receive. Deliveries are
// counted per epoch (the time between two views) for that.
type callbacks struct {
	mu      sync.Mutex
	idle    *sync.Cond // signalled when a view callback ends or an epoch drains
	queue   []func()
	running bool
	// Views queued and views whose callback has returned, counted since the
	// channel was made.
	queued, done atomic.Uint64
	cur          atomic.Pointer[epoch]
	wg           sync.WaitGroup
}

// epoch counts the deliveries that reached the channel after view q-1 was
// queued and before view q.
type epoch struct {
	q      uint64 // views queued before it began
	active atomic.Int64
	closed atomic.Bool // view q has been queued
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
	if view {
		before := cb.cur.Load()
		q := cb.queued.Add(1)
		cb.cur.Store(&epoch{q: q})
		before.closed.Store(true)
		g := f
		f = func() {
			cb.mu.Lock()
			for before.active.Load() > 0 {
				cb.idle.Wait()
			}
			cb.mu.Unlock()
			g()
		}
	}
	cb.queue = append(cb.queue, f)
	if cb.running {
		cb.mu.Unlock()
		return
	}
	cb.running = true
	cb.wg.Add(1)
	cb.mu.Unlock()
	go cb.run()
}

func (cb *callbacks) run() {
	defer cb.wg.Done()
	for {
		cb.mu.Lock()
		if len(cb.queue) == 0 {
			cb.running = false
			cb.mu.Unlock()
			return
		}
		f := cb.queue[0]
		cb.queue[0] = nil
		cb.queue = cb.queue[1:]
		cb.mu.Unlock()
		f()
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

// gate returns once the ViewAccepted of every view queued before e began
// has returned.
func (cb *callbacks) gate(e *epoch) {
	if cb.done.Load() >= e.q {
		return
	}
	cb.mu.Lock()
	for cb.done.Load() < e.q {
		cb.idle.Wait()
	}
	cb.mu.Unlock()
}

// leave ends a delivery admitted by enter.
func (cb *callbacks) leave(e *epoch) {
	if e.active.Add(-1) == 0 && e.closed.Load() {
		cb.mu.Lock()
		cb.idle.Broadcast()
		cb.mu.Unlock()
	}
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

// inCallback reports whether the calling goroutine is running one of the
// channel's callbacks into the application (Receive, ViewAccepted, Block,
// Unblock, GetState, SetState). Go gives goroutines no identity, so it reads
// the caller's stack; it is called only by Disconnect, Close and Connect, so
// the delivery path pays nothing for it.
func inCallback() bool {
	pcs := make([]uintptr, 256)
	n := runtime.Callers(2, pcs)
	for n == len(pcs) {
		pcs = make([]uintptr, 2*len(pcs))
		n = runtime.Callers(2, pcs)
	}
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		for _, name := range callbackFrames {
			if f.Function == name || strings.HasPrefix(f.Function, name+".") {
				return true
			}
		}
		if !more {
			return false
		}
	}
}
