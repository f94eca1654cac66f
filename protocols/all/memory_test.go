package all_test

import (
	"context"
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

// liveHeap returns the bytes of live heap objects after a full GC.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
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
		net := stacktest.NewNetwork(t, 1)
		data := simStack(t, "udp.toml", "")
		vars := map[string]string{"STRATA_SIM_NETWORK": net.Name()}
		recv := &slowCounter{}
		var chs []*stack.Channel
		for i, r := range []stack.Receiver{stack.ReceiverFuncs{}, recv} {
			sc, err := stack.ParseConfigVars("udp.toml", data, vars)
			require.NoError(t, err)
			ch, err := stack.NewChannelFromConfig(sc, stack.WithName(stacktest.Names[i]), stack.WithReceiver(r), stack.WithSeed(uint64(i+1)))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ch.Close() })
			require.NoError(t, ch.Connect(t.Context(), "memory"))
			chs = append(chs, ch)
		}
		stacktest.WaitFor(t, time.Minute, func() bool {
			v := chs[0].View()
			return v != nil && len(v.Members) == 2
		}, "one view of two")
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
