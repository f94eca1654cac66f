package transport

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

// AddrCache maps logical addresses to the unicast (UDP) or listening (TCP)
// socket address of their transport. Discovery fills it (EvAddPhysicalAddress), and so does every
// received datagram (a stack that trusts its network) or every message an
// authenticating layer accepted (one that does not). Entries of members
// that are not in the current view expire after they have not been heard
// from for expiry; the cache holds at most max entries, and a new entry
// beyond that pushes out one of a non-member.
type AddrCache struct {
	expiry time.Duration
	max    int
	mu     sync.RWMutex
	m      map[stack.Address]*PhysEntry
	view   map[stack.Address]bool

	// Evicted counts non-members pushed out; Refused, newcomers refused
	// because the cache is full of members.
	Evicted, Refused atomic.Int64
}

// PhysEntry is where a member is: its address, and the same as a
// *net.UDPAddr for UDP's WriteBatch (which takes a net.Addr).
type PhysEntry struct {
	AP   netip.AddrPort
	UDP  *net.UDPAddr
	seen atomic.Int64 // unix nanos
}

// NewAddrCache returns a cache whose non-members expire after expiry, with
// at most max entries.
func NewAddrCache(expiry time.Duration, max int) *AddrCache {
	return &AddrCache{expiry: expiry, max: max, m: map[stack.Address]*PhysEntry{}, view: map[stack.Address]bool{}}
}

// Learn records that a is at ap (now).
func (c *AddrCache) Learn(a stack.Address, ap netip.AddrPort) {
	now := time.Now().UnixNano()
	c.mu.RLock()
	e := c.m[a]
	c.mu.RUnlock()
	if e != nil && e.AP == ap {
		e.seen.Store(now)
		return
	}
	e = &PhysEntry{AP: ap, UDP: net.UDPAddrFromAddrPort(ap)}
	e.seen.Store(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, known := c.m[a]; !known && len(c.m) >= c.max && !c.evictLocked() && !c.view[a] {
		c.Refused.Add(1) // full of members: nothing to push out (a member goes in all the same)
		return
	}
	c.m[a] = e
}

// MoveQuiet is how long a member must have been silent at its known
// address before a preamble in its name from elsewhere moves it. Without
// it, a trickle of datagrams in a busy member's name from another port
// (forged, or relayed) moved its address back and forth, and the credits
// and retransmissions sent to it in between were lost: three perf members
// fell from 107-112K to 14.5-17K msgs/s under 200 such datagrams a
// second (#33).
const MoveQuiet = 2 * time.Second

// LearnUnlessHeard is Learn for an address a datagram's preamble claims:
// it does not move a's entry to ap while a was heard from at its entry's
// address within quiet, and reports whether the entry now says ap. So
// datagrams from another port in a busy member's name do not send that
// member's unicasts (credits, retransmission requests, acks) elsewhere
// until its next datagram; a member gone quiet at its old address is
// followed to the new one.
func (c *AddrCache) LearnUnlessHeard(a stack.Address, ap netip.AddrPort, quiet time.Duration) bool {
	c.mu.RLock()
	e := c.m[a]
	c.mu.RUnlock()
	if e != nil && e.AP != ap && time.Since(time.Unix(0, e.seen.Load())) < quiet {
		return false
	}
	c.Learn(a, ap)
	return true
}

// evictLocked removes one entry of a non-member (the map's iteration order
// picks which), and reports whether there was one.
func (c *AddrCache) evictLocked() bool {
	for a := range c.m {
		if !c.view[a] {
			delete(c.m, a)
			c.Evicted.Add(1)
			return true
		}
	}
	return false
}

// Differs reports whether the cache holds an address for a other than ap.
func (c *AddrCache) Differs(a stack.Address, ap netip.AddrPort) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.m[a]
	return e != nil && e.AP != ap
}

// Get returns where a is, or nil.
func (c *AddrCache) Get(a stack.Address) *PhysEntry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[a]
}

// SetView records the members whose entries never expire.
func (c *AddrCache) SetView(v *stack.View) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.view)
	for _, m := range v.Members {
		c.view[m] = true
	}
}

// Targets returns where a group message goes without IP multicast: the
// view's members (but self), or, before there is a view of others, every
// member the cache knows.
func (c *AddrCache) Targets(self stack.Address, dst []*PhysEntry) []*PhysEntry {
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

// Expire removes entries of non-members not heard from within expiry.
func (c *AddrCache) Expire(now time.Time) int {
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

// Size returns the number of entries.
func (c *AddrCache) Size() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// Members returns every member with a known address, but self.
func (c *AddrCache) Members(self stack.Address) []stack.Address {
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

// Event answers the address events every transport answers the same way
// from its cache c (nil before Start): learn a member's address, list the
// members known, name a member's address (local for this member, self).
// A view also updates c but is not taken (handled false): it goes on down.
func (c *AddrCache) Event(self stack.Address, local netip.AddrPort, ev stack.Event) (result stack.Answer, handled bool) {
	switch e := ev.(type) {
	case stack.EvViewChange:
		if v := e.View; v != nil && c != nil {
			c.SetView(v)
		}
	case stack.EvAddPhysicalAddress:
		if c != nil && e.Physical.IsValid() && e.Logical != self {
			c.Learn(e.Logical, e.Physical)
		}
		return stack.Answer{}, true
	case stack.EvKnownMembers:
		if c == nil {
			return stack.Reply(e, []stack.Address(nil)), true
		}
		return stack.Reply(e, c.Members(self)), true
	case stack.EvGetLocalPhysicalAddress:
		return stack.Reply(e, local), true
	case stack.EvGetPhysicalAddress:
		a := e.Member
		if a == self {
			return stack.Reply(e, local), true
		}
		var ap netip.AddrPort
		if c != nil && !a.IsZero() {
			if ce := c.Get(a); ce != nil {
				ap = ce.AP
			}
		}
		return stack.Reply(e, ap), true
	}
	return stack.Answer{}, false
}
