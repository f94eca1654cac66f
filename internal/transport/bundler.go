package transport

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/strata-go/strata/stack"
)

// ErrQueueFull is returned by SendQueue.Put when the queue is full and the
// caller asked to drop rather than wait.
var ErrQueueFull = errors.New("transport: bundler queue full")

// SendQueue is the bounded queue between senders and the bundler. It is a
// slice under a mutex rather than a channel: a sender pays one uncontended
// lock per message, and the bundler takes everything queued in one swap,
// where a channel costs a lock on each side per message (7% of a one-sender
// run's CPU went to the channel).
type SendQueue struct {
	max int

	mu     sync.Mutex
	msgs   []*stack.Message
	asleep bool          // the bundler waits on wake
	wake   chan struct{} // capacity 1: the bundler's wake-up
	room   chan struct{} // closed when the bundler takes; nil unless a sender waits
}

// NewSendQueue returns a queue that holds n messages.
func NewSendQueue(n int) *SendQueue {
	return &SendQueue{max: max(n, 1), wake: make(chan struct{}, 1)}
}

// TryPut queues m if there is room, without waiting, and reports whether it
// did (the fast path of Put).
func (q *SendQueue) TryPut(m *stack.Message) bool {
	q.mu.Lock()
	if len(q.msgs) >= q.max {
		q.mu.Unlock()
		return false
	}
	q.msgs = append(q.msgs, m)
	wake := q.asleep
	q.asleep = false
	q.mu.Unlock()
	if wake {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// Put queues m. When the queue is full it returns ErrQueueFull at once if
// drop is set, and otherwise waits for room, ctx or done.
func (q *SendQueue) Put(ctx context.Context, m *stack.Message, drop bool, done <-chan struct{}) error {
	for {
		if q.TryPut(m) {
			return nil
		}
		if drop {
			return ErrQueueFull
		}
		q.mu.Lock()
		if len(q.msgs) < q.max { // the bundler took meanwhile
			q.mu.Unlock()
			continue
		}
		if q.room == nil {
			q.room = make(chan struct{})
		}
		room := q.room
		q.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return stack.ErrClosed
		}
	}
}

// Take moves everything queued into dst (emptied first) and returns it. With
// wait set and nothing queued it waits for a message or for done; it returns
// false only when done is closed.
func (q *SendQueue) Take(dst []*stack.Message, wait bool, done <-chan struct{}) ([]*stack.Message, bool) {
	clear(dst)
	dst = dst[:0]
	for {
		q.mu.Lock()
		if len(q.msgs) > 0 || !wait {
			// Swap: the senders append to what the bundler handed back.
			dst, q.msgs = q.msgs, dst
			if q.room != nil {
				close(q.room)
				q.room = nil
			}
			q.mu.Unlock()
			return dst, true
		}
		q.asleep = true
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-done:
			return dst, false
		}
	}
}

// BufPool hands out buffers of one capacity (a bundle's largest size plus
// room), so the data path never allocates per bundle.
type BufPool struct{ p sync.Pool }

// NewBufPool returns a pool of buffers with capacity size.
func NewBufPool(size int) *BufPool {
	bp := &BufPool{}
	bp.p.New = func() any { b := make([]byte, 0, size); return &b }
	return bp
}

// Get returns an empty buffer.
func (p *BufPool) Get() *[]byte {
	b := p.p.Get().(*[]byte)
	*b = (*b)[:0]
	return b
}

// Put returns a buffer to the pool.
func (p *BufPool) Put(b *[]byte) { p.p.Put(b) }

// BundleCounters are the bundler's statistics (and those of bundles a
// transport sends itself, unbundled).
type BundleCounters struct {
	BundlesSent atomic.Int64 `stat:"bundles_sent"`
	BundleMsgs  atomic.Int64 `stat:"bundle_msgs_sent"`
	BundleBytes atomic.Int64
}

// Count adds one bundle of msgs messages and n bytes.
func (c *BundleCounters) Count(msgs, n int) {
	c.BundlesSent.Add(1)
	c.BundleMsgs.Add(int64(msgs))
	c.BundleBytes.Add(int64(n))
}

// AvgSize is the average size of the bundles sent so far.
func (c *BundleCounters) AvgSize() int64 {
	if n := c.BundlesSent.Load(); n > 0 {
		return c.BundleBytes.Load() / n
	}
	return 0
}

