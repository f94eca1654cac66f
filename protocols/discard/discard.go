// Package discard is the fault-injection protocol DISCARD: it drops messages
// going up or down, by seeded random rate or by predicate. Place it in any
// stack, from a config or at runtime (Stack.InsertBelow) in tests.
package discard

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/strata-go/strata/stack"
)

// Config configures DISCARD.
type Config struct {
	Up   float64 `toml:"up" doc:"fraction of received messages to drop, 0..1"`
	Down float64 `toml:"down" doc:"fraction of sent messages to drop, 0..1"`
	Seed uint64  `toml:"seed" doc:"seed of the random drops; the same seed drops the same messages"`
}

// DefaultConfig drops nothing.
func DefaultConfig() Config { return Config{Seed: 1} }

// Validate checks the rates.
func (c *Config) Validate() error {
	if c.Up < 0 || c.Up > 1 {
		return stack.BadKey("up", "must be between 0 and 1, got %v", c.Up)
	}
	if c.Down < 0 || c.Down > 1 {
		return stack.BadKey("down", "must be between 0 and 1, got %v", c.Down)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "DISCARD", ID: stack.IDDISCARD,
		Doc:      "drops messages up and/or down, by seeded rate or predicate (fault injection)",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
}

// Discard is the DISCARD protocol.
type Discard struct {
	stack.Base
	cfg Config

	mu       sync.Mutex
	rng      *rand.Rand
	upIf     func(*stack.Message) bool
	downIf   func(*stack.Message) bool
	upRate   float64
	downRate float64

	droppedUp   atomic.Int64 `stat:"dropped_up"`
	droppedDown atomic.Int64 `stat:"dropped_down"`
}

var _ stack.Protocol = (*Discard)(nil)

// New returns a DISCARD layer.
func New(cfg Config) *Discard {
	return &Discard{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), upRate: cfg.Up, downRate: cfg.Down}
}

// Name returns "DISCARD".
func (d *Discard) Name() string { return "DISCARD" }

// DropUpIf drops every received message for which f returns true (nil: none).
func (d *Discard) DropUpIf(f func(*stack.Message) bool) { d.mu.Lock(); d.upIf = f; d.mu.Unlock() }

// DropDownIf drops every sent message for which f returns true (nil: none).
func (d *Discard) DropDownIf(f func(*stack.Message) bool) {
	d.mu.Lock()
	d.downIf = f
	d.mu.Unlock()
}

// SetRates changes the random drop rates.
func (d *Discard) SetRates(up, down float64) {
	d.mu.Lock()
	d.upRate, d.downRate = up, down
	d.mu.Unlock()
}

// Dropped returns how many messages were dropped up and down.
func (d *Discard) Dropped() (up, down int64) { return d.droppedUp.Load(), d.droppedDown.Load() }

func (d *Discard) drop(m *stack.Message, upward bool) bool {
	d.mu.Lock()
	pred, rate := d.downIf, d.downRate
	if upward {
		pred, rate = d.upIf, d.upRate
	}
	d.mu.Unlock()
	// The predicate runs without the lock: a test's predicate may block
	// one message (to make it late) while the others pass.
	if pred != nil && pred(m) {
		return true
	}
	if rate <= 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rng.Float64() < rate
}

// Down drops or forwards m.
func (d *Discard) Down(ctx context.Context, m *stack.Message) error {
	if d.drop(m, false) {
		d.droppedDown.Add(1)
		return nil
	}
	return d.PassDown(ctx, m)
}

// Up drops or forwards m.
func (d *Discard) Up(m *stack.Message) {
	if d.drop(m, true) {
		d.droppedUp.Add(1)
		return
	}
	d.PassUp(m)
}

// PreservesBatches marks DISCARD as a stack.BatchPreserver: its UpBatch only
// removes messages.
func (*Discard) PreservesBatches() {}

// UpBatch drops matching messages and forwards the rest.
func (d *Discard) UpBatch(b *stack.Batch) {
	b.Keep(func(m *stack.Message) bool {
		if d.drop(m, true) {
			d.droppedUp.Add(1)
			return false
		}
		return true
	})
	d.PassUpBatch(b)
}

// Stats reports the drop counters.
func (d *Discard) Stats() []stack.Stat {
	return stack.CounterStats(d)
}
