package tcp_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/internal/testing/grouptest"
	_ "github.com/strata-go/strata/protocols/all"
	"github.com/strata-go/strata/protocols/tcp"
	"github.com/strata-go/strata/stack"
	"github.com/strata-go/strata/stack/stacktest"
)

// wait bounds the waits on real sockets. It is generous: CI runs these
// tests beside the chaos suite on two cores, and TLS handshakes under that
// load once took longer than 20 s (a local .ci/run in session 15).
const wait = time.Minute

// testConfig listens on 127.0.0.1 on a free port, so tests run in parallel
// and beside other programs.
func testConfig() tcp.Config {
	cfg := tcp.DefaultConfig()
	cfg.BindAddr = "127.0.0.1"
	cfg.BindPort = 0
	return cfg
}

type member struct {
	ch  *stack.Channel
	tcp *tcp.TCP
	col *stacktest.Collector
}

// startMembers connects n channels on TCP (with above's layers) to
// cluster, tells each the others' addresses (as discovery will) and
// installs one view of all of them.
func startMembers(t testing.TB, n int, cluster string, cfg tcp.Config, above func() []stack.Protocol) []*member {
	t.Helper()
	var ms []*member
	for i := range n {
		ms = append(ms, startMember(t, fmt.Sprintf("%s-%c", cluster, 'A'+i), cluster, cfg, above))
	}
	introduce(t, ms)
	addrs := make([]stack.Address, n)
	chs := make([]*stack.Channel, n)
	for i, m := range ms {
		addrs[i], chs[i] = m.ch.Address(), m.ch
	}
	stacktest.InjectView(t, stack.NewView(addrs[0], 2, addrs...), chs...)
	return ms
}

func startMember(t testing.TB, name, cluster string, cfg tcp.Config, above func() []stack.Protocol) *member {
	t.Helper()
	tp := tcp.New(cfg)
	protos := []stack.Protocol{tp}
	if above != nil {
		protos = append(protos, above()...)
	}
	col := stacktest.NewCollector()
	ch, err := stack.New(stack.FromProtocols(protos...), stack.WithName(name), stack.WithReceiver(col))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	require.NoError(t, ch.Connect(context.Background(), cluster))
	return &member{ch: ch, tcp: tp, col: col}
}

func introduce(t testing.TB, ms []*member) {
	t.Helper()
	for _, a := range ms {
		for _, b := range ms {
			if a != b {
				teach(t, a, b.ch.Address(), b.tcp.PhysicalAddress())
			}
		}
	}
}

func teach(t testing.TB, m *member, a stack.Address, ap netip.AddrPort) {
	t.Helper()
	err := stack.Of(m.ch).DownEvent(context.Background(), stack.EvAddPhysicalAddress{Logical: a, Physical: ap})
	require.NoError(t, err)
}

// freeTCPPort returns a port free on 127.0.0.1 now.
func freeTCPPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// configFS is a shipped config with edits (old → new) applied, for tests
// that need, say, a faster failure detector than the shipped one.
func configFS(t testing.TB, file string, edits ...string) fstest.MapFS {
	t.Helper()
	data, err := os.ReadFile("../../configs/" + file)
	require.NoError(t, err)
	s := string(data)
	for i := 0; i+1 < len(edits); i += 2 {
		require.Contains(t, s, edits[i])
		s = strings.Replace(s, edits[i], edits[i+1], 1)
	}
	return fstest.MapFS{file: &fstest.MapFile{Data: []byte(s)}}
}

// fastFailureDetection makes tcp.toml exclude a dead member within seconds.
var fastFailureDetection = []string{
	"type = \"FD_ALL\"\ninterval = \"8s\"\ntimeout = \"40s\"", "type = \"FD_ALL\"\ninterval = \"300ms\"\ntimeout = \"2s\"",
	"type = \"VERIFY_SUSPECT\"\ntimeout = \"1.5s\"", "type = \"VERIFY_SUSPECT\"\ntimeout = \"500ms\"",
}

// startFromConfig starts one member on a config in fsys with vars; its log
// is printed if the test fails.
func startFromConfig(t *testing.T, fsys fstest.MapFS, file, name string, vars map[string]string) (*stack.Channel, *stacktest.Collector) {
	t.Helper()
	col := stacktest.NewCollector()
	log := &grouptest.SyncBuffer{}
	logger := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ch, err := stack.New(stack.FromFS(fsys, file), stack.WithVars(vars), stack.WithName(name), stack.WithReceiver(col), stack.WithLogger(logger))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of %s (%s):\n%s", name, ch.Address(), log.String())
		}
	})
	return ch, col
}

func transportOf(ch *stack.Channel) *tcp.TCP { return stack.Of(ch).Protocols()[0].(*tcp.TCP) }
