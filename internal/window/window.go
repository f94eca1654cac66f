// Package window is the receive window that NAKACK and UNICAST2 share, as
// NAKACK2 and UNICAST3 share JGroups' Table: one sender's messages by seqno,
// delivered in order by one goroutine at a time, the seqnos still missing
// (for retransmission requests), and a purge up to a stable point.
//
// A Window has no lock and reads no clock: the protocol guards it with its
// own lock and passes the time in, so every method can be table-tested.
package window

import (
	"slices"
	"sync"
	"time"

	"github.com/strata-go/strata/stack"
)

// MaxAhead is how far past the highest delivered seqno a message may be;
// Add refuses one further (TooFar), so a forged seqno cannot open a gap
// nobody can fill. A real message that far ahead is resent once the gap
// closes.
const MaxAhead = 1 << 20

// Entry is one seqno's slot above the highest delivered (below it, only
// Msg counts). An entry without a message is a placeholder: for a seqno
// that will never come (the sender purged it; Skip), or for a message
// passed up already and not kept (Delivered).
type Entry struct {
	Msg *stack.Message
	// Delivered: passed up already (out of band), or never to be; the
	// remover passes it by.
	Delivered bool
	// Pending: not deliverable yet (an own message put before its
	// loopback copy came); the remover waits for it, unless Delivered.
	Pending bool
	used    bool // the slot holds an entry
}

// fillable reports whether a message may still fill e: a placeholder for
// a seqno the sender said it purged, not yet passed by the remover.
func (e Entry) fillable() bool { return e.Msg == nil && !e.Delivered }

// Result says what Add did with a message.
type Result uint8

// Add's results.
const (
	Added     Result = iota // kept; deliverable once the seqnos below it are
	Duplicate               // delivered or purged already, or in the window
	TooFar                  // more than MaxAhead past the highest delivered: dropped
	Full                    // over the caller's byte limit: dropped, and counted as a gap to ask for again
)

// Window is one sender's receive window: seqnos up to HighestDelivered
// were delivered, and entries are kept from Low (keep) or from
// HighestDelivered+1 up to HighestReceived. A Window is not safe for
// concurrent use: its protocol's lock guards it.
type Window struct {
	low, hd, hr uint64
	// rows hold the entries from base on, rowSize seqnos a row, as
	// JGroups' Table does: a slot is found by arithmetic, a stream costs
	// no allocation (rows freed below low are reused), and a seqno far
	// ahead costs one row, not every row up to it.
	rows     []*row
	base     uint64 // seqno of rows[0][0]: a multiple of rowSize
	n        int    // entries held
	bytes    int64  // payload bytes of the kept messages
	buffered int64  // payload bytes of messages not yet delivered
	keep     bool   // delivered entries stay until Purge (for retransmission)
	removing bool
	// cold holds what only a window with traffic needs, made on first
	// use: a member of a large group holds a window for every sender,
	// and most never send.
	cold *cold
}

// cold is the part of a Window that only a window with traffic needs.
type cold struct {
	free []*row // rows freed below low, for the next ones needed (at most maxFree)
	// spare: the slice the remover gathers messages in, kept between
	// runs (only the remover touches it; the layers above do not keep a
	// batch's slice once they return).
	spare []*stack.Message
	pacer stack.Pacer
}

// c returns w's cold part, made now if w has none yet.
func (w *Window) c() *cold {
	if w.cold == nil {
		w.cold = &cold{}
	}
	return w.cold
}

// New returns an empty window whose next seqno to deliver is hd+1. With
// keep, delivered messages stay until Purge, so they can be retransmitted
// to other members (NAKACK); without, the remover drops them (UNICAST2,
// whose sender keeps them).
func New(hd uint64, keep bool) *Window {
	return &Window{low: hd + 1, hd: hd, hr: hd, base: (hd + 1) &^ (rowSize - 1), keep: keep}
}

// rowSize is how many seqnos a row holds (a power of two): a row is 1 KB.
const rowSize = 64

