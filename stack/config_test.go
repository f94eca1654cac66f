package stack_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/protocols/delay"
	"github.com/strata-go/strata/protocols/discard"
	"github.com/strata-go/strata/protocols/sim"
	"github.com/strata-go/strata/stack"
)

func TestParseConfigAcceptsAStackAndKeepsOrder(t *testing.T) {
	src := `# a test stack
[[protocol]]
type = "SIM"
network = "n1"

[[protocol]]
type = "DELAY"
up = "5ms"
jitter = "1ms"

[[protocol]]
type = "DISCARD"
down = 0.25
`
	sc, err := stack.ParseConfig("t.toml", []byte(src))
	require.NoError(t, err)
	require.Len(t, sc.Protocols, 3)
	require.Equal(t, "SIM", sc.Protocols[0].Type.Name)
	require.Equal(t, 2, sc.Protocols[0].Line)
	require.Equal(t, 4, sc.Protocols[0].Keys["network"])
	require.Equal(t, "n1", sc.Protocols[0].Config.(*sim.Config).Network)
	d := sc.Protocols[1].Config.(*delay.Config)
	require.Equal(t, 5*time.Millisecond, d.Up)
	require.Equal(t, time.Millisecond, d.Jitter)
	require.Equal(t, 0.25, sc.Protocols[2].Config.(*discard.Config).Down)
	require.Equal(t, []stack.Setting{{Key: "up", Value: `"5ms"`}, {Key: "jitter", Value: `"1ms"`}}, sc.Protocols[1].Changed())

	protos, err := sc.Build()
	require.NoError(t, err)
	require.Equal(t, "DISCARD", protos[2].Name())
}

func TestParseConfigEnvironmentSubstitution(t *testing.T) {
	t.Setenv("STRATA_TEST_NET", "from-env")
	src := "[[protocol]]\ntype = \"SIM\"\nnetwork = \"${STRATA_TEST_NET:dflt}\"\nqueue_len = ${STRATA_TEST_UNSET_QLEN:77}\n"
	sc, err := stack.ParseConfig("env.toml", []byte(src))
	require.NoError(t, err)
	cfg := sc.Protocols[0].Config.(*sim.Config)
	require.Equal(t, "from-env", cfg.Network)
	require.Equal(t, 77, cfg.QueueLen)

	_, err = stack.ParseConfig("bad.toml", []byte("[[protocol]]\ntype = \"SIM\"\nnetwork = \"${STRATA_TEST_SURELY_UNSET}\"\n"))
	requireConfigError(t, err, 3, "", "", "STRATA_TEST_SURELY_UNSET is not set")

	// A comment is left alone, after a key as on its own line; a # inside
	// a string does not start one.
	sc, err = stack.ParseConfig("comment.toml", []byte("[[protocol]]\ntype = \"SIM\" # ${STRATA_TEST_SURELY_UNSET} or ${broken\nnetwork = \"a#${STRATA_TEST_NET}\" # ${STRATA_TEST_SURELY_UNSET}\n"))
	require.NoError(t, err)
	require.Equal(t, "a#from-env", sc.Protocols[0].Config.(*sim.Config).Network)

	_, err = stack.ParseConfig("bad.toml", []byte("[[protocol]]\ntype = \"SIM\"\nnetwork = \"${STRATA_TEST_NET:x\"\n"))
	requireConfigError(t, err, 3, "", "", "malformed variable reference")
}

