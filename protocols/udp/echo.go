package udp

import (
	"sync/atomic"
	"time"
)

// echoPacer keeps this member's own multicasts from filling its multicast
// socket's receive buffer where the kernel cannot drop them for it (no
// socket filter: ownMulticastFilter is for Linux). With multicast loopback every group datagram a
// member sends comes back to its own multicast socket (where the reader
// drops it on the preamble). Flow control bounds what every other member
// has outstanding in that buffer, but nothing bounds the member's own
// copies: while its reader is not scheduled, they pile up and crowd out
// the other members' datagrams, which NAKACK then has to fetch again. So
// the bundler waits while more than the member's share of the buffer
// (flow control's share, fit_receive_buffer) has been sent and not read
// back.
//
// The account: sent counts the bytes of group datagrams written (by the
// bundler, after each write), back those read back (by the reader). Own datagrams the kernel dropped would never come
// back, so whenever a read finds the socket drained, everything sent before
// the read began is accounted for: back is raised to what sent was then. A
// bundler waits at most echoWaitMax, and then forgives what is out, so a
// reader that is gone or starved holds it once per limit bytes at most.
type echoPacer struct {
	limit atomic.Int64 // bytes sent and not read back before the bundler waits (0: off)
	sent  atomic.Int64
	back  atomic.Int64
	wake  chan struct{} // the reader read some back (capacity 1)

	waits    atomic.Int64 `stat:"echo_waits"`
	timeouts atomic.Int64 `stat:"echo_wait_timeouts"`
}

// echoWaitMax is the longest a bundler waits for its own datagrams to be
// read back before it sends anyway.
const echoWaitMax = 20 * time.Millisecond

func newEchoPacer() *echoPacer { return &echoPacer{wake: make(chan struct{}, 1)} }

// outstanding returns the bytes sent and not read back (below 0 while a
// datagram read back is not counted as written yet).
func (p *echoPacer) outstanding() int64 { return p.sent.Load() - p.back.Load() }

// wait blocks while more than limit bytes are outstanding, for at most
// echoWaitMax in all, or until done is closed.
func (p *echoPacer) wait(done <-chan struct{}) {
	limit := p.limit.Load()
	if limit <= 0 || p.outstanding() <= limit {
		return
	}
	p.waits.Add(1)
	t := time.NewTimer(echoWaitMax)
	defer t.Stop()
	for p.outstanding() > limit {
		select {
		case <-p.wake:
		case <-t.C:
			// The reader is starved, or the datagrams do not come back:
			// forgive them, so that this costs at most one wait per limit
			// bytes sent.
			p.timeouts.Add(1)
			p.raise(p.sent.Load())
			return
		case <-done:
			return
		}
	}
}

// wrote counts n bytes of group datagrams written.
func (p *echoPacer) wrote(n int) { p.sent.Add(int64(n)) }

// readBack counts n bytes of an own group datagram read back. The reader
// may read a datagram before the bundler's write has returned and counted
// it: outstanding is below 0 until then.
func (p *echoPacer) readBack(n int) { p.back.Add(int64(n)) }

// drained records that a read that began when sent was at mark found the
// socket empty: what was sent before is read back or lost. (The read may
// have waited for its first datagram long after mark: back never goes
// down.)
func (p *echoPacer) drained(mark int64) { p.raise(mark) }

// raise sets back to at least v. (A datagram that was written and counted
// but not yet queued to the socket when a drained read took its mark is
// counted twice; on loopback the kernel queues it before the write
// returns, so this is rare, and makes the account lenient by one
// datagram.)
func (p *echoPacer) raise(v int64) {
	for {
		b := p.back.Load()
		if b >= v || p.back.CompareAndSwap(b, v) {
			return
		}
	}
}

// signal wakes a waiting bundler.
func (p *echoPacer) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}
