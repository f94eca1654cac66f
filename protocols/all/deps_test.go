package all_test

import (
	"go/build"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoProtocolImportsAnother keeps the protocols swappable: what two
// layers share (digests, member info, membership kinds, flush and state
// transfer roles) lives in the core, so no protocol package imports
// another (test code and this package aside).
func TestNoProtocolImportsAnother(t *testing.T) {
	const prefix = "github.com/strata-go/strata/protocols/"
	dirs, err := os.ReadDir("..")
	require.NoError(t, err)
	checked := 0
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == "all" {
			continue
		}
		pkg, err := build.ImportDir(filepath.Join("..", d.Name()), 0)
		require.NoError(t, err)
		for _, imp := range pkg.Imports {
			require.False(t, strings.HasPrefix(imp, prefix), "protocols/%s imports %s", d.Name(), imp)
		}
		checked++
	}
	require.Greater(t, checked, 15)
}
