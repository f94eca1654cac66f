// Package tcp is the TCP transport: one listening socket, one connection
// per peer (set up on demand, reused, and one even when two members dial
// each other at once), a group message sent once per view member, the
// bundler and batch hand-off UDP uses (internal/transport,
// stack.TransportBase), length-prefixed frames with a hard bound, read in
// place into the receive chunks UDP reads datagrams into (no copy per
// frame), a bounded send queue per peer, and optional TLS with files
// reloaded on change.
package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/internal/transport"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "TCP", ID: stack.IDTCP, Transport: true,
		Doc:      "TCP transport: one connection per peer, group messages as one send per member, bundling, bounded frames and per-peer queues, optional TLS",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
}

// ErrMessageTooBig is returned by Down for a message that does not fit in
// one bundle of max_bundle_size; put FRAG above the transport.
var ErrMessageTooBig = errors.New("tcp: message larger than max_bundle_size (add FRAG to the stack)")

// TCP is the TCP transport.
type TCP struct {
	stack.TransportBase
	cfg Config

	bindIP netip.Addr
	dialFn func(ctx context.Context, d *net.Dialer, addr string) (net.Conn, error)
	ln     net.Listener
	local  netip.AddrPort
	tlsr   *tlsReloader

	cache         *transport.AddrCache
	authenticated bool
	queue         *transport.SendQueue
	bufs          *transport.BufPool
	bc            transport.BundleCounters

	mu      sync.Mutex
	stopped bool
	peers   map[netip.AddrPort]*peer
	open    map[net.Conn]struct{} // every socket, pending or established, for Stop
	pending atomic.Int64

	whoMu  sync.Mutex
	whoHas map[stack.Address]time.Time

	framesSent      atomic.Int64 `stat:"frames_sent"`
	framesRecv      atomic.Int64 `stat:"frames_received"`
	bytesRecv       atomic.Int64 `stat:"bytes_received"`
	connsAccepted   atomic.Int64 `stat:"connections_accepted"`
	connsDialled    atomic.Int64 `stat:"connections_dialled"`
	connsDuplicate  atomic.Int64 `stat:"connections_duplicate_closed"`
	connsExpired    atomic.Int64 `stat:"connections_expired"`
	connsClosed     atomic.Int64 `stat:"connections_closed"`
	dialFailures    atomic.Int64 `stat:"dial_failures"`
	badFrames       atomic.Int64 `stat:"bad_frames"`
	badHellos       atomic.Int64 `stat:"bad_preambles"`
	helloTimeouts   atomic.Int64 `stat:"preamble_timeouts"`
	refusedPending  atomic.Int64 `stat:"refused_too_many_pending"`
	tlsRefused      atomic.Int64 `stat:"tls_handshake_failures"`
	readErrors      atomic.Int64 `stat:"read_errors"`
	writeErrors     atomic.Int64 `stat:"write_errors"`
	acceptErrors    atomic.Int64 `stat:"accept_errors"`
	droppedFull     atomic.Int64 `stat:"dropped_queue_full"`
	droppedPeerFull atomic.Int64 `stat:"dropped_peer_queue_full"`
	droppedUnreach  atomic.Int64 `stat:"dropped_unreachable"`
	droppedNoPhys   atomic.Int64 `stat:"dropped_no_physical_address"`
	tooBig          atomic.Int64 `stat:"rejected_too_big"`
	whoHasSent      atomic.Int64 `stat:"who_has_sent"`
	expired         atomic.Int64 `stat:"addr_cache_expired"`
	unprovenMoves   atomic.Int64 `stat:"addr_moves_unproven"`
	refusedMoves    atomic.Int64 `stat:"addr_moves_refused"`
}

var (
	_ stack.Transport      = (*TCP)(nil)
	_ stack.AddressLearner = (*TCP)(nil)
	_ transport.Sink       = (*sink)(nil)
)

// New returns a TCP transport with cfg.
func New(cfg Config) *TCP { return &TCP{cfg: cfg} }

// Name returns "TCP".
func (t *TCP) Name() string { return "TCP" }

// Config returns the transport's configuration.
func (t *TCP) Config() Config { return t.cfg }

// SetDial replaces how connections to peers are made (d.DialContext to
// addr by default), before Connect: tests whose members live in network
// namespaces dial from inside theirs.
func (t *TCP) SetDial(dial func(ctx context.Context, d *net.Dialer, addr string) (net.Conn, error)) {
	t.dialFn = dial
}

