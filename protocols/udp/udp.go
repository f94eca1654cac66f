// Package udp is the UDP transport: one unicast socket and one IP multicast
// socket (or, with ip_mcast = false, one unicast per member for group
// messages), a sender-side bundler, batched socket I/O, and a
// logical-to-physical address cache.
package udp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/strata-go/strata/internal/transport"
	"github.com/strata-go/strata/stack"
)

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "UDP", ID: stack.IDUDP, Transport: true,
		Doc:      "UDP transport: unicast socket, IP multicast (or one unicast per member), bundling, batched I/O",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
}

// ErrMessageTooBig is returned by Down for a message that does not fit in
// one datagram of max_bundle_size; put FRAG above the transport.
var ErrMessageTooBig = errors.New("udp: message larger than max_bundle_size (add FRAG to the stack)")

// UDP is the UDP transport.
type UDP struct {
	stack.TransportBase
	cfg Config

	bindIP netip.Addr
	iface  *net.Interface
	group  *net.UDPAddr

	uc    *net.UDPConn
	upc   *ipv4.PacketConn
	mc    *net.UDPConn
	mpc   *ipv4.PacketConn
	local netip.AddrPort

	cache         *transport.AddrCache
	authenticated bool // the stack has a SourceAuthenticator: learn only what it proved
	queue         *transport.SendQueue
	bufs          *transport.BufPool
	sndPool       sync.Pool
	bc            transport.BundleCounters
	ucRecvBuf     atomic.Int64 // receive buffers the kernel granted (0: not known)
	mcRecvBuf     atomic.Int64
	echo          *echoPacer  // own multicasts not yet read back (multicast loopback)
	ownFiltered   atomic.Bool // the kernel drops own multicasts for the multicast socket (ownMulticastFilter)
	noOwnFilter   bool        // tests: read own multicasts back as where no filter can be attached

	whoMu  sync.Mutex
	whoHas map[stack.Address]time.Time

	datagramsSent   atomic.Int64 `stat:"datagrams_sent"`
	datagramsRecv   atomic.Int64 `stat:"datagrams_received"`
	sendCalls       atomic.Int64 `stat:"send_calls"` // sendmmsg calls: datagrams_sent / send_calls per call
	recvCalls       atomic.Int64 `stat:"recv_calls"` // recvmmsg calls that returned datagrams
	bytesRecv       atomic.Int64 `stat:"bytes_received"`
	droppedFull     atomic.Int64 `stat:"dropped_queue_full"`
	droppedNoPhys   atomic.Int64 `stat:"dropped_no_physical_address"`
	droppedOversize atomic.Int64 `stat:"dropped_oversized"`
	tooBig          atomic.Int64 `stat:"rejected_too_big"`
	socketErrors    atomic.Int64 `stat:"socket_errors"`
	whoHasSent      atomic.Int64 `stat:"who_has_sent"`
	expired         atomic.Int64 `stat:"addr_cache_expired"`
	unprovenMoves   atomic.Int64 `stat:"addr_moves_unproven"`
	refusedMoves    atomic.Int64 `stat:"addr_moves_refused"`
}

var (
	_ stack.Transport            = (*UDP)(nil)
	_ stack.AddressLearner       = (*UDP)(nil)
	_ stack.ReceiveBufferSizer   = (*UDP)(nil)
	_ stack.OwnMulticastReceiver = (*UDP)(nil)
)

// New returns a UDP transport with cfg.
func New(cfg Config) *UDP { return &UDP{cfg: cfg, echo: newEchoPacer()} }

// Name returns "UDP".
func (u *UDP) Name() string { return "UDP" }

// Config returns the transport's configuration.
func (u *UDP) Config() Config { return u.cfg }

// PhysicalAddress returns the unicast socket's address (valid once started).
func (u *UDP) PhysicalAddress() netip.AddrPort { return u.local }

