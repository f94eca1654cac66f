package stack

// slabBytes is the size of the blocks a Slab carves payloads from, and
// slabMaxPayload the largest payload it carves (a larger one is made on
// its own: it would waste most of a block's tail).
const (
	slabBytes      = 64 << 10
	slabMaxPayload = slabBytes / 8
)

// A Slab makes payloads and messages for a goroutine that sends many small
// ones: it carves them from blocks (64 KB of bytes, 64 messages) instead of
// allocating each, which in Go costs about as much as the stack's whole
// send path for a 1 KB message once the collector's sweeping is counted.
// A block stays in memory while anything carved from it is referenced, so
// a Slab suits messages that are sent and let go, not ones an application
// keeps. The zero value is ready; not safe for concurrent use (one per
// goroutine).
type Slab struct {
	bytes []byte
	msgs  []Message
}

// Bytes returns a zeroed slice of n bytes whose capacity is n, so that an
// append to it never writes into the next one.
func (s *Slab) Bytes(n int) []byte {
	if n > slabMaxPayload {
		return make([]byte, n)
	}
	if len(s.bytes) < n {
		s.bytes = make([]byte, slabBytes)
	}
	b := s.bytes[:n:n]
	s.bytes = s.bytes[n:]
	return b
}

// NewMessage is like the package's NewMessage, with the message carved
// from the slab.
func (s *Slab) NewMessage(dest Address, payload []byte) *Message {
	if len(s.msgs) == 0 {
		s.msgs = make([]Message, msgSlab)
	}
	m := &s.msgs[0]
	s.msgs = s.msgs[1:]
	m.Dest, m.Payload = dest, payload
	return m
}
