// Package verifysuspect is VERIFY_SUSPECT: it double-checks every suspicion
// coming up from failure detection before the membership protocol acts on
// it. It asks the suspect "are you dead?" and passes the suspicion up only
// if nothing at all (an answer or any other message) arrives from the
// suspect within timeout, so one lost heartbeat never excludes a live
// member.
package verifysuspect

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/wire"
)

// Config configures VERIFY_SUSPECT.
type Config struct {
	Timeout time.Duration `toml:"timeout" doc:"how long a suspect has to show it is alive"`
	NumMsgs int           `toml:"num_msgs" doc:"are-you-dead requests sent per suspicion, spread over timeout"`
}

// DefaultConfig returns VERIFY_SUSPECT's defaults (JGroups' udp.xml).
func DefaultConfig() Config { return Config{Timeout: 1500 * time.Millisecond, NumMsgs: 2} }

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.Timeout <= 0:
		return stack.BadKey("timeout", "must be > 0, got %s", c.Timeout)
	case c.NumMsgs < 1 || c.NumMsgs > 100:
		return stack.BadKey("num_msgs", "must be 1..100, got %d", c.NumMsgs)
	}
	return nil
}

func init() {
	stack.Register(stack.ProtocolSpec[Config]{
		Name: "VERIFY_SUSPECT", ID: stack.IDVerifySuspect,
		Requires: []stack.Service{stack.ServiceFailureDetection}, RequiresAbove: []stack.Service{stack.ServiceMembership},
		Doc:      "double-checks suspicions: passes one up only if the suspect stays silent for timeout",
		Defaults: DefaultConfig,
		New:      func(c Config) (stack.Protocol, error) { return New(c), nil },
	})
	stack.RegisterHeader(stack.HeaderType{
		ID: stack.IDVerifySuspect, Name: "VERIFY_SUSPECT", Decode: decodeHeader,
		Samples: func() []stack.Header { return []stack.Header{&Header{Type: areYouDead}, &Header{Type: iAmNotDead}} },
	})
}

const (
	areYouDead uint8 = 1
	iAmNotDead uint8 = 2
)

// Header is an are-you-dead request or its answer.
type Header struct{ Type uint8 }

// Size returns the encoded length.
func (h *Header) Size() int { return 1 }

// AppendTo appends the encoding.
func (h *Header) AppendTo(b []byte) []byte { return append(b, h.Type) }