// Init validates the config and resolves bind_addr on this machine.
func (u *UDP) Init() error {
	if err := u.cfg.Validate(); err != nil {
		return err
	}
	ip, ifc, err := resolveBindAddr(u.cfg.BindAddr)
	if err != nil {
		return fmt.Errorf("udp: %w", err)
	}
	u.bindIP, u.iface = ip, ifc
	u.SetMaxQueued(u.cfg.MaxQueued)
	u.SetMaxDatagram(u.cfg.BundleSize)
	if u.cfg.IPMcast {
		g := netip.MustParseAddr(u.cfg.McastAddr)
		u.group = net.UDPAddrFromAddrPort(netip.AddrPortFrom(g, uint16(u.cfg.McastPort)))
	}
	u.bufs = transport.NewBufPool(int(u.cfg.BundleSize) + 256)
	u.sndPool.New = func() any { return &sender{u: u} }
	return nil
}

// Start opens the sockets and starts the readers, the bundler and the cache
// reaper.
func (u *UDP) Start() error {
	if err := u.openUnicast(); err != nil {
		return err
	}
	if u.cfg.IPMcast {
		if err := u.openMulticast(); err != nil {
			_ = u.uc.Close()
			return err
		}
	}
	u.cache = transport.NewAddrCache(u.cfg.CacheExpiry, u.cfg.CacheMax)
	u.authenticated = u.Stack().Authenticated()
	u.queue = transport.NewSendQueue(u.cfg.QueueLen)
	u.whoHas = map[stack.Address]time.Time{}
	u.Log().Info("udp transport started", "local", u.local, "iface", u.iface.Name, "ip_mcast", u.cfg.IPMcast, "group", u.group)
	u.echo.sent.Store(0)
	u.echo.back.Store(0)
	u.Go(func(done <-chan struct{}) { u.readLoop(u.upc, nil, done) })
	if u.mpc != nil {
		var echo *echoPacer
		if u.cfg.McastLoop && !u.ownFiltered.Load() {
			echo = u.echo // own multicasts come back to this socket
		}
		u.Go(func(done <-chan struct{}) { u.readLoop(u.mpc, echo, done) })
	}
	u.Go(func(done <-chan struct{}) {
		transport.NewBundler(u, u.queue, int(u.cfg.BundleSize), u.bufs, &sender{u: u, paced: u.mpc != nil && u.cfg.McastLoop && !u.ownFiltered.Load()}, &u.bc).Run(done)
	})
	u.GoEvery(max(u.cfg.CacheExpiry/4, 10*time.Millisecond), u.reap)
	return nil
}

func (u *UDP) openUnicast() error {
	first, last := u.cfg.BindPort, u.cfg.BindPort+u.cfg.PortRange
	if first == 0 {
		last = 0
	}
	var err error
	for port := first; port <= last; port++ {
		u.uc, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(u.bindIP, uint16(port))))
		if err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("udp: bind %s ports %d..%d: %w", u.bindIP, first, last, err)
	}
	u.local = u.uc.LocalAddr().(*net.UDPAddr).AddrPort()
	u.upc = ipv4.NewPacketConn(u.uc)
	// Multicasts leave from the unicast socket, so receivers learn the
	// sender's unicast address from every datagram. Pin the interface: the
	// default route may lead off the machine.
	steps := []struct {
		what string
		set  func() error
	}{
		{"set receive buffer", func() error { return u.uc.SetReadBuffer(int(u.cfg.UcastRecvBuf)) }},
		{"set send buffer", func() error { return u.uc.SetWriteBuffer(int(u.cfg.UcastSendBuf)) }},
	}
	if u.cfg.IPMcast {
		steps = append(steps, []struct {
			what string
			set  func() error
		}{
			{"set multicast interface", func() error { return u.upc.SetMulticastInterface(u.iface) }},
			{"set multicast TTL", func() error { return u.upc.SetMulticastTTL(u.cfg.IPTTL) }},
			{"set multicast loopback", func() error { return u.upc.SetMulticastLoopback(u.cfg.McastLoop) }},
		}...)
	}
	for _, st := range steps {
		if err := st.set(); err != nil {
			_ = u.uc.Close()
			return fmt.Errorf("udp: %s on %s: %w", st.what, u.local, err)
		}
	}
	u.ucRecvBuf.Store(int64(u.checkBuffers(u.uc, "unicast", int(u.cfg.UcastRecvBuf), int(u.cfg.UcastSendBuf))))
	return nil
}

