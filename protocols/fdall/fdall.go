// Package fdall is FD_ALL, failure detection by heartbeats: every member
// multicasts a heartbeat every interval on the internal lane, and suspects
// (EvSuspect up) every view member it has heard nothing from within timeout.
// Any message from a member counts as a heartbeat, so a busy member is
// never suspected for want of heartbeats.
package fdall

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures FD_ALL.
type Config struct {
	Interval      time.Duration `toml:"interval" doc:"time between two heartbeats of this member"`
	Timeout       time.Duration `toml:"timeout" doc:"a member not heard from for this long is suspected"`
	CheckInterval time.Duration `toml:"timeout_check_interval" doc:"how often the timestamps are checked against timeout"`
}

// DefaultConfig returns JGroups' FD_ALL defaults.
func DefaultConfig() Config {
	return Config{Interval: 8 * time.Second, Timeout: 40 * time.Second, CheckInterval: 2 * time.Second}
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.Interval <= 0:
		return stack.BadKey("interval", "must be > 0, got %s", c.Interval)
	case c.Timeout <= c.Interval:
		return stack.BadKey("timeout", "(%s) must be greater than interval (%s), or every lost heartbeat is a suspicion", c.Timeout, c.Interval)
	case c.CheckInterval <= 0 || c.CheckInterval > c.Timeout:
		return stack.BadKey("timeout_check_interval", "must be in (0, timeout], got %s", c.CheckInterval)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "FD_ALL", ID: stack.IDFDALL,
		Provides: []stack.Service{stack.ServiceFailureDetection}, RequiresAbove: []stack.Service{stack.ServiceMembership},
		Doc:      "failure detection: multicast heartbeats; suspects members silent for longer than timeout",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{
		ID: stack.IDFDALL, Name: "FD_ALL", Decode: decodeHeader,
		Samples: func() []stack.Header { return []stack.Header{heartbeat{}} },
	})
}

// heartbeat is FD_ALL's header: it has no body.
type heartbeat struct{}

func (heartbeat) Size() int                { return 0 }
func (heartbeat) AppendTo(b []byte) []byte { return b }

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	if r.Len() != 0 {
		r.Fail("FD_ALL heartbeat with a %d-byte body", r.Len())
		return nil, r.Err()
	}
	return heartbeat{}, nil
}

// FDAll is the FD_ALL protocol.
type FDAll struct {
	stack.Base
	cfg Config

	mu        sync.RWMutex
	last      map[stack.Address]*atomic.Int64 // unix nanos of the last message heard
	suspected map[stack.Address]bool          // guarded by mu (write lock)

	sent         atomic.Int64 `stat:"heartbeats_sent"`
	received     atomic.Int64 `stat:"heartbeats_received"`
	suspicions   atomic.Int64 `stat:"suspicions"`
	unsuspicions atomic.Int64 `stat:"unsuspicions"`
}

var _ stack.Protocol = (*FDAll)(nil)

// New returns an FD_ALL layer.
func New(cfg Config) *FDAll {
	return &FDAll{cfg: cfg, last: map[stack.Address]*atomic.Int64{}, suspected: map[stack.Address]bool{}}
}

// Name returns "FD_ALL".
func (f *FDAll) Name() string { return "FD_ALL" }

// Init validates the config.
func (f *FDAll) Init() error { return f.cfg.Validate() }

// Start starts the heartbeat and the timeout check.
func (f *FDAll) Start() error {
	f.mu.Lock()
	clear(f.last)
	clear(f.suspected)
	f.mu.Unlock()
	f.GoEvery(f.cfg.Interval, f.sendHeartbeat)
	f.GoEvery(f.cfg.CheckInterval, f.check)
	return nil
}

func (f *FDAll) sendHeartbeat() {
	if f.View().Size() < 2 {
		return
	}
	m := stack.NewMessage(stack.Address{}, nil).Set(stack.Internal | stack.OOB | stack.NoReliability)
	m.PutHeader(f.ID(), heartbeat{})
	f.sent.Add(1)
	_ = f.PassDown(f.Context(), m)
}

// check suspects every member silent for longer than timeout, again at
// every check while it stays silent (the layers above decide what to do).
func (f *FDAll) check() {
	now := time.Now().UnixNano()
	var suspects []stack.Address
	f.mu.Lock()
	for a, t := range f.last {
		if now-t.Load() > int64(f.cfg.Timeout) {
			suspects = append(suspects, a)
			if !f.suspected[a] {
				f.suspected[a] = true
				f.suspicions.Add(1)
				f.Log().Info("suspecting member: no message within timeout", "member", a, "timeout", f.cfg.Timeout)
			}
		}
	}
	f.mu.Unlock()
	if len(suspects) > 0 {
		_, _ = f.PassUpEvent(stack.EvSuspect{Members: suspects})
	}
}

// touch records that a was heard from now.
func (f *FDAll) touch(a stack.Address) {
	f.mu.RLock()
	t := f.last[a]
	was := t != nil && f.suspected[a]
	f.mu.RUnlock()
	if t == nil {
		return
	}
	t.Store(time.Now().UnixNano())
	if !was {
		return
	}
	f.mu.Lock()
	was = f.suspected[a]
	delete(f.suspected, a)
	f.mu.Unlock()
	if was {
		f.unsuspicions.Add(1)
		_, _ = f.PassUpEvent(stack.EvUnsuspect{Member: a})
	}
}

// Up counts every message as a heartbeat of its sender and takes
// heartbeats out.
func (f *FDAll) Up(m *stack.Message) {
	f.touch(m.Src)
	if _, ok := m.Header(f.ID()).(heartbeat); ok {
		if m.Src != f.LocalAddress() {
			f.received.Add(1)
		}
		return
	}
	f.PassUp(m)
}

// PreservesBatches marks FD_ALL as a stack.BatchPreserver: its UpBatch only
// removes messages.
func (*FDAll) PreservesBatches() {}

// UpBatch counts the batch as a heartbeat of its sender.
func (f *FDAll) UpBatch(bt *stack.Batch) {
	f.touch(bt.Src)
	if !bt.MayHave(f.ID()) {
		f.PassUpBatch(bt)
		return
	}
	bt.Keep(func(m *stack.Message) bool {
		_, ok := m.Header(f.ID()).(heartbeat)
		if ok && m.Src != f.LocalAddress() {
			f.received.Add(1)
		}
		return !ok
	})
	if len(bt.Msgs) > 0 {
		f.PassUpBatch(bt)
	}
}

// DownEvent tracks the view: new members start as heard from now.
func (f *FDAll) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok {
		if v := vc.View; v != nil {
			f.setView(v)
		}
	}
	return f.PassDownEvent(ctx, ev)
}

func (f *FDAll) setView(v *stack.View) {
	now := time.Now().UnixNano()
	self := f.LocalAddress()
	in := v.MemberSet() // Contains is linear: a set keeps a view change O(N)
	f.mu.Lock()
	defer f.mu.Unlock()
	for a := range f.last {
		if _, ok := in[a]; !ok {
			delete(f.last, a)
			delete(f.suspected, a)
		}
	}
	for _, a := range v.Members {
		if a != self && f.last[a] == nil {
			t := &atomic.Int64{}
			t.Store(now)
			f.last[a] = t
		}
	}
}

// Stats reports FD_ALL's counters.
func (f *FDAll) Stats() []stack.Stat {
	return stack.CounterStats(f)
}
