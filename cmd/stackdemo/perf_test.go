package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPerfDefaultRunsWithoutLoss runs perf as the README's main job does
// (the embedded default stack, UDP on 127.0.0.1), smaller, and reads its
// JSON.
func TestPerfDefaultRunsWithoutLoss(t *testing.T) {
	for _, mode := range []string{"multicast", "unicast", "rpc"} {
		t.Run(mode, func(t *testing.T) {
			code, out, errOut := runCmd("perf", "-members", "3", "-mode", mode, "-count", "2000", "-json")
			require.Equal(t, 0, code, errOut)
			var r perfResult
			require.NoError(t, json.Unmarshal([]byte(out), &r), out)
			require.Empty(t, r.Errors)
			require.Equal(t, 3, r.Members)
			switch mode {
			case "multicast":
				// Each of 3 members gets every member's 2000, its own included.
				require.EqualValues(t, 3*3*2000, r.TotalMsgs)
				require.Contains(t, r.Stats, "MFC.blocked_time_ns", "flow control's waits are reported")
			case "unicast":
				require.EqualValues(t, 3*2000, r.TotalMsgs)
			case "rpc":
				require.NotNil(t, r.Latency)
				require.Positive(t, r.Latency.P50)
				require.LessOrEqual(t, r.Latency.P50, r.Latency.Max)
			}
		})
	}
}

// TestPerfAllocEachAndSlabDeliverTheSame: a payload per make and payloads
// carved from a stack.Slab (the default) both arrive whole and in order;
// the JSON says which was used.
func TestPerfAllocEachAndSlabDeliverTheSame(t *testing.T) {
	for _, alloc := range []string{"each", "slab"} {
		code, out, errOut := runCmd("perf", "-members", "2", "-alloc", alloc, "-count", "3000", "-json")
		require.Equal(t, 0, code, errOut)
		var r perfResult
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		require.Empty(t, r.Errors)
		require.Equal(t, alloc, r.Alloc)
		require.EqualValues(t, 2*2*3000, r.TotalMsgs)
	}
}

func TestPerfAnycastNeedsGroupFCAndRunsWithIt(t *testing.T) {
	code, _, errOut := runCmd("perf", "-members", "3", "-mode", "anycast", "-count", "100")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "no GROUPFC layer in the stack")
	code, out, errOut := runCmd("perf", "-config", filepath.Join("..", "..", "configs", "groupfc.toml"), "-members", "3", "-mode", "anycast", "-count", "1000")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no loss")
	require.Contains(t, out, "GROUPFC.blocked_ms", "GROUPFC's waits are reported")
}

// TestPerfFailsLoudlyOnLoss: a stack without reliability under 30% loss
// must make perf exit 1 and say what was lost.
func TestPerfFailsLoudlyOnLoss(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lossy.toml")
	require.NoError(t, os.WriteFile(p, []byte("[[protocol]]\ntype = \"SIM\"\nnetwork = \"${STRATA_SIM_NETWORK:x}\"\n[[protocol]]\ntype = \"DISCARD\"\nup = 0.3\n"), 0o644))
	code, _, errOut := runCmd("perf", "-config", p, "-members", "2", "-count", "200", "-timeout", "2s")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "FAILED")
}

func TestPerfRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-members", "1"}, {"-mode", "gossip"}, {"-size", "3"}, {"-count", "0"}, {"-alloc", "pool"}} {
		code, _, errOut := runCmd(append([]string{"perf"}, args...)...)
		require.Equal(t, exitConfig, code, "%v: %s", args, errOut)
	}
}

