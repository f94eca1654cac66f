package stack_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// probe is a test layer that counts what passes it and can swallow
// INTERNAL messages (as a protocol consumes its own control traffic).
type probe struct {
	stack.Base
	name           string
	swallowIntl    bool
	up, down, intl atomic.Int64
	mu             sync.Mutex
	intlSeen       []*stack.Message
}

func (p *probe) Name() string {
	if p.name != "" {
		return p.name
	}
	return "PROBE"
}

func (p *probe) Down(ctx context.Context, m *stack.Message) error {
	p.down.Add(1)
	return p.PassDown(ctx, m)
}

func (p *probe) Up(m *stack.Message) {
	if p.see(m) {
		p.PassUp(m)
	}
}

func (p *probe) UpBatch(b *stack.Batch) {
	b.Keep(p.see)
	p.PassUpBatch(b)
}

func (p *probe) see(m *stack.Message) bool {
	p.up.Add(1)
	if m.Has(stack.Internal) {
		p.intl.Add(1)
		p.mu.Lock()
		p.intlSeen = append(p.intlSeen, m)
		p.mu.Unlock()
		return !p.swallowIntl
	}
	return true
}

func TestRegularMessagesFIFOPerSenderWithEightParallelSenders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const senders, perSender = 8, 2000
		c := stacktest.StartSIM(t, senders+1, stacktest.Seed(t), nil)
		recv := c.Recv[senders]
		var inFlight, maxInFlight atomic.Int64
		perSrc := map[stack.Address]*atomic.Int64{}
		for _, a := range c.Addresses() {
			perSrc[a] = &atomic.Int64{}
		}
		recv.OnMsg = func(m *stack.Message) {
			n := inFlight.Add(1)
			for {
				old := maxInFlight.Load()
				if n <= old || maxInFlight.CompareAndSwap(old, n) {
					break
				}
			}
			if perSrc[m.Src].Add(1) != 1 {
				t.Errorf("two goroutines delivering regular messages of %s at once", m.Src)
			}
			time.Sleep(time.Microsecond) // virtual: lets other senders' deliveries overlap
			perSrc[m.Src].Add(-1)
			inFlight.Add(-1)
		}
		var wg sync.WaitGroup
		for i := range senders {
			wg.Go(func() {
				ch := c.Channels[i]
				for seq := range perSender {
					if !assert.NoError(t, ch.Send(t.Context(), stack.NewMessage(c.Channels[senders].Address(), stacktest.Payload(i, seq, 16)))) {
						return
					}
				}
			})
		}
		wg.Wait()
		stacktest.WaitFor(t, time.Minute, func() bool { return recv.Len() == senders*perSender }, "all messages delivered")
		require.Empty(t, recv.CheckExactlyOnce(c.Addresses()[:senders], perSender, true))
		require.Greater(t, maxInFlight.Load(), int64(1), "senders are delivered in parallel")
	})
}

func TestBlockedRegularReceiverDoesNotStopInternalOrOOB(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pr := &probe{swallowIntl: true}
		c := stacktest.StartSIM(t, 2, stacktest.Seed(t), func(i int) []stack.Protocol {
			if i == 1 {
				return []stack.Protocol{pr}
			}
			return nil
		})
		a, b := c.Channels[0], c.Channels[1]
		release := make(chan struct{})
		var gotOOB atomic.Bool
		c.Recv[1].OnMsg = func(m *stack.Message) {
			switch string(m.Payload) {
			case "regular":
				<-release // the application blocks in Receive
			case "oob":
				gotOOB.Store(true)
			}
		}
		ctx := t.Context()
		require.NoError(t, a.Send(ctx, stack.NewMessage(b.Address(), []byte("regular"))))
		require.NoError(t, a.Send(ctx, stack.NewMessage(b.Address(), []byte("regular-2"))))
		synctest.Wait() // B's regular lane for A is now blocked in Receive
		require.NoError(t, a.Send(ctx, stack.NewMessage(b.Address(), []byte("control")).Set(stack.Internal)))
		require.NoError(t, a.Send(ctx, stack.NewMessage(b.Address(), []byte("oob")).Set(stack.OOB)))
		synctest.Wait()
		require.EqualValues(t, 1, pr.intl.Load(), "INTERNAL message reached the protocol")
		require.True(t, gotOOB.Load(), "OOB message reached the application")
		require.Equal(t, 1, c.Recv[1].Len(), "only the OOB message is recorded; the regular ones wait behind the blocked Receive")
		close(release)
		stacktest.WaitFor(t, time.Second, func() bool { return c.Recv[1].Len() == 3 }, "regular messages delivered after release")
		got := c.Recv[1].Messages()
		require.Equal(t, "oob", string(got[0].Payload))
		require.Equal(t, "regular", string(got[1].Payload))
		require.Equal(t, "regular-2", string(got[2].Payload))
	})
}

