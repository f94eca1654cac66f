package stack_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	_ "github.com/strata-go/strata/protocols/all" // registers every protocol
	"github.com/strata-go/strata/stack"
)

// TestNewChoosesOneStack: without a stack option New builds the default
// stack (udp.toml); with two it refuses and says so; a config that cannot
// be read is named in the error.
func TestNewChoosesOneStack(t *testing.T) {
	ch, err := stack.New(stack.WithName("A"))
	require.NoError(t, err)
	var names []string
	for _, p := range stack.Of(ch).Protocols() {
		names = append(names, p.Name())
	}
	require.Equal(t, "UDP", names[0], "the default stack is udp.toml")
	require.Contains(t, names, "GMS")
	require.NoError(t, ch.Close())

	_, err = stack.New(stack.Shipped("sim.toml"), stack.Shipped("udp.toml"))
	require.ErrorContains(t, err, "more than one stack")

	_, err = stack.New(stack.FromFile("no-such-stack.toml"))
	require.ErrorContains(t, err, "no-such-stack.toml")

	ch, err = stack.New(stack.Shipped("sim.toml"), stack.WithVars(map[string]string{"STRATA_SIM_NETWORK": "new-test"}))
	require.NoError(t, err)
	require.Equal(t, "SIM", stack.Of(ch).Protocols()[0].Name())
	require.NoError(t, ch.Close())
}

// TestWithDiagNeedsTheDiagPackageAndAnAddress: without package diag in the
// program, a diagnostics address is an error that says what to import,
// and a malformed one is refused before anything listens.
func TestWithDiagNeedsTheDiagPackageAndAnAddress(t *testing.T) {
	sim := stack.Shipped("sim.toml")
	_, err := stack.New(sim, stack.WithDiag("127.0.0.1:0"))
	require.ErrorContains(t, err, `import _ "github.com/strata-go/strata/diag"`)
	_, err = stack.New(sim, stack.WithDiag("7900"))
	require.ErrorContains(t, err, "diag_addr: want host:port")
	ch, err := stack.New(sim, stack.WithDiag(""))
	require.NoError(t, err)
	require.Nil(t, ch.DiagAddr())
	require.NoError(t, ch.Close())
}
