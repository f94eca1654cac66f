package stack

import (
	"sync"

	"github.com/google/uuid"
)

// AddressSize is the encoded length of an Address on the wire.
const AddressSize = 16

// Address identifies one member of a group: a random UUID, fresh for every
// channel. The zero Address means "none" (as a destination: the whole group).
// Addresses are comparable values and can be map keys.
type Address struct {
	id uuid.UUID
}

// NewAddress returns a new random address.
func NewAddress() Address { return Address{id: uuid.New()} }

// NewNamedAddress returns a new random address and records name as its
// logical name.
func NewNamedAddress(name string) Address {
	a := NewAddress()
	SetLogicalName(a, name)
	return a
}

// AddressFromUUID wraps an existing UUID, for decoders and tests.
func AddressFromUUID(id uuid.UUID) Address { return Address{id: id} }

// UUID returns the address's UUID.
func (a Address) UUID() uuid.UUID { return a.id }

// IsZero reports whether a is the zero (no) address.
func (a Address) IsZero() bool { return a.id == uuid.Nil }

// Compare orders addresses by their UUID bytes; it is the order used to pick
// coordinators of merged groups.
func (a Address) Compare(b Address) int {
	for i := range a.id {
		if a.id[i] != b.id[i] {
			if a.id[i] < b.id[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// String returns the logical name if one is known, else the UUID.
func (a Address) String() string {
	if a.IsZero() {
		return "<none>"
	}
	if n, ok := LogicalName(a); ok {
		return n
	}
	return a.id.String()
}

// AppendBinary appends the 16 bytes of the address.
func (a Address) AppendBinary(b []byte) ([]byte, error) { return append(b, a.id[:]...), nil }

// names is the process-wide logical name cache, filled by channels and by
// discovery (JGroups' NameCache).
var names sync.Map // Address -> string

// SetLogicalName records the human-readable name of an address.
func SetLogicalName(a Address, name string) {
	if name == "" {
		names.Delete(a)
		return
	}
	names.Store(a, name)
}

// LogicalName returns the recorded name of a, if any.
func LogicalName(a Address) (string, bool) {
	v, ok := names.Load(a)
	if !ok {
		return "", false
	}
	return v.(string), true
}

// ForgetLogicalName removes a's name from the cache (when a member is gone).
func ForgetLogicalName(a Address) { names.Delete(a) }
