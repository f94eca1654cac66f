package diag_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/diag"
	_ "github.com/strata-go/strata/protocols/all"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// udpVars binds a shipped UDP config to 127.0.0.1 on free ports, with a
// multicast group of the test's own and ip_ttl 0, so tests run in parallel
// and beside other programs.
func udpVars(t testing.TB) map[string]string {
	return map[string]string{
		"STRATA_BIND_ADDR":  "127.0.0.1",
		"STRATA_BIND_PORT":  "0",
		"STRATA_MCAST_ADDR": fmt.Sprintf("239.%d.%d.%d", 1+rand.IntN(250), rand.IntN(256), 1+rand.IntN(254)),
		"STRATA_MCAST_PORT": strconv.Itoa(freeUDPPort(t)),
		"STRATA_IP_TTL":     "0",
	}
}

func freeUDPPort(t testing.TB) int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// group starts n members of config on loopback, A with its diagnostics on a
// free port, waits until they share a view, and has each multicast one
// message that all receive.
func group(t *testing.T, config string, n int) []*stack.Channel {
	vars := udpVars(t)
	var chs []*stack.Channel
	var cols []*stacktest.Collector
	for i := range n {
		col := stacktest.NewCollector()
		cols = append(cols, col)
		opts := []stack.Option{stack.Shipped(config), stack.WithVars(vars), stack.WithName(string(rune('A' + i))), stack.WithReceiver(col)}
		if i == 0 {
			opts = append(opts, stack.WithDiag("127.0.0.1:0"))
		}
		ch, err := stack.New(opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		require.NoError(t, ch.Connect(ctx, "diag-test"))
		cancel()
		chs = append(chs, ch)
	}
	stacktest.WaitForSameView(t, 30*time.Second, chs...)
	for _, ch := range chs {
		require.NoError(t, ch.SendTo(context.Background(), stack.Address{}, []byte("hello")))
	}
	for i, col := range cols {
		stacktest.WaitFor(t, 30*time.Second, func() bool { return col.Len() == n }, "member %d gets every hello", i)
	}
	return chs
}

func get(t *testing.T, addr net.Addr, path string) []byte {
	t.Helper()
	rsp, err := http.Get("http://" + addr.String() + path)
	require.NoError(t, err)
	defer rsp.Body.Close()
	require.Equal(t, http.StatusOK, rsp.StatusCode, path)
	var b strings.Builder
	_, err = bufio.NewReader(rsp.Body).WriteTo(&b)
	require.NoError(t, err)
	return []byte(b.String())
}

// TestMetricsHaveEveryStatOnceWithLabels scrapes /metrics of a member of a
// full stack and parses it with Prometheus' text parser: every stat of
// Channel.Stats() is there exactly once, named strata_<protocol>_<stat>
// (with _total and type counter for counters, type gauge otherwise),
// labelled with the cluster and the member; a counter's value lies between
// the values read just before and just after the scrape.
func TestMetricsHaveEveryStatOnceWithLabels(t *testing.T) {
	for _, config := range []string{"udp.toml", "secure.toml", "flush.toml"} {
		t.Run(config, func(t *testing.T) {
			stacktest.CheckLeaks(t)
			if config == "secure.toml" { // ENCRYPT and AUTH read their key and secret from the environment
				t.Setenv("STRATA_ENCRYPT_KEY", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
				t.Setenv("STRATA_AUTH_SECRET", "diag-test-secret-of-32-bytes-lng")
			}
			chs := group(t, config, 2)
			a := chs[0]
			before := a.Stats()
			body := get(t, a.DiagAddr(), "/metrics")
			after := a.Stats()
			parser := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
			require.NoError(t, err)

			n := 0
			for i, ps := range before {
				for j, s := range ps.Stats {
					name := diag.MetricName(ps.Protocol, s)
					fam, ok := fams[name]
					require.True(t, ok, "%s.%s has no metric %s", ps.Protocol, s.Name, name)
					require.Len(t, fam.Metric, 1, name)
					want := dto.MetricType_GAUGE
					if s.Counter {
						want = dto.MetricType_COUNTER
					}
					require.Equal(t, want, fam.GetType(), name)
					labels := map[string]string{}
					for _, l := range fam.Metric[0].Label {
						labels[l.GetName()] = l.GetValue()
					}
					require.Equal(t, map[string]string{"cluster": "diag-test", "member": "A"}, labels, name)
					if s.Counter {
						v := int64(fam.Metric[0].GetCounter().GetValue())
						require.GreaterOrEqual(t, v, s.Value, name)
						require.LessOrEqual(t, v, after[i].Stats[j].Value, name)
					}
					n++
				}
			}
			require.Greater(t, n, 100)
			for name, want := range map[string]float64{"strata_view_size": 2, "strata_coordinator": 1, "strata_view_id": float64(a.View().ID.Seq)} {
				require.Contains(t, fams, name)
				require.Equal(t, want, fams[name].Metric[0].GetGauge().GetValue(), name)
			}
			for _, name := range []string{"strata_sent_messages_total", "strata_received_messages_total", "strata_sent_bytes_total", "strata_received_bytes_total"} {
				require.Contains(t, fams, name)
				require.Positive(t, fams[name].Metric[0].GetCounter().GetValue(), name)
			}
			if config == "udp.toml" {
				require.Contains(t, fams, "strata_blocked_seconds_total")
				require.Len(t, fams["strata_blocked_seconds_total"].Metric, 2, "MFC and UFC")
			}
			require.Contains(t, fams, "go_goroutines", "the Go runtime's metrics too")
		})
	}
}

// TestSnapshotHasTheViewAndEveryProtocol reads /debug/strata: the view as
// the member has it, every member with its physical address, and every
// layer, bottom first, with its config values and counters.
func TestSnapshotHasTheViewAndEveryProtocol(t *testing.T) {
	stacktest.CheckLeaks(t)
	chs := group(t, "udp.toml", 3)
	a := chs[0]
	var s diag.Snapshot
	require.NoError(t, json.Unmarshal(get(t, a.DiagAddr(), "/debug/strata"), &s))
	v := a.View()
	require.Equal(t, "diag-test", s.Cluster)
	require.Equal(t, "A", s.Member)
	require.True(t, s.Connected)
	require.True(t, s.Coordinator)
	require.NotNil(t, s.View)
	require.Equal(t, v.ID.String(), s.View.ID)
	require.Equal(t, 3, s.View.Size)
	require.Equal(t, []string{"A", "B", "C"}, s.View.Members)
	require.Len(t, s.Members, 3)
	for i, m := range s.Members {
		require.Equal(t, v.Members[i].UUID().String(), m.UUID)
		require.True(t, strings.HasPrefix(m.Physical, "127.0.0.1:"), "%s's physical address: %q", m.Name, m.Physical)
	}
	require.Equal(t, s.Members[0].Physical, s.Physical)

	var names []string
	for _, p := range stack.Of(a).Protocols() {
		names = append(names, p.Name())
	}
	var got []string
	for _, p := range s.Protocols {
		got = append(got, p.Name)
		require.NotEmpty(t, p.Config, p.Name)
		require.NotEmpty(t, p.Stats, p.Name)
	}
	require.Equal(t, names, got)
	require.Equal(t, `"127.0.0.1"`, s.Protocols[0].Config["bind_addr"])
	require.Equal(t, `"2s"`, s.Protocols[len(names)-4].Config["view_ack_timeout"], "GMS, as udp.toml sets it")
	require.Contains(t, s.Protocols[0].Counters, "msgs_sent")

	fetched, err := diag.Fetch(context.Background(), http.DefaultClient, a.DiagAddr().String())
	require.NoError(t, err)
	require.Equal(t, s.View, fetched.View)
	require.Contains(t, string(get(t, a.DiagAddr(), "/debug/pprof/")), "goroutine")
}

// listeners counts the TCP sockets this process listens on.
func listeners(t *testing.T) int {
	t.Helper()
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(data), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) > 9 && fs[3] == "0A" { // LISTEN
				inodes[fs[9]] = true
			}
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && strings.HasPrefix(target, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] {
			n++
		}
	}
	return n
}