func decodeHeader(r *wire.Reader) (stack.Header, error) {
	h := &Header{Type: r.Uint8()}
	if r.Err() == nil && h.Type != areYouDead && h.Type != iAmNotDead {
		r.Fail("VERIFY_SUSPECT type %d", h.Type)
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

type check struct {
	deadline time.Time
	next     time.Time // when the next request is due
	left     int       // requests still to send
}

// VerifySuspect is the VERIFY_SUSPECT protocol.
type VerifySuspect struct {
	stack.Base
	cfg Config

	mu      sync.Mutex
	pending map[stack.Address]*check
	n       atomic.Int32 // len(pending), read without the lock on every message
	kick    chan struct{}

	requests  atomic.Int64 `stat:"verifications"`
	answers   atomic.Int64 `stat:"answers_sent"`
	confirmed atomic.Int64 `stat:"suspicions_confirmed"`
	cleared   atomic.Int64 `stat:"suspicions_cleared"`
}

var _ stack.Protocol = (*VerifySuspect)(nil)

// New returns a VERIFY_SUSPECT layer.
func New(cfg Config) *VerifySuspect {
	return &VerifySuspect{cfg: cfg, pending: map[stack.Address]*check{}, kick: make(chan struct{}, 1)}
}

// Name returns "VERIFY_SUSPECT".
func (v *VerifySuspect) Name() string { return "VERIFY_SUSPECT" }

// Init validates the config.
func (v *VerifySuspect) Init() error { return v.cfg.Validate() }

// Start starts the goroutine that sends requests and ends checks.
func (v *VerifySuspect) Start() error {
	v.mu.Lock()
	clear(v.pending)
	v.n.Store(0)
	v.mu.Unlock()
	v.Go(v.loop)
	return nil
}

func (v *VerifySuspect) loop(done <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next, ok := v.step(time.Now())
		if ok {
			t.Reset(time.Until(next))
		} else {
			t.Stop()
		}
		select {
		case <-done:
			return
		case <-v.kick:
		case <-t.C:
		}
	}
}

// step sends due requests and confirms expired suspicions; it returns when
// it next has work.
func (v *VerifySuspect) step(now time.Time) (time.Time, bool) {
	var ask, dead []stack.Address
	var next time.Time
	v.mu.Lock()
	for a, c := range v.pending {
		if !now.Before(c.deadline) {
			dead = append(dead, a)
			delete(v.pending, a)
			continue
		}
		if c.left > 0 && !now.Before(c.next) {
			ask = append(ask, a)
			c.left--
			c.next = now.Add(v.cfg.Timeout / time.Duration(v.cfg.NumMsgs))
		}
		due := c.deadline
		if c.left > 0 && c.next.Before(due) {
			due = c.next
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	v.n.Store(int32(len(v.pending)))
	v.mu.Unlock()
	for _, a := range ask {
		v.send(a, areYouDead)
	}
	if len(dead) > 0 {
		v.confirmed.Add(int64(len(dead)))
		v.Log().Info("suspicion confirmed: no sign of life", "members", dead, "timeout", v.cfg.Timeout)
		_, _ = v.PassUpEvent(stack.EvSuspect{Members: dead})
	}
	return next, !next.IsZero()
}

func (v *VerifySuspect) send(to stack.Address, typ uint8) {
	m := stack.NewMessage(to, nil).Set(stack.Internal | stack.OOB | stack.NoReliability | stack.DontBundle)
	m.PutHeader(v.ID(), &Header{Type: typ})
	if typ == areYouDead {
		v.requests.Add(1)
	} else {
		v.answers.Add(1)
	}
	_ = v.PassDown(v.Context(), m)
}

// alive clears a pending suspicion of a: it has shown a sign of life.
func (v *VerifySuspect) alive(a stack.Address) {
	if v.n.Load() == 0 {
		return
	}
	v.mu.Lock()
	_, ok := v.pending[a]
	delete(v.pending, a)
	v.n.Store(int32(len(v.pending)))
	v.mu.Unlock()
	if ok {
		v.cleared.Add(1)
		_, _ = v.PassUpEvent(stack.EvUnsuspect{Member: a})
	}
}

// Up answers are-you-dead requests; any message clears its sender.
func (v *VerifySuspect) Up(m *stack.Message) {
	v.alive(m.Src)
	if h, ok := m.Header(v.ID()).(*Header); ok {
		if h.Type == areYouDead {
			v.send(m.Src, iAmNotDead)
		}
		return
	}
	v.PassUp(m)
}

// PreservesBatches marks VERIFY_SUSPECT as a stack.BatchPreserver: its UpBatch only
// removes messages.
func (*VerifySuspect) PreservesBatches() {}

// UpBatch clears the batch's sender and handles its requests.
func (v *VerifySuspect) UpBatch(bt *stack.Batch) {
	v.alive(bt.Src)
	if !bt.MayHave(v.ID()) {
		v.PassUpBatch(bt)
		return
	}
	bt.Keep(func(m *stack.Message) bool {
		h, ok := m.Header(v.ID()).(*Header)
		if ok && h.Type == areYouDead {
			v.send(m.Src, iAmNotDead)
		}
		return !ok
	})
	if len(bt.Msgs) > 0 {
		v.PassUpBatch(bt)
	}
}

// UpEvent starts verifying suspects; an unsuspect from below clears them.
func (v *VerifySuspect) UpEvent(ev stack.Event) (stack.Answer, error) {
	switch e := ev.(type) {
	case stack.EvSuspect:
		as := e.Members
		v.suspect(as)
		return stack.Answer{}, nil
	case stack.EvUnsuspect:
		if a := e.Member; !a.IsZero() {
			v.alive(a)
		}
		return stack.Answer{}, nil
	}
	return v.PassUpEvent(ev)
}

func (v *VerifySuspect) suspect(as []stack.Address) {
	now := time.Now()
	self := v.LocalAddress()
	added := false
	vw := v.View()
	v.mu.Lock()
	for _, a := range as {
		if a == self || v.pending[a] != nil || (vw != nil && !vw.Contains(a)) {
			continue
		}
		v.pending[a] = &check{deadline: now.Add(v.cfg.Timeout), next: now, left: v.cfg.NumMsgs}
		added = true
	}
	v.n.Store(int32(len(v.pending)))
	v.mu.Unlock()
	if added {
		select {
		case v.kick <- struct{}{}:
		default:
		}
	}
}

// DownEvent forgets suspects that left the view.
func (v *VerifySuspect) DownEvent(ctx context.Context, ev stack.Event) (stack.Answer, error) {
	if vc, ok := ev.(stack.EvViewChange); ok {
		if nv := vc.View; nv != nil {
			v.mu.Lock()
			for a := range v.pending {
				if !nv.Contains(a) {
					delete(v.pending, a)
				}
			}
			v.n.Store(int32(len(v.pending)))
			v.mu.Unlock()
		}
	}
	return v.PassDownEvent(ctx, ev)
}

// Stats reports VERIFY_SUSPECT's counters.
func (v *VerifySuspect) Stats() []stack.Stat {
	return append(stack.CounterStats(v),
		stack.Stat{Name: "verifying", Value: int64(v.n.Load())},
	)
}
