package flush

// SetRegularStopForTest makes STOP_FLUSH a regular message (no INTERNAL,
// no OOB), as JGroups' FLUSH sent it, to show what the internal lane fixes.
func (f *FLUSH) SetRegularStopForTest(on bool) {
	f.mu.Lock()
	f.regularStop = on
	f.mu.Unlock()
}
