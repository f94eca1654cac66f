package strata_test

import (
	"os"
	"strings"
	"testing"
)

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
	s := string(readme)
	i := strings.Index(s, "## Embedding")
	if i < 0 {
		t.Fatal("README has no ## Embedding section")
	}
	b := strings.Index(s[i:], "```go\n") + i + len("```go\n")
	e := strings.Index(s[b:], "```") + b
	snippet := s[b:e]
	if !strings.HasPrefix(snippet, "import (") || !strings.Contains(snippet, "func run(") {
		t.Fatalf("README's embedding snippet should be the imports and run:\n%s", snippet)
	}
	if !strings.Contains(string(example), snippet) {
		t.Fatalf("README's embedding snippet is not example_embed_test.go's imports and run:\n%s", snippet)
	}
}
