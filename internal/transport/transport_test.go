package transport

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

func TestSendQueueBlocksDropsAndHonoursCtx(t *testing.T) {
	q := NewSendQueue(1)
	done := make(chan struct{})
	m := stack.NewMessage(stack.Address{}, nil)
	require.NoError(t, q.Put(context.Background(), m, false, done))
	require.ErrorIs(t, q.Put(context.Background(), m, true, done), ErrQueueFull, "full queue drops when asked to")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, q.Put(ctx, m, false, done), context.DeadlineExceeded, "full queue blocks until ctx ends")

	close(done)
	require.ErrorIs(t, q.Put(context.Background(), m, false, done), stack.ErrClosed)

	got, ok := q.Take(nil, false, nil)
	require.True(t, ok)
	require.Len(t, got, 1)
	require.NoError(t, q.Put(context.Background(), m, false, make(chan struct{})), "room again")
}

func TestAddrCacheExpiresOnlyNonMembers(t *testing.T) {
	c := NewAddrCache(time.Minute, 2000)
	a, b, self := stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	pa := netip.MustParseAddrPort("127.0.0.1:7800")
	pb := netip.MustParseAddrPort("127.0.0.1:7801")
	c.Learn(a, pa)
	c.Learn(b, pb)
	c.Learn(self, netip.MustParseAddrPort("127.0.0.1:7802"))
	c.SetView(stack.NewView(a, 1, a, self))

	targets := c.Targets(self, nil)
	require.Len(t, targets, 1, "with a view, group messages go to the view's other members")
	require.Equal(t, pa, targets[0].AP)

	require.Zero(t, c.Expire(time.Now()))
	require.Equal(t, 1, c.Expire(time.Now().Add(2*time.Minute)), "b is not in the view and went quiet")
	require.Nil(t, c.Get(b))
	require.NotNil(t, c.Get(a))

	c.Learn(a, pb)
	require.Equal(t, pb, c.Get(a).AP, "a new physical address replaces the old")
	c.SetView(stack.NewView(a, 2, self))
	require.Len(t, c.Targets(self, nil), 1, "no view of others: every known member")
}

// TestAddrCacheIsBoundedAndKeepsMembers: a flood of new sources (each an
// empty bundle from a new address, in a stack that trusts its network)
// cannot grow the cache past logical_addr_cache_max_size; what it pushes
// out are non-members, never the view's members, which may exceed the
// bound themselves.
func TestAddrCacheIsBoundedAndKeepsMembers(t *testing.T) {
	c := NewAddrCache(time.Minute, 10)
	members := make([]stack.Address, 12)
	for i := range members {
		members[i] = stack.NewAddress()
	}
	c.SetView(stack.NewView(members[0], 1, members[:3]...))
	pa := netip.MustParseAddrPort("127.0.0.1:7800")
	for _, m := range members[:3] {
		c.Learn(m, pa)
	}
	for range 10_000 {
		c.Learn(stack.NewAddress(), pa)
	}
	require.Equal(t, 10, c.Size())
	require.EqualValues(t, 10_000-7, c.Evicted.Load())
	for _, m := range members[:3] {
		require.NotNil(t, c.Get(m), "a member is never pushed out")
	}

	c.SetView(stack.NewView(members[0], 2, members...))
	for _, m := range members {
		c.Learn(m, pa)
	}
	require.Equal(t, 12, c.Size(), "a view larger than the bound is kept whole")
	c.Learn(stack.NewAddress(), pa)
	require.EqualValues(t, 1, c.Refused.Load(), "full of members: a newcomer is refused and counted")
}

// numbered returns n group messages whose payloads are their indexes.
func numbered(n int) []*stack.Message {
	ms := make([]*stack.Message, n)
	for i := range ms {
		ms[i] = stack.NewMessage(stack.Address{}, []byte{byte(i)})
	}
	return ms
}

// TestSendQueueTakeWaitsAndHandsOverEverything: the bundler's Take sleeps
// on an empty queue until a sender puts, then takes all that is queued in
// one go, in order; a sender blocked on a full queue gets room when the
// bundler takes, and done ends a waiting Take.
func TestSendQueueTakeWaitsAndHandsOverEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewSendQueue(3)
		done := make(chan struct{})
		ms := numbered(5)
		got := make(chan []*stack.Message)
		go func() {
			var b []*stack.Message
			for {
				var ok bool
				if b, ok = q.Take(b, true, done); !ok {
					close(got)
					return
				}
				got <- slices.Clone(b)
			}
		}()
		synctest.Wait() // the bundler sleeps on the empty queue
		for _, m := range ms[:3] {
			require.True(t, q.TryPut(m))
		}
		// The bundler may already have taken some (it runs in parallel);
		// if not, this Put waits for room, which the next Take makes.
		put := make(chan error)
		go func() { put <- q.Put(context.Background(), ms[3], false, done) }()
		first := <-got
		require.Equal(t, ms[:len(first)], first, "in order")
		require.NoError(t, <-put, "room once the bundler took")
		var rest []*stack.Message
		for len(first)+len(rest) < 4 {
			rest = append(rest, <-got...)
		}
		require.Equal(t, ms[:4], append(first, rest...))
		close(done)
		_, open := <-got
		require.False(t, open, "done ends a waiting Take")
	})
}

// TestSendQueuePutWaitsForTheBundlerToTake: a Put on a full queue stays
// blocked until the bundler takes, then queues its message after the ones
// taken.
func TestSendQueuePutWaitsForTheBundlerToTake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := NewSendQueue(2)
		done := make(chan struct{})
		ms := numbered(3)
		require.True(t, q.TryPut(ms[0]))
		require.True(t, q.TryPut(ms[1]))
		require.False(t, q.TryPut(ms[2]), "full")
		put := make(chan error, 1)
		go func() { put <- q.Put(context.Background(), ms[2], false, done) }()
		synctest.Wait()
		select {
		case err := <-put:
			t.Fatalf("Put returned (%v) on a full queue nobody took from", err)
		default:
		}
		got, ok := q.Take(nil, false, done)
		require.True(t, ok)
		require.Equal(t, ms[:2], got)
		require.NoError(t, <-put, "room once the bundler took")
		got, _ = q.Take(nil, false, done)
		require.Equal(t, ms[2:], got)
	})
}

// BenchmarkSendQueue1Producer: one sender putting, the bundler taking.
func BenchmarkSendQueue1Producer(b *testing.B) {
	q := NewSendQueue(10000)
	done := make(chan struct{})
	m := stack.NewMessage(stack.Address{}, nil)
	var wg sync.WaitGroup
	want := b.N
	wg.Go(func() {
		var batch []*stack.Message
		for n := 0; n < want; n += len(batch) {
			batch, _ = q.Take(batch, true, done)
		}
	})
	b.ReportAllocs()
	b.ResetTimer()
	for range want {
		_ = q.Put(context.Background(), m, false, done)
	}
	wg.Wait()
}
