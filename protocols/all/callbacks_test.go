package all_test

// The callback matrix: each application callback × each thing an
// application may do in it, on the shipped stacks over SIM in virtual time.
// One member, H, does it in the callback; the group goes on meanwhile: the
// others keep sending, and a member joins. Afterwards the chaos suite's
// invariants hold (nothing lost or delivered twice, per-sender order, one
// view, virtual synchrony with FLUSH), and nothing waited past a deadline.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/strata-go/strata/protocols/groupfc"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// The callbacks of the matrix.
const (
	cbReceive = iota
	cbView
	cbBlock
	cbUnblock
	cbGetState
	cbSetState
)

var cbNames = []string{"Receive", "ViewAccepted", "Block", "Unblock", "GetState", "SetState"}

// The actions of the matrix.
const (
	actBlock = iota // wait 2 minutes
	actReply        // a unicast to the sender (or the coordinator)
	actMulticast
	actFlush // StartFlush and StopFlush
	actGetState
	actDisconnect
)

var actNames = []string{"block", "reply", "multicast", "flush", "getstate", "disconnect"}

// hookStream marks the multicasts sent from a callback (see hook.maybe).
const hookStream = 63

// hook is H's receiver: the recorder, plus the action run once in the
// armed callback.
type hook struct {
	*recorder
	r     *chaosRun
	self  int
	cb    int
	act   int
	armed atomic.Bool
	fired atomic.Bool
	done  chan struct{}
	err   error // of the action; read after done
	took  time.Duration
}

func (h *hook) Receive(m *stack.Message) {
	h.recorder.Receive(m)
	if m.Src != h.r.chs[h.self].Address() {
		h.maybe(cbReceive, m.Src)
	}
}

func (h *hook) ViewAccepted(v *stack.View) {
	h.recorder.ViewAccepted(v)
	h.maybe(cbView, v.Coordinator())
}

func (h *hook) Block()   { h.maybe(cbBlock, stack.Address{}) }
func (h *hook) Unblock() { h.maybe(cbUnblock, stack.Address{}) }

func (h *hook) GetState(w io.Writer) error {
	_, err := w.Write([]byte("state"))
	h.maybe(cbGetState, stack.Address{})
	return err
}

func (h *hook) SetState(rd io.Reader) error {
	_, err := io.ReadAll(rd)
	h.maybe(cbSetState, stack.Address{})
	return err
}

// maybe runs the action if cb is the armed callback, once.
func (h *hook) maybe(cb int, peer stack.Address) {
	if cb != h.cb || !h.armed.Load() || !h.fired.CompareAndSwap(false, true) {
		return
	}
	defer close(h.done)
	start := time.Now()
	defer func() { h.took = time.Since(start) }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch := h.r.chs[h.self]
	to := h.r.index(peer)
	if to < 0 || to == h.self {
		to = h.r.index(ch.View().Coordinator())
	}
	switch h.act {
	case actBlock:
		time.Sleep(2 * time.Minute)
	case actReply:
		if to >= 0 && to != h.self {
			h.err = h.r.send(h.self, kindUcast, to, 300)
		}
	case actMulticast:
		// A stream of its own (to = hookStream), beside the member's
		// traffic, which may be sending at the same time.
		h.err = h.r.send(h.self, kindMcast, hookStream, 300)
	case actFlush:
		if h.err = ch.StartFlush(ctx); h.err == nil {
			h.err = ch.StopFlush(ctx)
		}
	case actGetState:
		h.err = ch.GetState(ctx, stack.Address{})
	case actDisconnect:
		h.r.mu.Lock()
		h.r.dead[h.self] = true
		h.r.leaver = h.self
		h.r.noteLeftTo(h.self)
		h.r.mu.Unlock()
		h.r.stop(h.self)
		h.err = ch.Disconnect(ctx)
	}
}

// stateful gives the other members' recorders a state, so that any member
// can serve a joiner's.
type stateful struct{ *recorder }

func (s stateful) GetState(w io.Writer) error {
	_, err := w.Write([]byte("state"))
	return err
}

func (s stateful) SetState(rd io.Reader) error {
	_, err := io.ReadAll(rd)
	return err
}

func (s stateful) Block()   {}
func (s stateful) Unblock() {}

// index returns the member whose address is a, or -1.
func (r *chaosRun) index(a stack.Address) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, ch := range r.chs {
		if ch.Address() == a {
			return i
		}
	}
	return -1
}

