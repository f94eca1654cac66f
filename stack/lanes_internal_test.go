package stack

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// A burst of deliveries after another reuses the parked worker instead of
// starting a goroutine per burst (whose stack grew anew each time: 21% of
// an RPC run's CPU); an idle worker exits after workerIdle, and wait ends
// the parked ones, after which deliveries start workers again.
func TestDeliveryWorkersAreReusedAcrossBursts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		l := newLanes(func(bt *Batch) {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range bt.Msgs {
				got = append(got, string(m.Payload))
			}
		})
		a, b := NewAddress(), NewAddress()
		burst := func(src Address, lane Lane, s string) {
			m := NewMessage(Address{}, []byte(s))
			m.Src = src
			l.deliver(&Batch{Src: src, Lane: lane, Msgs: []*Message{m}}, false)
			synctest.Wait()
		}
		burst(a, LaneRegular, "1")
		burst(b, LaneRegular, "2")
		burst(a, LaneOOB, "3")
		burst(b, LaneInternal, "4")
		require.Equal(t, []string{"1", "2", "3", "4"}, got)
		require.EqualValues(t, 1, l.started.Load(), "one worker for four bursts")

		time.Sleep(workerIdle + time.Millisecond)
		synctest.Wait()
		burst(a, LaneRegular, "5")
		require.EqualValues(t, 2, l.started.Load(), "the idle worker exited; a new one started")

		l.wait() // ends the parked worker
		burst(a, LaneRegular, "6")
		require.EqualValues(t, 3, l.started.Load())
		require.Equal(t, []string{"1", "2", "3", "4", "5", "6"}, got)
		l.wait()
	})
}
