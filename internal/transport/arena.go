package transport

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// RecvChunkSize is the size of the chunks a RecvArena reads into: 16
// datagrams of the largest UDP size.
const RecvChunkSize = 1 << 20

type recvChunk [RecvChunkSize]byte

// keptChunks is how many recycled chunks are kept (32 MB) while chunks are
// being taken: a busy member reads through hundreds of chunks a second,
// and a sync.Pool alone frees what waited through two collections, which
// at 50 or more collections a second is most of them: each fresh chunk
// then cost 256 page faults to touch (5% of a one-sender run's CPU). Beyond
// these, spare chunks go to a pool, so a burst costs nothing once it is
// over; and after a collection with no chunk taken, the kept ones go to
// the pool too, so a process that stopped reading gives them back.
const keptChunks = 32

// armedPerCycle is how many chunks, at most, are handed out with the
// finalizer that recycles them between two collections; beyond it they are
// plain allocations the collector frees. A finalized chunk survives the
// collection that finds it unreachable and counts in the live heap that the
// next heap goal doubles. Without a bound, the chunks read between two
// collections set the heap goal, which sets how many are read before the
// next: a process that reads faster than it allocates (four members in one
// process, reading 10 GB/s) drove its heap goal past 6 GB in ten seconds,
// and paid for it in page faults. With the bound, the chunks armed in one
// cycle add at most 64 MB to the next goal; chunks armed in earlier cycles
// and held since (NAKACK keeps what it received until it is stable) add
// theirs when they are let go, as any other memory would. 128 and 256 were
// no faster, and cost more page faults with GOGC=off.
const armedPerCycle = 64

var (
	freeMu     sync.Mutex
	freeChunks []*recvChunk // at most keptChunks
	freeTaken  bool         // a chunk came off freeChunks since the last collection
	armed      int          // chunks given the finalizer since the last collection
	spareChunk sync.Pool
	idleTicks  atomic.Int64 // collections seen by trimIdle, for tests
)

// chunksMade counts the chunks allocated (not recycled), for tests.
var chunksMade atomic.Int64

// recycle is a chunk's finalizer: it runs once nothing refers into the
// chunk any more (no message, payload or layer), so its bytes are free
// to be read into again.
func recycle(c *recvChunk) {
	freeMu.Lock()
	if len(freeChunks) < keptChunks {
		freeChunks = append(freeChunks, c)
		freeMu.Unlock()
		return
	}
	freeMu.Unlock()
	spareChunk.Put(c)
}

// gcTick's finalizer runs once per collection: it re-arms itself. (A
// pointer field keeps it out of the tiny allocator, whose objects' may
// never be finalized.)
type gcTick struct{ _ *byte }

func init() { armIdleTrim() }

func armIdleTrim() {
	runtime.SetFinalizer(&gcTick{}, func(*gcTick) {
		trimIdle()
		armIdleTrim()
	})
}

// trimIdle hands the kept chunks to the pool when none was taken since
// the last collection.
func trimIdle() {
	freeMu.Lock()
	var idle []*recvChunk
	if !freeTaken {
		idle, freeChunks = freeChunks, nil
	}
	freeTaken = false
	armed = 0
	freeMu.Unlock()
	for _, c := range idle {
		spareChunk.Put(c)
	}
	idleTicks.Add(1)
}

// newChunk returns a recycled chunk if there is one, or a new one, not
// cleared (newDirtyChunk): a recycled chunk is not cleared either. The
// first armedPerCycle chunks of a collection cycle get the finalizer that
// recycles them; the rest, recycled or new, are the collector's to free.
func newChunk() *recvChunk {
	var c *recvChunk
	freeMu.Lock()
	arm := armed < armedPerCycle
	if arm {
		armed++
	}
	if n := len(freeChunks); n > 0 {
		c, freeChunks[n-1] = freeChunks[n-1], nil
		freeChunks = freeChunks[:n-1]
		freeTaken = true
	}
	freeMu.Unlock()
	if c == nil {
		c, _ = spareChunk.Get().(*recvChunk)
	}
	if c == nil {
		c = newDirtyChunk()
		chunksMade.Add(1)
	}
	if arm {
		runtime.SetFinalizer(c, recycle)
	}
	return c
}

