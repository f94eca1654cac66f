package window_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/window"
	"github.com/strata-go/strata/stack"
)

// harness drives one window and names its messages by seqno.
type harness struct {
	w    *window.Window
	mu   sync.Mutex
	seqs map[*stack.Message]uint64
	stop uint64 // deliver stops before this seqno (0: never)
}

func (h *harness) msg(seq uint64, size int) *stack.Message {
	m := stack.NewMessage(stack.Address{}, make([]byte, size))
	h.seqs[m] = seq
	return m
}

// deliver runs the remover and returns the seqnos it passed up, in order.
func (h *harness) deliver() []uint64 {
	var got []uint64
	h.mu.Lock()
	h.w.Deliver(&h.mu, &window.Remover{
		Stop: func(window.Entry) bool { return h.stop != 0 && h.w.HighestDelivered()+1 >= h.stop },
		Up: func(msgs []*stack.Message) {
			for _, m := range msgs {
				got = append(got, h.seqs[m])
			}
		},
	})
	return got
}

// step is one operation on the window and what it must give.
type step struct {
	name string
	do   func(t *testing.T, h *harness)
}

const size = 10 // payload bytes of every message

func add(seq uint64, want window.Result) step {
	return addLimit(seq, 0, want)
}

func addLimit(seq uint64, limit int64, want window.Result) step {
	return step{fmt.Sprintf("add %d", seq), func(t *testing.T, h *harness) {
		got := h.w.Add(seq, h.msg(seq, size), false, limit)
		require.Equal(t, want, got, "add %d", seq)
	}}
}

// addOOB adds seq as a message passed up already and not kept (UNICAST2's
// OOB).
func addOOB(seq uint64, want window.Result) step {
	return step{fmt.Sprintf("add OOB %d", seq), func(t *testing.T, h *harness) {
		got := h.w.Add(seq, nil, true, 0)
		require.Equal(t, want, got, "add OOB %d", seq)
	}}
}

// addKeptOOB adds seq and marks it passed up, keeping it (NAKACK's OOB).
func addKeptOOB(seq uint64) step {
	return step{fmt.Sprintf("add kept OOB %d", seq), func(t *testing.T, h *harness) {
		require.Equal(t, window.Added, h.w.Add(seq, h.msg(seq, size), false, 0))
		h.w.MarkDelivered(seq)
		e, ok := h.w.Get(seq)
		require.True(t, ok && e.Delivered && e.Msg != nil, "kept for retransmission")
	}}
}

func addRange(from, to uint64, want window.Result) step {
	return step{fmt.Sprintf("add %d..%d", from, to), func(t *testing.T, h *harness) {
		for s := from; s <= to; s++ {
			add(s, want).do(t, h)
		}
	}}
}

// put puts an own message, pending until arrive (with delivered: never
// to be delivered here, a DontLoopback one).
func put(seq uint64, delivered bool) step {
	return step{fmt.Sprintf("put %d", seq), func(t *testing.T, h *harness) {
		h.w.Put(seq, h.msg(seq, size), delivered)
		e, _ := h.w.Get(seq)
		require.True(t, e.Pending)
	}}
}

// arrive: the loopback copy of own message seq came.
func arrive(seq uint64) step {
	return step{fmt.Sprintf("arrive %d", seq), func(t *testing.T, h *harness) {
		require.Equal(t, window.Duplicate, h.w.Add(seq, h.msg(seq, size), false, 0))
		require.True(t, h.w.Arrive(seq), "it was pending")
		require.False(t, h.w.Arrive(seq), "no longer")
	}}
}

func deliver(want ...uint64) step {
	return step{fmt.Sprint("deliver ", want), func(t *testing.T, h *harness) {
		require.Equal(t, want, h.deliver())
	}}
}

func missing(limit int, want ...uint64) step {
	return step{fmt.Sprint("missing ", want), func(t *testing.T, h *harness) {
		require.Equal(t, want, h.w.Missing(h.w.HighestReceived(), limit))
	}}
}

func purge(upto uint64, want int) step {
	return step{fmt.Sprintf("purge %d", upto), func(t *testing.T, h *harness) {
		require.Equal(t, want, h.w.Purge(upto))
	}}
}

