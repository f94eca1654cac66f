// Package stable is STABLE: members gossip the highest seqno each has
// delivered from every sender; once every member of the view has delivered a
// seqno, the reliable-multicast layer below purges it. It bounds the memory
// NAKACK holds for retransmission to what is not yet stable.
package stable

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures STABLE.
type Config struct {
	Interval time.Duration `toml:"desired_avg_gossip" doc:"average time between two gossips of this member's digest (randomised by ±50%)"`
	MaxBytes stack.Size    `toml:"max_bytes" doc:"bytes of multicasts received after which a gossip is sent at once"`
}

// DefaultConfig returns STABLE's defaults.
func DefaultConfig() Config { return Config{Interval: 20 * time.Second, MaxBytes: 4_000_000} }

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.Interval <= 0:
		return stack.BadKey("desired_avg_gossip", "must be > 0, got %s", c.Interval)
	case c.MaxBytes <= 0:
		return stack.BadKey("max_bytes", "must be > 0, got %d", c.MaxBytes)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "STABLE", ID: stack.IDSTABLE,
		Requires: []stack.Service{stack.ServiceReliableMulticast},
		Doc:      "gossips delivered seqnos; purges NAKACK's tables of what every member has delivered",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{
		ID: stack.IDSTABLE, Name: "STABLE", Decode: decodeHeader,
		Samples: func() []stack.Header {
			a, b := stack.NewAddress(), stack.NewAddress()
			return []stack.Header{
				&Header{ViewID: stack.ViewID{Creator: a, Seq: 3}, Digest: stack.Digest{{Member: a, HighestDelivered: 10, HighestReceived: 12}, {Member: b}}},
				&Header{Digest: stack.Digest{}},
			}
		},
	})
}

// Header is a STABLE gossip: the sender's view id and digest.
type Header struct {
	ViewID stack.ViewID
	Digest stack.Digest
}

// Size returns the encoded length.
func (h *Header) Size() int {
	return stack.ViewIDSize(h.ViewID) + stack.DigestSize(h.Digest)
}

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte {
	b = stack.AppendViewID(b, h.ViewID)
	return stack.AppendDigest(b, h.Digest)
}

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{ViewID: stack.ReadViewID(r)}
	h.Digest = stack.ReadDigest(r)
	if err := r.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

// STABLE is the STABLE protocol.
type STABLE struct {
	stack.Base
	cfg Config

	mu      sync.Mutex
	view    *stack.View
	gossips map[stack.Address]stack.Digest
	bytes   int64

	sent     atomic.Int64 `stat:"gossips_sent"`
	received atomic.Int64 `stat:"gossips_received"`
	rounds   atomic.Int64 `stat:"stable_rounds"`
	stale    atomic.Int64 `stat:"gossips_ignored"`
}

var _ stack.Protocol = (*STABLE)(nil)

// New returns a STABLE layer.
func New(cfg Config) *STABLE { return &STABLE{cfg: cfg, gossips: map[stack.Address]stack.Digest{}} }

// Name returns "STABLE".
func (s *STABLE) Name() string { return "STABLE" }

// Init validates the config.
func (s *STABLE) Init() error { return s.cfg.Validate() }

// Start starts the gossip timer.
func (s *STABLE) Start() error {
	s.Go(func(done <-chan struct{}) {
		for {
			d := s.cfg.Interval/2 + s.Rand().Duration(s.cfg.Interval)
			t := time.NewTimer(d)
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
				s.Gossip()
			}
		}
	})
	return nil
}

// Gossip multicasts this member's digest now.
func (s *STABLE) Gossip() {
	s.mu.Lock()
	v := s.view
	s.bytes = 0
	s.mu.Unlock()
	if v == nil || v.Size() < 1 {
		return
	}
	d, err := stack.Ask(s.Context(), s, stack.EvGetDigest{})
	if err != nil {
		return
	}
	m := stack.NewMessage(stack.Address{}, nil).Set(stack.Internal | stack.NoReliability)
	m.PutHeader(s.ID(), &Header{ViewID: v.ID, Digest: d})
	s.sent.Add(1)
	_ = s.PassDown(s.Context(), m)
}

// Up takes gossips; every other message counts towards max_bytes.
func (s *STABLE) Up(m *stack.Message) {
	if h, ok := m.Header(s.ID()).(*Header); ok {
		s.handleGossip(m.Src, h)
		return
	}
	s.count(m)
	s.PassUp(m)
}

// UpBatch takes the batch's gossips and counts the rest.
func (s *STABLE) UpBatch(b *stack.Batch) {
	b.Keep(func(m *stack.Message) bool {
		if h, ok := m.Header(s.ID()).(*Header); ok {
			s.handleGossip(m.Src, h)
			return false
		}
		s.count(m)
		return true
	})
	s.PassUpBatch(b)
}

func (s *STABLE) count(m *stack.Message) {
	if !m.IsMulticast() {
		return
	}
	s.mu.Lock()
	s.bytes += int64(len(m.Payload))
	now := s.bytes >= int64(s.cfg.MaxBytes)
	s.mu.Unlock()
	if now {
		s.Gossip()
	}
}

func (s *STABLE) handleGossip(src stack.Address, h *Header) {
	s.received.Add(1)
	s.mu.Lock()
	if s.view == nil || h.ViewID != s.view.ID || !s.view.Contains(src) {
		s.mu.Unlock()
		s.stale.Add(1)
		return
	}
	s.gossips[src] = h.Digest
	if len(s.gossips) < s.view.Size() {
		s.mu.Unlock()
		return
	}
	// Every member has gossiped: the minimum per sender is stable.
	minD := stack.Digest{}
	first := s.gossips[s.view.Members[0]]
	for _, e := range first {
		low := e.HighestDelivered
		all := true
		for _, m := range s.view.Members[1:] {
			o, ok := s.gossips[m].Get(e.Member)
			if !ok {
				all = false
				break
			}
			low = min(low, o.HighestDelivered)
		}
		if all {
			minD = append(minD, stack.DigestEntry{Member: e.Member, HighestDelivered: low})
		}
	}
	clear(s.gossips)
	s.mu.Unlock()
	s.rounds.Add(1)
	_, _ = s.PassDownEvent(s.Context(), stack.EvStable{Digest: minD})
}

// DownEvent tracks the view.
func (s *STABLE) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok {
		if v := vc.View; v != nil {
			s.mu.Lock()
			s.view = v
			clear(s.gossips)
			s.mu.Unlock()
		}
	}
	return s.PassDownEvent(ctx, ev)
}

// Stats reports STABLE's counters.
func (s *STABLE) Stats() []stack.Stat {
	return stack.CounterStats(s)
}
