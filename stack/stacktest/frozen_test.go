package stacktest

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// A dump in go test's timeout format: bubble 7 is frozen (every goroutine
// has waited 5 minutes, one of them on a mutex), bubble 8 is not (one of
// its goroutines waited less than a minute, which the runtime leaves out).
const sampleDump = `goroutine 1 [chan receive, 12 minutes]:
testing.(*T).Run(0xc0001b2fc8, {0xc0046f1879, 0x7}, 0xc0046f1880)

goroutine 40 [synctest.Run (durable), 5 minutes, synctest bubble 7]:
testing/synctest.Test(0xc000102a80, 0xc00001e0f0)
github.com/strata-go/strata/protocols/all_test.TestChaosColdStart.func1.1(0xc000102a80)

goroutine 41 [select (durable), 5 minutes, synctest bubble 7]:
github.com/strata-go/strata/stack.(*lanes).worker(0xc00355d540)

goroutine 42 [sync.Mutex.Lock, 5 minutes, synctest bubble 7]:
sync.(*Mutex).Lock(...)
github.com/strata-go/strata/protocols/gms.(*GMS).handle(0xc0001)

goroutine 50 gp=0xc000190d20 m=nil [select (durable), 6 minutes, synctest bubble 8]:
github.com/strata-go/strata/stack.(*lanes).worker(0xc00355d541)

goroutine 51 gp=0xc000190d21 m=nil [sync.Mutex.Lock, synctest bubble 8]:
github.com/strata-go/strata/protocols/nakack.(*NAKACK).up(0xc0002)
`

func TestFrozenReportNamesTheBubbleAndWhatHoldsIt(t *testing.T) {
	report := frozenReport([]byte(sampleDump), 4*time.Minute)
	require.Contains(t, report, "bubble 7: 3 goroutines")
	require.Contains(t, report, "gms.(*GMS).handle", "the mutex-blocked goroutine's stack")
	require.NotContains(t, report, "lanes).worker", "durably blocked goroutines are left out")
	require.Contains(t, report, "TestChaosColdStart.func1.1", "the bubble's test")
	require.NotContains(t, report, "bubble 8", "a bubble with a goroutine that ran within the limit")
	lines := strings.Split(strings.TrimSpace(report), "\n")
	require.Equal(t, "=== FROZEN: bubbles [7] did not move for 4m0s; the stacks above hold them", lines[len(lines)-1])

	require.Empty(t, frozenReport([]byte(sampleDump), 6*time.Minute), "bubble 7 has waited only 5 minutes")
}

// freezeBubble starts a bubble that a goroutine blocked on a mutex from
// outside it freezes (virtual time stops while another sleeps), and returns
// once the runtime's dump shows that goroutine at the lock, with the dump
// and release, which lets the bubble finish and waits for it.
func freezeBubble(t *testing.T) (dump []dumpedGoroutine, locker dumpedGoroutine, release func()) {
	var mu sync.Mutex
	var got atomic.Bool
	mu.Lock()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		synctest.Test(t, func(t *testing.T) {
			go lockOnce(&mu, &got)
			time.Sleep(time.Second)
		})
	}()
	for {
		dump = parseDump(allStacks())
		for _, g := range dump {
			if g.bubble != 0 && strings.Contains(g.text, "stacktest.lockOnce(") && g.state == "sync.Mutex.Lock" {
				return dump, g, func() {
					mu.Unlock()
					<-finished
					require.True(t, got.Load())
				}
			}
		}
		time.Sleep(time.Millisecond) // real time, outside the bubble: the goroutine is on its way to the lock
	}
}

func lockOnce(mu *sync.Mutex, got *atomic.Bool) {
	mu.Lock() // not a durable block: the bubble's virtual time stops
	got.Store(true)
	mu.Unlock()
}

// The runtime's dump, as the watchdog reads it, shows the goroutine at the
// mutex not durably blocked and the sleeper durably, in one bubble.
func TestParseDumpSeesALiveFrozenBubble(t *testing.T) {
	dump, locker, release := freezeBubble(t)
	defer release()
	require.False(t, locker.durable, "a mutex wait: %s", locker.text)
	sleeper := false
	for _, g := range dump {
		if g.bubble == locker.bubble && g.state == "sleep (durable)" {
			sleeper = g.durable
		}
	}
	require.True(t, sleeper, "the sleeping goroutine, durably blocked in the same bubble")
}

func TestWatchFrozenFailsOnAFrozenBubble(t *testing.T) {
	_, _, release := freezeBubble(t)
	defer release()
	defer func(c, a time.Duration) { FrozenCheck, FrozenAfter = c, a }(FrozenCheck, FrozenAfter)
	FrozenCheck, FrozenAfter = time.Millisecond, 0 // every goroutine has waited long enough
	var out strings.Builder
	failed := false
	watchFrozen(make(chan struct{}), &out, func() { failed = true })
	require.True(t, failed)
	require.Contains(t, out.String(), "stacktest.lockOnce(")
	require.Contains(t, out.String(), "=== FROZEN: bubbles")
}