// TestNoListenerWithoutDiagAddr: a channel whose diag_addr is empty (the
// default) opens no listening socket; one with diag_addr opens one, only
// where told, and Close closes it and its goroutines.
func TestNoListenerWithoutDiagAddr(t *testing.T) {
	stacktest.CheckLeaks(t)
	base := listeners(t)
	ch, err := stack.New(stack.Shipped("udp.toml"), stack.WithVars(udpVars(t)), stack.WithName("A"))
	require.NoError(t, err)
	require.NoError(t, ch.Connect(context.Background(), "diag-off"))
	require.Nil(t, ch.DiagAddr())
	require.Equal(t, base, listeners(t), "no listener without diag_addr")
	require.NoError(t, ch.Close())

	src := "diag_addr = \"127.0.0.1:0\"\n[[protocol]]\ntype = \"SIM\"\nnetwork = \"diag-on\"\n"
	sc, err := stack.ParseConfig("on.toml", []byte(src))
	require.NoError(t, err)
	ch, err = stack.New(stack.FromConfig(sc), stack.WithName("B"))
	require.NoError(t, err)
	require.Equal(t, base+1, listeners(t))
	addr := ch.DiagAddr().(*net.TCPAddr)
	require.Equal(t, "127.0.0.1", addr.IP.String(), "binds only where told")
	require.Contains(t, string(get(t, addr, "/")), "/debug/strata")
	require.NoError(t, ch.Close())
	require.Equal(t, base, listeners(t), "Close closes it")
	_, err = http.Get("http://" + addr.String() + "/metrics")
	require.Error(t, err)

	ch, err = stack.New(stack.FromConfig(sc), stack.WithDiag(""))
	require.NoError(t, err)
	require.Nil(t, ch.DiagAddr(), "WithDiag(\"\") overrides the config's diag_addr")
	require.NoError(t, ch.Close())
}

// TestCloseEndsAProfileInProgress: a 30-second CPU profile being served
// does not hold up Close, and leaves no goroutine behind.
func TestCloseEndsAProfileInProgress(t *testing.T) {
	stacktest.CheckLeaks(t)
	ch, err := stack.New(stack.Shipped("sim.toml"), stack.WithVars(map[string]string{"STRATA_SIM_NETWORK": "diag-profile"}), stack.WithDiag("127.0.0.1:0"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	done := make(chan error, 1)
	go func() {
		rsp, err := http.Get("http://" + ch.DiagAddr().String() + "/debug/pprof/profile?seconds=30")
		if err == nil {
			rsp.Body.Close()
		}
		done <- err
	}()
	// Wait until the profile runs (its handler's goroutine shows in a dump).
	stacktest.WaitFor(t, 10*time.Second, func() bool {
		return strings.Contains(string(get(t, ch.DiagAddr(), "/debug/pprof/goroutine?debug=2")), "net/http/pprof.Profile(")
	}, "the profile runs")
	start := time.Now()
	require.NoError(t, ch.Close())
	require.Less(t, time.Since(start), 10*time.Second)
	<-done
}
