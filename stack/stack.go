package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Stack is an ordered list of protocols, bottom (the transport) first, with
// a top layer that hands messages and events to the channel. Layers can be
// inserted and removed at runtime (tests place fault injectors that way).
type Stack struct {
	mu       sync.Mutex
	protos   []Protocol // bottom first
	top      *topLayer
	state    stackState
	local    atomic.Pointer[Address]
	cluster  atomic.Pointer[string]
	log      *slog.Logger
	lanes    *lanes
	rand     atomic.Pointer[Rand]
	maxDgram atomic.Int64 // the transport's largest datagram (0: no bound)
}

type stackState int

const (
	stateBuilt stackState = iota
	stateInited
	stateStarted
	stateStopped
	stateClosed
)

// NewStack links protos, bottom first. The bottom protocol must be the only
// transport (a protocol embedding TransportBase).
func NewStack(protos ...Protocol) (*Stack, error) {
	if err := checkOrder(protos); err != nil {
		return nil, err
	}
	s := &Stack{protos: slices.Clone(protos), log: discardLogger}
	s.rand.Store(newRandomRand())
	s.top = &topLayer{}
	s.top.self = s.top
	s.top.st = s
	for _, p := range s.protos {
		s.adopt(p)
	}
	s.relink()
	t := s.protos[0].(Transport).transportBase()
	s.lanes = newLanes(t.PassUpBatch)
	return s, nil
}

func checkOrder(protos []Protocol) error {
	if len(protos) == 0 {
		return errors.New("stack: no protocols (a stack needs a transport at the bottom)")
	}
	seen := map[Protocol]bool{}
	var transports []string
	for i, p := range protos {
		if p == nil {
			return fmt.Errorf("stack: protocol %d is nil", i)
		}
		if seen[p] {
			return fmt.Errorf("stack: protocol %s appears twice", p.Name())
		}
		seen[p] = true
		if _, ok := p.(Transport); ok {
			transports = append(transports, fmt.Sprintf("%s (position %d)", p.Name(), i+1))
		}
	}
	switch {
	case len(transports) == 0:
		return fmt.Errorf("stack: no transport: the first (bottom) protocol must be a transport such as UDP or SIM, got %s", protos[0].Name())
	case len(transports) > 1:
		return fmt.Errorf("stack: %d transports: %s; a stack has exactly one, at the bottom", len(transports), strings.Join(transports, ", "))
	}
	if _, ok := protos[0].(Transport); !ok {
		return fmt.Errorf("stack: transport %s must be the first (bottom) protocol", transports[0])
	}
	return nil
}

func (s *Stack) adopt(p Protocol) {
	b := p.base()
	b.self = p
	_, bp := p.(BatchPreserver)
	_, tr := p.(Transport)
	b.preserves = bp || tr
	b.st = s
	if t, ok := LookupProtocol(p.Name()); ok {
		b.id = t.ID
	}
	b.log = s.log.With("protocol", p.Name())
}

// relink rewires every layer's neighbours; callers hold s.mu or own s.
func (s *Stack) relink() {
	for i, p := range s.protos {
		b := p.base()
		if i == 0 {
			b.down.Store(nil)
		} else {
			b.down.Store(&link{s.protos[i-1]})
		}
		if i == len(s.protos)-1 {
			b.up.Store(&link{s.top})
		} else {
			b.up.Store(&link{s.protos[i+1]})
		}
	}
	s.top.down.Store(&link{s.protos[len(s.protos)-1]})
}

// SetLogger sets the logger the stack and its layers use (default: discard).
func (s *Stack) SetLogger(l *slog.Logger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l == nil {
		l = discardLogger
	}
	s.log = l
	for _, p := range s.protos {
		p.base().log = l.With("protocol", p.Name())
	}
}

// Logger returns the stack's logger.
func (s *Stack) Logger() *slog.Logger { return s.log }

// LocalAddress returns the address of the member this stack belongs to.
func (s *Stack) LocalAddress() Address {
	if a := s.local.Load(); a != nil {
		return *a
	}
	return Address{}
}

// SetLocalAddress sets the member's address; the channel does this before
// each start.
func (s *Stack) SetLocalAddress(a Address) { s.local.Store(&a) }

