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
// Messages wait for views: a message reaches Receive only once every
// ViewAccepted queued before it has returned, so the application sees each
// message after the view it was delivered in, as it would if the view
// callback ran on the delivering goroutine.
type callbacks struct {
	mu      sync.Mutex
	idle    *sync.Cond // signalled when a view callback ends
	queue   []func()
	running bool
	// Views queued and views whose callback has returned, counted since the
	// channel was made. A message that arrives when queued is q waits until
	// done reaches q: for the views before it, not for those after.
	queued, done atomic.Uint64
	wg           sync.WaitGroup
}

func newCallbacks() *callbacks {
	cb := &callbacks{}
	cb.idle = sync.NewCond(&cb.mu)
	return cb
}

// do queues f; view says it is a ViewAccepted, which messages wait for.
func (cb *callbacks) do(f func(), view bool) {
	cb.mu.Lock()
	cb.queue = append(cb.queue, f)
	if view {
		cb.queued.Add(1)
	}
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

// awaitViews returns once the ViewAccepted of every view queued before the
// call has returned. It is the delivery path's gate; it costs two atomic
// loads when no view callback is pending.
func (cb *callbacks) awaitViews() {
	q := cb.queued.Load()
	if cb.done.Load() >= q {
		return
	}
	cb.mu.Lock()
	for cb.done.Load() < q {
		cb.idle.Wait()
	}
	cb.mu.Unlock()
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