func skip(upto uint64, want int) step {
	return step{fmt.Sprintf("skip %d", upto), func(t *testing.T, h *harness) {
		require.Equal(t, want, h.w.Skip(upto))
	}}
}

func raise(hr uint64) step {
	return step{fmt.Sprintf("raise %d", hr), func(_ *testing.T, h *harness) { h.w.Raise(hr) }}
}

func stopAt(seq uint64) step {
	return step{fmt.Sprintf("stop at %d", seq), func(_ *testing.T, h *harness) { h.stop = seq }}
}

// state checks low, highest delivered, highest received and how many
// entries and undelivered bytes the window holds.
func state(low, hd, hr uint64, entries int, buffered int64) step {
	return step{fmt.Sprintf("state %d|%d|%d", low, hd, hr), func(t *testing.T, h *harness) {
		w := h.w
		require.Equal(t, []any{low, hd, hr, entries, buffered},
			[]any{w.Low(), w.HighestDelivered(), w.HighestReceived(), w.Len(), w.Buffered()}, "low, hd, hr, entries, buffered")
	}}
}

func deliveredAbove(want ...uint64) step {
	return step{fmt.Sprint("delivered above ", want), func(t *testing.T, h *harness) {
		got := h.w.DeliveredAbove()
		slices.Sort(got)
		require.Equal(t, want, got)
	}}
}