// PhysicalAddress returns the listening socket's address (valid once
// started).
func (t *TCP) PhysicalAddress() netip.AddrPort { return t.local }

// Init validates the config and resolves bind_addr on this machine.
func (t *TCP) Init() error {
	if err := t.cfg.Validate(); err != nil {
		return err
	}
	ip, _, err := transport.ResolveBindAddr(t.cfg.BindAddr)
	if err != nil {
		return fmt.Errorf("tcp: %w", err)
	}
	t.bindIP = ip
	t.SetMaxQueued(t.cfg.MaxQueued)
	t.SetMaxDatagram(t.cfg.BundleSize)
	t.bufs = transport.NewBufPool(int(t.cfg.BundleSize) + 256)
	return nil
}

// Start listens and starts the acceptor, the bundler and the reaper.
func (t *TCP) Start() error {
	if t.cfg.TLSEnabled {
		r, err := newTLSReloader(&t.cfg)
		if err != nil {
			return fmt.Errorf("tcp: %w", err)
		}
		t.tlsr = r
	}
	if err := t.listen(); err != nil {
		return err
	}
	t.cache = transport.NewAddrCache(t.cfg.CacheExpiry, t.cfg.CacheMax)
	t.authenticated = t.Stack().Authenticated()
	t.queue = transport.NewSendQueue(t.cfg.QueueLen)
	t.whoHas = map[stack.Address]time.Time{}
	t.mu.Lock()
	t.stopped = false
	t.peers = map[netip.AddrPort]*peer{}
	t.open = map[net.Conn]struct{}{}
	t.mu.Unlock()
	t.Log().Info("tcp transport started", "local", t.local, "tls", t.cfg.TLSEnabled)
	ln := t.ln
	t.Go(func(done <-chan struct{}) { t.acceptLoop(ln, done) })
	t.Go(func(done <-chan struct{}) {
		transport.NewBundler(t, t.queue, int(t.cfg.BundleSize), t.bufs, &sink{t: t}, &t.bc).Run(done)
	})
	t.GoEvery(t.reapInterval(), t.reap)
	if t.tlsr != nil {
		t.GoEvery(t.cfg.TLSReload, t.tlsr.check)
	}
	return nil
}

func (t *TCP) reapInterval() time.Duration {
	d := min(t.cfg.CacheExpiry/4, time.Second)
	if t.cfg.ConnExpiry > 0 {
		d = min(d, t.cfg.ConnExpiry/2)
	}
	return max(d, 10*time.Millisecond)
}

func (t *TCP) listen() error {
	first, last := t.cfg.BindPort, t.cfg.BindPort+t.cfg.PortRange
	if first == 0 {
		last = 0
	}
	lc := net.ListenConfig{KeepAlive: t.cfg.KeepAlive}
	var err error
	for port := first; port <= last; port++ {
		t.ln, err = lc.Listen(context.Background(), "tcp4", netip.AddrPortFrom(t.bindIP, uint16(port)).String())
		if err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("tcp: listen %s ports %d..%d: %w", t.bindIP, first, last, err)
	}
	t.local = t.ln.Addr().(*net.TCPAddr).AddrPort()
	t.local = netip.AddrPortFrom(t.local.Addr().Unmap(), t.local.Port())
	return nil
}

// Stop closes the listener and every connection; the goroutines exit.
func (t *TCP) Stop() {
	t.mu.Lock()
	t.stopped = true
	open := t.open
	t.open = nil
	for _, p := range t.peers {
		p.close()
	}
	t.peers = nil
	t.mu.Unlock()
	if t.ln != nil {
		_ = t.ln.Close()
	}
	for nc := range open {
		_ = nc.Close()
	}
}

// track records an open socket so that Stop closes it; after Stop it
// closes nc and returns false.
func (t *TCP) track(nc net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		_ = nc.Close()
		return false
	}
	t.open[nc] = struct{}{}
	return true
}

func (t *TCP) untrack(nc net.Conn) {
	t.mu.Lock()
	if t.open != nil {
		delete(t.open, nc)
	}
	t.mu.Unlock()
	_ = nc.Close()
}

