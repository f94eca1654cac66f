package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/strata-go/strata/configs"
	"github.com/strata-go/strata/internal/testing/tlstest"
)

func runCmd(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

// setTLSFiles points tcp-tls.toml at a certificate, key and CA made for
// the test.
func setTLSFiles(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	f := ca.Issue(t, t.TempDir(), "member")
	t.Setenv("STRATA_TLS_CERT", f.Cert)
	t.Setenv("STRATA_TLS_KEY", f.Key)
	t.Setenv("STRATA_TLS_CA", f.CA)
}

func TestValidateAcceptsEveryShippedConfig(t *testing.T) {
	setTLSFiles(t)
	files, err := fs.Glob(configs.FS, "*.toml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			code, out, errOut := runCmd("validate", filepath.Join("..", "..", "configs", f))
			require.Equal(t, 0, code, errOut)
			require.Contains(t, out, "protocols, bottom first")
		})
	}
	code, out, _ := runCmd("validate")
	require.Equal(t, 0, code)
	require.Contains(t, out, "(embedded)")
}

func TestValidatePrintsChangedValues(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.toml")
	require.NoError(t, os.WriteFile(p, []byte("[[protocol]]\ntype = \"SIM\"\nnetwork = \"lab\"\n[[protocol]]\ntype = \"DELAY\"\nup = \"2ms\"\nseed = 1\n"), 0o644))
	code, out, _ := runCmd("validate", p)
	require.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	require.Regexp(t, `^ 1  SIM +network="lab"$`, lines[1])
	require.Regexp(t, `^ 2  DELAY +up="2ms"$`, lines[2], "seed = 1 is the default and is not shown")
}

func TestValidateRejectsWithFileAndLine(t *testing.T) {
	cases := map[string]string{
		"unknown-protocol.toml":     `:5: protocol #2: type: unknown protocol "NAKACKK"`,
		"unknown-key.toml":          `:3: SIM: netwrk: unknown key; did you mean "network"?`,
		"wrong-type.toml":           `:5: DISCARD: up: want a number, got string "lots"`,
		"negative-size.toml":        `:3: SIM: queue_len: must be > 0, got -5`,
		"negative-interval.toml":    `:6: DELAY: down: must not be negative, got -2s`,
		"zero-interval.toml":        `:6: NAKACK: xmit_interval: must be > 0, got 0s`,
		"no-transport.toml":         `:1: DISCARD: no transport in the stack`,
		"two-transports.toml":       `:3: SIM: second transport`,
		"transport-not-bottom.toml": `:3: SIM: the transport must be the first [[protocol]]`,
		"flush-without-gms.toml":    `:10: FLUSH: needs membership below it, and no layer below it provides it (GMS does)`,
		"gms-below-nakack.toml":     `:10: GMS: needs reliable multicast below it, and no layer below it provides it (NAKACK does)`,
		"groupfc-unreliable.toml":   `:4: GROUPFC: needs reliable multicast below it`,
		"merge3-without-gms.toml":   `:4: MERGE3: needs membership above it, and no layer above it provides it (GMS does)`,
		"frag-too-big.toml":         `:7: FRAG: frag_size: 60KB does not fit UDP's largest datagram (20KB)`,
		"datagram-too-small.toml":   `:3: SIM: max_bundle_size: 1400B cannot carry GMS's control messages`,
		"frag-below-flush.toml":     `:16: FLUSH: must be above FRAG: FRAG splits its large messages`,
		"unterminated-var.toml":     `:3: malformed variable reference in "bind_addr = \"${STRATA_BIND_ADDR:127.0.0.1\""`,
		"no-such-interface.toml":    `:3: UDP: bind_addr: `,
	}
	for file, want := range cases {
		t.Run(file, func(t *testing.T) {
			path := filepath.Join("testdata", file)
			code, out, errOut := runCmd("validate", path)
			require.Equal(t, 2, code)
			require.Empty(t, out)
			require.Contains(t, errOut, path+want)
		})
	}
}

func TestProtocolsListsKeysWithDefaultsAndDocs(t *testing.T) {
	code, out, _ := runCmd("protocols")
	require.Equal(t, 0, code)
	require.Contains(t, out, "SIM (transport), id 1:")
	require.Regexp(t, `queue_len\s+integer\s+= 1048576\s+packets a member's inbox holds`, out)
	require.Regexp(t, `up\s+duration\s+= "0s"\s+how long each received message`, out)
}

func TestUsageErrors(t *testing.T) {
	code, _, errOut := runCmd()
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "usage:")
	code, _, errOut = runCmd("frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown command "frobnicate"`)
	code, _, errOut = runCmd("validate", "does-not-exist.toml")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "does-not-exist.toml")
}
