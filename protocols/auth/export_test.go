package auth

// Reject returns a REJECT header, for tests that forge one.
func Reject() *Header { return &Header{Type: typeReject} }

// IsChallenge reports whether h is a CHALLENGE.
func IsChallenge(h *Header) bool { return h.Type == typeChallenge }