// RecvArena is where a datagram transport reads: batches of receive slots
// carved at consecutive offsets of 1 MB chunks, so that the messages
// decoded from a datagram alias the chunk instead of a copy of it. The
// arena never reads into a chunk's bytes twice while the chunk is its
// current one; it moves on to another chunk when the current one is full,
// and the old one is read into again only after the garbage collector
// found that nothing refers into it (a finalizer puts it back for reuse).
// So a layer may keep what it received as long as it likes (NAKACK until
// stable, UNICAST2 and FRAG until complete, the application) without
// counting references or copying. No chunk is cleared (a reader sees only
// the bytes a read wrote), and recycled chunks cost no fresh pages from
// the kernel either (up to armedPerCycle chunks are recycled a collection
// cycle; the others are freed by the collector).
// What a layer keeps pins its whole chunk.
//
// What is not kept costs no space: a datagram the transport dropped
// (Drop) gives its bytes back, and a short datagram (at most an eighth
// of a slot) that came after a longer gap (a slot's unused tail) is
// moved down to close the gap, so that heartbeats and acknowledgements
// do not pin 64 KB each. Longer datagrams stay where they were read:
// moving them would cost a copy, the thing the arena is there to avoid.
//
// A RecvArena belongs to one reading goroutine.
type RecvArena struct {
	slot  int    // room for the largest datagram
	chunk []byte // the current chunk (len == cap)
	off   int    // first free byte of chunk
	base  int    // offset of the first slot handed out by Slots
	prev  int    // off before the last Take, for Drop
	taken bool   // Take ran since Slots or Drop, so Drop may undo it
}

// NewRecvArena returns an arena that hands out slots of slot bytes, at
// most RecvChunkSize.
func NewRecvArena(slot int) *RecvArena {
	if slot <= 0 || slot > RecvChunkSize {
		panic("transport: NewRecvArena: slot size out of range")
	}
	return &RecvArena{slot: slot}
}

// Slots sets bufs[i] to consecutive slots of free space, as many as fit in
// the current chunk (at least one: a full chunk is left behind for a new
// one), and returns how many it set. Read into those and call Take for
// each datagram read, in slot order, before calling Slots again.
func (a *RecvArena) Slots(bufs [][]byte) int {
	if len(a.chunk)-a.off < a.slot {
		a.chunk, a.off = newChunk()[:], 0
	}
	n := min(len(bufs), (len(a.chunk)-a.off)/a.slot)
	for i := range n {
		lo := a.off + i*a.slot
		bufs[i] = a.chunk[lo : lo+a.slot : lo+a.slot]
	}
	a.base, a.taken = a.off, false
	return n
}

// Take returns the datagram of n bytes read into slot i, as a slice whose
// capacity ends with it (appending to it cannot reach the next datagram).
// The bytes stay where they are unless they are short (an eighth of a
// slot or less) and the free space before them is larger than they are;
// then they move down, to close the gap. The returned bytes are the
// caller's for good, unless Drop gives them back.
func (a *RecvArena) Take(i, n int) []byte {
	lo := a.base + i*a.slot
	if n < 0 || n > a.slot || lo < a.off {
		panic("transport: RecvArena.Take out of order or out of range")
	}
	if gap := lo - a.off; gap > n && n <= a.slot/8 {
		copy(a.chunk[a.off:a.off+n], a.chunk[lo:lo+n])
		lo = a.off
	}
	a.prev, a.off, a.taken = a.off, lo+n, true
	return a.chunk[lo : lo+n : lo+n]
}

// Drop gives back the bytes the last Take returned: nothing refers to
// them (the transport dropped the datagram without decoding messages from
// it), so the next datagram may be read there.
func (a *RecvArena) Drop() {
	if !a.taken {
		panic("transport: RecvArena.Drop without Take")
	}
	a.off, a.taken = a.prev, false
}

// NewRecvChunk returns a RecvChunkSize receive chunk, recycled (or freed)
// once nothing refers into it, as RecvArena's are: for a stream transport
// that frames its own reads (TCP). The caller must never write into
// bytes it has handed out; it moves on to a new chunk instead.
func NewRecvChunk() []byte { return newChunk()[:] }
