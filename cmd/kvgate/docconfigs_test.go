package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/gateway"
)

// TestDocumentedServeConfigs: every kvgate serve config the README and
// docs/serve.md show loads as written, as kvgate serve --config loads it
// (the README's was refused: slo_ttft beside classes, which a
// walkthrough met copying it). A fragment (one section) is loaded with
// one endpoint added.
func TestDocumentedServeConfigs(t *testing.T) {
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	for _, doc := range []string{"../../README.md", "../../docs/serve.md"} {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		found := block.FindAllSubmatch(data, -1)
		if len(found) == 0 {
			t.Fatalf("%s: no yaml block", doc)
		}
		for i, m := range found {
			text := string(m[1])
			if !strings.Contains(text, "endpoints:") && !strings.Contains(text, "discovery:") {
				text = "endpoints: [{url: \"http://127.0.0.1:1\", model: m}]\n" + text
			}
			path := filepath.Join(t.TempDir(), "kvgate.yaml")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			f := serveFlags{config: path, set: map[string]bool{}}
			if _, err := f.load(gateway.Config{}); err != nil {
				first, _, _ := strings.Cut(strings.TrimSpace(string(m[1])), "\n")
				t.Errorf("%s, yaml block %d (%q): %v", doc, i+1, first, err)
			}
		}
	}
}

// TestEngineAPIKeyFromTheEnvironment: KVGATE_ENGINE_API_KEY gives the
// engines' key when the config does not (as VLLM_API_KEY gives vLLM's),
// and a key that cannot go in a header is refused at the start.
func TestEngineAPIKeyFromTheEnvironment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvgate.yaml")
	if err := os.WriteFile(path, []byte("endpoints: [{url: \"http://127.0.0.1:1\", model: m}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVGATE_ENGINE_API_KEY", "sk-env")
	f := serveFlags{config: path, set: map[string]bool{}}
	sc, err := f.load(gateway.Config{})
	if err != nil || sc.EngineAPIKey != "sk-env" {
		t.Fatalf("%v, key %q", err, sc.EngineAPIKey)
	}
	t.Setenv("KVGATE_ENGINE_API_KEY", "bad\nkey")
	if _, err := f.load(gateway.Config{}); err == nil || !strings.Contains(err.Error(), "engine_api_key") {
		t.Fatalf("a key with a newline: %v", err)
	}
}