func (t *TCP) acceptLoop(ln net.Listener, done <-chan struct{}) {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, most likely: wait a little, as
			// net/http does, rather than spin.
			t.acceptErrors.Add(1)
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-done:
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		if t.pending.Add(1) > int64(t.cfg.MaxPending) {
			t.pending.Add(-1)
			t.refusedPending.Add(1)
			_ = nc.Close()
			continue
		}
		if !t.track(nc) {
			t.pending.Add(-1)
			continue
		}
		if !t.Go(func(done <-chan struct{}) { t.serve(nc, done) }) {
			t.pending.Add(-1)
			t.untrack(nc)
		}
	}
}

// serve reads an accepted connection's preamble (after TLS), within
// peer_addr_read_timeout, registers it, and reads its frames.
func (t *TCP) serve(raw net.Conn, done <-chan struct{}) {
	t.setSockOpts(raw)
	_ = raw.SetDeadline(time.Now().Add(t.cfg.PeerTimeout))
	nc := raw
	if t.tlsr != nil {
		tc := tls.Server(raw, t.tlsr.server())
		if err := tc.Handshake(); err != nil {
			t.pending.Add(-1)
			t.tlsRefused.Add(1)
			t.Log().Debug("tcp: TLS handshake refused", "remote", raw.RemoteAddr(), "err", err)
			t.untrack(raw)
			return
		}
		nc = tc
	}
	peerAddr, err := readHello(nc)
	t.pending.Add(-1)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.helloTimeouts.Add(1)
		} else {
			t.badHellos.Add(1)
		}
		t.untrack(raw)
		return
	}
	_ = raw.SetDeadline(time.Time{})
	t.connsAccepted.Add(1)
	c := &conn{nc: nc, raw: raw, peer: peerAddr, dialled: false}
	if !t.register(c) {
		return
	}
	t.readLoop(c, done)
}

func (t *TCP) setSockOpts(nc net.Conn) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return
	}
	_ = tc.SetNoDelay(t.cfg.TCPNoDelay)
	// A size set explicitly turns the kernel's auto-tuning off.
	if t.cfg.RecvBuf > 0 {
		_ = tc.SetReadBuffer(int(t.cfg.RecvBuf))
	}
	if t.cfg.SendBuf > 0 {
		_ = tc.SetWriteBuffer(int(t.cfg.SendBuf))
	}
	if t.cfg.KeepAlive < 0 {
		_ = tc.SetKeepAlive(false)
	} else {
		_ = tc.SetKeepAlive(true)
		if t.cfg.KeepAlive > 0 {
			_ = tc.SetKeepAlivePeriod(t.cfg.KeepAlive)
		}
	}
}

// dial connects to p, sends the preamble and registers the connection. It
// returns the connection p uses now (this one, or one the peer dialled at
// the same time that won), or nil.
func (t *TCP) dial(p *peer) *conn {
	ctx, cancel := context.WithTimeout(t.Context(), t.cfg.ConnTimeout)
	defer cancel()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: t.bindIP.AsSlice()}, KeepAlive: t.cfg.KeepAlive}
	var raw net.Conn
	var err error
	if t.dialFn != nil {
		raw, err = t.dialFn(ctx, d, p.addr.String())
	} else {
		raw, err = d.DialContext(ctx, "tcp4", p.addr.String())
	}
	if err != nil {
		t.dialFailures.Add(1)
		return nil
	}
	if !t.track(raw) {
		return nil
	}
	t.setSockOpts(raw)
	nc := raw
	deadline, _ := ctx.Deadline()
	_ = raw.SetDeadline(deadline)
	if t.tlsr != nil {
		tc := tls.Client(raw, t.tlsr.client())
		if err := tc.HandshakeContext(ctx); err != nil {
			t.tlsRefused.Add(1)
			t.dialFailures.Add(1)
			t.untrack(raw)
			return nil
		}
		nc = tc
	}
	if _, err := nc.Write(appendHello(nil, t.local)); err != nil {
		t.dialFailures.Add(1)
		t.untrack(raw)
		return nil
	}
	_ = raw.SetDeadline(time.Time{})
	t.connsDialled.Add(1)
	c := &conn{nc: nc, raw: raw, peer: p.addr, dialled: true}
	if !t.register(c) {
		return nil
	}
	t.Go(func(done <-chan struct{}) { t.readLoop(c, done) })
	t.mu.Lock()
	defer t.mu.Unlock()
	return p.conn
}

// initiator is the listening address of the member that dialled c.
func (t *TCP) initiator(c *conn) netip.AddrPort {
	if c.dialled {
		return t.local
	}
	return c.peer
}

