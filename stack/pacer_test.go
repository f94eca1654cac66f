package stack

import (
	"testing"
	"time"
)

// TestPacer: the first request for a new mark waits first, the next back
// off from there (2, 4, 8 times first) while the mark stays put; a new
// mark starts over.
func TestPacer(t *testing.T) {
	const first, interval = 10 * time.Millisecond, 100 * time.Millisecond
	t0 := time.Unix(0, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var p Pacer
	steps := []struct {
		now  time.Duration
		mark uint64
		want bool
	}{
		{0, 5, false},                     // a new gap: wait first
		{5 * time.Millisecond, 5, false},  // not yet
		{10 * time.Millisecond, 5, true},  // first request
		{25 * time.Millisecond, 5, false}, // backing off from first: 20ms
		{30 * time.Millisecond, 5, true},
		{60 * time.Millisecond, 5, false}, // 40ms
		{70 * time.Millisecond, 5, true},
		{150 * time.Millisecond, 5, true},  // 80ms
		{160 * time.Millisecond, 6, false}, // progress: a new mark waits first again
		{170 * time.Millisecond, 6, true},
	}
	for i, s := range steps {
		if got := p.Due(at(s.now), s.mark, first, interval); got != s.want {
			t.Fatalf("step %d (%v, mark %d): Due = %v, want %v", i, s.now, s.mark, got, s.want)
		}
	}
	var q Pacer
	if !q.Due(t0, 1, 0, interval) {
		t.Fatal("with first = 0 the first request goes at once")
	}
}

// TestPacerWaitIsBounded: while the mark stays put, the wait stops growing
// at 4 intervals, so a hole on a lossy link is asked for again
// within a few intervals however many requests were lost before.
func TestPacerWaitIsBounded(t *testing.T) {
	const first, interval = 10 * time.Millisecond, 100 * time.Millisecond
	t0 := time.Unix(0, 0)
	var p Pacer
	var last, longest time.Duration
	for now := time.Duration(0); now <= time.Minute; now += time.Millisecond {
		if p.Due(t0.Add(now), 7, first, interval) {
			longest = max(longest, now-last)
			last = now
		}
	}
	if longest != 4*interval {
		t.Fatalf("longest wait between requests %v, want 4 intervals (%v)", longest, 4*interval)
	}
}
