package stack

import (
	"sync"
	"sync/atomic"
)

// lanes delivers received messages up the stack from the transport:
//   - regular: per (sender, unicast|multicast) FIFO, at most one goroutine
//     per sender at a time, different senders in parallel;
//   - OOB: as they come, on up to maxOOB concurrent goroutines;
//   - internal: like OOB but on workers of its own, so control traffic is
//     never queued behind application messages.
//
// Delivery never blocks the caller (the transport's reader): work beyond the
// worker limits waits in a queue.
type lanes struct {
	up func(*Batch) // the transport's PassUpBatch

	mu      sync.Mutex
	senders map[senderKey]*senderQueue
	oob     pool
	intl    pool
	wg      sync.WaitGroup

	delivered [numLanes]atomic.Int64
}

type senderKey struct {
	src   Address
	mcast bool
}

type senderQueue struct {
	running bool
	pending []*Message
	spare   []*Message
	batch   Batch
}

// Worker limits for the concurrent lanes.
const (
	maxOOBWorkers      = 64
	maxInternalWorkers = 16
)

func newLanes(up func(*Batch)) *lanes {
	l := &lanes{up: up, senders: make(map[senderKey]*senderQueue)}
	l.oob = pool{max: maxOOBWorkers, l: l}
	l.intl = pool{max: maxInternalWorkers, l: l}
	return l
}

// deliver takes ownership of bt (a batch of one sender and one lane) unless
// it is regular, whose messages it copies out.
func (l *lanes) deliver(bt *Batch) {
	if len(bt.Msgs) == 0 {
		return
	}
	l.delivered[bt.Lane].Add(int64(len(bt.Msgs)))
	switch bt.Lane {
	case LaneOOB:
		l.oob.submit(bt)
	case LaneInternal:
		l.intl.submit(bt)
	default:
		l.deliverRegular(bt)
	}
}

func (l *lanes) deliverRegular(bt *Batch) {
	k := senderKey{src: bt.Src, mcast: bt.Dest.IsZero()}
	l.mu.Lock()
	q := l.senders[k]
	if q == nil {
		q = &senderQueue{}
		q.batch.Src, q.batch.Dest, q.batch.Lane = bt.Src, bt.Dest, LaneRegular
		l.senders[k] = q
	}
	q.pending = append(q.pending, bt.Msgs...)
	start := !q.running
	q.running = true
	if start {
		l.wg.Add(1)
	}
	l.mu.Unlock()
	if start {
		go l.drain(k, q)
	}
}

// drain delivers q's messages until its queue is empty. The running flag is
// reset in a defer, so a delivery that panics cannot leave the sender marked
// running forever (JGroups JGRP-3032).
func (l *lanes) drain(k senderKey, q *senderQueue) {
	defer l.wg.Done()
	finished := false
	defer func() {
		if !finished {
			l.mu.Lock()
			q.running = false
			clear(q.pending)
			q.pending = q.pending[:0]
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
			}
			l.mu.Unlock()
			return
		}
		msgs := q.pending
		q.pending = q.spare[:0]
		l.mu.Unlock()

		q.batch.Msgs = msgs
		l.up(&q.batch)
		clear(msgs)
		q.spare = msgs[:0]
		q.batch.Msgs = nil
	}
}

// pool runs batches on up to max goroutines; the rest wait in a FIFO.
type pool struct {
	l       *lanes
	max     int
	mu      sync.Mutex
	running int
	queue   []*Batch
}

func (p *pool) submit(bt *Batch) {
	p.mu.Lock()
	if p.running >= p.max {
		p.queue = append(p.queue, bt)
		p.mu.Unlock()
		return
	}
	p.running++
	p.l.wg.Add(1)
	p.mu.Unlock()
	go p.work(bt)
}

func (p *pool) work(bt *Batch) {
	defer p.l.wg.Done()
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
		p.mu.Unlock()
	}
}

// wait blocks until every delivery goroutine has returned.
func (l *lanes) wait() { l.wg.Wait() }
