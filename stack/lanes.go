package stack

import (
	"sync"
	"sync/atomic"
	"time"
)

// lanes delivers received messages up the stack from the transport:
//   - regular: per (sender, unicast|multicast) FIFO, at most one goroutine
//     per sender at a time, different senders in parallel;
//   - OOB: as they come, on up to maxOOB concurrent goroutines;
//   - internal: like OOB but on workers of its own, so control traffic is
//     never queued behind application messages.
//
// Delivery never blocks the caller (the transport's reader): work beyond the
// worker limits waits in a queue. What waits is bounded (maxBytes, the
// transport's max_queued_bytes): per sender on the regular lane, per pool
// on the others. What would go beyond it is dropped and counted, as a full
// socket buffer drops; the reliable layers above fetch it again. Own
// messages (loopback) are never dropped: the local member's flow control
// already bounds them, and NAKACK waits for its own copy.
type lanes struct {
	up       func(*Batch) // the transport's PassUpBatch
	maxBytes atomic.Int64 // bound of each queue; 0: none

	mu      sync.Mutex
	senders map[senderKey]*senderQueue
	lastK   senderKey    // the key of lastQ: a sender's messages come in runs,
	lastQ   *senderQueue // so most lookups skip the map (nil: none)
	oob     pool
	intl    pool
	wg      sync.WaitGroup // every worker goroutine

	// Workers stay parked for workerIdle after their work, so that a burst
	// of deliveries reuses a goroutine (and the stack it grew) instead of
	// starting one per burst. handoff is unbuffered: a job goes to a worker
	// only if one is parked, otherwise to a new one. wait closes quit.
	handoff chan job
	started atomic.Int64 // workers started (a job handed to a parked one starts none)
	quitMu  sync.Mutex
	quit    chan struct{}
	closing bool

	delivered [numLanes]atomic.Int64
	dropped   [numLanes]atomic.Int64 // messages dropped: their queue was full
	peak      atomic.Int64           // the most bytes one queue has held (not counting loopback)
}

// queueCost is what a queued message is counted as: its payload and a
// fixed share for the message and its headers, so that a flood of empty
// messages is bounded too.
func queueCost(m *Message) int64 { return int64(len(m.Payload)) + 128 }

// fits reports whether a message of cost c may join a queue holding q
// bytes.
func (l *lanes) fits(q, c int64) bool {
	m := l.maxBytes.Load()
	return m <= 0 || q+c <= m
}

// notePeak records a queue's size if it is the largest yet.
func (l *lanes) notePeak(q int64) {
	for {
		p := l.peak.Load()
		if q <= p || l.peak.CompareAndSwap(p, q) {
			return
		}
	}
}

type senderKey struct {
	src   Address
	mcast bool
}

type senderQueue struct {
	running bool
	pending []*Message
	bytes   int64        // queueCost of pending
	sum     batchSummary // of pending, made as they are queued: the batch's summary once drained
	spare   []*Message
	batch   Batch
}

// Worker limits for the concurrent lanes.
const (
	maxOOBWorkers      = 64
	maxInternalWorkers = 16
)

// workerIdle is how long a delivery worker waits for more work before it
// exits.
const workerIdle = time.Second

// job is what a worker runs: a sender's regular queue (q), or a batch of a
// concurrent lane's pool (p).
type job struct {
	k  senderKey
	q  *senderQueue
	p  *pool
	bt *Batch
}

func (j job) run(l *lanes) {
	if j.p != nil {
		j.p.work(j.bt)
		return
	}
	l.drain(j.k, j.q)
}

// start runs j on a parked worker, or on a new one if none is parked.
func (l *lanes) start(j job) {
	select {
	case l.handoff <- j:
		return
	default:
	}
	l.wg.Add(1)
	l.started.Add(1)
	go l.worker(j)
}

// worker runs jobs until it has been idle for workerIdle or the lanes are
// waited for.
func (l *lanes) worker(j job) {
	defer l.wg.Done()
	var idle *time.Timer
	for {
		j.run(l)
		l.quitMu.Lock()
		closing, quit := l.closing, l.quit
		l.quitMu.Unlock()
		if closing {
			return
		}
		if idle == nil {
			idle = time.NewTimer(workerIdle)
			defer idle.Stop()
		} else {
			idle.Reset(workerIdle)
		}
		select {
		case j = <-l.handoff:
		case <-idle.C:
			return
		case <-quit:
			return
		}
	}
}

func newLanes(up func(*Batch)) *lanes {
	l := &lanes{up: up, senders: make(map[senderKey]*senderQueue), handoff: make(chan job), quit: make(chan struct{})}
	l.oob = pool{max: maxOOBWorkers, l: l, lane: LaneOOB}
	l.intl = pool{max: maxInternalWorkers, l: l, lane: LaneInternal}
	return l
}

// deliver takes ownership of bt (a batch of one sender and one lane) unless
// it is regular, whose messages it copies out. own: bt is the local
// member's loopback, never dropped.
func (l *lanes) deliver(bt *Batch, own bool) {
	if len(bt.Msgs) == 0 {
		return
	}
	l.delivered[bt.Lane].Add(int64(len(bt.Msgs)))
	switch bt.Lane {
	case LaneOOB:
		l.oob.submit(bt, own)
	case LaneInternal:
		l.intl.submit(bt, own)
	default:
		l.deliverRegular(bt, own)
	}
}