// register makes c the peer's connection, or not: when the peer already
// has one, the connection dialled by the member with the smaller address
// stays, and both ends decide alike, so two members that dial each other
// at once end with one connection. A connection dialled by the same member
// as the existing one replaces it (the peer restarted or reconnected). The
// loser is half-closed once its writer (if any) has flushed, and its
// reader drains it until the other end half-closes too: nothing sent on
// it is lost.
func (t *TCP) register(c *conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		_ = c.raw.Close()
		return false
	}
	p := t.peerLocked(c.peer)
	if p == nil {
		_ = c.raw.Close()
		return false
	}
	c.p = p
	p.touch()
	old := p.conn
	switch {
	case old == nil:
		p.conn = c
	case t.initiator(c) == t.initiator(old) || t.initiator(c).Compare(t.initiator(old)) < 0:
		p.conn = c
		t.demoteLocked(old)
	default:
		t.demoteLocked(c)
	}
	p.wake()
	return true
}

func (t *TCP) demoteLocked(c *conn) {
	t.connsDuplicate.Add(1)
	c.demoted = true
	if !c.adopted {
		c.closeWrite()
	}
}

// current returns the connection p's writer is to use, marking it adopted.
func (t *TCP) current(p *peer) *conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := p.conn
	if c != nil {
		c.adopted = true
	}
	return c
}

// closeConn closes c and forgets it.
func (t *TCP) closeConn(c *conn) {
	c.once.Do(func() {
		t.connsClosed.Add(1)
		t.mu.Lock()
		if c.p != nil && c.p.conn == c {
			c.p.conn = nil
		}
		if t.open != nil {
			delete(t.open, c.raw)
		}
		t.mu.Unlock()
		_ = c.raw.Close()
	})
}

// readLoop reads c's frames until it ends. A frame whose length is 0 or
// above max_bundle_size, or whose bundle preamble does not parse, cuts the
// peer off and is counted. Frames are read in place into receive chunks
// (frameReader): the messages decoded from a frame alias the chunk, no
// copy per frame.
func (t *TCP) readLoop(c *conn, done <-chan struct{}) {
	defer t.closeConn(c)
	fr := newFrameReader(c.nc, int(t.cfg.BundleSize))
	for {
		data, err := fr.next()
		if err != nil {
			switch {
			case errors.Is(err, errBadFrame), errors.Is(err, io.ErrUnexpectedEOF):
				t.badFrames.Add(1)
				t.Log().Debug("tcp: bad frame, peer cut off", "peer", c.peer, "err", err)
			case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
			default:
				select {
				case <-done:
				default:
					t.readErrors.Add(1)
				}
			}
			return
		}
		t.framesRecv.Add(1)
		t.bytesRecv.Add(int64(len(data)))
		c.p.touch()
		if !t.handleBundle(data, c.peer) {
			t.badFrames.Add(1)
			t.Log().Debug("tcp: malformed bundle, peer cut off", "peer", c.peer)
			return
		}
	}
}

// handleBundle passes a received bundle to the stack and learns where its
// sender is (as UDP does from a datagram: not moving a member heard from at
// its known address within transport.MoveQuiet, counted in
// addr_moves_refused). It reports false for a bundle
// whose preamble is malformed (not one of another cluster or version).
func (t *TCP) handleBundle(data []byte, from netip.AddrPort) bool {
	if cl := t.Stack().Cluster(); cl != "" {
		if _, err := stack.ReadBundleHeader(wire.NewReader(data), cl); err != nil &&
			!errors.Is(err, stack.ErrWrongCluster) && !errors.Is(err, stack.ErrWrongVersion) {
			t.Counters().DroppedMalformed.Add(1)
			return false
		}
	}
	h, ok := t.Receive(data, from)
	if !ok || h.Src.IsZero() || h.Src == t.LocalAddress() || t.cache == nil {
		return true
	}
	if t.authenticated {
		if t.cache.Differs(h.Src, from) {
			t.unprovenMoves.Add(1)
		}
		return true
	}
	if !t.cache.LearnUnlessHeard(h.Src, from, transport.MoveQuiet) {
		t.refusedMoves.Add(1)
	}
	return true
}

// LearnAddress records that src is at from: the authenticating layer
// (ENCRYPT) accepted a message src sealed that came over a connection from
// the member listening there.
func (t *TCP) LearnAddress(src stack.Address, from netip.AddrPort) {
	if t.cache != nil && from.IsValid() && !src.IsZero() && src != t.LocalAddress() {
		t.cache.Learn(src, from)
	}
}