// Rand returns the stack's source of random choices.
func (s *Stack) Rand() *Rand { return s.rand.Load() }

// SetSeed makes the stack's random choices (and the channel's addresses)
// follow seed, so a run can be replayed.
func (s *Stack) SetSeed(seed uint64) { s.rand.Store(NewRand(seed)) }

// Cluster returns the cluster name set by Connect.
func (s *Stack) Cluster() string {
	if c := s.cluster.Load(); c != nil {
		return *c
	}
	return ""
}

// SetCluster records the cluster name; the channel does this on Connect.
func (s *Stack) SetCluster(name string) { s.cluster.Store(&name) }

// Protocols returns the layers, bottom first.
func (s *Stack) Protocols() []Protocol {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.protos)
}

// Transport returns the bottom layer.
func (s *Stack) Transport() Transport {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.protos[0].(Transport)
}

// Find returns the lowest layer named name, or nil.
func (s *Stack) Find(name string) Protocol {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.index(name); i >= 0 {
		return s.protos[i]
	}
	return nil
}

// Find returns the lowest layer of s whose type is T.
func Find[T Protocol](s *Stack) (T, bool) {
	for _, p := range s.Protocols() {
		if t, ok := p.(T); ok {
			return t, true
		}
	}
	var zero T
	return zero, false
}

func (s *Stack) index(name string) int {
	return slices.IndexFunc(s.protos, func(p Protocol) bool { return p.Name() == name })
}

// InsertAbove places p directly above the layer named neighbour.
func (s *Stack) InsertAbove(p Protocol, neighbour string) error { return s.insert(p, neighbour, 1) }

// InsertBelow places p directly below the layer named neighbour (never below
// the transport).
func (s *Stack) InsertBelow(p Protocol, neighbour string) error { return s.insert(p, neighbour, 0) }