func (l *lanes) deliverRegular(bt *Batch, own bool) {
	l.enqueue(bt.Src, bt.Dest, bt.Msgs, nil, own)
}

// deliverOne delivers a single message (a loopback) without building a
// batch for it.
func (l *lanes) deliverOne(m *Message, own bool) {
	if lane := m.Lane(); lane != LaneRegular {
		l.deliver(&Batch{Src: m.Src, Dest: m.Dest, Lane: lane, Msgs: []*Message{m}}, own)
		return
	}
	l.delivered[LaneRegular].Add(1)
	l.enqueue(m.Src, m.Dest, nil, m, own)
}

// enqueue adds msgs (and one, if not nil) to the regular queue of src and
// dest's kind, dropping what does not fit, and starts its drainer.
func (l *lanes) enqueue(src, dest Address, msgs []*Message, one *Message, own bool) {
	k := senderKey{src: src, mcast: dest.IsZero()}
	l.mu.Lock()
	q := l.lastQ
	if q == nil || l.lastK != k {
		if q = l.senders[k]; q == nil {
			q = &senderQueue{}
			q.batch.Src, q.batch.Dest, q.batch.Lane = src, dest, LaneRegular
			l.senders[k] = q
		}
		l.lastK, l.lastQ = k, q
	}
	dropped := 0
	add := func(m *Message) {
		c := queueCost(m)
		if !own && !l.fits(q.bytes, c) {
			dropped++
			return
		}
		q.bytes += c
		q.sum.add(m)
		q.pending = append(q.pending, m)
	}
	for _, m := range msgs {
		add(m)
	}
	if one != nil {
		add(one)
	}
	if dropped > 0 {
		l.dropped[LaneRegular].Add(int64(dropped))
	}
	if !own {
		l.notePeak(q.bytes)
	}
	if len(q.pending) == 0 {
		l.mu.Unlock()
		return
	}
	start := !q.running
	q.running = true
	l.mu.Unlock()
	if start {
		l.start(job{k: k, q: q})
	}
}

// drain delivers q's messages until its queue is empty. The running flag is
// reset in a defer, so a delivery that panics cannot leave the sender marked
// running forever (JGroups JGRP-3032).
func (l *lanes) drain(k senderKey, q *senderQueue) {
	finished := false
	defer func() {
		if !finished {
			l.mu.Lock()
			q.running = false
			clear(q.pending)
			q.pending, q.bytes, q.sum = q.pending[:0], 0, batchSummary{}
			l.mu.Unlock()
		}
	}()
	for {
		l.mu.Lock()
		if len(q.pending) == 0 {
			q.running = false
			finished = true
			if len(l.senders) > 256 {
				delete(l.senders, k)
				l.lastQ = nil
			}
			l.mu.Unlock()
			return
		}
		msgs, sum := q.pending, q.sum
		q.pending, q.bytes, q.sum = q.spare[:0], 0, batchSummary{}
		l.mu.Unlock()

		sum.slot, sum.n = &msgs[0], len(msgs)
		q.batch.Msgs, q.batch.sum = msgs, sum
		l.up(&q.batch)
		clear(msgs)
		q.spare = msgs[:0]
		q.batch.Msgs = nil
	}
}

// pool runs batches on up to max goroutines; the rest wait in a FIFO of at
// most the lanes' maxBytes.
type pool struct {
	l       *lanes
	lane    Lane
	max     int
	mu      sync.Mutex
	running int
	queue   []*Batch
	bytes   int64 // batchCost of queue
}

// batchCost is the queueCost of bt's messages.
func batchCost(bt *Batch) int64 {
	var c int64
	for _, m := range bt.Msgs {
		c += queueCost(m)
	}
	return c
}

func (p *pool) submit(bt *Batch, own bool) {
	p.mu.Lock()
	if p.running >= p.max {
		c := batchCost(bt)
		if !own && !p.l.fits(p.bytes, c) {
			p.mu.Unlock()
			p.l.dropped[p.lane].Add(int64(len(bt.Msgs)))
			return
		}
		p.bytes += c
		if !own {
			p.l.notePeak(p.bytes)
		}
		p.queue = append(p.queue, bt)
		p.mu.Unlock()
		return
	}
	p.running++
	p.mu.Unlock()
	p.l.start(job{p: p, bt: bt})
}

func (p *pool) work(bt *Batch) {
	exited := false
	defer func() {
		if !exited {
			p.mu.Lock()
			p.running--
			p.mu.Unlock()
		}
	}()
	for {
		p.l.up(bt)
		p.mu.Lock()
		if len(p.queue) == 0 {
			p.running--
			exited = true
			p.mu.Unlock()
			return
		}
		bt = p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		p.bytes -= batchCost(bt)
		p.mu.Unlock()
	}
}

// wait blocks until every delivery goroutine has returned, parked ones
// included; later deliveries start new ones.
func (l *lanes) wait() {
	l.quitMu.Lock()
	if !l.closing {
		l.closing = true
		close(l.quit)
	}
	l.quitMu.Unlock()
	l.wg.Wait()
	l.quitMu.Lock()
	if l.closing {
		l.closing = false
		l.quit = make(chan struct{})
	}
	l.quitMu.Unlock()
}
