// Package sim is the in-memory transport SIM: many channels in one process
// talk through a named Network with per-link faults, in virtual time under
// testing/synctest.
package sim

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/strata-go/strata/stack"
)

// Config configures SIM.
type Config struct {
	Network  string `toml:"network" doc:"name of the in-memory network; channels on the same name talk to each other"`
	Seed     uint64 `toml:"seed" doc:"fault seed used when this member creates the network"`
	QueueLen int    `toml:"queue_len" doc:"packets a member's inbox holds; more are dropped and counted, as by a full socket buffer"`
	// MaxQueued is UDP's max_queued_bytes.
	MaxQueued stack.Size `toml:"max_queued_bytes" doc:"received bytes waiting for delivery per sender (regular lane) or per lane (OOB, internal); more are dropped and counted (0: no bound)"`
}

// DefaultConfig returns SIM's defaults.
func DefaultConfig() Config {
	return Config{Network: "default", Seed: 1, QueueLen: 1 << 20, MaxQueued: stack.DefaultMaxQueued}
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
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "SIM", ID: stack.IDSIM, Transport: true,
		Doc:      "in-memory transport for tests: channels in one process on a named network with per-link faults",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
}

// SIM is the in-memory transport.
type SIM struct {
	stack.TransportBase
	cfg Config
	net *Network
	ep  *endpoint
}

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
	return nil
}

// Start attaches the member to its network and starts the receive loop.
func (s *SIM) Start() error {
	ep := newEndpoint(s.LocalAddress(), s.cfg.QueueLen)
	n, err := attach(s.cfg.Network, s.cfg.Seed, ep)
	if err != nil {
		return err
	}
	ep.n = n
	s.net, s.ep = n, ep
	s.Go(func(done <-chan struct{}) { s.receiveLoop(ep, done) })
	return nil
}

func (s *SIM) receiveLoop(ep *endpoint, done <-chan struct{}) {
	var pkts [][]byte
	for {
		select {
		case <-done:
			return
		case <-ep.notify:
		}
		pkts = ep.take(pkts)
		for i, p := range pkts {
			s.net.Delivered.Add(1)
			s.Receive(p, netip.AddrPort{})
			pkts[i] = nil
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

// Inject hands raw bytes to the member as if they came from the network,
// for tests of malformed input.
func (s *SIM) Inject(pkt []byte) { s.Receive(pkt, netip.AddrPort{}) }
