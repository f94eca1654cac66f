package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/diag"
	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// TestProbeFindsTheMemberWhoseViewLags: A, B and C form a group over UDP
// on 127.0.0.1, each with its diagnostics on a free port; C's DISCARD
// drops everything GMS sends it, so when D joins, C keeps the old view.
// probe of A, B and C marks C's view LAGS, and only C's, in text and JSON.
func TestProbeFindsTheMemberWhoseViewLags(t *testing.T) {
	stacktest.CheckLeaks(t)
	vars := map[string]string{
		"STRATA_BIND_ADDR":  "127.0.0.1",
		"STRATA_BIND_PORT":  "0",
		"STRATA_MCAST_ADDR": fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254)),
		"STRATA_MCAST_PORT": strconv.Itoa(freeUDPPort(t)),
		"STRATA_IP_TTL":     "0",
	}
	var chs []*stack.Channel
	for _, name := range []string{"A", "B", "C", "D"} {
		ch, err := stack.New(stack.Shipped("udp.toml"), stack.WithVars(vars), stack.WithName(name), stack.WithDiag("127.0.0.1:0"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		chs = append(chs, ch)
	}
	a, b, c, d := chs[0], chs[1], chs[2], chs[3]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, ch := range chs[:3] {
		require.NoError(t, ch.Connect(ctx, "probe-test"))
	}
	stacktest.WaitForSameView(t, 30*time.Second, a, b, c)

	drop := discard.New(discard.DefaultConfig())
	drop.DropUpIf(func(m *stack.Message) bool { return m.Header(stack.IDGMS) != nil })
	require.NoError(t, stack.Of(c).InsertBelow(drop, "GMS"))
	// Taken out before the channels close (cleanups run last first), so
	// that C's leave is answered.
	t.Cleanup(func() { _, _ = stack.Of(c).Remove("DISCARD") })
	require.NoError(t, d.Connect(ctx, "probe-test"))
	stacktest.WaitFor(t, 30*time.Second, func() bool {
		v := a.View()
		return v.Size() == 4 && b.View().ID == v.ID && d.View().ID == v.ID
	}, "A, B and D see the view with D")
	stacktest.WaitFor(t, 30*time.Second, func() bool { return drop.Stats()[0].Value > 0 }, "C's DISCARD drops the view")
	require.Equal(t, 3, c.View().Size(), "C missed the view with D")

	endpoints := []string{a.DiagAddr().String(), b.DiagAddr().String(), c.DiagAddr().String()}
	code, out, errOut := runCmd(append([]string{"probe"}, endpoints...)...)
	require.Equal(t, exitOK, code, errOut)
	t.Log("\n" + out)
	var viewLine string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "view ") {
			viewLine = l
		}
	}
	require.Equal(t, 1, strings.Count(viewLine, "LAGS"), out)
	require.Regexp(t, `^view +\[A\|4\] \(4\) +\[A\|4\] \(4\) +\[A\|3\] \(3\) LAGS$`, viewLine)
	require.Contains(t, out, "DISCARD", "C's DISCARD counters differ from the others' (they have none)")

	code, out, errOut = runCmd(append([]string{"probe", "-json"}, endpoints...)...)
	require.Equal(t, exitOK, code, errOut)
	var r probeReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Len(t, r.Members, 3)
	for i, m := range r.Members {
		require.Empty(t, m.Error)
		require.Equal(t, i == 2, m.ViewLags, "%s", m.Snapshot.Member)
		require.Equal(t, []string{"A", "B", "C"}[i], m.Snapshot.Member)
	}
	require.Equal(t, a.View().ID.String(), r.Members[0].Snapshot.View.ID)
	require.Equal(t, c.View().ID.String(), r.Members[2].Snapshot.View.ID)

	// A member that does not answer is reported, and probe exits 1.
	require.NoError(t, b.Close())
	code, out, _ = runCmd("probe", "-timeout", "5s", endpoints[0], endpoints[1])
	require.Equal(t, exitFail, code)
	require.Contains(t, out, "DOWN")
	require.Contains(t, out, endpoints[1]+": ")
}

func TestProbeNeedsAnEndpoint(t *testing.T) {
	code, _, errOut := runCmd("probe")
	require.Equal(t, exitConfig, code)
	require.Contains(t, errOut, "give one or more diagnostics endpoints")
}

// TestCompareViews: only a member that missed a view of the same creator
// lags; of two views with different creators (a partition) the one fewer
// members hold differs, and with a tie both do.
func TestCompareViews(t *testing.T) {
	snap := func(creator string, seq uint64) probeMember {
		return probeMember{Snapshot: &diag.Snapshot{View: &diag.View{ID: fmt.Sprintf("[%s|%d]", creator, seq), Creator: creator, Seq: seq}}}
	}
	flags := func(ms ...probeMember) (out []string) {
		compareViews(ms)
		for _, m := range ms {
			switch {
			case m.ViewLags:
				out = append(out, "lags")
			case m.ViewDiffers:
				out = append(out, "differs")
			default:
				out = append(out, "")
			}
		}
		return out
	}
	require.Equal(t, []string{"", "", ""}, flags(snap("A", 3), snap("A", 3), snap("A", 3)))
	require.Equal(t, []string{"", "lags", ""}, flags(snap("A", 4), snap("A", 3), snap("A", 4)))
	require.Equal(t, []string{"", "", "differs"}, flags(snap("A", 4), snap("A", 4), snap("C", 1)))
	require.Equal(t, []string{"differs", "differs"}, flags(snap("A", 4), snap("C", 1)))
	require.Equal(t, []string{"", ""}, flags(snap("A", 4), probeMember{Error: "down"}))
}

// TestPerfServesDiagnostics: perf -diag gives each member an endpoint and
// says where.
func TestPerfServesDiagnostics(t *testing.T) {
	code, _, errOut := runCmd("perf", "-members", "2", "-count", "200", "-diag", "127.0.0.1:0")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `perf-0: diagnostics on http://127\.0\.0\.1:\d+/ \(stackdemo probe 127\.0\.0\.1:\d+\)`, errOut)
	require.Contains(t, errOut, "perf-1: diagnostics on")
	code, _, errOut = runCmd("perf", "-members", "2", "-count", "200", "-diag", "7900")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, `-diag "7900": want host:port`)
}
