package stable

// SetMaxEntriesForTest sets the entries per STABLE message and returns a
// function that restores it.
func SetMaxEntriesForTest(n int) (restore func()) {
	old := maxEntries
	maxEntries = n
	return func() { maxEntries = old }
}