// TestCallbackMatrix runs every callback × action pair on flush.toml, and
// the pairs that apply on groupfc.toml (no FLUSH, no state transfer there).
func TestCallbackMatrix(t *testing.T) {
	skipShort(t)
	for _, file := range []string{"flush.toml", "groupfc.toml"} {
		for cb := range cbNames {
			for act := range actNames {
				if file == "groupfc.toml" && (cb >= cbBlock || act == actFlush || act == actGetState) {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%s", file, cbNames[cb], actNames[act]), func(t *testing.T) {
					t.Parallel()
					synctest.Test(t, func(t *testing.T) { callbackCase(t, file, cb, act) })
				})
			}
		}
	}
}

func callbackCase(t *testing.T, file string, cb, act int) {
	const n, h = 3, 1
	r := newChaosRun(t, file, uint64(100*cb+act+1))
	if file == "groupfc.toml" {
		r.groupfc = true
		r.prepare = func(ch *stack.Channel) {
			mustGroupFC(ch).SetIdentity(groupfc.Identity{Loopback: true, MemberEvents: true})
		}
	}
	r.start(n)
	defer r.close()
	j := r.add() // the joiner, connected below
	// H does the action in its callback; for SetState H is the joiner,
	// which fetches its state from the coordinator; for GetState the
	// joiner fetches it from H.
	hooked, from := h, stack.Address{}
	switch cb {
	case cbSetState:
		hooked = j
	case cbGetState:
		from = r.chs[h].Address()
	}
	hk := &hook{recorder: r.recs[hooked], r: r, self: hooked, cb: cb, act: act, done: make(chan struct{})}
	for i := range r.chs {
		if i == hooked {
			r.chs[i].SetReceiver(hk)
		} else {
			r.chs[i].SetReceiver(stateful{r.recs[i]})
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer r.stopAll()
	for i := range n {
		r.traffic(i, &wg)
	}
	time.Sleep(time.Second)
	hk.armed.Store(true)

	joined := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if cb == cbGetState || cb == cbSetState {
			joined <- r.chs[j].ConnectWithState(ctx, "chaos", from)
		} else {
			joined <- r.chs[j].Connect(ctx, "chaos")
		}
	}()
	r.require(waitUntil(time.Minute, hk.fired.Load), "%s never ran", cbNames[cb])

	// While H's callback blocks, the others' traffic goes on (with FLUSH,
	// after its safety timeout when the callback is a state transfer's).
	if act == actBlock {
		var others []int
		for _, i := range r.alive() {
			if i != hk.self && i < n {
				others = append(others, i)
			}
		}
		a, b := others[0], others[len(others)-1]
		k := streamKey{a, kindMcast, 0}
		r.mu.Lock()
		sent := r.seqs[k]
		r.mu.Unlock()
		r.require(waitUntil(time.Minute, func() bool { return r.has(b, k, sent+5) }),
			"%s's multicasts stopped reaching %s while %s's %s blocked", stacktest.Names[a], stacktest.Names[b], stacktest.Names[hk.self], cbNames[cb])
		r.require(!hk.isDone(), "the callback returned early")
	}
	r.require(waitUntil(3*time.Minute, hk.isDone), "%s's %s did not return from %s within 3 minutes", stacktest.Names[hk.self], cbNames[cb], actNames[act])
	r.require(hk.err == nil || errors.Is(hk.err, stack.ErrWouldDeadlock), "%s from %s: %v", actNames[act], cbNames[cb], hk.err)
	r.require(hk.took < time.Minute+time.Second || act == actBlock, "%s from %s took %s", actNames[act], cbNames[cb], hk.took)

	var err error
	r.require(waitUntil(4*time.Minute, func() bool {
		select {
		case err = <-joined:
			return true
		default:
			return false
		}
	}), "Connect did not return")
	switch {
	case err == nil:
		if !(hooked == j && act == actDisconnect) {
			r.traffic(j, &wg)
		}
	case cb == cbGetState && act == actBlock:
		// The joiner gives up on a state provider that does not answer,
		// with a clear error, and is not a member.
		r.require(strings.Contains(err.Error(), "no data from"), "the joiner's error: %v", err)
		r.mu.Lock()
		r.dead[j] = true
		r.mu.Unlock()
	default:
		r.require(false, "the joiner could not join while %s's %s did %s: %v", stacktest.Names[hk.self], cbNames[cb], actNames[act], err)
	}
	t.Logf("%s from %s: %v after %s; the join: %v", actNames[act], cbNames[cb], hk.err, hk.took, err)

	time.Sleep(time.Second)
	r.require(waitUntil(3*time.Minute, func() bool { return r.sameView(r.alive()) }), "no common view")
	r.stopAll()
	wg.Wait()
	r.settle()
	r.check()
	if file == "flush.toml" {
		r.checkVirtualSynchrony()
	}
}

func (h *hook) isDone() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}
