package udp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

func TestSendQueueBlocksDropsAndHonoursCtx(t *testing.T) {
	q := newSendQueue(1)
	done := make(chan struct{})
	m := stack.NewMessage(stack.Address{}, nil)
	require.NoError(t, q.put(context.Background(), m, false, done))
	require.ErrorIs(t, q.put(context.Background(), m, true, done), errQueueFull, "full queue drops when asked to")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, q.put(ctx, m, false, done), context.DeadlineExceeded, "full queue blocks until ctx ends")

	close(done)
	require.ErrorIs(t, q.put(context.Background(), m, false, done), stack.ErrClosed)

	<-q.ch
	require.NoError(t, q.put(context.Background(), m, false, make(chan struct{})), "room again")
}

func TestAddrCacheExpiresOnlyNonMembers(t *testing.T) {
	c := newAddrCache(time.Minute, 2000)
	a, b, self := stack.NewAddress(), stack.NewAddress(), stack.NewAddress()
	pa := netip.MustParseAddrPort("127.0.0.1:7800")
	pb := netip.MustParseAddrPort("127.0.0.1:7801")
	c.learn(a, pa)
	c.learn(b, pb)
	c.learn(self, netip.MustParseAddrPort("127.0.0.1:7802"))
	c.setView(stack.NewView(a, 1, a, self))

	targets := c.targets(self, nil)
	require.Len(t, targets, 1, "with a view, group messages go to the view's other members")
	require.Equal(t, pa, targets[0].ap)

	require.Zero(t, c.expire(time.Now()))
	require.Equal(t, 1, c.expire(time.Now().Add(2*time.Minute)), "b is not in the view and went quiet")
	require.Nil(t, c.get(b))
	require.NotNil(t, c.get(a))

	c.learn(a, pb)
	require.Equal(t, pb, c.get(a).ap, "a new physical address replaces the old")
	c.setView(stack.NewView(a, 2, self))
	require.Len(t, c.targets(self, nil), 1, "no view of others: every known member")
}

// FuzzReceive feeds the transport's receive path directly.
func FuzzReceive(f *testing.F) {
	src := stack.NewAddress()
	f.Add(stack.EncodeBundle(nil, "fuzz", src, true, stack.NewMessage(stack.Address{}, []byte("hello"))))
	f.Add(stack.EncodeBundle(nil, "fuzz", src, false, stack.NewMessage(stack.NewAddress(), nil)))
	f.Add([]byte{})
	u := New(DefaultConfig())
	ch, err := stack.New(stack.FromProtocols([]stack.Protocol{u}...))
	if err != nil {
		f.Fatal(err)
	}
	defer ch.Close()
	ch.Stack().SetCluster("fuzz")
	u.cache = newAddrCache(time.Minute, 2000)
	from := netip.MustParseAddrPort("127.0.0.1:9")
	f.Fuzz(func(t *testing.T, data []byte) {
		before := u.datagramsRecv.Load()
		u.handleDatagram(data, from)
		if u.datagramsRecv.Load() != before+1 {
			t.Fatal("datagram not counted")
		}
	})
}

// TestAddrCacheIsBoundedAndKeepsMembers: a flood of new sources (each an
// empty bundle from a new address, in a stack that trusts its network)
// cannot grow the cache past logical_addr_cache_max_size; what it pushes
// out are non-members, never the view's members, which may exceed the
// bound themselves.
func TestAddrCacheIsBoundedAndKeepsMembers(t *testing.T) {
	c := newAddrCache(time.Minute, 10)
	members := make([]stack.Address, 12)
	for i := range members {
		members[i] = stack.NewAddress()
	}
	c.setView(stack.NewView(members[0], 1, members[:3]...))
	pa := netip.MustParseAddrPort("127.0.0.1:7800")
	for _, m := range members[:3] {
		c.learn(m, pa)
	}
	for range 10_000 {
		c.learn(stack.NewAddress(), pa)
	}
	require.Equal(t, 10, c.size())
	require.EqualValues(t, 10_000-7, c.evicted.Load())
	for _, m := range members[:3] {
		require.NotNil(t, c.get(m), "a member is never pushed out")
	}

	c.setView(stack.NewView(members[0], 2, members...))
	for _, m := range members {
		c.learn(m, pa)
	}
	require.Equal(t, 12, c.size(), "a view larger than the bound is kept whole")
	c.learn(stack.NewAddress(), pa)
	require.EqualValues(t, 1, c.refused.Load(), "full of members: a newcomer is refused and counted")
}