// maxFree is how many freed rows a window keeps for reuse: enough for a
// burst of a thousand messages above a gap to cost no allocation the next
// time, while an idle window holds at most this much (17 KB with its
// current row).
const maxFree = 16

type row [rowSize]Entry

// find returns seq's entry, or nil if the window holds none.
func (w *Window) find(seq uint64) *Entry {
	if seq < w.base {
		return nil
	}
	i := (seq - w.base) / rowSize
	if i >= uint64(len(w.rows)) || w.rows[i] == nil {
		return nil
	}
	if e := &w.rows[i][seq%rowSize]; e.used {
		return e
	}
	return nil
}

// slot returns seq's slot, marked used (a new one is zero), making its
// row if needed; seq is at least base.
func (w *Window) slot(seq uint64) *Entry {
	i := (seq - w.base) / rowSize
	for i >= uint64(len(w.rows)) {
		w.rows = append(w.rows, nil)
	}
	r := w.rows[i]
	if r == nil {
		if c := w.cold; c != nil && len(c.free) > 0 {
			r = c.free[len(c.free)-1]
			c.free = c.free[:len(c.free)-1]
		} else {
			r = new(row)
		}
		w.rows[i] = r
	}
	e := &r[seq%rowSize]
	if !e.used {
		e.used = true
		w.n++
	}
	return e
}

// drop empties e.
func (w *Window) drop(e *Entry) {
	if e.Msg != nil {
		w.bytes -= int64(len(e.Msg.Payload))
	}
	*e = Entry{}
	w.n--
}

// trim lets go of the rows wholly below low (their entries are gone),
// keeping up to maxFree to reuse.
func (w *Window) trim() {
	k := 0
	for k < len(w.rows) && w.base+rowSize <= w.low {
		if r := w.rows[k]; r != nil && len(w.c().free) < maxFree {
			*r = row{} // empty already; cleared so that reuse cannot see a stale entry
			w.cold.free = append(w.cold.free, r)
		}
		k++
		w.base += rowSize
	}
	if k > 0 { // moved to the front, so rows keeps its capacity
		n := copy(w.rows, w.rows[k:])
		clear(w.rows[n:])
		w.rows = w.rows[:n]
		if cap(w.rows) > 64 && n <= cap(w.rows)/4 {
			// Grown by a seqno far ahead: a window that is short again
			// does not keep the room.
			w.rows = slices.Clone(w.rows)
		}
	}
	if len(w.rows) == 0 {
		w.base = w.low &^ (rowSize - 1)
	}
}

// Low returns the lowest seqno the window may still hold (everything below
// it was purged).
func (w *Window) Low() uint64 { return w.low }

// HighestDelivered returns the highest seqno delivered: the remover has
// passed everything up to it.
func (w *Window) HighestDelivered() uint64 { return w.hd }

// HighestReceived returns the highest seqno known to exist: received, or
// announced by the sender (Raise).
func (w *Window) HighestReceived() uint64 { return w.hr }

// Len returns how many entries the window holds.
func (w *Window) Len() int { return w.n }

// Bytes returns the payload bytes of the messages the window holds.
func (w *Window) Bytes() int64 { return w.bytes }

// Buffered returns the payload bytes of the messages not yet delivered,
// which Add's limit bounds.
func (w *Window) Buffered() int64 { return w.buffered }

// Removing reports whether a remover is delivering from the window.
func (w *Window) Removing() bool { return w.removing }

// Get returns the entry for seq, and whether there is one.
func (w *Window) Get(seq uint64) (Entry, bool) {
	if e := w.find(seq); e != nil {
		return *e, true
	}
	return Entry{}, false
}

// Raise records that the sender has sent up to hr (it said so, or a
// digest does): the seqnos up to it become missing.
func (w *Window) Raise(hr uint64) { w.hr = max(w.hr, hr) }