func TestParseConfigErrorsNameFileLineProtocolKey(t *testing.T) {
	cases := []struct {
		name, src      string
		line           int
		proto, key, in string
	}{
		{"unknown protocol", "[[protocol]]\ntype = \"SIM\"\n\n[[protocol]]\ntype = \"DISCRAD\"\n",
			5, "protocol #2", "type", `unknown protocol "DISCRAD"; did you mean "DISCARD"?`},
		{"unknown key", "[[protocol]]\ntype = \"SIM\"\nnetwrok = \"x\"\n",
			3, "SIM", "netwrok", `unknown key; did you mean "network"?`},
		{"unknown key in second table is not hidden by the first", "[[protocol]]\ntype = \"SIM\"\nnetwork = \"x\"\n[[protocol]]\ntype = \"DELAY\"\nnetwork = \"x\"\n",
			6, "DELAY", "network", "unknown key"},
		{"wrong type", "[[protocol]]\ntype = \"SIM\"\nqueue_len = \"many\"\n",
			3, "SIM", "queue_len", `want an integer, got string "many"`},
		{"integer duration", "[[protocol]]\ntype = \"SIM\"\n[[protocol]]\ntype = \"DELAY\"\nup = 5\n",
			5, "DELAY", "up", `want a duration string with a unit`},
		{"bad duration", "[[protocol]]\ntype = \"SIM\"\n[[protocol]]\ntype = \"DELAY\"\nup = \"5 parsecs\"\n",
			5, "DELAY", "up", `invalid duration "5 parsecs"`},
		{"negative duration", "[[protocol]]\ntype = \"SIM\"\n[[protocol]]\ntype = \"DELAY\"\n\ndown = \"-1s\"\n",
			6, "DELAY", "down", "must not be negative"},
		{"zero queue", "[[protocol]]\ntype = \"SIM\"\nqueue_len = 0\n",
			3, "SIM", "queue_len", "must be > 0"},
		{"rate out of range", "[[protocol]]\ntype = \"SIM\"\n[[protocol]]\ntype = \"DISCARD\"\nup = 1.5\n",
			5, "DISCARD", "up", "between 0 and 1"},
		{"no transport", "[[protocol]]\ntype = \"DISCARD\"\n",
			1, "DISCARD", "", "no transport in the stack"},
		{"two transports", "[[protocol]]\ntype = \"SIM\"\n[[protocol]]\ntype = \"DELAY\"\n[[protocol]]\ntype = \"SIM\"\n",
			5, "SIM", "", "second transport (the first is SIM on line 1)"},
		{"transport not at bottom", "[[protocol]]\ntype = \"DELAY\"\n[[protocol]]\ntype = \"SIM\"\n",
			3, "SIM", "", "must be the first [[protocol]]"},
		{"missing type", "[[protocol]]\nnetwork = \"x\"\n",
			1, "protocol #1", "type", "missing"},
		{"syntax error", "[[protocol]]\ntype = \"SIM\nnetwork = 1\n",
			2, "", "type", "strings cannot contain newlines"},
		{"unknown top-level key", "cluster = \"x\"\n[[protocol]]\ntype = \"SIM\"\n",
			1, "", "cluster", "unknown top-level key"},
		{"empty", "# nothing\n", 0, "", "", "no [[protocol]] tables"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := stack.ParseConfig("bad.toml", []byte(tc.src))
			requireConfigError(t, err, tc.line, tc.proto, tc.key, tc.in)
		})
	}
}

func requireConfigError(t *testing.T, err error, line int, proto, key, contains string) {
	t.Helper()
	require.Error(t, err)
	var ce *stack.ConfigError
	require.True(t, errors.As(err, &ce), "want *ConfigError, got %T: %v", err, err)
	require.Equal(t, "bad.toml", ce.File, "error names the file: %v", err)
	require.Equal(t, line, ce.Line, "line: %v", err)
	require.Equal(t, proto, ce.Protocol, "protocol: %v", err)
	require.Equal(t, key, ce.Key, "key: %v", err)
	require.Contains(t, ce.Reason, contains)
}

func TestLoadConfigFileErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "stack.toml")
	require.NoError(t, os.WriteFile(p, []byte("[[protocol]]\ntype = \"SIM\"\nbogus = 1\n"), 0o644))
	_, err := stack.LoadConfig(p)
	require.EqualError(t, err, p+`:3: SIM: bogus: unknown key (valid keys: network, seed, queue_len, max_queued_bytes, max_bundle_size, bind_addr, bind_port, port_range)`)
	_, err = stack.LoadConfig(filepath.Join(dir, "missing.toml"))
	require.ErrorContains(t, err, "missing.toml")
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]stack.Size{
		"64KB": 64000, "64KiB": 65536, "1.5MB": 1500000, "4MiB": 4 << 20, "100": 100, "7b": 7, " 2 GB ": 2e9,
	} {
		got, err := stack.ParseSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "KB", "ten", "1e400", "NaN"} {
		_, err := stack.ParseSize(in)
		require.Error(t, err, in)
	}
	require.Equal(t, "64KB", stack.Size(64000).String())
	require.Equal(t, "4MiB", stack.Size(4<<20).String())
}

func TestRegistryRejectsDuplicatesAndBuildsInCode(t *testing.T) {
	require.Panics(t, func() {
		stack.Register(stack.ProtocolSpec[sim.Config]{Name: "SIM", Defaults: sim.DefaultConfig,
			New: func(sim.Config) (stack.Protocol, error) { return nil, nil }})
	})
	p, err := stack.NewProtocol[delay.Config]("DELAY", func(c *delay.Config) { c.Up = time.Second })
	require.NoError(t, err)
	require.Equal(t, "DELAY", p.Name())
	_, err = stack.NewProtocol[delay.Config]("DELAY", func(c *delay.Config) { c.Up = -time.Second })
	require.ErrorContains(t, err, "up: must not be negative")
	_, err = stack.NewProtocol[delay.Config]("NOPE", nil)
	require.ErrorContains(t, err, "unknown protocol")
}

