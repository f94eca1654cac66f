package stacktest

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Main runs a package's tests with a watchdog for frozen synctest bubbles
// (call it from TestMain). A bubble's virtual time moves only when every
// goroutine in it is durably blocked; one goroutine blocked on a mutex (or
// a channel from outside the bubble) stops it for good, and the test then
// hangs until go test's timeout, whose dump of every goroutine is too long
// to read the culprit off a CI log's tail. The watchdog looks every
// FrozenCheck; a bubble none of whose goroutines has run for FrozenAfter
// is reported with the stacks that hold it (those not durably blocked)
// printed last, and the run fails.
func Main(m *testing.M) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchFrozen(stop, os.Stderr, func() { os.Exit(3) })
	}()
	code := m.Run()
	close(stop)
	<-done
	os.Exit(code)
}

// FrozenCheck and FrozenAfter set Main's watchdog: how often it looks, and
// how long a bubble may go without any goroutine in it running.
var (
	FrozenCheck = 30 * time.Second
	FrozenAfter = 4 * time.Minute
)

func watchFrozen(stop <-chan struct{}, w io.Writer, fail func()) {
	t := time.NewTicker(FrozenCheck)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if report := frozenReport(allStacks(), FrozenAfter); report != "" {
			fmt.Fprint(w, report)
			fail()
			return
		}
	}
}

func allStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// goroutineHeader matches a goroutine's first line in a stack dump, with
// or without GOTRACEBACK=system's gp= and m= fields.
var goroutineHeader = regexp.MustCompile(`^goroutine (\d+)(?: [^\[]*)? \[(.*)\]:$`)

type dumpedGoroutine struct {
	state   string // "select (durable)", "sync.Mutex.Lock", "running", ...
	waited  time.Duration
	bubble  int // 0: outside any bubble
	text    string
	durable bool
}

func parseDump(dump []byte) []dumpedGoroutine {
	var out []dumpedGoroutine
	for block := range bytes.SplitSeq(dump, []byte("\n\n")) {
		text := strings.TrimSpace(string(block))
		first, _, _ := strings.Cut(text, "\n")
		h := goroutineHeader.FindStringSubmatch(first)
		if h == nil {
			continue
		}
		g := dumpedGoroutine{text: text}
		for i, f := range strings.Split(h[2], ", ") {
			switch {
			case i == 0:
				g.state = f
				g.durable = strings.Contains(f, "(durable)")
			case strings.HasSuffix(f, " minutes"):
				n, _ := strconv.Atoi(strings.TrimSuffix(f, " minutes"))
				g.waited = time.Duration(n) * time.Minute
			case strings.HasPrefix(f, "synctest bubble "):
				g.bubble, _ = strconv.Atoi(strings.TrimPrefix(f, "synctest bubble "))
			}
		}
		out = append(out, g)
	}
	return out
}

// frozenReport returns the report of the bubbles in dump whose goroutines
// have all waited at least after, or "" when there are none. The runtime
// gives waits in whole minutes, from one minute on.
func frozenReport(dump []byte, after time.Duration) string {
	by := map[int][]dumpedGoroutine{}
	for _, g := range parseDump(dump) {
		if g.bubble != 0 {
			by[g.bubble] = append(by[g.bubble], g)
		}
	}
	var frozen []int
	for b, gs := range by {
		if !slices.ContainsFunc(gs, func(g dumpedGoroutine) bool { return g.waited < after }) {
			frozen = append(frozen, b)
		}
	}
	if len(frozen) == 0 {
		return ""
	}
	slices.Sort(frozen)
	var sb strings.Builder
	sb.WriteString("\n=== FROZEN SYNCTEST BUBBLE (stacktest.Main's watchdog)\n")
	for _, b := range frozen {
		gs := by[b]
		fmt.Fprintf(&sb, "bubble %d: %d goroutines, none has run for %s; virtual time stopped because these are not durably blocked:\n\n", b, len(gs), after)
		holders := 0
		for _, g := range gs {
			if !g.durable {
				sb.WriteString(g.text + "\n\n")
				holders++
			}
		}
		if holders == 0 {
			sb.WriteString("(every goroutine is durably blocked: the runtime should have declared a deadlock)\n\n")
		}
		for _, g := range gs {
			if strings.HasPrefix(g.state, "synctest.Run") || strings.Contains(g.text, "testing/synctest.Test") {
				fmt.Fprintf(&sb, "bubble %d's test:\n%s\n\n", b, g.text)
				break
			}
		}
	}
	fmt.Fprintf(&sb, "=== FROZEN: bubbles %v did not move for %s; the stacks above hold them\n", frozen, after)
	return sb.String()
}
