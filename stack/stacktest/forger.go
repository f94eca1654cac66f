package stacktest

import (
	"sync"

	"github.com/strata-go/strata/stack"
)

// Forger is a test layer that tampers with one received message: the first
// one Forge returns true for (Forge rewrites it in place, say its header),
// on the way up. Put it below the layer under test to feed that layer a
// forged message among real traffic.
type Forger struct {
	stack.Base
	Forge func(*stack.Message) bool

	mu   sync.Mutex
	done bool
}

// Name returns "FORGER".
func (f *Forger) Name() string { return "FORGER" }

func (f *Forger) forge(m *stack.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.done && f.Forge(m) {
		f.done = true
	}
}

// Up forges m if it is the one, and passes it up.
func (f *Forger) Up(m *stack.Message) {
	f.forge(m)
	f.PassUp(m)
}

// UpBatch forges the one message of b, if there, and passes b up.
func (f *Forger) UpBatch(b *stack.Batch) {
	for _, m := range b.Msgs {
		f.forge(m)
	}
	f.PassUpBatch(b)
}