// reap expires address-cache entries and old WHO_HAS marks, and closes
// connections to addresses of no view member that were idle for
// conn_expiry_timeout.
func (t *TCP) reap() {
	now := time.Now()
	t.expired.Add(int64(t.cache.Expire(now)))
	t.whoMu.Lock()
	for a, at := range t.whoHas {
		if now.Sub(at) > t.cfg.WhoHasTimeout {
			delete(t.whoHas, a)
		}
	}
	t.whoMu.Unlock()
	if t.cfg.ConnExpiry <= 0 {
		return
	}
	members := map[netip.AddrPort]bool{}
	if v := t.View(); v != nil {
		for _, m := range v.Members {
			if e := t.cache.Get(m); e != nil {
				members[e.AP] = true
			}
		}
	}
	var gone []*conn
	t.mu.Lock()
	for ap, p := range t.peers {
		if members[ap] || now.Sub(time.Unix(0, p.lastUsed.Load())) < t.cfg.ConnExpiry {
			continue
		}
		t.connsExpired.Add(1)
		delete(t.peers, ap)
		p.close()
		if p.conn != nil {
			gone = append(gone, p.conn)
		}
	}
	t.mu.Unlock()
	for _, c := range gone {
		t.closeConn(c)
	}
}

// peerLocked returns the peer at ap, creating it and its writer.
func (t *TCP) peerLocked(ap netip.AddrPort) *peer {
	if p := t.peers[ap]; p != nil {
		return p
	}
	if t.stopped || ap == t.local {
		return nil
	}
	p := &peer{t: t, addr: ap, q: make(chan *frame, t.cfg.SendQueueSize), kick: make(chan struct{}, 1), stop: make(chan struct{})}
	p.touch()
	if !t.Go(p.run) {
		return nil
	}
	t.peers[ap] = p
	return p
}

// enqueue puts f on ap's queue, or drops and counts it if that is full.
func (t *TCP) enqueue(ap netip.AddrPort, f *frame) {
	t.mu.Lock()
	p := t.peerLocked(ap)
	t.mu.Unlock()
	if p == nil {
		f.release()
		return
	}
	select {
	case p.q <- f:
	default:
		t.droppedPeerFull.Add(1)
		f.release()
	}
}

// Down queues m for the bundler, or sends it at once if it is INTERNAL or
// DONT_BUNDLE. A full bundler queue blocks (honouring ctx) or, with
// drop_when_full or the DontBlock transient flag, drops and counts.
func (t *TCP) Down(ctx context.Context, m *stack.Message) error {
	local := t.LocalAddress()
	if n := stack.BundleOverhead + len(t.Stack().Cluster()) + m.EncodedSize(local); n > int(t.cfg.BundleSize) {
		t.tooBig.Add(1)
		return fmt.Errorf("%w: %d bytes, max_bundle_size %d", ErrMessageTooBig, n, t.cfg.BundleSize)
	}
	if !t.PrepareSend(m) {
		return nil
	}
	if t.queue == nil {
		return stack.ErrNotConnected
	}
	if m.Flags&(stack.Internal|stack.DontBundle) != 0 {
		buf := t.bufs.Get()
		*buf = stack.EncodeBundle(*buf, t.Stack().Cluster(), local, m.IsMulticast(), m)
		t.bc.Count(1, len(*buf))
		(&sink{t: t}).Bundle(buf, m.Dest)
		return nil
	}
	if t.queue.TryPut(m) {
		return nil // the common case, without reading Done (a lock)
	}
	drop := t.cfg.DropFull || m.HasTransient(stack.DontBlock)
	switch err := t.queue.Put(ctx, m, drop, t.Done()); {
	case errors.Is(err, transport.ErrQueueFull):
		t.droppedFull.Add(1)
		return nil
	case err != nil:
		return err
	}
	return nil
}

// DownEvent handles the physical-address events and views.
func (t *TCP) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if res, ok := t.cache.Event(t.LocalAddress(), t.local, ev); ok {
		return res, nil
	}
	if e, ok := ev.(stack.EvSendToPhysical); ok {
		if e.Msg == nil || !e.To.IsValid() {
			return stack.Answer{}, fmt.Errorf("tcp: SEND_TO_PHYSICAL needs a message and a valid address, have %v", e.To)
		}
		return stack.Answer{}, t.sendToPhysical(e)
	}
	return t.PassDownEvent(ctx, ev)
}

