package stack

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Rand is a stack's source of random choices: protocols draw their jitter,
// backoffs and picks from it (Base.Rand), and the channel draws its
// addresses from it. Seeded (WithSeed), a whole run over SIM in virtual
// time makes the same choices again, so a failing seed replays. It is safe
// for concurrent use.
type Rand struct {
	mu sync.Mutex
	r  *rand.Rand
}

// NewRand returns a Rand seeded with seed.
func NewRand(seed uint64) *Rand {
	return &Rand{r: rand.New(rand.NewPCG(seed, seed^0x5eed_57a7a))}
}

// newRandomRand returns a Rand seeded from the operating system.
func newRandomRand() *Rand {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return NewRand(binary.LittleEndian.Uint64(b[:]))
}

// Uint64 returns a random 64-bit value.
func (r *Rand) Uint64() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r.Uint64()
}

// IntN returns a random int in [0, n); n must be > 0.
func (r *Rand) IntN(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r.IntN(n)
}

// Duration returns a random duration in [0, d); 0 when d <= 0.
func (r *Rand) Duration(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Duration(r.r.Int64N(int64(d)))
}

// address returns a random (version 4) UUID address.
func (r *Rand) address() Address {
	var id uuid.UUID
	r.mu.Lock()
	binary.LittleEndian.PutUint64(id[:8], r.r.Uint64())
	binary.LittleEndian.PutUint64(id[8:], r.r.Uint64())
	r.mu.Unlock()
	id[6] = id[6]&0x0f | 0x40 // version 4
	id[8] = id[8]&0x3f | 0x80 // RFC 4122 variant
	return Address{id: id}
}
