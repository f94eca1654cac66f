package all_test

import (
	"context"
	"encoding/binary"
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// liveHeap returns the bytes of live heap objects once collections stop
// freeing any: at least four, and two in a row that free nothing, so that
// what an earlier test left to finalizers and pools is gone. UDP's
// receive chunks go through a finalizer into a list of kept chunks, from
// there (after a collection with none taken) into a pool, which drops
// them over two more collections. After a test over real UDP that was
// 158-209 MB of the baseline; in one full run it was not yet there at the
// start (22 MB) and was at a peak (72 MB above it, over the bound). The
// finalizers run on a goroutine of their own, hence the yield.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	last, still := uint64(math.MaxUint64), 0
	for i := range 16 {
		runtime.GC()
		runtime.Gosched()
		metrics.Read(s)
		v := s[0].Value.Uint64()
		if v >= last {
			still++
		} else {
			still = 0
		}
		if i >= 3 && still >= 2 {
			return v
		}
		last = v
	}
	return last
}

// udpPair connects A (which receives nothing) and B (r) on udp.toml over
// SIM, in one view; call it inside synctest.
func udpPair(t *testing.T, r stack.Receiver) []*stack.Channel {
	net := stacktest.NewNetwork(t, 1)
	data := simStack(t, "udp.toml", "")
	vars := map[string]string{"STRATA_SIM_NETWORK": net.Name()}
	var chs []*stack.Channel
	for i, r := range []stack.Receiver{stack.ReceiverFuncs{}, r} {
		sc, err := stack.ParseConfigVars("udp.toml", data, vars)
		require.NoError(t, err)
		ch, err := stack.New(stack.FromConfig(sc), stack.WithName(stacktest.Names[i]), stack.WithReceiver(r), stack.WithSeed(uint64(i+1)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		require.NoError(t, ch.Connect(t.Context(), "pair"))
		chs = append(chs, ch)
	}
	stacktest.WaitFor(t, time.Minute, func() bool {
		v := chs[0].View()
		return v != nil && len(v.Members) == 2
	}, "one view of two")
	return chs
}

// slowCounter is a Receiver that takes its time: every message costs it
// 50µs (virtual), so a sender without flow control would fill every queue
// on the way.
type slowCounter struct {
	bytes atomic.Int64
}

func (s *slowCounter) Receive(m *stack.Message) {
	time.Sleep(50 * time.Microsecond)
	s.bytes.Add(int64(len(m.Payload)))
}

func (s *slowCounter) ViewAccepted(*stack.View) {}

// TestSlowReceiverKeepsHeapsFlat sends 1 GB (half multicast, half unicast,
// 8 KB messages) from A to B on udp.toml (SIM in place of UDP), where B's
// Receive is slow. UFC and MFC hold A back, STABLE lets NAKACK and
// UNICAST2 purge, so the live heap of the process (both members) stays
// within a few times max_credits of where it started, far below the
// gigabyte that went through. Virtual time.
func TestSlowReceiverKeepsHeapsFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: sends 1 GB")
	}
	const (
		size  = 8 << 10
		total = 1 << 30
		each  = total / size / 2 // messages per kind
		bound = 64 << 20         // live heap allowed above the start
	)
	synctest.Test(t, func(t *testing.T) {
		recv := &slowCounter{}
		chs := udpPair(t, recv)
		start := liveHeap()
		var peak atomic.Uint64
		sample := func() {
			if h := liveHeap(); h > peak.Load() {
				peak.Store(h)
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		b := chs[1].Address()
		var wg sync.WaitGroup
		for _, dest := range []stack.Address{{}, b} {
			wg.Go(func() {
				for i := range each {
					if err := chs[0].Send(ctx, stack.NewMessage(dest, make([]byte, size))); err != nil {
						t.Errorf("send %d to %v: %v", i, dest, err)
						return
					}
					if dest.IsZero() && i%(each/16) == 0 {
						sample()
					}
				}
			})
		}
		wg.Wait()
		stacktest.WaitFor(t, time.Hour, func() bool { return recv.bytes.Load() == total }, "B received the gigabyte")
		sample()
		t.Logf("live heap: %d MB at the start, %d MB at the peak, after %d MB through a slow receiver", start>>20, peak.Load()>>20, total>>20)
		require.Less(t, peak.Load(), start+bound, "the live heap stays within %d MB of the start", bound>>20)
	})
}

// orderedCounter is a slow Receiver that checks each sender's messages
// come in order per kind (the first 8 bytes of a payload are its index).
type orderedCounter struct {
	slowCounter
	mu   sync.Mutex
	next map[bool]uint64 // by multicast
	bad  atomic.Int64
}

func (o *orderedCounter) Receive(m *stack.Message) {
	o.mu.Lock()
	k := m.Dest.IsZero()
	if binary.BigEndian.Uint64(m.Payload) != o.next[k] {
		o.bad.Add(1)
	}
	o.next[k]++
	o.mu.Unlock()
	o.slowCounter.Receive(m)
}

// TestPeerIgnoringCreditsCannotGrowTheReceiver: A sends 64 MB (8 KB
// messages, half multicast, half unicast) to a slow B with every message
// marked NO_FC, as a peer that ignores UFC and MFC would, all at once. B's
// delivery queues and NAKACK's and UNICAST2's buffers stay within their
// bounds (max_queued_bytes, max_buffered_bytes: 16 MB each by default); the
// excess is dropped and counted, fetched again, and in the end B has
// every message once and in order.
func TestPeerIgnoringCreditsCannotGrowTheReceiver(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: sends 64 MB")
	}
	const (
		size  = 8 << 10
		total = 64 << 20
		each  = total / size / 2
		bound = 16 << 20
	)
	synctest.Test(t, func(t *testing.T) {
		recv := &orderedCounter{next: map[bool]uint64{}}
		chs := udpPair(t, recv)
		b := chs[1].Address()
		var wg sync.WaitGroup
		for _, dest := range []stack.Address{{}, b} {
			wg.Go(func() {
				for i := range each {
					p := make([]byte, size)
					binary.BigEndian.PutUint64(p, uint64(i))
					if err := chs[0].Send(t.Context(), stack.NewMessage(dest, p).Set(stack.NoFC)); err != nil {
						t.Errorf("send %d to %v: %v", i, dest, err)
						return
					}
				}
			})
		}
		wg.Wait()
		stacktest.WaitFor(t, time.Hour, func() bool { return recv.bytes.Load() == total }, "B received all of it")
		stats := map[string]int64{}
		for _, p := range stack.Of(chs[1]).Protocols() {
			if r, ok := p.(stack.StatsReporter); ok {
				for _, s := range r.Stats() {
					stats[p.Name()+"."+s.Name] = s.Value
				}
			}
		}
		t.Logf("B: queue peak %d KB, NAKACK buffer peak %d KB, UNICAST2 buffer peak %d KB; dropped: queue full %d, NAKACK %d, UNICAST2 %d",
			stats["SIM.queued_bytes_peak"]>>10, stats["NAKACK.buffered_bytes_peak"]>>10, stats["UNICAST2.buffered_bytes_peak"]>>10,
			stats["SIM.dropped_queue_full_regular"], stats["NAKACK.dropped_buffer_full"], stats["UNICAST2.dropped_buffer_full"])
		require.Zero(t, recv.bad.Load(), "B got each sender's messages in order")
		require.Positive(t, stats["SIM.dropped_queue_full_regular"], "B dropped what did not fit")
		require.LessOrEqual(t, stats["SIM.queued_bytes_peak"], int64(bound))
		require.LessOrEqual(t, stats["NAKACK.buffered_bytes_peak"], int64(bound))
		require.LessOrEqual(t, stats["UNICAST2.buffered_bytes_peak"], int64(bound))
	})
}
