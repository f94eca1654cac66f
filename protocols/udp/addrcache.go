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
// transport. Discovery fills it (EvAddPhysicalAddress), and so does every
// received datagram (a stack that trusts its network) or every message an
// authenticating layer accepted (one that does not). Entries of members
// that are not in the current view expire after they have not been heard
// from for expiry; the cache holds at most max entries, and a new entry
// beyond that pushes out one of a non-member.
type addrCache struct {
	expiry time.Duration
	max    int
	mu     sync.RWMutex
	m      map[stack.Address]*physEntry
	view   map[stack.Address]bool

	evicted, refused atomic.Int64
}

type physEntry struct {
	ap   netip.AddrPort
	udp  *net.UDPAddr // for WriteBatch, which takes a net.Addr
	seen atomic.Int64 // unix nanos
}

func newAddrCache(expiry time.Duration, max int) *addrCache {
	return &addrCache{expiry: expiry, max: max, m: map[stack.Address]*physEntry{}, view: map[stack.Address]bool{}}
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
	defer c.mu.Unlock()
	if _, known := c.m[a]; !known && len(c.m) >= c.max && !c.evictLocked() && !c.view[a] {
		c.refused.Add(1) // full of members: nothing to push out (a member goes in all the same)
		return
	}
	c.m[a] = e
}

// evictLocked removes one entry of a non-member (the map's iteration order
// picks which), and reports whether there was one.
func (c *addrCache) evictLocked() bool {
	for a := range c.m {
		if !c.view[a] {
			delete(c.m, a)
			c.evicted.Add(1)
			return true
		}
	}
	return false
}

// differs reports whether the cache holds an address for a other than ap.
func (c *addrCache) differs(a stack.Address, ap netip.AddrPort) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.m[a]
	return e != nil && e.ap != ap
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
