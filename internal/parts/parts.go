// Package parts cuts a protocol's large control message into parts that
// each fit one datagram, and puts them back together at the receiver.
//
// It is for layers below FRAG whose messages grow with the group (GMS's
// views and digests). The parts travel through the reliable layers below
// them (UNICAST2, NAKACK), so each part is retransmitted on its own until
// it arrives: under loss a message of many parts still arrives whole,
// where one of many unreliable fragments would almost never. A message's
// id is a hash of its bytes, so a message sent again (a view resent to a
// member that did not acknowledge it) has the same id, and the parts of
// both sendings complete the one message.
package parts

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

var seed = maphash.MakeSeed()

// ID returns the id of the message whose encoding is b: the same bytes
// get the same id (in this process), so its parts sent twice are one.
func ID(b []byte) uint64 { return maphash.Bytes(seed, b) }

// Split cuts b into chunks of at most size bytes (at least one chunk). The
// chunks share b's memory, which must not change afterwards.
func Split(b []byte, size int) [][]byte {
	size = max(size, 1)
	out := make([][]byte, 0, len(b)/size+1)
	for len(b) > size {
		out = append(out, b[:size:size])
		b = b[size:]
	}
	return append(out, b)
}

// Limits bound what a Reassembler keeps.
type Limits struct {
	MaxWhole     int           // bytes of one message; larger announcements are dropped
	MaxPerSender int           // messages in progress per sender; one more evicts the sender's oldest
	MaxBytes     int           // bytes in progress in all; more evicts the oldest
	TTL          time.Duration // a message in progress that gets no part for this long is dropped
}

// Reassembler puts messages sent in parts back together, per sender and
// id. What it keeps is bounded (Limits): a peer that sends parts that
// never complete, or forges them, cannot grow it.
type Reassembler struct {
	lim Limits

	mu       sync.Mutex
	pending  map[key]*whole
	bySender map[stack.Address]int
	bytes    int

	// Completed counts messages put back together; Dropped counts parts
	// refused (inconsistent or too large) and messages evicted unfinished.
	Completed, Dropped atomic.Int64
}

type key struct {
	src stack.Address
	id  uint64
}

type whole struct {
	chunks [][]byte
	have   int
	size   int
	last   time.Time
}

// NewReassembler returns a reassembler with limits lim.
func NewReassembler(lim Limits) *Reassembler {
	return &Reassembler{lim: lim, pending: map[key]*whole{}, bySender: map[stack.Address]int{}}
}

// Add takes part index of count of message id from src at now (chunk is
// copied). It returns the whole message once its last part came, else nil.
func (r *Reassembler) Add(src stack.Address, id uint64, index, count int, chunk []byte, now time.Time) []byte {
	if count < 1 || index < 0 || index >= count || count > r.lim.MaxWhole || len(chunk) > r.lim.MaxWhole {
		r.Dropped.Add(1)
		return nil
	}
	if count == 1 {
		r.Completed.Add(1)
		return append([]byte(nil), chunk...)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := key{src, id}
	w := r.pending[k]
	if w == nil {
		r.expire(now)
		for r.bySender[src] >= r.lim.MaxPerSender {
			r.evictOldest(src, true)
		}
		w = &whole{chunks: make([][]byte, count)}
		r.pending[k] = w
		r.bySender[src]++
	}
	if len(w.chunks) != count || w.size+len(chunk) > r.lim.MaxWhole {
		r.drop(k, w)
		r.Dropped.Add(1)
		return nil
	}
	w.last = now
	if w.chunks[index] != nil {
		return nil // a duplicate (the message sent again)
	}
	for r.bytes+len(chunk) > r.lim.MaxBytes && len(r.pending) > 1 {
		r.evictOldest(stack.Address{}, false)
		if r.pending[k] != w {
			return nil // this one was the oldest
		}
	}
	w.chunks[index] = append([]byte(nil), chunk...)
	w.have++
	w.size += len(chunk)
	r.bytes += len(chunk)
	if w.have < count {
		return nil
	}
	out := make([]byte, 0, w.size)
	for _, c := range w.chunks {
		out = append(out, c...)
	}
	r.drop(k, w)
	r.Completed.Add(1)
	return out
}

// Pending returns the number of messages in progress.
func (r *Reassembler) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// drop forgets k; callers hold r.mu.
func (r *Reassembler) drop(k key, w *whole) {
	delete(r.pending, k)
	r.bytes -= w.size
	if r.bySender[k.src]--; r.bySender[k.src] <= 0 {
		delete(r.bySender, k.src)
	}
}

// expire drops what got no part within the TTL; callers hold r.mu.
func (r *Reassembler) expire(now time.Time) {
	for k, w := range r.pending {
		if now.Sub(w.last) > r.lim.TTL {
			r.drop(k, w)
			r.Dropped.Add(1)
		}
	}
}

// evictOldest drops the message in progress (of src, if only is set) that
// grew least recently; callers hold r.mu.
func (r *Reassembler) evictOldest(src stack.Address, only bool) {
	var ok key
	var ow *whole
	for k, w := range r.pending {
		if only && k.src != src {
			continue
		}
		if ow == nil || w.last.Before(ow.last) {
			ok, ow = k, w
		}
	}
	if ow != nil {
		r.drop(ok, ow)
		r.Dropped.Add(1)
	}
}