func TestLayerInsertedAtRuntimeBelowAnotherSeesTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		top := &probe{name: "UPPER"}
		c := stacktest.StartSIM(t, 2, stacktest.Seed(t), func(i int) []stack.Protocol {
			if i == 0 {
				return []stack.Protocol{top}
			}
			return nil
		})
		a, b := c.Channels[0], c.Channels[1]
		ins := &probe{name: "INSERTED"}
		require.NoError(t, stack.Of(a).InsertBelow(ins, "UPPER"))
		names := []string{}
		for _, p := range stack.Of(a).Protocols() {
			names = append(names, p.Name())
		}
		require.Equal(t, []string{"SIM", "INSERTED", "UPPER"}, names)

		require.NoError(t, a.SendTo(t.Context(), b.Address(), []byte("down")))
		require.NoError(t, b.SendTo(t.Context(), a.Address(), []byte("up")))
		stacktest.WaitFor(t, time.Second, func() bool { return c.Recv[0].Len() == 1 && c.Recv[1].Len() == 1 }, "both delivered")
		require.EqualValues(t, 1, ins.down.Load())
		require.EqualValues(t, 1, ins.up.Load())
		require.EqualValues(t, 1, top.down.Load())
		require.EqualValues(t, 1, top.up.Load())

		// A DISCARD inserted at runtime drops what its predicate selects.
		d := discard.New(discard.DefaultConfig())
		d.DropUpIf(func(m *stack.Message) bool { return string(m.Payload) == "drop-me" })
		require.NoError(t, stack.Of(a).InsertAbove(d, "SIM"))
		require.NoError(t, b.SendTo(t.Context(), a.Address(), []byte("drop-me")))
		require.NoError(t, b.SendTo(t.Context(), a.Address(), []byte("keep-me")))
		stacktest.WaitFor(t, time.Second, func() bool { return c.Recv[0].Len() == 2 }, "kept message delivered")
		synctest.Wait()
		up, _ := d.Dropped()
		require.EqualValues(t, 1, up)
		require.Equal(t, "keep-me", string(c.Recv[0].Messages()[1].Payload))

		removed, err := stack.Of(a).Remove("INSERTED")
		require.NoError(t, err)
		require.Same(t, ins, removed)
		require.NoError(t, a.SendTo(t.Context(), b.Address(), []byte("after-remove")))
		stacktest.WaitFor(t, time.Second, func() bool { return c.Recv[1].Len() == 2 }, "delivered after removal")
		require.EqualValues(t, 1, ins.down.Load(), "removed layer sees no more traffic")
	})
}

func TestCloseLeavesNoGoroutine(t *testing.T) {
	stacktest.CheckLeaks(t)
	// Real time, not synctest: the leak check itself is under test here.
	c := stacktest.StartSIM(t, 3, 7, func(int) []stack.Protocol {
		return []stack.Protocol{&probe{}}
	})
	for i, ch := range c.Channels {
		for j := range 100 {
			require.NoError(t, ch.Send(context.Background(), stack.NewMessage(stack.Address{}, stacktest.Payload(i, j, 8))))
		}
	}
	stacktest.WaitFor(t, 10*time.Second, func() bool {
		for _, r := range c.Recv {
			if r.Len() != 300 {
				return false
			}
		}
		return true
	}, "every member gets every multicast (own included)")
	c.Close()
}

func TestDisconnectAndReconnectGetsNewAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := stacktest.StartSIM(t, 2, 1, nil)
		a := c.Channels[0]
		old := a.Address()
		require.NoError(t, a.Disconnect(t.Context()))
		require.Nil(t, a.View())
		require.ErrorIs(t, a.SendTo(t.Context(), stack.Address{}, []byte("x")), stack.ErrNotConnected)
		require.NoError(t, a.Connect(t.Context(), "test"))
		require.NotEqual(t, old, a.Address())
		require.Equal(t, 1, a.View().Size(), "without membership, a member starts alone")
		require.NoError(t, a.Close())
		require.ErrorIs(t, a.SendTo(t.Context(), stack.Address{}, []byte("x")), stack.ErrClosed)
		require.ErrorIs(t, a.Connect(t.Context(), "test"), stack.ErrClosed)
	})
}

// TestFullQueueDropsAndCountsButNeverOwnMessages fills B's regular queue for
// A while B's Receive is blocked: what goes beyond max_queued_bytes is
// dropped and counted, the queue never holds more, and B's own multicasts
// (looped back, which NAKACK waits for) are never dropped.
func TestFullQueueDropsAndCountsButNeverOwnMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const bound, size, count = 64 << 10, 1000, 500
		net := stacktest.NewNetwork(t, 1)
		transports := make([]*sim.SIM, 2)
		c := stacktest.Start(t, 2, func(i int) []stack.Protocol {
			cfg := sim.DefaultConfig()
			cfg.Network, cfg.MaxQueued = net.Name(), bound
			transports[i] = sim.New(cfg)
			return []stack.Protocol{transports[i]}
		})
		c.Net = net
		c.InjectView(t)
		a, b := c.Channels[0], c.Channels[1]
		release := make(chan struct{})
		var once sync.Once
		open := func() { once.Do(func() { close(release) }) }
		t.Cleanup(open) // before the channels close, if a check fails
		var blocked atomic.Bool
		c.Recv[1].OnMsg = func(m *stack.Message) {
			if m.Src == a.Address() && blocked.CompareAndSwap(false, true) {
				<-release // the application blocks in Receive
			}
		}
		ctx := t.Context()
		for i := range count {
			require.NoError(t, a.Send(ctx, stack.NewMessage(b.Address(), stacktest.Payload(0, i, size))))
		}
		for i := range count {
			require.NoError(t, b.Send(ctx, stack.NewMessage(stack.Address{}, stacktest.Payload(1, i, size))))
		}
		synctest.Wait()
		dropped := stacktest.Stat(t, transports[1], "dropped_queue_full_regular")
		peak := stacktest.Stat(t, transports[1], "queued_bytes_peak")
		require.Positive(t, dropped, "A's messages beyond the bound are dropped")
		require.LessOrEqual(t, peak, int64(bound), "no queue holds more than max_queued_bytes")
		open()
		stacktest.WaitFor(t, time.Minute, func() bool { return c.Recv[1].Len() == 2*count-int(dropped) }, "the rest delivered")
		own := 0
		for _, m := range c.Recv[1].Messages() {
			if m.Src == b.Address() {
				own++
			}
		}
		require.Equal(t, count, own, "every own multicast delivered: loopback is never dropped")
	})
}

// TestLoopbackDeliversTheSentMessageItself: a member's own multicast and
// its unicast to itself come back up as the very messages it sent, not
// copies (a copy per message was 6% of a one-sender run's CPU), and the
// multicast still goes out to the others.
func TestLoopbackDeliversTheSentMessageItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := stacktest.StartSIM(t, 2, stacktest.Seed(t), nil)
		a := c.Channels[0]
		mc := stack.NewMessage(stack.Address{}, []byte("to all"))
		uc := stack.NewMessage(a.Address(), []byte("to me"))
		require.NoError(t, a.Send(t.Context(), mc))
		require.NoError(t, a.Send(t.Context(), uc))
		synctest.Wait()
		got := c.Recv[0].Messages()
		require.Len(t, got, 2)
		// The two are on different queues (multicast and unicast), with no
		// order between them.
		if got[0] != mc {
			got[0], got[1] = got[1], got[0]
		}
		require.Same(t, mc, got[0], "own multicast")
		require.Same(t, uc, got[1], "unicast to self")
		other := c.Recv[1].Messages()
		require.Len(t, other, 1)
		require.NotSame(t, mc, other[0])
		require.Equal(t, "to all", string(other[0].Payload))
	})
}