// seqs returns from..to.
func seqs(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func TestWindow(t *testing.T) {
	const far = window.MaxAhead
	for _, tc := range []struct {
		name  string
		hd    uint64
		keep  bool
		steps []step
	}{
		{name: "in order", steps: []step{
			add(1, window.Added), add(2, window.Added), add(3, window.Added),
			state(1, 0, 3, 3, 3*size),
			deliver(1, 2, 3), state(4, 3, 3, 0, 0), deliver(),
		}},
		{name: "a gap holds back what is above it until filled", steps: []step{
			add(1, window.Added), add(3, window.Added), add(5, window.Added),
			deliver(1), missing(10, 2, 4), state(2, 1, 5, 2, 2*size),
			add(2, window.Added), deliver(2, 3), missing(10, 4),
			add(4, window.Added), deliver(4, 5), missing(10),
		}},
		{name: "duplicates: delivered, in the window, or below a start", hd: 10, steps: []step{
			add(5, window.Duplicate), add(10, window.Duplicate),
			add(12, window.Added), add(12, window.Duplicate),
			add(11, window.Added), deliver(11, 12), add(11, window.Duplicate), add(12, window.Duplicate),
			state(13, 12, 12, 0, 0),
		}},
		{name: "out of window: more than MaxAhead past the highest delivered", hd: 10, steps: []step{
			add(10+far+1, window.TooFar), state(11, 10, 10, 0, 0),
			add(10+far, window.Added), state(11, 10, 10+far, 1, size),
			missing(3, 11, 12, 13),
		}},
		{name: "kept: delivered messages stay until purged, never past delivery", keep: true, steps: []step{
			addRange(1, 5, window.Added), add(7, window.Added),
			deliver(1, 2, 3, 4, 5), state(1, 5, 7, 6, size),
			add(3, window.Duplicate),
			purge(3, 3), state(4, 5, 7, 3, size), add(3, window.Duplicate),
			purge(100, 2), state(6, 5, 7, 1, size), // 7 is not delivered: kept
			add(6, window.Added), deliver(6, 7), purge(7, 2), state(8, 7, 7, 0, 0),
		}},
		{name: "not kept: the remover drops what it delivers", steps: []step{
			addRange(1, 3, window.Added), deliver(1, 2, 3), state(4, 3, 3, 0, 0),
			purge(3, 0), state(4, 3, 3, 0, 0),
		}},
		{name: "OOB passed up already is not delivered again", steps: []step{
			addOOB(2, window.Added), addOOB(2, window.Duplicate), add(2, window.Duplicate),
			deliveredAbove(2), state(1, 0, 2, 1, 0),
			add(1, window.Added), deliver(1), state(3, 2, 2, 0, 0), deliveredAbove(),
		}},
		{name: "OOB kept for retransmission is passed by", keep: true, steps: []step{
			addKeptOOB(2), state(1, 0, 2, 1, 0), deliveredAbove(2),
			add(1, window.Added), deliver(1), state(1, 2, 2, 2, 0),
		}},
		{name: "skipped seqnos are passed by, and filled if they come first", hd: 2, steps: []step{
			add(7, window.Added), skip(5, 3), skip(5, 0), missing(10, 6),
			add(4, window.Added), add(4, window.Duplicate),
			deliver(4), state(6, 5, 7, 1, size),
			add(6, window.Added), deliver(6, 7),
		}},
		{name: "bounded: over the limit dropped, counted as a gap, the next always taken", steps: []step{
			addLimit(2, 2*size, window.Added), addLimit(3, 2*size, window.Added),
			addLimit(5, 2*size, window.Full), state(1, 0, 5, 2, 2*size), missing(10, 1, 4, 5),
			addLimit(1, 2*size, window.Added), state(1, 0, 5, 3, 3*size),
			deliver(1, 2, 3), addLimit(5, 2*size, window.Added), addLimit(4, 2*size, window.Added), deliver(4, 5),
		}},
		{name: "own messages wait for their loopback copies, but for those never to be delivered", keep: true, steps: []step{
			put(1, false), put(2, true), put(3, false), put(4, false),
			deliver(), arrive(3), deliver(), arrive(1), deliver(1, 3), state(1, 3, 4, 4, size),
			arrive(4), deliver(4), purge(4, 4), state(5, 4, 4, 0, 0),
		}},
		{name: "a stream across many rows, in and out of order", hd: 200, steps: []step{
			addRange(202, 900, window.Added), missing(5, 201), state(201, 200, 900, 699, 699*size),
			add(201, window.Added), deliver(seqs(201, 900)...), state(901, 900, 900, 0, 0),
			add(5000, window.Added), missing(2, 901, 902), addRange(901, 4999, window.Added),
			deliver(seqs(901, 5000)...), state(5001, 5000, 5000, 0, 0), add(700, window.Duplicate),
		}},
		{name: "kept across many rows: purge frees rows but not what is above", keep: true, steps: []step{
			addRange(1, 1000, window.Added), deliver(seqs(1, 1000)...), add(1300, window.Added),
			purge(600, 600), state(601, 1000, 1300, 401, size),
			add(300, window.Duplicate), add(1000, window.Duplicate),
			purge(5000, 400), state(1001, 1000, 1300, 1, size), missing(3, 1001, 1002, 1003),
		}},
		{name: "a stop holds delivery until lifted", steps: []step{
			stopAt(3), addRange(1, 4, window.Added), deliver(1, 2), deliver(),
			state(3, 2, 4, 2, 2*size), stopAt(0), deliver(3, 4),
		}},
		{name: "missing is bounded and ends at the highest received", steps: []step{
			add(1, window.Added), raise(10), add(4, window.Added),
			missing(3, 2, 3, 5), missing(100, 2, 3, 5, 6, 7, 8, 9, 10),
			raise(5), missing(100, 2, 3, 5, 6, 7, 8, 9, 10), // raise only raises
		}},
		// JGRP-1873 in the report's order, as the receiver's window sees
		// it: B's window for A was 10|20 and B closed it; A's 21 came
		// with no window and was dropped; A's answer (10 first .. 21) is
		// lost but for 21; then the STABLE(12) B sent before closing
		// comes back. Nothing may be lost or delivered twice.
		{name: "JGRP-1873: a window reopened at the first seqno asks for the lost ones; a stale stable point purges nothing undelivered", hd: 9, keep: true, steps: []step{
			add(21, window.Added), state(10, 9, 21, 1, size),
			purge(12, 0), state(10, 9, 21, 1, size),
			missing(256, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20),
			addRange(10, 20, window.Added), add(21, window.Duplicate),
			deliver(10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21),
			purge(12, 3), state(13, 21, 21, 9, 0),
			addRange(10, 21, window.Duplicate),
		}},
		{name: "JGRP-1873: a window reopened after a closed one's delivery (tombstone) delivers nothing again", hd: 20, steps: []step{
			addOOB(23, window.Added), // an OOB delivered above the gap before the close
			addRange(10, 20, window.Duplicate), addOOB(23, window.Duplicate), add(23, window.Duplicate),
			add(21, window.Added), deliver(21), add(22, window.Added), deliver(22), state(24, 23, 23, 0, 0),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &harness{w: window.New(tc.hd, tc.keep), seqs: map[*stack.Message]uint64{}}
			for i, s := range tc.steps {
				t.Logf("step %d: %s", i, s.name)
				s.do(t, h)
			}
		})
	}
}

// TestOneRemoverAtATime: while one goroutine delivers (its Up blocked in a
// slow layer above), another that adds and calls Deliver returns at once
// without delivering; the first delivers what was added before it stops.
func TestOneRemoverAtATime(t *testing.T) {
	var mu sync.Mutex
	w := window.New(0, false)
	msgs := map[*stack.Message]uint64{}
	addLocked := func(seq uint64) {
		m := stack.NewMessage(stack.Address{}, nil)
		msgs[m] = seq
		require.Equal(t, window.Added, w.Add(seq, m, false, 0))
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var first, second []uint64
	var done sync.WaitGroup
	mu.Lock()
	addLocked(1)
	done.Go(func() {
		blocked := false
		w.Deliver(&mu, &window.Remover{Up: func(ms []*stack.Message) {
			for _, m := range ms {
				first = append(first, msgs[m])
			}
			if !blocked {
				blocked = true
				close(entered)
				<-release
			}
		}})
	})
	<-entered
	mu.Lock()
	require.True(t, w.Removing())
	addLocked(2)
	addLocked(3)
	w.Deliver(&mu, &window.Remover{Up: func(ms []*stack.Message) {
		for _, m := range ms {
			second = append(second, msgs[m])
		}
	}})
	require.Empty(t, second, "a second remover returns at once")
	close(release)
	done.Wait()
	require.Equal(t, []uint64{1, 2, 3}, first, "the remover loops until nothing is left")
	mu.Lock()
	defer mu.Unlock()
	require.False(t, w.Removing())
}

// TestClosedWindowDeliversNoMore: a window closed or replaced while its
// remover was in Up delivers nothing more; the messages stay.
func TestClosedWindowDeliversNoMore(t *testing.T) {
	var mu sync.Mutex
	w := window.New(0, false)
	open := true
	var got int
	done := 0
	mu.Lock()
	w.Add(1, stack.NewMessage(stack.Address{}, nil), false, 0)
	w.Deliver(&mu, &window.Remover{
		Open: func() bool { return open },
		Up: func(ms []*stack.Message) {
			got += len(ms)
			mu.Lock()
			w.Add(2, stack.NewMessage(stack.Address{}, nil), false, 0)
			open = false
			mu.Unlock()
		},
		Done: func() { done++ },
	})
	require.Equal(t, 1, got)
	require.Equal(t, 1, done)
	require.False(t, w.Removing())
	require.EqualValues(t, 1, w.HighestDelivered())
	require.Equal(t, 1, w.Len(), "message 2 stays in the closed window")
}

// TestPanicInUpReleasesTheRemover: a layer above that panics leaves the
// window free for the next remover, after Abort and Done.
func TestPanicInUpReleasesTheRemover(t *testing.T) {
	var mu sync.Mutex
	w := window.New(0, false)
	var calls []string
	mu.Lock()
	w.Add(1, stack.NewMessage(stack.Address{}, nil), false, 0)
	require.Panics(t, func() {
		w.Deliver(&mu, &window.Remover{
			Up:    func([]*stack.Message) { panic("layer above") },
			Abort: func() { calls = append(calls, "abort") },
			Done:  func() { calls = append(calls, "done") },
		})
	})
	require.Equal(t, []string{"abort", "done"}, calls)
	require.True(t, mu.TryLock(), "the lock was released")
	require.False(t, w.Removing())
	w.Add(2, stack.NewMessage(stack.Address{}, nil), false, 0)
	n := 0
	w.Deliver(&mu, &window.Remover{Up: func(ms []*stack.Message) { n += len(ms) }})
	require.Equal(t, 1, n)
}

// TestDueIsPacedByTheTimePassedIn: the window reads no clock; requests
// for a gap that makes no progress go first after first, then back off,
// and start over when delivery moves on.
func TestDueIsPacedByTheTimePassedIn(t *testing.T) {
	w := window.New(0, false)
	w.Raise(5)
	t0 := time.Unix(1000, 0)
	const first, interval = 10 * time.Millisecond, 100 * time.Millisecond
	for _, c := range []struct {
		at   time.Duration
		want bool
	}{
		{0, false}, {5 * time.Millisecond, false}, {10 * time.Millisecond, true},
		{20 * time.Millisecond, false}, {30 * time.Millisecond, true}, // 2x first
		{60 * time.Millisecond, false}, {70 * time.Millisecond, true}, // 4x first
	} {
		require.Equal(t, c.want, w.Due(t0.Add(c.at), first, interval), "at %s", c.at)
	}
	// Progress: a new mark waits first again.
	w.Add(1, stack.NewMessage(stack.Address{}, nil), false, 0)
	var mu sync.Mutex
	mu.Lock()
	w.Deliver(&mu, &window.Remover{Up: func([]*stack.Message) {}})
	require.False(t, w.Due(t0.Add(80*time.Millisecond), first, interval))
	require.True(t, w.Due(t0.Add(90*time.Millisecond), first, interval))
}

// TestSteadyStateDeliveryDoesNotAllocate: add and deliver one message at a
// time reuse the spare slice and a slab of entries.
func TestSteadyStateDeliveryDoesNotAllocate(t *testing.T) {
	var mu sync.Mutex
	w := window.New(0, false)
	m := stack.NewMessage(stack.Address{}, nil)
	seq := uint64(0)
	r := &window.Remover{Up: func([]*stack.Message) {}}
	allocs := testing.AllocsPerRun(1000, func() {
		seq++
		mu.Lock()
		w.Add(seq, m, false, 0)
		w.Deliver(&mu, r)
	})
	require.Zero(t, allocs)
}

func TestSlabHandsOutDistinctZeroValues(t *testing.T) {
	var s window.Slab[[2]int]
	seen := map[*[2]int]bool{}
	for range 200 {
		p := s.New()
		require.Equal(t, [2]int{}, *p)
		require.False(t, seen[p])
		seen[p] = true
		p[0] = 1
	}
}

// BenchmarkAddDeliver: one message added and delivered at a time, as a
// stream in order.
func BenchmarkAddDeliver(b *testing.B) {
	var mu sync.Mutex
	w := window.New(0, false)
	m := stack.NewMessage(stack.Address{}, make([]byte, 1000))
	r := &window.Remover{Up: func([]*stack.Message) {}}
	seq := uint64(0)
	b.ReportAllocs()
	for b.Loop() {
		seq++
		mu.Lock()
		w.Add(seq, m, false, 0)
		w.Deliver(&mu, r)
	}
}

// model is the window written the plain way, with a map, for
// TestRandomOperationsMatchAModel.
type model struct {
	keep            bool
	low, hd, hr     uint64
	entries         map[uint64]*window.Entry
	bytes, buffered int64
}

func (m *model) add(seq uint64, msg *stack.Message, delivered bool, limit int64) window.Result {
	if seq <= m.hd || seq < m.low {
		return window.Duplicate
	}
	if seq-m.hd > window.MaxAhead {
		return window.TooFar
	}
	e := m.entries[seq]
	if e != nil && (e.Msg != nil || e.Delivered) {
		return window.Duplicate
	}
	if delivered {
		m.entries[seq] = &window.Entry{Delivered: true}
	} else {
		size := int64(len(msg.Payload))
		if limit > 0 && seq != m.hd+1 && m.buffered+size > limit {
			m.hr = max(m.hr, seq)
			return window.Full
		}
		m.entries[seq] = &window.Entry{Msg: msg}
		m.bytes += size
		m.buffered += size
	}
	m.hr = max(m.hr, seq)
	return window.Added
}

func (m *model) deliver() []*stack.Message {
	var out []*stack.Message
	for e := m.entries[m.hd+1]; e != nil; e = m.entries[m.hd+1] {
		m.hd++
		if !e.Delivered && e.Msg != nil {
			m.buffered -= int64(len(e.Msg.Payload))
			out = append(out, e.Msg)
		}
		if !m.keep {
			m.purgeOne(m.hd)
			m.low = m.hd + 1
		}
	}
	return out
}

func (m *model) purgeOne(s uint64) bool {
	e := m.entries[s]
	if e == nil {
		return false
	}
	if e.Msg != nil {
		m.bytes -= int64(len(e.Msg.Payload))
	}
	delete(m.entries, s)
	return true
}

// TestRandomOperationsMatchAModel: adds in and out of order, duplicates,
// seqnos far ahead, OOB, bounds, skips, deliveries and purges, drawn at
// random, leave the window as they leave a plain map of entries.
func TestRandomOperationsMatchAModel(t *testing.T) {
	for seed := range uint64(20) {
		for _, keep := range []bool{false, true} {
			t.Run(fmt.Sprintf("seed=%d,keep=%v", seed, keep), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 7))
				start := rng.Uint64N(1000)
				w := window.New(start, keep)
				m := &model{keep: keep, low: start + 1, hd: start, hr: start, entries: map[uint64]*window.Entry{}}
				var mu sync.Mutex
				for i := range 2000 {
					op := rng.IntN(100)
					switch {
					case op < 70:
						seq := m.hd - 3 + uint64(rng.IntN(200))
						if rng.IntN(50) == 0 {
							seq = m.hd + uint64(rng.IntN(3*window.MaxAhead/2))
						}
						msg := stack.NewMessage(stack.Address{}, make([]byte, rng.IntN(100)))
						oob := rng.IntN(10) == 0
						var limit int64
						if rng.IntN(3) == 0 {
							limit = 2000
						}
						if oob {
							msg = nil
						}
						require.Equal(t, m.add(seq, msg, oob, limit), w.Add(seq, msg, oob, limit), "op %d: add %d", i, seq)
					case op < 75:
						upto := m.hd + uint64(rng.IntN(80))
						n := 0
						for s := m.hd + 1; s <= upto; s++ {
							if m.entries[s] == nil {
								m.entries[s] = &window.Entry{}
								n++
							}
						}
						m.hr = max(m.hr, upto)
						require.Equal(t, n, w.Skip(upto), "op %d: skip %d", i, upto)
					case op < 85:
						upto := m.low + uint64(rng.IntN(300)) - 50
						n := 0
						for s := m.low; s <= min(upto, m.hd); s++ {
							if m.purgeOne(s) {
								n++
							}
						}
						m.low = max(m.low, min(upto, m.hd)+1)
						require.Equal(t, n, w.Purge(upto), "op %d: purge %d", i, upto)
					default:
						want := m.deliver()
						var got []*stack.Message
						mu.Lock()
						w.Deliver(&mu, &window.Remover{Up: func(ms []*stack.Message) { got = append(got, ms...) }})
						require.Equal(t, want, got, "op %d: deliver", i)
					}
					require.Equal(t, []any{m.low, m.hd, m.hr, len(m.entries), m.bytes, m.buffered},
						[]any{w.Low(), w.HighestDelivered(), w.HighestReceived(), w.Len(), w.Bytes(), w.Buffered()},
						"op %d: low, hd, hr, entries, bytes, buffered", i)
					var wantMissing, wantAbove []uint64
					for s := m.hd + 1; s <= m.hr && len(wantMissing) < 20; s++ {
						if m.entries[s] == nil {
							wantMissing = append(wantMissing, s)
						}
					}
					require.Equal(t, wantMissing, w.Missing(w.HighestReceived(), 20), "op %d: missing", i)
					if i%10 != 0 {
						continue // (a scan of every entry: not after every op)
					}
					for s, e := range m.entries {
						if s > m.hd && e.Delivered {
							wantAbove = append(wantAbove, s)
						}
					}
					slices.Sort(wantAbove)
					require.Equal(t, wantAbove, w.DeliveredAbove(), "op %d: delivered above", i)
				}
			})
		}
	}
}
