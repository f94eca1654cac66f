package stack_test

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/stack"
)

type counted struct {
	a     atomic.Int64 `stat:"first"`
	skip  atomic.Int64
	other int
	b     atomic.Int64 `stat:"second"`
}

// TestCounterStats reads the tagged counters, in field order, and only
// them; a tag on a field that is not a counter is a programming error.
func TestCounterStats(t *testing.T) {
	var c counted
	c.a.Store(3)
	c.skip.Store(9)
	c.b.Add(-2)
	require.Equal(t, []stack.Stat{{Name: "first", Value: 3, Counter: true}, {Name: "second", Value: -2, Counter: true}}, stack.CounterStats(&c))
	c.a.Add(1)
	require.Equal(t, int64(4), stack.CounterStats(&c)[0].Value, "read at each call")

	require.Panics(t, func() { stack.CounterStats(c.other) })
	require.Panics(t, func() {
		stack.CounterStats(&struct {
			n int `stat:"n"`
		}{})
	})
}

// TestCounterStatsGaugeTag: a field tagged ",gauge" (a peak) is reported
// as a gauge, so that exporters do not present it as an ever-growing count.
func TestCounterStatsGaugeTag(t *testing.T) {
	var c struct {
		n    atomic.Int64 `stat:"n"`
		peak atomic.Int64 `stat:"peak,gauge"`
	}
	c.peak.Store(7)
	require.Equal(t, []stack.Stat{{Name: "n", Value: 0, Counter: true}, {Name: "peak", Value: 7}}, stack.CounterStats(&c))
	require.Panics(t, func() {
		stack.CounterStats(&struct {
			n atomic.Int64 `stat:"n,gauges"`
		}{})
	})
}
