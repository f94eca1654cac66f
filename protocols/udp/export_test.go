package udp

// WithoutOwnFilter makes u read its own multicasts back, as on a system
// where the socket filter cannot be attached (call before Connect).
func WithoutOwnFilter(u *UDP) *UDP {
	u.noOwnFilter = true
	return u
}
