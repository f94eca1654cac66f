package stack

import (
	"context"
	"sync"
)

// Gate holds senders back while it is closed. Every blocking layer (FLUSH,
// flow control) waits on a Gate rather than on a lock of its own, so the rule
// that INTERNAL messages are never held back on the way down holds by
// construction: Wait lets them through at once.
type Gate struct {
	mu     sync.Mutex
	closed bool
	open   chan struct{} // closed when the gate opens; nil while open
}

// Close makes later Waits block (INTERNAL messages excepted).
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		g.open = make(chan struct{})
	}
}

// Open releases every waiting sender.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.open)
		g.open = nil
	}
}

// IsClosed reports whether the gate is closed.
func (g *Gate) IsClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Wait returns when the gate is open, at once for INTERNAL messages, or
// with ctx's error when ctx ends first.
func (g *Gate) Wait(ctx context.Context, m *Message) error {
	if m != nil && m.Flags&Internal != 0 {
		return nil
	}
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