func TestNewStackChecksTransportPlacement(t *testing.T) {
	_, err := stack.NewStack()
	require.ErrorContains(t, err, "no protocols")
	_, err = stack.NewStack(discard.New(discard.DefaultConfig()))
	require.ErrorContains(t, err, "no transport")
	_, err = stack.NewStack(discard.New(discard.DefaultConfig()), sim.New(sim.DefaultConfig()))
	require.ErrorContains(t, err, "must be the first (bottom) protocol")
	_, err = stack.NewStack(sim.New(sim.DefaultConfig()), sim.New(sim.DefaultConfig()))
	require.ErrorContains(t, err, "2 transports")
	d := discard.New(discard.DefaultConfig())
	_, err = stack.NewStack(sim.New(sim.DefaultConfig()), d, d)
	require.ErrorContains(t, err, "appears twice")
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("[[protocol]]\ntype = \"SIM\"\nnetwork = \"x\"\n[[protocol]]\ntype = \"DELAY\"\nup = \"1s\"\n"))
	f.Add([]byte("[[protocol]]\ntype = \"SIM\"\nqueue_len = ${Q:5}\n"))
	f.Add([]byte("[[protocol]]\ntype = \"DISCARD\"\nup = 2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := stack.ParseConfig("fuzz.toml", data)
		if err != nil {
			var ce *stack.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error is not a *ConfigError: %T %v", err, err)
			}
			return
		}
		if len(sc.Protocols) == 0 || !sc.Protocols[0].Type.Transport {
			t.Fatalf("accepted a stack without a transport at the bottom")
		}
	})
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"64KB", "1.5MiB", "100", "-3gb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := stack.ParseSize(s)
		if err != nil {
			return
		}
		again, err := stack.ParseSize(v.String())
		if err != nil || again != v {
			t.Fatalf("%q -> %d -> %q -> %d, %v", s, v, v.String(), again, err)
		}
	})
}

// TestDiagAddrIsATopLevelKeyCheckedWithItsLine: diag_addr (off when absent)
// sits above the [[protocol]] tables; a wrong value or a diag_addr inside a
// protocol's table is an error naming the file, the line and the key.
func TestDiagAddrIsATopLevelKeyCheckedWithItsLine(t *testing.T) {
	const sim = "[[protocol]]\ntype = \"SIM\"\nnetwork = \"n\"\n"
	sc, err := stack.ParseConfig("off.toml", []byte(sim))
	require.NoError(t, err)
	require.Empty(t, sc.DiagAddr, "off by default")

	t.Setenv("STRATA_TEST_DIAG", "127.0.0.1:7999")
	sc, err = stack.ParseConfig("on.toml", []byte("# diagnostics\ndiag_addr = \"${STRATA_TEST_DIAG:}\"\n"+sim))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:7999", sc.DiagAddr)
	sc, err = stack.ParseConfig("empty.toml", []byte("diag_addr = \"${STRATA_TEST_DIAG_UNSET:}\"\n"+sim))
	require.NoError(t, err)
	require.Empty(t, sc.DiagAddr)

	for src, want := range map[string]string{
		"\ndiag_addr = 7900\n" + sim:             `bad.toml:2: diag_addr: want a string such as "127.0.0.1:7900" ("": off), got integer 7900`,
		"diag_addr = \"7900\"\n" + sim:           `bad.toml:1: diag_addr: want host:port`,
		"diag_addr = \":7900\"\n" + sim:          `bad.toml:1: diag_addr: ":7900" names no host`,
		"diag_addr = \"127.0.0.1:http\"\n" + sim: `bad.toml:1: diag_addr: port "http" of "127.0.0.1:http" must be a number`,
		"diag_addr = \"239.1.2.3:7900\"\n" + sim: `bad.toml:1: diag_addr: 239.1.2.3 is a multicast address`,
		sim + "diag_addr = \"127.0.0.1:7900\"\n": `bad.toml:4: SIM: diag_addr: unknown key; diag_addr is a top-level key: write it above the first [[protocol]]`,
	} {
		_, err := stack.ParseConfig("bad.toml", []byte(src))
		var ce *stack.ConfigError
		require.ErrorAs(t, err, &ce, src)
		require.Contains(t, err.Error(), want)
	}
}
