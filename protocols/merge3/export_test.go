package merge3

// HeardForTest returns how many announcements m keeps for its next check.
func (m *Merge3) HeardForTest() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.heard)
}
