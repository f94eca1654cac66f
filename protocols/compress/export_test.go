package compress

// DecodeForTest runs the receive-side decoder on a header and payload.
func DecodeForTest(c *Compress, h *Header, p []byte) ([]byte, error) { return c.decode(h, p) }