func (u *UDP) openMulticast() error {
	lc := net.ListenConfig{Control: reuseAddr}
	pc, err := lc.ListenPacket(context.Background(), "udp4", u.group.String())
	if err != nil {
		return fmt.Errorf("udp: bind multicast %s: %w", u.group, err)
	}
	u.mc = pc.(*net.UDPConn)
	u.mpc = ipv4.NewPacketConn(u.mc)
	if err := u.mpc.JoinGroup(u.iface, &net.UDPAddr{IP: u.group.IP}); err != nil {
		_ = u.mc.Close()
		return fmt.Errorf("udp: join %s on %s: %w", u.group.IP, u.iface.Name, err)
	}
	if err := u.mc.SetReadBuffer(int(u.cfg.McastRecvBuf)); err != nil {
		_ = u.mc.Close()
		return fmt.Errorf("udp: set multicast receive buffer: %w", err)
	}
	u.mcRecvBuf.Store(int64(u.checkBuffers(u.mc, "multicast", int(u.cfg.McastRecvBuf), 0)))
	u.ownFiltered.Store(false)
	if u.cfg.McastLoop && !u.noOwnFilter {
		prog, err := ownMulticastFilter(u.local)
		if err == nil {
			err = u.mpc.SetBPF(prog)
		}
		if err != nil {
			u.Log().Debug("udp: no socket filter for own multicasts: they are read back and dropped", "err", err)
		} else {
			u.ownFiltered.Store(true)
		}
	}
	return nil
}

// checkBuffers logs the socket buffers the kernel granted (a warning if
// less than asked) and returns the receive buffer granted (0: not known).
func (u *UDP) checkBuffers(c *net.UDPConn, which string, wantRecv, wantSend int) int {
	recv, send, err := bufferSizes(c)
	if err != nil || recv == 0 {
		return 0
	}
	if recv < wantRecv || (wantSend > 0 && send < wantSend) {
		u.Log().Warn("udp: kernel granted smaller socket buffers than configured (raise net.core.rmem_max / wmem_max); flow control fits its credits to what was granted",
			"socket", which, "recv_asked", wantRecv, "recv_granted", recv, "send_asked", wantSend, "send_granted", send)
	} else {
		u.Log().Debug("udp: socket buffers granted", "socket", which, "recv", recv, "send", send)
	}
	return min(recv, wantRecv)
}

// ReceiveBuffer returns the receive buffer the kernel granted to the socket
// that takes group messages (group) or unicasts, for flow control
// (stack.ReceiveBufferSizer). Without IP multicast the unicast socket takes
// both, and each kind gets half of it.
func (u *UDP) ReceiveBuffer(group bool) int {
	if u.cfg.IPMcast && group {
		return int(u.mcRecvBuf.Load())
	}
	if !u.cfg.IPMcast {
		return int(u.ucRecvBuf.Load() / 2)
	}
	return int(u.ucRecvBuf.Load())
}

// Stop closes the sockets; the readers and the bundler exit.
func (u *UDP) Stop() {
	if u.uc != nil {
		_ = u.uc.Close()
	}
	if u.mc != nil {
		_ = u.mc.Close()
	}
}