// sendToPhysical sends one message, unbundled, to a network address
// (discovery probing hosts whose members it does not know yet).
func (t *TCP) sendToPhysical(ps stack.EvSendToPhysical) error {
	if t.queue == nil {
		return stack.ErrNotConnected
	}
	if ps.To == t.local {
		return nil
	}
	m := ps.Msg
	m.Src = t.LocalAddress()
	buf := t.bufs.Get()
	*buf = stack.EncodeBundle(*buf, t.Stack().Cluster(), m.Src, false, m)
	t.bc.Count(1, len(*buf))
	t.enqueue(netip.AddrPortFrom(ps.To.Addr().Unmap(), ps.To.Port()), newFrame(buf, 1, t.bufs))
	return nil
}

// askWhoHas tells discovery (an event up) that a's address is needed, at
// most once per who_has_cache_timeout per address.
func (t *TCP) askWhoHas(a stack.Address) {
	now := time.Now()
	t.whoMu.Lock()
	if last, ok := t.whoHas[a]; ok && now.Sub(last) < t.cfg.WhoHasTimeout {
		t.whoMu.Unlock()
		return
	}
	t.whoHas[a] = now
	t.whoMu.Unlock()
	t.whoHasSent.Add(1)
	t.Go(func(<-chan struct{}) { _, _ = t.PassUpEvent(stack.EvWhoHas{Member: a}) })
}

// Connections returns the number of peers with an established connection.
func (t *TCP) Connections() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, p := range t.peers {
		if p.conn != nil {
			n++
		}
	}
	return n
}

// Stats reports the shared transport counters and TCP's own.
func (t *TCP) Stats() []stack.Stat {
	t.mu.Lock()
	npeers, nopen := len(t.peers), len(t.open)
	t.mu.Unlock()
	cacheSize, evicted, refused := 0, int64(0), int64(0)
	if t.cache != nil {
		cacheSize, evicted, refused = t.cache.Size(), t.cache.Evicted.Load(), t.cache.Refused.Load()
	}
	out := append(append(t.TransportBase.Stats(), stack.CounterStats(t)...), stack.CounterStats(&t.bc)...)
	out = append(out,
		stack.Stat{Name: "avg_bundle_size", Value: t.bc.AvgSize()},
		stack.Stat{Name: "peers", Value: int64(npeers)},
		stack.Stat{Name: "connections", Value: int64(t.Connections())},
		stack.Stat{Name: "sockets_open", Value: int64(nopen)},
		stack.Stat{Name: "pending_connections", Value: t.pending.Load()},
		stack.Stat{Name: "addr_cache_size", Value: int64(cacheSize)},
		stack.Stat{Name: "addr_cache_evicted", Value: evicted, Counter: true},
		stack.Stat{Name: "addr_cache_full_refused", Value: refused, Counter: true},
	)
	if t.tlsr != nil {
		out = append(out,
			stack.Stat{Name: "tls_reloads", Value: t.tlsr.reloads.Load(), Counter: true},
			stack.Stat{Name: "tls_reload_errors", Value: t.tlsr.reloadErrors.Load(), Counter: true})
	}
	return out
}

// sink takes the bundler's finished bundles: a group bundle goes on the
// queue of every view member (one frame, shared), a unicast bundle on its
// destination's.
type sink struct {
	t       *TCP
	targets []*transport.PhysEntry
}

// Bundle queues buf for dest (transport.Sink).
func (s *sink) Bundle(buf *[]byte, dest stack.Address) {
	t := s.t
	if dest.IsZero() {
		s.targets = t.cache.Targets(t.LocalAddress(), s.targets)
		if len(s.targets) == 0 {
			t.bufs.Put(buf)
			return
		}
		f := newFrame(buf, len(s.targets), t.bufs)
		for _, e := range s.targets {
			t.enqueue(e.AP, f)
		}
		clear(s.targets)
		return
	}
	e := t.cache.Get(dest)
	if e == nil {
		t.droppedNoPhys.Add(1)
		t.bufs.Put(buf)
		t.askWhoHas(dest)
		return
	}
	t.enqueue(e.AP, newFrame(buf, 1, t.bufs))
}

// Flush does nothing: each peer's writer flushes when its queue is empty
// (transport.Sink).
func (s *sink) Flush() {}