func (s *Stack) insert(p Protocol, neighbour string, offset int) error {
	if _, ok := p.(Transport); ok {
		return fmt.Errorf("stack: cannot insert transport %s into a stack", p.Name())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == stateClosed {
		return ErrClosed
	}
	i := s.index(neighbour)
	if i < 0 {
		return fmt.Errorf("stack: no protocol %s", neighbour)
	}
	if slices.Contains(s.protos, p) {
		return fmt.Errorf("stack: protocol %s is already in the stack", p.Name())
	}
	pos := i + offset
	if pos == 0 {
		return fmt.Errorf("stack: cannot insert %s below the transport", p.Name())
	}
	s.adopt(p)
	if s.state >= stateInited {
		if err := p.Init(); err != nil {
			return fmt.Errorf("stack: init %s: %w", p.Name(), err)
		}
	}
	if s.state == stateStarted {
		p.base().beginStart()
		if err := p.Start(); err != nil {
			return fmt.Errorf("stack: start %s: %w", p.Name(), err)
		}
	}
	// Link p before publishing it, so traffic reaching p finds its neighbours.
	b := p.base()
	b.down.Store(&link{s.protos[pos-1]})
	if pos < len(s.protos) {
		b.up.Store(&link{s.protos[pos]})
	} else {
		b.up.Store(&link{s.top})
	}
	s.protos = slices.Insert(s.protos, pos, p)
	s.relink()
	return nil
}

// Remove takes the lowest layer named name out of the stack, stopping and
// closing it if the stack was running. The transport cannot be removed.
func (s *Stack) Remove(name string) (Protocol, error) {
	s.mu.Lock()
	i := s.index(name)
	if i < 0 {
		s.mu.Unlock()
		return nil, fmt.Errorf("stack: no protocol %s", name)
	}
	if i == 0 {
		s.mu.Unlock()
		return nil, fmt.Errorf("stack: cannot remove the transport %s", name)
	}
	p := s.protos[i]
	s.protos = slices.Delete(s.protos, i, i+1)
	s.relink()
	state := s.state
	s.mu.Unlock()
	if state == stateStarted {
		stopLayer(p)
	}
	if state >= stateInited && state < stateClosed {
		return p, p.Close()
	}
	return p, nil
}

// Init initialises every layer, bottom first.
func (s *Stack) Init() error {
	s.mu.Lock()
	if s.state != stateBuilt {
		s.mu.Unlock()
		return fmt.Errorf("stack: Init called twice")
	}
	protos := slices.Clone(s.protos)
	s.mu.Unlock()
	for i, p := range protos {
		if err := p.Init(); err != nil {
			for j := i - 1; j >= 0; j-- {
				_ = protos[j].Close()
			}
			return fmt.Errorf("init %s: %w", p.Name(), err)
		}
	}
	s.mu.Lock()
	s.state = stateInited
	s.mu.Unlock()
	return nil
}

// Start starts every layer, bottom first. If one fails, those already
// started are stopped again.
func (s *Stack) Start() error {
	s.mu.Lock()
	if s.state != stateInited && s.state != stateStopped {
		s.mu.Unlock()
		return fmt.Errorf("stack: Start in state %d", s.state)
	}
	protos := slices.Clone(s.protos)
	s.mu.Unlock()
	for i, p := range protos {
		p.base().beginStart()
		if err := p.Start(); err != nil {
			for j := i; j >= 0; j-- {
				stopLayer(protos[j])
			}
			s.lanes.wait()
			return fmt.Errorf("start %s: %w", p.Name(), err)
		}
	}
	s.mu.Lock()
	s.state = stateStarted
	s.mu.Unlock()
	return nil
}

func stopLayer(p Protocol) {
	b := p.base()
	b.beginStop()
	p.Stop()
	b.waitGoroutines()
}

// Stop stops every layer, top first, waiting for each layer's goroutines and
// then for every delivery goroutine.
func (s *Stack) Stop() {
	s.mu.Lock()
	if s.state != stateStarted {
		s.mu.Unlock()
		return
	}
	protos := slices.Clone(s.protos)
	s.state = stateStopped
	s.mu.Unlock()
	for i := len(protos) - 1; i >= 0; i-- {
		stopLayer(protos[i])
	}
	s.lanes.wait()
}

// Close stops the stack if needed and closes every layer, top first.
func (s *Stack) Close() error {
	s.Stop()
	s.lanes.wait() // deliveries of a stack that never started (tests feed transports directly)
	s.mu.Lock()
	if s.state == stateClosed {
		s.mu.Unlock()
		return nil
	}
	inited := s.state >= stateInited
	s.state = stateClosed
	protos := slices.Clone(s.protos)
	s.mu.Unlock()
	if !inited {
		return nil
	}
	var errs []error
	for i := len(protos) - 1; i >= 0; i-- {
		if err := protos[i].Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", protos[i].Name(), err))
		}
	}
	return errors.Join(errs...)
}

// Down sends m from the top of the stack.
func (s *Stack) Down(ctx context.Context, m *Message) error { return s.top.PassDown(ctx, m) }

// DownEvent sends ev from the top of the stack; ask a query with Ask.
func (s *Stack) DownEvent(ctx context.Context, ev Event) error {
	_, err := s.top.PassDownEvent(ctx, ev)
	return err
}

// Stats returns every layer's counters, bottom first.
func (s *Stack) Stats() []ProtocolStats {
	var out []ProtocolStats
	for _, p := range s.Protocols() {
		if r, ok := p.(StatsReporter); ok {
			out = append(out, ProtocolStats{Protocol: p.Name(), Stats: r.Stats()})
		}
	}
	return out
}

// ProtocolStats are the counters of one layer.
type ProtocolStats struct {
	Protocol string
	Stats    []Stat
}

// topLayer sits above the highest protocol and hands traffic to the
// channel (or drops it when there is none).
type topLayer struct {
	Base
	ch *Channel
}

func (t *topLayer) Name() string { return "TOP" }

func (t *topLayer) Up(m *Message) {
	if c := t.ch; c != nil {
		c.receive(m)
	}
}

func (t *topLayer) UpBatch(bt *Batch) {
	if c := t.ch; c != nil {
		c.receiveBatch(bt)
	}
}

func (t *topLayer) UpEvent(ev Event) (Answer, error) {
	if c := t.ch; c != nil {
		return Answer{}, c.upEvent(ev)
	}
	return Answer{}, nil
}