// TestPerfJoinAcrossProcesses: three stackdemo perf -join processes on the
// default stack form one group, the first starts the run, and each reports
// every message of the others, with no loss; the warm-up round before it
// is not counted.
func TestPerfJoinAcrossProcesses(t *testing.T) {
	for _, mode := range []string{"multicast", "unicast"} {
		t.Run(mode, func(t *testing.T) {
			env := append(os.Environ(), "STACKDEMO_AS_MAIN=1",
				"STRATA_BIND_PORT="+strconv.Itoa(freeUDPPort(t)),
				fmt.Sprintf("STRATA_MCAST_ADDR=239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254)),
				"STRATA_MCAST_PORT="+strconv.Itoa(freeUDPPort(t)))
			var cmds []*exec.Cmd
			var outs []*bytes.Buffer
			for i := range 3 {
				cmd := exec.Command(os.Args[0], "perf", "-join", "-members", "3", "-mode", mode, "-count", "3000", "-warmup", "500", "-json",
					"-cluster", "perf-join-"+mode, "-name", fmt.Sprint("p", i), "-timeout", "2m")
				cmd.Env = env
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, os.Stderr
				require.NoError(t, cmd.Start())
				cmds, outs = append(cmds, cmd), append(outs, &out)
			}
			seen := map[int]bool{}
			for i, cmd := range cmds {
				require.NoError(t, cmd.Wait(), "process %d", i)
				var r perfResult
				require.NoError(t, json.Unmarshal(outs[i].Bytes(), &r), outs[i].String())
				require.Empty(t, r.Errors)
				require.Len(t, r.PerMember, 1)
				want := int64(2 * 3000)
				if mode == "unicast" {
					want = 3000
				}
				require.Equal(t, want, r.TotalMsgs, "process %d received everything meant for it", i)
				require.Equal(t, 500, r.Warmup)
				// A member process reports the same counters as a run in one
				// process: flow control's waits and the transport's calls.
				require.Contains(t, r.Stats, "MFC.blocked_time_ns")
				require.Positive(t, r.Stats["UDP.datagrams_sent"], "process %d", i)
				require.Positive(t, r.CPUSeconds, "process %d reports its own CPU time", i)
				seen[r.PerMember[0].Member] = true
			}
			require.Len(t, seen, 3, "each process was a different member")
		})
	}
}

// TestPerfRpcOnEveryShippedConfig: -mode rpc (package rpc's Call) works on
// every shipped stack, GROUPFC's (requests and answers through its
// windows) and secure.toml's (ENCRYPT and AUTH) included.
func TestPerfRpcOnEveryShippedConfig(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "configs", "*.toml"))
	require.NoError(t, err)
	require.Len(t, files, 9)
	setTLSFiles(t)
	t.Setenv("STRATA_ENCRYPT_KEY", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
	t.Setenv("STRATA_AUTH_SECRET", "rpc-test-secret-of-32-bytes-long")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if filepath.Base(f) == "kubernetes.toml" {
				t.Skip("DNS_PING needs a DNS server naming the members (protocols/ping's DNS tests start one); this test asks no DNS server")
			}
			code, out, errOut := runCmd("perf", "-config", f, "-members", "3", "-mode", "rpc", "-size", "64", "-count", "300", "-json", "-timeout", "2m")
			require.Equal(t, 0, code, errOut)
			var r perfResult
			require.NoError(t, json.Unmarshal([]byte(out), &r), out)
			require.Empty(t, r.Errors)
			require.NotNil(t, r.Latency)
			require.Positive(t, r.CallsPerS)
			require.Zero(t, r.Stats["RPC.late_responses"], "each call got its one answer")
		})
	}
}

// TestPerfMemberCountsAgreeWithTheVerdict: in a multicast run every
// member's printed count is every member's messages, its own included,
// when perf says nothing was lost (perf read the counts while a member's
// own looped-back messages were still arriving: 78112 of 80,000, and "no
// loss"). Several runs, since the lag depends on scheduling.
func TestPerfMemberCountsAgreeWithTheVerdict(t *testing.T) {
	for range 3 {
		code, out, errOut := runCmd("perf", "-members", "3", "-count", "5000", "-json")
		require.Equal(t, 0, code, errOut)
		var r perfResult
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		require.Empty(t, r.Errors)
		for _, m := range r.PerMember {
			require.EqualValues(t, 3*5000, m.Msgs, "member %d's count", m.Member)
		}
	}
}

// TestPerfRpcPrintsCallsPerSecond: -mode rpc's text output gives calls per
// second, not a count of messages that rpc does not count.
func TestPerfRpcPrintsCallsPerSecond(t *testing.T) {
	code, out, errOut := runCmd("perf", "-members", "2", "-mode", "rpc", "-size", "64", "-count", "200")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `rpc: [1-9][0-9]* calls/s`, out)
	require.Contains(t, out, "latency µs: p50")
	require.NotContains(t, out, "msgs received")
	require.Contains(t, out, "× 200 calls of 64 bytes")
}

