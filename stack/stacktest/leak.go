package stacktest

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"
)

// CheckLeaks records the goroutines running now and, when t ends (after
// cleanups registered later, such as channel Close), fails t if goroutines
// started since are still running after a grace period. Call it first in a
// test that does not run under synctest (synctest checks this itself).
func CheckLeaks(t testing.TB) {
	t.Helper()
	before := goroutineIDs()
	t.Cleanup(func() {
		var leaked []string
		deadline := time.Now().Add(leakGrace)
		for {
			leaked = leaked[:0]
			for id, stack := range goroutineStacks() {
				if _, ok := before[id]; !ok && !ignorable(stack) {
					leaked = append(leaked, stack)
				}
			}
			if len(leaked) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(leaked) > 0 {
			t.Errorf("%d goroutines leaked:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
	})
}

// leakGrace is how long CheckLeaks lets goroutines finish exiting.
var leakGrace = 5 * time.Second

func ignorable(stack string) bool {
	for _, s := range []string{"testing.(*T).Run", "testing.tRunner", "runtime.goexit0", "testing.runFuzzing", "os/signal.signal_recv"} {
		if strings.Contains(stack, s) && !strings.Contains(stack, "strata") {
			return true
		}
	}
	return false
}

func goroutineIDs() map[string]struct{} {
	out := map[string]struct{}{}
	for id := range goroutineStacks() {
		out[id] = struct{}{}
	}
	return out
}

func goroutineStacks() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	self := ""
	for i, g := range bytes.Split(buf, []byte("\n\n")) {
		s := string(g)
		line, _, _ := strings.Cut(s, "\n")
		id := strings.Fields(line)
		if len(id) < 2 {
			continue
		}
		if i == 0 {
			self = id[1]
			continue
		}
		if id[1] != self {
			out[id[1]] = s
		}
	}
	return out
}
