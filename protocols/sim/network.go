package sim

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

// Rule is the behaviour of a link. Probabilities are in [0,1]; faults are
// drawn from the network's seeded source, per link, in packet order, so the
// same seed and the same traffic give the same faults.
type Rule struct {
	Drop          float64                   // probability a packet is lost
	Duplicate     float64                   // probability a packet arrives twice
	Reorder       float64                   // probability a packet is held back up to ReorderWindow
	ReorderWindow time.Duration             // default 1ms
	Delay         time.Duration             // fixed latency
	Jitter        time.Duration             // extra random latency in [0, Jitter)
	DropIf        func(*stack.Message) bool // drops matching messages (by header, flags, ...)
}

func (r Rule) faulty() bool {
	return r.Drop > 0 || r.Duplicate > 0 || r.Reorder > 0 || r.Delay > 0 || r.Jitter > 0 || r.DropIf != nil
}

type linkKey struct{ from, to stack.Address }

// Network is an in-memory network: members attached under the same network
// name exchange packets through it, with per-link rules for faults. It is
// built on mutexes, channels and timers only, so a whole cluster can run
// inside a testing/synctest bubble in virtual time.
type Network struct {
	name     string
	seed     uint64
	explicit bool

	mu      sync.Mutex
	members map[stack.Address]*endpoint
	phys    map[netip.AddrPort]*endpoint // members with a network address
	def     Rule
	links   map[linkKey]Rule
	island  map[stack.Address]int // nil: no partition
	rngs    map[linkKey]*rand.Rand
	order   map[stack.Address]uint64 // attach order: link seeds must not depend on random addresses
	nextIdx uint64
	cut     sync.Map // stack.Address -> true: isolated by Cut
	ncut    atomic.Int32

	// Counters.
	Sent        atomic.Int64
	Delivered   atomic.Int64
	Dropped     atomic.Int64
	Duplicated  atomic.Int64
	Partitioned atomic.Int64
	Overflowed  atomic.Int64
	Unreachable atomic.Int64 // sent to a network address no member holds
	// SentBytes counts the bytes of every packet put on the network: a
	// multicast once, as one datagram on a wire with IP multicast.
	SentBytes atomic.Int64

	tap atomic.Pointer[func(m *stack.Message, size, receivers int)]
}

// SetTap has f see every packet put on the network (nil: none): the
// message, its encoded size (a multicast once) and how many members it is
// handed to (copies included; none when lost). Scale tests classify
// traffic with it. f runs on the sender's goroutine and must not block.
func (n *Network) SetTap(f func(m *stack.Message, size, receivers int)) {
	if f == nil {
		n.tap.Store(nil)
		return
	}
	n.tap.Store(&f)
}

// count records one packet put on the network and handed to outs.
func (n *Network) count(m *stack.Message, size int, outs []out) {
	n.Sent.Add(1)
	n.SentBytes.Add(int64(size))
	if f := n.tap.Load(); f != nil {
		r := 0
		for _, o := range outs {
			r += o.f.copies
		}
		(*f)(m, size, r)
	}
}

var (
	netMu    sync.Mutex
	networks = map[string]*Network{}
)

// NewNetwork creates and registers the network name with a fault seed. It
// fails if the name is taken. Close removes it.
func NewNetwork(name string, seed uint64) (*Network, error) {
	netMu.Lock()
	defer netMu.Unlock()
	if _, ok := networks[name]; ok {
		return nil, fmt.Errorf("sim: network %q exists", name)
	}
	n := newNetwork(name, seed)
	n.explicit = true
	networks[name] = n
	return n, nil
}

// Lookup returns the registered network name, if any.
func Lookup(name string) (*Network, bool) {
	netMu.Lock()
	defer netMu.Unlock()
	n, ok := networks[name]
	return n, ok
}

func newNetwork(name string, seed uint64) *Network {
	return &Network{
		name: name, seed: seed,
		members: map[stack.Address]*endpoint{},
		phys:    map[netip.AddrPort]*endpoint{},
		links:   map[linkKey]Rule{},
		rngs:    map[linkKey]*rand.Rand{},
		order:   map[stack.Address]uint64{},
	}
}

