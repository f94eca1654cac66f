package stacktest

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// CheckLeaks records the goroutines running now and, when t ends (after
// cleanups registered later, such as channel Close), fails t if goroutines
// started since are still running after a grace period (go.uber.org/goleak
// does the looking). Call it first in a test that does not run under
// synctest (synctest checks this itself).
func CheckLeaks(t testing.TB) {
	t.Helper()
	opts := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("os/signal.signal_recv")}
	t.Cleanup(func() {
		// goleak looks again for about half a second; a loaded machine
		// may need longer to let exiting goroutines go.
		deadline := time.Now().Add(leakGrace)
		for {
			err := goleak.Find(opts...)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("goroutines leaked: %v", err)
				return
			}
		}
	})
}

// leakGrace is how long CheckLeaks lets goroutines finish exiting.
var leakGrace = 5 * time.Second
