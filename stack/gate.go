package stack

import (
	"context"
	"sync"
	"sync/atomic"
)

// Gate holds senders back while it is closed. Every blocking layer (FLUSH,
// flow control) waits on a Gate rather than on a lock of its own, so the rule
// that INTERNAL messages are never held back on the way down holds by
// construction: Wait lets them through at once.
//
// Wait and IsClosed are one atomic load each (they run on every multicast);
// Close and Open are serialised by mu.
type Gate struct {
	mu   sync.Mutex
	open atomic.Pointer[chan struct{}] // closed when the gate opens; nil while open
}

// Close makes later Waits block (INTERNAL messages excepted).
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open.Load() == nil {
		ch := make(chan struct{})
		g.open.Store(&ch)
	}
}

// Open releases every waiting sender.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p := g.open.Load(); p != nil {
		g.open.Store(nil)
		close(*p)
	}
}

// IsClosed reports whether the gate is closed.
func (g *Gate) IsClosed() bool { return g.open.Load() != nil }

// Wait returns when the gate is open, at once for INTERNAL messages, or
// with ctx's error when ctx ends first.
func (g *Gate) Wait(ctx context.Context, m *Message) error {
	if m != nil && m.Flags&Internal != 0 {
		return nil
	}
	p := g.open.Load()
	if p == nil {
		return nil
	}
	select {
	case <-*p:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