// attach joins ep to network name, creating it (with seed) if needed. With
// a valid bind, ep takes the first network address from bind up to
// portRange ports above it that no member holds, as a socket binds.
func attach(name string, seed uint64, ep *endpoint, bind netip.AddrPort, portRange int) (*Network, error) {
	netMu.Lock()
	defer netMu.Unlock()
	n, ok := networks[name]
	if !ok {
		n = newNetwork(name, seed)
		networks[name] = n
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := n.members[ep.addr]; dup {
		return nil, fmt.Errorf("sim: address %s already attached to network %q", ep.addr, name)
	}
	if bind.IsValid() {
		for p := int(bind.Port()); !ep.phys.IsValid(); p++ {
			if p > int(bind.Port())+portRange {
				return nil, fmt.Errorf("sim: no free port in %s..%d on network %q", bind, int(bind.Port())+portRange, name)
			}
			if ap := netip.AddrPortFrom(bind.Addr(), uint16(p)); n.phys[ap] == nil {
				ep.phys = ap
				n.phys[ap] = ep
			}
		}
	}
	n.members[ep.addr] = ep
	n.nextIdx++
	n.order[ep.addr] = n.nextIdx
	return n, nil
}

func (n *Network) detach(ep *endpoint) {
	netMu.Lock()
	defer netMu.Unlock()
	n.mu.Lock()
	if n.members[ep.addr] == ep {
		delete(n.members, ep.addr)
	}
	if ep.phys.IsValid() && n.phys[ep.phys] == ep {
		delete(n.phys, ep.phys)
	}
	empty := len(n.members) == 0
	n.mu.Unlock()
	if empty && !n.explicit && networks[n.name] == n {
		delete(networks, n.name)
	}
}

// Name returns the network's name.
func (n *Network) Name() string { return n.name }

// Seed returns the fault seed; failing tests print it.
func (n *Network) Seed() uint64 { return n.seed }

// Close unregisters the network. Members still attached keep working until
// they stop.
func (n *Network) Close() {
	netMu.Lock()
	defer netMu.Unlock()
	if networks[n.name] == n {
		delete(networks, n.name)
	}
}

// SetDefault sets the rule of every link that has no rule of its own.
func (n *Network) SetDefault(r Rule) {
	n.mu.Lock()
	n.def = r
	n.mu.Unlock()
}

// SetLink sets the rule of the one-way link from -> to.
func (n *Network) SetLink(from, to stack.Address, r Rule) {
	n.mu.Lock()
	n.links[linkKey{from, to}] = r
	n.mu.Unlock()
}

// ClearLinks removes every per-link rule and the default rule.
func (n *Network) ClearLinks() {
	n.mu.Lock()
	n.def = Rule{}
	clear(n.links)
	n.mu.Unlock()
}

// Partition splits the members into islands: packets cross only between
// members of the same island. Members in no island form one more island.
func (n *Network) Partition(islands ...[]stack.Address) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.island = map[stack.Address]int{}
	for i, is := range islands {
		for _, a := range is {
			n.island[a] = i + 1
		}
	}
}

// Cut isolates a, as a crash looks from the network: no packet reaches it
// or leaves it until Restore. Unlike Partition it may be called from a
// DropIf predicate (to crash a member at one exact message).
func (n *Network) Cut(a stack.Address) {
	if _, loaded := n.cut.LoadOrStore(a, true); !loaded {
		n.ncut.Add(1)
	}
}

// Restore undoes Cut.
func (n *Network) Restore(a stack.Address) {
	if _, loaded := n.cut.LoadAndDelete(a); loaded {
		n.ncut.Add(-1)
	}
}

func (n *Network) isCut(a stack.Address) bool {
	_, ok := n.cut.Load(a)
	return ok
}

// Heal removes the partition.
func (n *Network) Heal() {
	n.mu.Lock()
	n.island = nil
	n.mu.Unlock()
}

// Members returns the attached addresses.
func (n *Network) Members() []stack.Address {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]stack.Address, 0, len(n.members))
	for a := range n.members {
		out = append(out, a)
	}
	return out
}

// rng returns the link's random source; callers hold n.mu.
func (n *Network) rng(k linkKey) *rand.Rand {
	r := n.rngs[k]
	if r == nil {
		// Seeded by the members' attach order, not their random addresses,
		// so a seed replays the same faults in a new run.
		r = rand.New(rand.NewPCG(n.seed, n.order[k.from]<<32|n.order[k.to]))
		n.rngs[k] = r
	}
	return r
}

// fate is what the network does with one packet on one link.
type fate struct {
	copies int           // 0 dropped, 1 normal, 2 duplicated
	delay  time.Duration // before delivery
}

// decide draws the fate of a packet on from -> to; callers hold n.mu.
func (n *Network) decide(from, to stack.Address, m *stack.Message) (fate, *endpoint) {
	ep := n.members[to]
	if ep == nil {
		return fate{}, nil
	}
	if n.ncut.Load() > 0 && (n.isCut(from) || n.isCut(to)) {
		n.Partitioned.Add(1)
		return fate{}, nil
	}
	if n.island != nil && n.island[from] != n.island[to] {
		n.Partitioned.Add(1)
		return fate{}, nil
	}
	k := linkKey{from, to}
	r, ok := n.links[k]
	if !ok {
		r = n.def
	}
	if !r.faulty() {
		return fate{copies: 1}, ep
	}
	if r.DropIf != nil && r.DropIf(m) {
		n.Dropped.Add(1)
		return fate{}, nil
	}
	src := n.rng(k)
	// Always draw the same number of values per packet, so one rule's
	// outcome does not shift the draws of the next packet.
	pDrop, pDup, pReorder := src.Float64(), src.Float64(), src.Float64()
	jitter, reorder := src.Int64(), src.Int64()
	if pDrop < r.Drop {
		n.Dropped.Add(1)
		return fate{}, nil
	}
	f := fate{copies: 1, delay: r.Delay}
	if pDup < r.Duplicate {
		f.copies = 2
		n.Duplicated.Add(1)
	}
	if r.Jitter > 0 {
		f.delay += time.Duration(jitter % int64(r.Jitter))
	}
	if pReorder < r.Reorder {
		w := r.ReorderWindow
		if w <= 0 {
			w = time.Millisecond
		}
		f.delay += time.Duration(reorder%int64(w)) + 1
	}
	return f, ep
}