// Add puts m in the window at seq; with delivered, m (which may then be
// nil) was passed up already (out of band) and only its seqno is kept, so
// it is neither delivered nor counted again. A seqno that is new, or a
// placeholder still to be passed, takes m, unless m would take the
// undelivered bytes past limit (0: no bound) and is not the next one to
// deliver (which is always taken, so delivery moves on and makes room).
func (w *Window) Add(seq uint64, m *stack.Message, delivered bool, limit int64) Result {
	if seq <= w.hd || seq < w.low {
		return Duplicate
	}
	if seq-w.hd > MaxAhead {
		return TooFar
	}
	if e := w.find(seq); e != nil && !e.fillable() {
		return Duplicate
	}
	if delivered {
		w.slot(seq).Delivered = true
	} else {
		size := int64(len(m.Payload))
		if limit > 0 && seq != w.hd+1 && w.buffered+size > limit {
			w.hr = max(w.hr, seq)
			return Full
		}
		w.slot(seq).Msg = m
		w.bytes += size
		w.buffered += size
	}
	w.hr = max(w.hr, seq)
	return Added
}

// Put puts m, a message of this member's own, in the window at seq without
// Add's checks (the protocol numbered it itself), Pending until Arrive.
// With delivered it is kept for retransmission but never delivered here.
func (w *Window) Put(seq uint64, m *stack.Message, delivered bool) {
	e := w.slot(seq)
	e.Msg, e.Delivered, e.Pending = m, delivered, true
	w.hr = max(w.hr, seq)
	size := int64(len(m.Payload))
	w.bytes += size
	if !delivered {
		w.buffered += size
	}
}

// Arrive makes seq deliverable (its loopback copy came, or is given up
// on) and reports whether it was Pending.
func (w *Window) Arrive(seq uint64) bool {
	e := w.find(seq)
	if e == nil || !e.Pending {
		return false
	}
	e.Pending = false
	return true
}

// MarkDelivered records that seq's message was passed up out of band: the
// remover will pass it by.
func (w *Window) MarkDelivered(seq uint64) {
	e := w.find(seq)
	if e == nil || e.Delivered {
		return
	}
	e.Delivered = true
	if e.Msg != nil {
		w.buffered -= int64(len(e.Msg.Payload))
	}
}

// Skip records that the seqnos above the highest delivered up to upto that
// the window lacks will never come (the sender purged them): the remover
// passes their placeholders by, while a message that still comes before it
// does fills its slot. Skip returns how many placeholders it made.
func (w *Window) Skip(upto uint64) int {
	n := 0
	for s := w.hd + 1; s <= upto; s++ {
		if w.find(s) == nil {
			w.slot(s)
			n++
		}
	}
	w.hr = max(w.hr, upto)
	return n
}

// DeliveredAbove returns, in order, the seqnos above the highest delivered
// whose messages were passed up already (out of band).
func (w *Window) DeliveredAbove() []uint64 {
	var out []uint64
	for i, r := range w.rows {
		if r == nil {
			continue
		}
		for j := range r {
			if s := w.base + uint64(i)*rowSize + uint64(j); r[j].used && r[j].Delivered && s > w.hd {
				out = append(out, s)
			}
		}
	}
	return out
}

// Gap reports whether seqnos above the highest delivered are known to exist.
func (w *Window) Gap() bool { return w.hr > w.hd }

// Due reports whether a retransmission request may go out at now, paced
// per window (stack.Pacer) with the highest delivered seqno as the mark of
// progress; first and interval are the Pacer's.
func (w *Window) Due(now time.Time, first, interval time.Duration) bool {
	return w.c().pacer.Due(now, w.hd, first, interval)
}

// Missing returns, in order, at most limit seqnos above the highest
// delivered, up to upto, that the window has no entry for.
func (w *Window) Missing(upto uint64, limit int) []uint64 {
	var missing []uint64
	for s := w.hd + 1; s <= upto && len(missing) < limit; s++ {
		if w.find(s) == nil {
			missing = append(missing, s)
		}
	}
	return missing
}