// TestPerfWarmupIsNotCounted: -warmup N sends an uncounted first round of N
// messages (calls) per sender; the measured round counts -count, in every
// mode, and a negative -warmup is refused.
func TestPerfWarmupIsNotCounted(t *testing.T) {
	for _, mode := range []string{"multicast", "unicast", "rpc"} {
		t.Run(mode, func(t *testing.T) {
			code, out, errOut := runCmd("perf", "-members", "3", "-mode", mode, "-count", "1000", "-warmup", "700", "-size", "64", "-json")
			require.Equal(t, 0, code, errOut)
			var r perfResult
			require.NoError(t, json.Unmarshal([]byte(out), &r), out)
			require.Empty(t, r.Errors)
			require.Equal(t, 700, r.Warmup)
			switch mode {
			case "multicast":
				require.EqualValues(t, 3*3*1000, r.TotalMsgs)
			case "unicast":
				require.EqualValues(t, 3*1000, r.TotalMsgs)
			case "rpc":
				require.Positive(t, r.CallsPerS)
			}
		})
	}
	code, _, _ := runCmd("perf", "-warmup", "-1")
	require.Equal(t, exitConfig, code)
	code, out, errOut := runCmd("perf", "-members", "2", "-count", "100", "-warmup", "50")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "(after a warm-up of 50)")
}

// TestPerfWritesProfiles: -cpuprofile, -memprofile and -mutexprofile each
// write a pprof file of its kind (gzipped, its sample types named in it),
// and -trace an execution trace.
func TestPerfWritesProfiles(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"-cpuprofile": "cpu", "-memprofile": "alloc_space", "-mutexprofile": "contentions"}
	args := []string{"perf", "-members", "2", "-count", "2000"}
	for flag := range files {
		args = append(args, flag, filepath.Join(dir, flag[1:]))
	}
	args = append(args, "-trace", filepath.Join(dir, "trace"))
	code, _, errOut := runCmd(args...)
	require.Equal(t, 0, code, errOut)
	// -trace: an execution trace (its header names the Go version).
	tr, err := os.ReadFile(filepath.Join(dir, "trace"))
	require.NoError(t, err, "-trace")
	require.Regexp(t, `^go 1\.[0-9]+ trace\x00`, string(tr[:min(len(tr), 16)]))
	for flag, sampleType := range files {
		f, err := os.Open(filepath.Join(dir, flag[1:]))
		require.NoError(t, err, flag)
		zr, err := gzip.NewReader(f)
		require.NoError(t, err, flag)
		b, err := io.ReadAll(zr)
		require.NoError(t, err, flag)
		require.NoError(t, f.Close())
		require.Contains(t, string(b), sampleType, "%s writes a profile with sample type %s", flag, sampleType)
	}
}

// TestPerfReportsItsCPUAndTheHostsShare: a run says what CPU time it cost
// per message sent and, on Linux, how much of the machine the host took, so
// that figures from a shared machine carry their context.
func TestPerfReportsItsCPUAndTheHostsShare(t *testing.T) {
	code, out, errOut := runCmd("perf", "-members", "2", "-count", "3000", "-json")
	require.Equal(t, 0, code, errOut)
	var r perfResult
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.Positive(t, r.CPUSeconds)
	require.InDelta(t, r.CPUSeconds*1e6/(2*3000), r.CPUMicrosPerMsg, 0.01*r.CPUMicrosPerMsg+0.01, "per message sent: 2 senders × 3000")
	if _, err := os.Stat("/proc/stat"); err == nil {
		require.NotNil(t, r.StealShare)
		require.True(t, *r.StealShare >= 0 && *r.StealShare <= 1, "a share: %v", *r.StealShare)
	}
	code, out, errOut = runCmd("perf", "-members", "2", "-count", "500")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `cpu: [0-9.]+s in this process, [0-9.]+ µs per message sent`, out)
}

// TestPerfReportsTheCollector: a run says how many collections its round
// took, what CPU they cost and under which GOGC and GOMEMLIMIT, so that a
// figure carries the setting it was made under.
func TestPerfReportsTheCollector(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(1))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(768 << 20))
	code, out, errOut := runCmd("perf", "-members", "2", "-count", "3000", "-json")
	require.Equal(t, 0, code, errOut)
	var r perfResult
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.Equal(t, "1", r.GC.GOGC)
	require.Equal(t, int64(768<<20), r.GC.Limit)
	// GOGC=1 collects each time the heap grows by 1%: a round that makes
	// 6000 messages of 1000 bytes takes many collections.
	require.Greater(t, r.GC.Cycles, uint64(1))
	require.Positive(t, r.GC.CPUSeconds)
	require.True(t, r.GC.CPUShare > 0 && r.GC.CPUShare <= 1, "a share: %v", r.GC.CPUShare)

	// With the collector off, the round has no cycles, whatever the
	// process had before it.
	runtime.GC()
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(math.MaxInt64)
	code, out, errOut = runCmd("perf", "-members", "2", "-count", "500")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `gc: 0 cycles, 0\.00s of CPU \(0%\); GOGC=off\n`, out, "the round's cycles only; no limit, none printed")
}
