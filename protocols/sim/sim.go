// Package sim is the in-memory transport SIM: many channels in one process
// talk through a named Network with per-link faults, in virtual time under
// testing/synctest.
package sim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/strata-go/strata/stack"
)

// Config configures SIM.
type Config struct {
	Network  string `toml:"network" doc:"name of the in-memory network; channels on the same name talk to each other"`
	Seed     uint64 `toml:"seed" doc:"fault seed used when this member creates the network"`
	QueueLen int    `toml:"queue_len" doc:"packets a member's inbox holds; more are dropped and counted, as by a full socket buffer"`
	// MaxQueued is UDP's max_queued_bytes.
	MaxQueued stack.Size `toml:"max_queued_bytes" doc:"received bytes waiting for delivery per sender (regular lane) or per lane (OOB, internal); more are dropped and counted (0: no bound)"`
	// BundleSize is UDP's max_bundle_size: a datagram limit, so that tests
	// over SIM meet the limits a real network sets.
	BundleSize stack.Size `toml:"max_bundle_size" doc:"largest packet SIM carries, as UDP's largest datagram; a larger message is refused as UDP refuses it (0: no bound)"`
	// A network address, as TCP's and UDP's bind keys give one: for
	// discovery that probes host:port lists (STATIC_PING).
	BindAddr  string `toml:"bind_addr" doc:"IP address of the member's network address (with bind_port)"`
	BindPort  int    `toml:"bind_port" doc:"the member's network address is bind_addr and the first port from bind_port up to port_range that no one on the network holds; 0: no network address (SEND_TO_PHYSICAL not supported)"`
	PortRange int    `toml:"port_range" doc:"ports above bind_port to try when it is taken"`
}

// DefaultConfig returns SIM's defaults.
func DefaultConfig() Config {
	return Config{Network: "default", Seed: 1, QueueLen: 1 << 20, MaxQueued: stack.DefaultMaxQueued, BindAddr: "127.0.0.1", PortRange: 50}
}

// Validate checks the config.
func (c *Config) Validate() error {
	if c.Network == "" {
		return stack.BadKey("network", "must not be empty")
	}
	if c.QueueLen <= 0 {
		return stack.BadKey("queue_len", "must be > 0, got %d", c.QueueLen)
	}
	if c.MaxQueued < 0 {
		return stack.BadKey("max_queued_bytes", "must be >= 0, got %d", c.MaxQueued)
	}
	if c.BundleSize != 0 && (c.BundleSize < 512 || c.BundleSize > stack.MaxPayload) {
		return stack.BadKey("max_bundle_size", "must be 0 (no bound) or between 512 bytes and %d, got %d", stack.MaxPayload, c.BundleSize)
	}
	switch {
	case c.BindPort < 0 || c.BindPort > 65535:
		return stack.BadKey("bind_port", "must be 0..65535, got %d", c.BindPort)
	case c.BindPort == 0:
		return nil
	}
	if _, err := netip.ParseAddr(c.BindAddr); err != nil {
		return stack.BadKey("bind_addr", "must be an IP address, got %q", c.BindAddr)
	}
	if c.PortRange < 0 || c.BindPort+c.PortRange > 65535 {
		return stack.BadKey("port_range", "must be >= 0 with bind_port+port_range <= 65535, got %d", c.PortRange)
	}
	return nil
}

// MaxDatagram is max_bundle_size (0: no bound), for the loader's checks of
// what fits one packet.
func (c *Config) MaxDatagram() stack.Size { return c.BundleSize }

// bind is the first address to try (port 0: none).
func (c *Config) bind() netip.AddrPort {
	if c.BindPort == 0 {
		return netip.AddrPort{}
	}
	ip, _ := netip.ParseAddr(c.BindAddr)
	return netip.AddrPortFrom(ip.Unmap(), uint16(c.BindPort))
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "SIM", ID: stack.IDSIM, Transport: true,
		Doc:      "in-memory transport for tests: channels in one process on a named network with per-link faults",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
}

// SIM is the in-memory transport. With bind_port, each member also has a
// synthetic network address (ip:port, unique on its network), reported as
// the UDP and TCP transports report theirs: discovery that probes host:port
// lists (STATIC_PING) runs over SIM, and every received message carries
// its sender's address (Message.From).
type SIM struct {
	stack.TransportBase
	cfg    Config
	net    *Network
	ep     *endpoint
	tooBig atomic.Int64 `stat:"msgs_too_big"`
}

// ErrMessageTooBig is returned by Down for a message whose packet is larger
// than max_bundle_size, as UDP refuses one.
var ErrMessageTooBig = errors.New("sim: message larger than max_bundle_size")

var _ stack.Transport = (*SIM)(nil)

// New returns a SIM transport with cfg.
func New(cfg Config) *SIM { return &SIM{cfg: cfg} }

// Name returns "SIM".
func (s *SIM) Name() string { return "SIM" }

// Network returns the network the member is attached to (nil when stopped).
func (s *SIM) Network() *Network { return s.net }