// Purge drops the entries up to upto (every member has delivered them), but
// none above the highest delivered, and returns how many it dropped.
func (w *Window) Purge(upto uint64) int {
	upto = min(upto, w.hd)
	n := 0
	for s := w.low; s <= upto; s++ {
		if e := w.find(s); e != nil {
			w.drop(e)
			n++
		}
	}
	w.low = max(w.low, upto+1)
	w.trim()
	return n
}

// Remover is what a protocol plugs into Deliver. Open and Stop run with
// the protocol's lock held, Up without it.
type Remover struct {
	// Open reports whether the window is still the sender's: a window
	// closed or replaced meanwhile delivers no more. Nil: always.
	Open func() bool
	// Stop reports whether delivery must wait before e, the next entry
	// (a flush holds its sender), as if it were Pending. Nil: never.
	Stop func(e Entry) bool
	// Ready runs with the lock held before each Up, with the same
	// messages (receipts, counters that must not lag). Nil: nothing.
	Ready func(msgs []*stack.Message)
	// Up passes msgs up, in order, without the lock, and must not keep
	// the slice.
	Up func(msgs []*stack.Message)
	// Done runs with the lock held when the remover stops: nothing left,
	// window closed, or Up panicked. Nil: nothing.
	Done func()
	// Abort runs without the lock, before Done, when Up panicked. Nil:
	// nothing.
	Abort func()
}

// Deliver passes up what the window can deliver, in seqno order, as its
// single remover: the caller holds mu (the lock that guards w); if another
// goroutine is removing, Deliver returns at once and leaves the messages
// to it, and otherwise it loops until nothing is left, releasing mu while
// Up runs. Deliver returns with mu released.
func (w *Window) Deliver(mu sync.Locker, r *Remover) {
	if w.removing {
		mu.Unlock()
		return
	}
	w.removing = true
	finished := false
	defer func() {
		if !finished { // Up panicked
			if r.Abort != nil {
				r.Abort()
			}
			mu.Lock()
			w.removing = false
			if r.Done != nil {
				r.Done()
			}
			mu.Unlock()
		}
	}()
	for {
		open := r.Open == nil || r.Open()
		var msgs []*stack.Message
		if open {
			msgs = w.take(r.Stop)
		}
		if len(msgs) == 0 {
			if open && cap(msgs) > 0 {
				w.c().spare = msgs
			}
			w.removing, finished = false, true
			if r.Done != nil {
				r.Done()
			}
			mu.Unlock()
			return
		}
		if r.Ready != nil {
			r.Ready(msgs)
		}
		mu.Unlock()
		r.Up(msgs)
		clear(msgs)
		mu.Lock()
		w.c().spare = msgs[:0]
	}
}

// take gathers the messages that can be delivered in order, in the spare
// slice, and moves the highest delivered seqno past them.
func (w *Window) take(stop func(Entry) bool) []*stack.Message {
	var msgs []*stack.Message
	if c := w.cold; c != nil {
		msgs, c.spare = c.spare[:0], nil
	}
	for {
		s := w.hd + 1
		e := w.find(s)
		if e == nil || e.Pending && !e.Delivered || stop != nil && stop(*e) {
			break
		}
		w.hd = s
		if !e.Delivered && e.Msg != nil {
			w.buffered -= int64(len(e.Msg.Payload))
			msgs = append(msgs, e.Msg)
		}
		if !w.keep {
			w.drop(e)
			w.low = s + 1
		}
	}
	if !w.keep {
		w.trim()
	}
	return msgs
}

// slabSize is how many values a Slab allocates at once.
const slabSize = 64

// Slab hands out zero values of T allocated slabSize at a time: one
// allocation per slabSize messages instead of one per message, for the
// headers reliable protocols put on the messages they send. A slab lives while one of its
// values is referenced. The zero value is ready; not safe for concurrent
// use.
type Slab[T any] struct{ free []T }

// New returns a pointer to a zero T.
func (s *Slab[T]) New() *T {
	if len(s.free) == 0 {
		s.free = make([]T, slabSize)
	}
	p := &s.free[0]
	s.free = s.free[1:]
	return p
}
