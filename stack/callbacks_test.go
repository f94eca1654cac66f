package stack

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// order records what happened, in order.
type order struct {
	mu  sync.Mutex
	got []string
}

func (o *order) add(s string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, s)
}

func (o *order) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.got...)
}

// queueView queues a view callback that records "view".
func queueView(cb *callbacks, o *order) {
	cb.do(func() {
		defer cb.viewDone()
		o.add("view")
	}, true)
}

// TestViewComesAfterEveryDeliveryBeforeIt: a message that reached the
// channel before a view but is not yet in Receive holds the view; one in
// an ordinary Receive holds it until Receive returns.
func TestViewComesAfterEveryDeliveryBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cb := newCallbacks()
		o := &order{}
		e := cb.enter()
		queueView(cb, o)
		time.Sleep(time.Hour)
		synctest.Wait()
		require.Empty(t, o.list(), "the message before the view has not been handed to Receive")
		end := cb.inApp(e, nil)
		time.Sleep(slowReceive / 2)
		o.add("receive returned")
		end()
		cb.leave(e)
		synctest.Wait()
		require.Equal(t, []string{"receive returned", "view"}, o.list())
		cb.wait()
	})
}

// TestSlowReceiveDoesNotHoldTheView: a Receive that runs for slowReceive
// no longer holds the next view (the message was handed over), also when
// the rest of its batch is admitted behind it (a receipt that is released
// only when Receive returns).
func TestSlowReceiveDoesNotHoldTheView(t *testing.T) {
	for _, admitted := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			cb := newCallbacks()
			o := &order{}
			var rc *Receipt
			if admitted {
				rc = &Receipt{cb: cb}
				rc.Admit()
			}
			e := cb.enterWith(rc)
			queueView(cb, o)
			end := cb.inApp(e, rc)
			time.Sleep(slowReceive - time.Millisecond)
			synctest.Wait()
			require.Empty(t, o.list(), "the view waits for a Receive that has run less than slowReceive")
			time.Sleep(time.Millisecond)
			synctest.Wait()
			require.Equal(t, []string{"view"}, o.list(), "a Receive that runs longer lets the view go (admitted batch: %v)", admitted)
			time.Sleep(time.Minute)
			end()
			cb.leave(e)
			if rc != nil {
				rc.Release()
			}
			cb.wait()
		})
	}
}

// TestDrainWaitsForEverySlowReceive: a state transfer's drain has no
// grace: the state must cover every message that reached the channel.
func TestDrainWaitsForEverySlowReceive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cb := newCallbacks()
		e := cb.enter()
		end := cb.inApp(e, nil)
		drained := make(chan struct{})
		go func() {
			cb.drain()
			close(drained)
		}()
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case <-drained:
			t.Fatal("the drain went on while a Receive ran")
		default:
		}
		end()
		cb.leave(e)
		<-drained
	})
}

// TestDrainWaitsForDeliveriesOfEarlierViews: a message that reached the
// channel before a view and is still in Receive (a view that waited
// slowReceive for it has gone, and another after it) is in the state too:
// the drain waits for it, and for one of an epoch between, not for one
// that came back.
func TestDrainWaitsForDeliveriesOfEarlierViews(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cb := newCallbacks()
		o := &order{}
		slow := cb.enter()
		endSlow := cb.inApp(slow, nil)
		queueView(cb, o)
		back := cb.enter() // of view 1's epoch, back before the drain
		mid := cb.enter()  // likewise, still out when the drain begins
		queueView(cb, o)
		cb.leave(back)
		time.Sleep(time.Hour)
		synctest.Wait()
		require.Equal(t, []string{"view"}, o.list(), "view 1 let the slow Receive go; view 2 waits for the delivery of view 1's epoch")
		drained := make(chan struct{})
		go func() {
			cb.drain()
			close(drained)
		}()
		wait := func(what string) {
			time.Sleep(time.Hour)
			synctest.Wait()
			select {
			case <-drained:
				t.Fatalf("the drain went on while %s", what)
			default:
			}
		}
		wait("a delivery of view 1's epoch was out")
		cb.inApp(mid, nil)()
		cb.leave(mid)
		wait("a Receive of view 0's epoch ran")
		endSlow()
		cb.leave(slow)
		<-drained
		cb.wait()
		require.Equal(t, []string{"view", "view"}, o.list())
	})
}
