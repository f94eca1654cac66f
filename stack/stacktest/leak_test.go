package stacktest

import (
	"fmt"
	"testing"
	"time"
)

// fakeTB records what CheckLeaks reports instead of failing the real test.
type fakeTB struct {
	testing.TB
	cleanups []func()
	errors   []string
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Errorf(format string, a ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, a...))
}

func (f *fakeTB) finish() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func TestCheckLeaksReportsALeftoverGoroutine(t *testing.T) {
	defer func(g time.Duration) { leakGrace = g }(leakGrace)
	leakGrace = 50 * time.Millisecond
	stop := make(chan struct{})
	defer close(stop)
	f := &fakeTB{TB: t}
	CheckLeaks(f)
	go func() { <-stop }()
	f.finish()
	if len(f.errors) != 1 {
		t.Fatalf("want one leak report, got %q", f.errors)
	}
}

func TestCheckLeaksPassesWhenGoroutinesExit(t *testing.T) {
	f := &fakeTB{TB: t}
	CheckLeaks(f)
	done := make(chan struct{})
	go func() { close(done) }()
	<-done
	f.finish()
	if len(f.errors) != 0 {
		t.Fatalf("unexpected leak report: %q", f.errors)
	}
}
