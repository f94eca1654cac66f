package strata_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// goBlock returns the first ```go block of s after the text after.
func goBlock(t *testing.T, s, after string) string {
	t.Helper()
	i := strings.Index(s, after)
	if i < 0 {
		t.Fatalf("README has no %q", after)
	}
	b := strings.Index(s[i:], "```go\n") + i + len("```go\n")
	e := strings.Index(s[b:], "```") + b
	return s[b:e]
}

// TestReadmeEmbeddingSnippetIsExampleEmbed: the README's embedding snippet
// is example_embed_test.go's imports and run, word for word, so what the
// README shows compiles and runs as it stands.
func TestReadmeEmbeddingSnippetIsExampleEmbed(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_embed_test.go")
	if err != nil {
		t.Fatal(err)
	}
	snippet := goBlock(t, string(readme), "## Embedding")
	if !strings.HasPrefix(snippet, "import (") || !strings.Contains(snippet, "func run(") {
		t.Fatalf("README's embedding snippet should be the imports and run:\n%s", snippet)
	}
	if !strings.Contains(string(example), snippet) {
		t.Fatalf("README's embedding snippet is not example_embed_test.go's imports and run:\n%s", snippet)
	}
}

// readmeFragments are the README's other Go snippets, API at a glance
// rather than programs, each with what it needs around it to compile: the
// packages, the variables it uses and those it declares and leaves unused.
// (Their packages have Examples that run: rpc/example_test.go,
// protocols/groupfc/example_test.go.)
var readmeFragments = []struct {
	after, imports, uses, unused string
}{
	{
		after:   "Request/response sits on a channel",
		imports: `"bytes"; "context"; "github.com/strata-go/strata"; "github.com/strata-go/strata/rpc"`,
		uses:    "ctx context.Context, ch *strata.Channel, recv strata.Receiver, member, b, c strata.Address",
		unused:  "err, rsp, rsps, f",
	},
	{
		after:   "### GROUPFC, briefly",
		imports: `"context"; "github.com/strata-go/strata"; "github.com/strata-go/strata/protocols/groupfc"`,
		uses:    "ctx context.Context, ch *strata.Channel, payload, p []byte, dest strata.Address",
		unused:  "err, to",
	},
}

// TestReadmeFragmentsCompile builds the README's other Go snippets as they
// stand, so that none of them names what no longer exists.
func TestReadmeFragmentsCompile(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	// Inside the module, so its packages resolve; "_" keeps it out of ./...
	dir, err := os.MkdirTemp(".", "_readme")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var all strings.Builder
	for i, f := range readmeFragments {
		src := fmt.Sprintf("package snippets\n\nimport (%s)\n\nfunc snippet%d(%s) {\n%s\n_ = []any{%s}\n}\n",
			f.imports, i, f.uses, goBlock(t, string(readme), f.after), f.unused)
		all.WriteString(src)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("snippet%d.go", i)), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("go", "build", "-o", os.DevNull, "./"+dir).CombinedOutput()
	if err != nil {
		t.Fatalf("README's Go snippets do not compile: %v\n%s\n%s", err, out, all.String())
	}
}