// readLoop reads datagrams from pc until done is closed. On the multicast
// socket echo accounts for the member's own multicasts read back.
func (u *UDP) readLoop(pc *ipv4.PacketConn, echo *echoPacer, done <-chan struct{}) {
	msgs := make([]ipv4.Message, u.cfg.BatchSize)
	bufs := make([][]byte, u.cfg.BatchSize)
	for i := range msgs {
		msgs[i].Buffers = bufs[i : i+1 : i+1]
	}
	// The messages decoded from a datagram alias the arena's chunk, which
	// is read into again only once nothing refers into it (see
	// transport.RecvArena): no copy per datagram, and whatever a layer
	// keeps stays intact. Up to 16 datagrams of the largest size fit in a
	// chunk, so up to 16 per recvmmsg when they are large.
	arena := transport.NewRecvArena(maxDatagram + 1)
	for {
		k := arena.Slots(bufs)
		var mark int64
		if echo != nil {
			mark = echo.sent.Load()
		}
		n, err := pc.ReadBatch(msgs[:k], 0)
		if n > 0 {
			u.recvCalls.Add(1)
		}
		if err != nil {
			select {
			case <-done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			u.socketErrors.Add(1)
			continue
		}
		for i := range n {
			m := &msgs[i]
			if m.N > maxDatagram {
				u.droppedOversize.Add(1)
				continue
			}
			var from netip.AddrPort
			if ua, ok := m.Addr.(*net.UDPAddr); ok {
				from = ua.AddrPort()
			}
			ok, own := u.handleDatagram(arena.Take(i, m.N), from)
			if !ok {
				arena.Drop() // nothing refers to it: read the next one there
			}
			if own && echo != nil {
				echo.readBack(m.N)
			}
		}
		if echo != nil {
			if n < k {
				echo.drained(mark) // the socket is empty
			}
			echo.signal()
		}
	}
}

// handleDatagram passes a received datagram to the stack. A stack that
// trusts its network learns the sender's physical address from the
// datagram's preamble, but does not move a member's address while the
// member was heard from at the old one within transport.MoveQuiet (counted in
// addr_moves_refused); one with an authenticating layer (ENCRYPT) does
// not learn from preambles at all, and counts the preambles that claim a
// known member is somewhere else (LearnAddress takes what that layer
// proved). It reports whether the stack accepted the bundle; when it did
// not, nothing refers to pkt any more. own reports an own multicast (which
// is never accepted: it was looped back).
func (u *UDP) handleDatagram(pkt []byte, from netip.AddrPort) (ok, own bool) {
	u.datagramsRecv.Add(1)
	u.bytesRecv.Add(int64(len(pkt)))
	if from.IsValid() {
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	}
	h, ok := u.Receive(pkt, from)
	if !ok {
		return false, h.Multicast && !h.Src.IsZero() && h.Src == u.LocalAddress()
	}
	if !from.IsValid() || h.Src.IsZero() || h.Src == u.LocalAddress() || u.cache == nil {
		return true, false
	}
	if u.authenticated {
		if u.cache.Differs(h.Src, from) {
			u.unprovenMoves.Add(1)
		}
		return true, false
	}
	if !u.cache.LearnUnlessHeard(h.Src, from, transport.MoveQuiet) {
		u.refusedMoves.Add(1)
	}
	return true, false
}

// echoLimit returns the bytes of own multicasts that may be sent and not
// read back before the bundler waits: the member's share of its multicast
// receive buffer, as flow control computes it (fit_receive_buffer); 0: no
// limit.
func (u *UDP) echoLimit() int64 {
	buf := u.mcRecvBuf.Load()
	v := u.View()
	if buf <= 0 || v == nil {
		return 0
	}
	return buf / int64(min(max(len(v.Members), 1), 8))
}

// ReceivesOwnMulticasts reports whether this member's own multicasts come
// back to its multicast socket's buffer: IP multicast with loopback and no
// filter attached to drop them (stack.OwnMulticastReceiver).
func (u *UDP) ReceivesOwnMulticasts() bool {
	return u.cfg.IPMcast && u.cfg.McastLoop && !u.ownFiltered.Load()
}

// LearnAddress records that src is at from: the authenticating layer
// (ENCRYPT) accepted a message src sealed that came from there.
func (u *UDP) LearnAddress(src stack.Address, from netip.AddrPort) {
	if u.cache != nil && from.IsValid() && !src.IsZero() && src != u.LocalAddress() {
		u.cache.Learn(src, from)
	}
}

// reap expires address-cache entries and old WHO_HAS marks.
func (u *UDP) reap() {
	now := time.Now()
	u.expired.Add(int64(u.cache.Expire(now)))
	u.whoMu.Lock()
	defer u.whoMu.Unlock()
	for a, at := range u.whoHas {
		if now.Sub(at) > u.cfg.WhoHasTimeout {
			delete(u.whoHas, a)
		}
	}
}

// Down queues m for the bundler, or sends it at once if it is INTERNAL or
// DONT_BUNDLE. A full queue blocks (honouring ctx) or, with drop_when_full
// or the DontBlock transient flag, drops and counts.
func (u *UDP) Down(ctx context.Context, m *stack.Message) error {
	local := u.LocalAddress()
	if n := stack.BundleOverhead + len(u.Stack().Cluster()) + m.EncodedSize(local); n > int(u.cfg.BundleSize) {
		u.tooBig.Add(1)
		return fmt.Errorf("%w: %d bytes, max_bundle_size %d", ErrMessageTooBig, n, u.cfg.BundleSize)
	}
	if !u.PrepareSend(m) {
		return nil
	}
	if u.queue == nil {
		return stack.ErrNotConnected
	}
	if m.Flags&(stack.Internal|stack.DontBundle) != 0 {
		s := u.getSender()
		buf := u.getBuf()
		*buf = stack.EncodeBundle(*buf, u.Stack().Cluster(), local, m.IsMulticast(), m)
		u.bc.Count(1, len(*buf))
		s.add(buf, m.Dest)
		s.flush()
		u.sndPool.Put(s)
		return nil
	}
	if u.queue.TryPut(m) {
		return nil
	}
	drop := u.cfg.DropFull || m.HasTransient(stack.DontBlock)
	switch err := u.queue.Put(ctx, m, drop, u.Done()); {
	case err == transport.ErrQueueFull:
		u.droppedFull.Add(1)
		return nil
	case err != nil:
		return err
	}
	return nil
}

// DownEvent handles the physical-address events and views.
func (u *UDP) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if res, ok := u.cache.Event(u.LocalAddress(), u.local, ev); ok {
		return res, nil
	}
	if e, ok := ev.(stack.EvSendToPhysical); ok {
		if e.Msg == nil || !e.To.IsValid() {
			return stack.Answer{}, fmt.Errorf("udp: SEND_TO_PHYSICAL needs a message and a valid address, have %v", e.To)
		}
		return stack.Answer{}, u.sendToPhysical(e)
	}
	return u.PassDownEvent(ctx, ev)
}

