package tcp

import "net/netip"

// DialPeer dials ap as a peer's writer does, and reports whether a
// connection to ap is in use afterwards.
func (t *TCP) DialPeer(ap netip.AddrPort) bool {
	t.mu.Lock()
	p := t.peerLocked(ap)
	t.mu.Unlock()
	return p != nil && t.dial(p) != nil
}

// ConnEnds returns the local and remote socket addresses of the connection
// in use to ap.
func (t *TCP) ConnEnds(ap netip.AddrPort) (local, remote string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[ap]
	if p == nil || p.conn == nil {
		return "", "", false
	}
	return p.conn.raw.LocalAddr().String(), p.conn.raw.RemoteAddr().String(), true
}

// ResetConnections closes every established connection's socket at once,
// as a network fault does; the peers' writers dial again.
func (t *TCP) ResetConnections() int {
	t.mu.Lock()
	var cs []*conn
	for _, p := range t.peers {
		if p.conn != nil {
			cs = append(cs, p.conn)
		}
	}
	t.mu.Unlock()
	for _, c := range cs {
		_ = c.raw.Close()
	}
	return len(cs)
}
