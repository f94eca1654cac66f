package all_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// blockOnce is A's receiver: its Receive of the first message from one
// member after it is armed blocks for two minutes.
type blockOnce struct {
	*recorder
	from    stack.Address
	armed   atomic.Bool
	blocked atomic.Bool
	done    atomic.Bool
}

func (b *blockOnce) Receive(m *stack.Message) {
	b.recorder.Receive(m)
	if m.Src == b.from && b.armed.Load() && b.blocked.CompareAndSwap(false, true) {
		time.Sleep(2 * time.Minute)
		b.done.Store(true)
	}
}

// TestSlowReceiveHoldsUpOnlyItsSender: A's Receive of a message from C
// blocks for two minutes; 5 s later a member joins. B's multicasts and
// unicasts to A in the next 40 s reach A while that Receive still blocks:
// the view waits only until the messages before it were handed to the
// application, and B's messages after the view wait only for the view.
// (Before, the view's ViewAccepted waited for every earlier Receive to
// return, and B's later messages for the view: 70 of 80 were still not
// delivered a minute later.)
func TestSlowReceiveHoldsUpOnlyItsSender(t *testing.T) {
	skipShort(t)
	for _, file := range []string{"udp.toml", "flush.toml", "groupfc.toml"} {
		t.Run(file, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { slowReceiveCase(t, file) })
		})
	}
}

func slowReceiveCase(t *testing.T, file string) {
	const a, b, c = 0, 1, 2
	r := newChaosRun(t, file, 7)
	if file == "groupfc.toml" {
		r.groupfc = true
		r.prepare = func(ch *stack.Channel) {
			mustGroupFC(ch).SetIdentity(groupfc.Identity{Loopback: true, MemberEvents: true})
		}
	}
	r.start(3)
	defer r.close()
	slow := &blockOnce{recorder: r.recs[a], from: r.chs[c].Address()}
	r.chs[a].SetReceiver(slow)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer r.stopAll()

	slow.armed.Store(true)
	r.send(c, kindMcast, 0, 200)
	r.require(waitUntil(time.Minute, slow.blocked.Load), "A never received C's message")
	for range 5 {
		r.send(c, kindMcast, 0, 200) // behind the blocked one at A
	}
	time.Sleep(5 * time.Second)
	d := r.add()
	joined := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		joined <- r.chs[d].Connect(ctx, "chaos")
	}()
	// B: 80 multicasts and unicasts to A over 40 s.
	for k := range 80 {
		kind := kindMcast
		if k%2 == 1 {
			kind = kindUcast
		}
		r.send(b, kind, a, 300)
		time.Sleep(500 * time.Millisecond)
	}
	r.require(waitUntil(time.Minute, func() bool { return r.sameView([]int{a, b, c, d}) }), "the joiner is not in every view")
	r.require(<-joined == nil, "the joiner could not join")
	want := map[int]int{kindMcast: 40, kindUcast: 40}
	r.require(waitUntil(20*time.Second, func() bool {
		for kind, n := range want {
			to := 0
			if kind == kindUcast {
				to = a
			}
			if !r.has(a, streamKey{b, kind, to}, n-1) {
				return false
			}
		}
		return true
	}), "B's messages did not reach A while A's Receive of C's message blocked: %s", r.gotFrom(a, b))
	r.require(!slow.done.Load(), "the blocked Receive returned already (the test took too long)")
	r.require(waitUntil(2*time.Minute, slow.done.Load), "the Receive never returned")
	r.settle()
	r.check()
	if file == "flush.toml" {
		r.checkVirtualSynchrony()
	}
	t.Logf("%s: B's 80 messages reached A while its Receive of C's message blocked", file)
}

// gotFrom says how many of from's multicasts and unicasts i delivered.
func (r *chaosRun) gotFrom(i, from int) string {
	rec := r.recs[i]
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return fmt.Sprintf("%s has %d multicasts and %d unicasts of %s's", stacktest.Names[i],
		len(rec.got[streamKey{from, kindMcast, 0}]), len(rec.got[streamKey{from, kindUcast, i}]), stacktest.Names[from])
}