// sendToPhysical sends one message, unbundled, to a network address (static
// discovery probing hosts whose members it does not know yet).
func (u *UDP) sendToPhysical(ps stack.EvSendToPhysical) error {
	if u.queue == nil {
		return stack.ErrNotConnected
	}
	if ps.To == u.local {
		return nil
	}
	m := ps.Msg
	m.Src = u.LocalAddress()
	s := u.getSender()
	buf := u.getBuf()
	*buf = stack.EncodeBundle(*buf, u.Stack().Cluster(), m.Src, false, m)
	u.bc.Count(1, len(*buf))
	s.bufs = append(s.bufs, buf)
	s.push(*buf, net.UDPAddrFromAddrPort(ps.To))
	s.flush()
	u.sndPool.Put(s)
	return nil
}

// askWhoHas tells discovery (an event up) that a's physical address is
// needed, at most once per who_has_cache_timeout per address.
func (u *UDP) askWhoHas(a stack.Address) {
	now := time.Now()
	u.whoMu.Lock()
	if last, ok := u.whoHas[a]; ok && now.Sub(last) < u.cfg.WhoHasTimeout {
		u.whoMu.Unlock()
		return
	}
	u.whoHas[a] = now
	u.whoMu.Unlock()
	u.whoHasSent.Add(1)
	// On its own goroutine: discovery will send, and the caller may be the
	// bundler that has to take that message.
	u.Go(func(<-chan struct{}) { _, _ = u.PassUpEvent(stack.EvWhoHas{Member: a}) })
}

func (u *UDP) getBuf() *[]byte { return u.bufs.Get() }

func (u *UDP) getSender() *sender { return u.sndPool.Get().(*sender) }

// Stats reports the shared transport counters and UDP's own.
func (u *UDP) Stats() []stack.Stat {
	avg := u.bc.AvgSize()
	cacheSize, evicted, refused := 0, int64(0), int64(0)
	if u.cache != nil {
		cacheSize, evicted, refused = u.cache.Size(), u.cache.Evicted.Load(), u.cache.Refused.Load()
	}
	return append(append(append(append(u.TransportBase.Stats(), stack.CounterStats(u)...), stack.CounterStats(&u.bc)...), stack.CounterStats(u.echo)...),
		stack.Stat{Name: "avg_bundle_size", Value: avg},
		stack.Stat{Name: "addr_cache_size", Value: int64(cacheSize)},
		stack.Stat{Name: "addr_cache_evicted", Value: evicted, Counter: true},
		stack.Stat{Name: "addr_cache_full_refused", Value: refused, Counter: true},
		stack.Stat{Name: "own_multicast_bytes_unread", Value: max(u.echo.outstanding(), 0)},
		stack.Stat{Name: "own_multicasts_filtered", Value: b2i(u.ownFiltered.Load())},
	)
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