// Sink is the transport side of a Bundler: it takes finished bundles and
// puts them on the network.
type Sink interface {
	// Bundle takes buf, a finished bundle for dest (zero: the group). The
	// sink owns buf and returns it to the pool once sent.
	Bundle(buf *[]byte, dest stack.Address)
	// Flush sends what Bundle took: the bundler's queue is drained, or
	// flushAfter bundles were finished since the last Flush. A sink that
	// sends each bundle as it takes it (TCP's) does nothing here.
	Flush()
}

// Owner is the transport a Bundler packs for: its local address and stack
// (for the cluster name).
type Owner interface {
	LocalAddress() stack.Address
	Stack() *stack.Stack
}

// flushAfter is how many finished bundles the bundler hands the sink before
// it has them sent, when the queue does not run dry first: under a steady
// load the queue may never be empty, and the bundles (64 KB each) would
// pile up and leave in one burst.
const flushAfter = 16

// Bundler is the one goroutine that packs queued messages into bundles,
// per destination. It finishes a destination's bundle when the next
// message would make it exceed max, and has the sink send everything as
// soon as the queue is drained, so a lone message waits for no timer, or
// once flushAfter bundles are finished, so a queue that never drains does
// not hold them back.
type Bundler struct {
	owner    Owner
	q        *SendQueue
	max      int
	pool     *BufPool
	sink     Sink
	counters *BundleCounters
	byDest   map[stack.Address]*bundle
	last     *bundle // the last destination's: runs of one are the rule
	active   []*bundle
	finished int // bundles handed to the sink since its last Flush
}

type bundle struct {
	dest  stack.Address
	buf   *[]byte
	count int
}

// NewBundler returns a bundler that takes messages from q and packs them
// into bundles of at most max bytes from pool for sink.
func NewBundler(owner Owner, q *SendQueue, max int, pool *BufPool, sink Sink, c *BundleCounters) *Bundler {
	return &Bundler{owner: owner, q: q, max: max, pool: pool, sink: sink, counters: c, byDest: map[stack.Address]*bundle{}}
}

// Run bundles until done is closed.
func (b *Bundler) Run(done <-chan struct{}) {
	var batch []*stack.Message
	for {
		var ok bool
		if batch, ok = b.q.Take(batch, true, done); !ok {
			return
		}
		// What is queued goes into bundles, and what arrives meanwhile
		// joins them, until the queue is empty; every flushAfter finished
		// bundles are sent on the way.
		for len(batch) > 0 {
			for _, m := range batch {
				b.add(m)
				if b.finished >= flushAfter {
					b.sink.Flush()
					b.finished = 0
				}
			}
			batch, _ = b.q.Take(batch, false, done)
		}
		b.flushAll()
	}
}

func (b *Bundler) add(m *stack.Message) {
	local := b.owner.LocalAddress()
	bd := b.last
	if bd == nil || bd.dest != m.Dest {
		if bd = b.byDest[m.Dest]; bd == nil {
			bd = &bundle{dest: m.Dest}
			b.byDest[m.Dest] = bd
		}
		b.last = bd
	}
	size := m.EncodedSize(local)
	if bd.count > 0 && len(*bd.buf)+size > b.max {
		b.finish(bd)
	}
	if bd.count == 0 {
		if bd.buf == nil {
			b.active = append(b.active, bd)
		}
		bd.buf = b.pool.Get()
		*bd.buf = stack.AppendBundleHeader(*bd.buf, b.owner.Stack().Cluster(), local, m.IsMulticast(), 0)
	}
	*bd.buf = stack.AppendMessage(*bd.buf, m, local)
	bd.count++
}

// finish closes bd's bundle and hands it to the sink; bd stays active with
// no buffer until its next message.
func (b *Bundler) finish(bd *bundle) {
	stack.PatchBundleCount(*bd.buf, bd.count)
	b.counters.Count(bd.count, len(*bd.buf))
	b.sink.Bundle(bd.buf, bd.dest)
	bd.count = 0
	b.finished++
}

func (b *Bundler) flushAll() {
	for _, bd := range b.active {
		if bd.count > 0 {
			b.finish(bd)
		}
		bd.buf = nil
	}
	b.active = b.active[:0]
	b.sink.Flush()
	b.finished = 0
	if len(b.byDest) > 1024 {
		clear(b.byDest)
		b.last = nil
	}
}
