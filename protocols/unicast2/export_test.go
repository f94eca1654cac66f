package unicast2

// DisableFixForTest makes the layer behave like JGroups' UNICAST2 (no
// tombstones, no timestamps, no STABLE on close), to show the tests fail.
func (u *UNICAST2) DisableFixForTest() { u.fixOff = true }

// TypeStable is a STABLE's header type, for tests that drop STABLEs.
const TypeStable = typeStable