// Init validates the config.
func (s *SIM) Init() error {
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	s.SetMaxQueued(s.cfg.MaxQueued)
	s.SetMaxDatagram(s.cfg.BundleSize)
	return nil
}

// Start attaches the member to its network and starts the receive loop.
func (s *SIM) Start() error {
	ep := newEndpoint(s.LocalAddress(), s.cfg.QueueLen)
	n, err := attach(s.cfg.Network, s.cfg.Seed, ep, s.cfg.bind(), s.cfg.PortRange)
	if err != nil {
		return err
	}
	ep.n = n
	s.net, s.ep = n, ep
	s.Go(func(done <-chan struct{}) { s.receiveLoop(ep, done) })
	return nil
}

func (s *SIM) receiveLoop(ep *endpoint, done <-chan struct{}) {
	var pkts []packet
	for {
		select {
		case <-done:
			return
		case <-ep.notify:
		}
		pkts = ep.take(pkts)
		for i, p := range pkts {
			s.net.Delivered.Add(1)
			s.Receive(p.data, p.from)
			pkts[i] = packet{}
		}
	}
}

// Stop detaches the member; queued and delayed packets are discarded.
func (s *SIM) Stop() {
	if s.ep != nil {
		s.ep.stop()
		s.net.detach(s.ep)
	}
}

// Down puts m on the network: to its destination, or to every other member
// for a multicast (the local copy is looped back by TransportBase).
func (s *SIM) Down(ctx context.Context, m *stack.Message) error {
	if len(m.Payload) > stack.MaxPayload {
		return fmt.Errorf("sim: payload of %d bytes exceeds %d", len(m.Payload), stack.MaxPayload)
	}
	if s.cfg.BundleSize > 0 {
		if n := stack.BundleOverhead + len(s.Stack().Cluster()) + m.EncodedSize(s.LocalAddress()); n > int(s.cfg.BundleSize) {
			s.tooBig.Add(1)
			return fmt.Errorf("%w: %d bytes, max_bundle_size %d", ErrMessageTooBig, n, s.cfg.BundleSize)
		}
	}
	if !s.PrepareSend(m) {
		return nil
	}
	n := s.net
	if n == nil {
		return stack.ErrNotConnected
	}
	// The bundle's source is this member, also for messages it forwards on
	// behalf of others (retransmissions).
	self := s.LocalAddress()
	pkt := stack.EncodeBundle(make([]byte, 0, stack.BundleOverhead+len(s.Stack().Cluster())+m.EncodedSize(self)),
		s.Stack().Cluster(), self, m.IsMulticast(), m)
	n.send(self, m.Dest, pkt, m)
	return nil
}

// PhysicalAddress returns the member's network address (zero without
// bind_port, or before Start).
func (s *SIM) PhysicalAddress() netip.AddrPort {
	if s.ep == nil {
		return netip.AddrPort{}
	}
	return s.ep.phys
}

// DownEvent answers, for a member with a network address, what a transport
// with network addresses answers: its own address, and SEND_TO_PHYSICAL
// (to the member holding that address; to none, lost). Other members'
// addresses are not needed: SIM routes by logical address.
func (s *SIM) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	phys := s.PhysicalAddress()
	if !phys.IsValid() {
		return s.TransportBase.DownEvent(ctx, ev)
	}
	switch e := ev.(type) {
	case stack.EvGetLocalPhysicalAddress:
		return stack.Reply(e, phys), nil
	case stack.EvGetPhysicalAddress:
		if e.Member == s.LocalAddress() {
			return stack.Reply(e, phys), nil
		}
		return stack.Reply(e, netip.AddrPort{}), nil
	case stack.EvSendToPhysical:
		if e.Msg == nil || !e.To.IsValid() {
			return stack.Answer{}, fmt.Errorf("sim: SEND_TO_PHYSICAL needs a message and a valid address, have %v", e.To)
		}
		if e.To == phys {
			return stack.Answer{}, nil
		}
		m := e.Msg
		if len(m.Payload) > stack.MaxPayload {
			return stack.Answer{}, fmt.Errorf("sim: payload of %d bytes exceeds %d", len(m.Payload), stack.MaxPayload)
		}
		m.Src = s.LocalAddress()
		pkt := stack.EncodeBundle(make([]byte, 0, stack.BundleOverhead+len(s.Stack().Cluster())+m.EncodedSize(m.Src)),
			s.Stack().Cluster(), m.Src, false, m)
		s.net.sendPhysical(m.Src, e.To, pkt, m)
		return stack.Answer{}, nil
	}
	return s.TransportBase.DownEvent(ctx, ev)
}

// Inject hands raw bytes to the member as if they came from the network,
// for tests of malformed input.
func (s *SIM) Inject(pkt []byte) { s.Receive(pkt, netip.AddrPort{}) }

// Stats reports the transport's counters and SIM's own.
func (s *SIM) Stats() []stack.Stat {
	return append(s.TransportBase.Stats(), stack.CounterStats(s)...)
}