// send delivers pkt (the encoding of m) from -> to, or to every other member
// when to is zero.
func (n *Network) send(from, to stack.Address, pkt []byte, m *stack.Message) {
	var outs []out
	n.mu.Lock()
	src := n.physOf(from)
	if to.IsZero() {
		for a := range n.members {
			if a == from {
				continue
			}
			if f, ep := n.decide(from, a, m); ep != nil {
				outs = append(outs, out{ep, f})
			}
		}
	} else if f, ep := n.decide(from, to, m); ep != nil {
		outs = append(outs, out{ep, f})
	}
	n.mu.Unlock()
	n.count(m, len(pkt), outs)
	deliver(outs, pkt, src)
}

// sendPhysical delivers pkt (the encoding of m) from the member from to the
// member holding the network address to; with no such member it is lost.
func (n *Network) sendPhysical(from stack.Address, to netip.AddrPort, pkt []byte, m *stack.Message) {
	n.mu.Lock()
	dst := n.phys[to]
	if dst == nil {
		n.mu.Unlock()
		n.count(m, len(pkt), nil)
		n.Unreachable.Add(1)
		return
	}
	src := n.physOf(from)
	var outs []out
	if f, ep := n.decide(from, dst.addr, m); ep != nil {
		outs = append(outs, out{ep, f})
	}
	n.mu.Unlock()
	n.count(m, len(pkt), outs)
	deliver(outs, pkt, src)
}

// physOf returns the network address of member a (zero if none); callers
// hold n.mu.
func (n *Network) physOf(a stack.Address) netip.AddrPort {
	if ep := n.members[a]; ep != nil {
		return ep.phys
	}
	return netip.AddrPort{}
}

// out is one receiver of a packet and what happens to it on the way.
type out struct {
	ep *endpoint
	f  fate
}

// deliver hands pkt, from the network address from, to each receiver.
// Every receiver gets the same bytes, not a copy each: a receiver decodes
// in place and never writes into a packet (decoded payloads are capped
// at their own length, so an append to one cannot reach into the next),
// as UDP's receivers read in place from their arena. A multicast to N
// members then costs its bytes once, not N times, which is what bounded
// the scale suite's group size by memory.
func deliver(outs []out, pkt []byte, from netip.AddrPort) {
	for _, o := range outs {
		for range o.f.copies {
			o.ep.enqueue(packet{pkt, from}, o.f.delay)
		}
	}
}

// packet is one datagram in an inbox and the network address it came from.
type packet struct {
	data []byte
	from netip.AddrPort
}

// endpoint is one member's attachment: an inbox and its timers.
type endpoint struct {
	addr    stack.Address
	phys    netip.AddrPort // zero: none
	n       *Network
	maxLen  int
	mu      sync.Mutex
	inbox   []packet
	notify  chan struct{}
	timers  map[*time.Timer]struct{}
	stopped bool
}

func newEndpoint(addr stack.Address, maxLen int) *endpoint {
	return &endpoint{addr: addr, maxLen: maxLen, notify: make(chan struct{}, 1), timers: map[*time.Timer]struct{}{}}
}

func (e *endpoint) enqueue(p packet, delay time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return
	}
	if delay > 0 {
		var t *time.Timer
		t = time.AfterFunc(delay, func() {
			e.mu.Lock()
			delete(e.timers, t)
			e.mu.Unlock()
			e.enqueue(p, 0)
		})
		e.timers[t] = struct{}{}
		return
	}
	if len(e.inbox) >= e.maxLen {
		e.n.Overflowed.Add(1)
		return
	}
	e.inbox = append(e.inbox, p)
	select {
	case e.notify <- struct{}{}:
	default:
	}
}

// take returns and clears the inbox.
func (e *endpoint) take(dst []packet) []packet {
	e.mu.Lock()
	defer e.mu.Unlock()
	dst = append(dst[:0], e.inbox...)
	clear(e.inbox)
	e.inbox = e.inbox[:0]
	return dst
}

func (e *endpoint) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopped = true
	for t := range e.timers {
		t.Stop()
	}
	clear(e.timers)
	e.inbox = nil
}
