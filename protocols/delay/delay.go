// Package delay is the fault-injection protocol DELAY: it holds messages
// going up or down for a fixed time plus seeded jitter.
package delay

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
)

// Config configures DELAY.
type Config struct {
	Up     time.Duration `toml:"up" doc:"how long each received message (or batch) is held"`
	Down   time.Duration `toml:"down" doc:"how long each sent message is held (the sender waits)"`
	Jitter time.Duration `toml:"jitter" doc:"extra random delay in [0, jitter), from seed"`
	Seed   uint64        `toml:"seed" doc:"seed of the jitter"`
}

// DefaultConfig delays nothing.
func DefaultConfig() Config { return Config{Seed: 1} }

// Validate checks that no duration is negative.
func (c *Config) Validate() error {
	for _, kv := range []struct {
		k string
		v time.Duration
	}{{"up", c.Up}, {"down", c.Down}, {"jitter", c.Jitter}} {
		if kv.v < 0 {
			return stack.BadKey(kv.k, "must not be negative, got %s", kv.v)
		}
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "DELAY", ID: stack.IDDELAY,
		Doc:      "delays messages up and/or down by a fixed time plus jitter (fault injection)",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
}

// Delay is the DELAY protocol.
type Delay struct {
	stack.Base
	cfg     Config
	mu      sync.Mutex
	rng     *rand.Rand
	delayed atomic.Int64 `stat:"delayed"`
}

var _ stack.Protocol = (*Delay)(nil)

// New returns a DELAY layer.
func New(cfg Config) *Delay {
	return &Delay{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0xde1a))}
}

// Name returns "DELAY".
func (d *Delay) Name() string { return "DELAY" }

func (d *Delay) wait(ctx context.Context, base time.Duration) error {
	dur := base
	if d.cfg.Jitter > 0 {
		d.mu.Lock()
		dur += time.Duration(d.rng.Int64N(int64(d.cfg.Jitter)))
		d.mu.Unlock()
	}
	if dur <= 0 {
		return nil
	}
	d.delayed.Add(1)
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.Done():
		return stack.ErrClosed
	}
}

// Down holds m, then forwards it.
func (d *Delay) Down(ctx context.Context, m *stack.Message) error {
	if err := d.wait(ctx, d.cfg.Down); err != nil {
		return err
	}
	return d.PassDown(ctx, m)
}

// Up holds m, then forwards it.
func (d *Delay) Up(m *stack.Message) {
	if d.wait(context.Background(), d.cfg.Up) == nil {
		d.PassUp(m)
	}
}

// PreservesBatches marks DELAY as a stack.BatchPreserver: its UpBatch holds
// batches, it does not change them.
func (*Delay) PreservesBatches() {}

// UpBatch holds the batch, then forwards it.
func (d *Delay) UpBatch(b *stack.Batch) {
	if d.wait(context.Background(), d.cfg.Up) == nil {
		d.PassUpBatch(b)
	}
}

// Stats reports how many messages were held.
func (d *Delay) Stats() []stack.Stat { return stack.CounterStats(d) }
