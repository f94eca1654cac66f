package udp

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

// addrCache maps logical addresses to the unicast socket address of their
// transport. Discovery fills it (EvAddPhysicalAddress); every received
// datagram refreshes its sender's entry. Entries of members that are not in
// the current view expire after they have not been heard from for expiry.
type addrCache struct {
	expiry time.Duration
	mu     sync.RWMutex
	m      map[stack.Address]*physEntry
	view   map[stack.Address]bool
}

type physEntry struct {
	ap   netip.AddrPort
	udp  *net.UDPAddr // for WriteBatch, which takes a net.Addr
	seen atomic.Int64 // unix nanos
}

func newAddrCache(expiry time.Duration) *addrCache {
	return &addrCache{expiry: expiry, m: map[stack.Address]*physEntry{}, view: map[stack.Address]bool{}}
}

// learn records that a is at ap (now).
func (c *addrCache) learn(a stack.Address, ap netip.AddrPort) {
	now := time.Now().UnixNano()
	c.mu.RLock()
	e := c.m[a]
	c.mu.RUnlock()
	if e != nil && e.ap == ap {
		e.seen.Store(now)
		return
	}
	e = &physEntry{ap: ap, udp: net.UDPAddrFromAddrPort(ap)}
	e.seen.Store(now)
	c.mu.Lock()
	c.m[a] = e
	c.mu.Unlock()
}

func (c *addrCache) get(a stack.Address) *physEntry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[a]
}

// setView records the members whose entries never expire.
func (c *addrCache) setView(v *stack.View) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.view)
	for _, m := range v.Members {
		c.view[m] = true
	}
}

// targets returns where a group message goes without IP multicast: the
// view's members (but self), or, before there is a view of others, every
// member the cache knows.
func (c *addrCache) targets(self stack.Address, dst []*physEntry) []*physEntry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	dst = dst[:0]
	if len(c.view) > 1 {
		for m := range c.view {
			if e := c.m[m]; e != nil && m != self {
				dst = append(dst, e)
			}
		}
		return dst
	}
	for a, e := range c.m {
		if a != self {
			dst = append(dst, e)
		}
	}
	return dst
}

// expire removes entries of non-members not heard from within expiry.
func (c *addrCache) expire(now time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for a, e := range c.m {
		if !c.view[a] && now.Sub(time.Unix(0, e.seen.Load())) > c.expiry {
			delete(c.m, a)
			n++
		}
	}
	return n
}

func (c *addrCache) size() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// members returns every member with a known address, but self.
func (c *addrCache) members(self stack.Address) []stack.Address {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]stack.Address, 0, len(c.m))
	for a := range c.m {
		if a != self {
			out = append(out, a)
		}
	}
	return out
}
