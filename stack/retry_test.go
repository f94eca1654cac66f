package stack_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

// TestRetry walks a schedule of a resend every 2 s for at most 5 s: due
// times, a resend at each, one resend for a late look that skipped a
// period, and expiry at the limit.
func TestRetry(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	r := stack.NewRetry(t0, 2*time.Second, 5*time.Second)
	require.Equal(t, at(2), r.Due())
	for _, step := range []struct {
		now             float64
		resend, expired bool
		due             float64
	}{
		{1.9, false, false, 2},
		{2, true, false, 4},
		{3, false, false, 4},
		{4.5, true, false, 5}, // the limit comes before the next resend
		{5, false, true, 5},
	} {
		resend, expired := r.At(at(step.now))
		require.Equal(t, step.resend, resend, "resend at %v s", step.now)
		require.Equal(t, step.expired, expired, "expired at %v s", step.now)
		require.Equal(t, at(step.due), r.Due(), "due after %v s", step.now)
	}
	late := stack.NewRetry(t0, time.Second, time.Minute)
	resend, _ := late.At(at(3.5))
	require.True(t, resend, "one resend for periods missed")
	require.Equal(t, at(4), late.Due())
}
