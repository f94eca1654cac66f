package stacktest

import (
	"strings"
	"testing"

	"github.com/strata-go/strata/stack"
)

// A program that forgets to import the shipped protocols is told how to.
// (This package's tests register only SIM.)
func TestUnknownProtocolSaysToImportTheShippedOnes(t *testing.T) {
	_, err := stack.ParseConfig("app.toml", []byte("[[protocol]]\ntype = \"UDP\"\n"))
	if err == nil || !strings.Contains(err.Error(), `import _ "github.com/strata-go/strata/protocols/all"`) {
		t.Fatalf("want a hint to import protocols/all, got %v", err)
	}
}
