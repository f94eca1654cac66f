package stacktest

import (
	"sync"
	"sync/atomic"

	"github.com/strata-go/strata/stack"
)

// Keeper is a receiver for tests of receive-buffer reuse: it checks every
// payload with Intact as it arrives and keeps every seventh message, as a
// layer or an application may keep what it received, so that the test can
// check the kept payloads again at the end.
type Keeper struct {
	Intact func(payload []byte) bool
	Got    atomic.Int64 // messages received
	Bad    atomic.Int64 // payloads that were not intact on arrival

	mu   sync.Mutex
	kept []*stack.Message
}

// Receive checks and perhaps keeps m.
func (k *Keeper) Receive(m *stack.Message) {
	if !k.Intact(m.Payload) {
		k.Bad.Add(1)
	}
	if k.Got.Add(1)%7 == 0 {
		k.mu.Lock()
		k.kept = append(k.kept, m)
		k.mu.Unlock()
	}
}

// ViewAccepted does nothing.
func (k *Keeper) ViewAccepted(*stack.View) {}

// Kept returns the messages kept so far.
func (k *Keeper) Kept() []*stack.Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*stack.Message(nil), k.kept...)
}
