package engine

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine/kvpub"
)

// TestLoRAAdapters: an engine serving LoRA adapters keeps each one's
// prefix cache apart from the base model's and the other adapters' (vLLM
// hashes blocks with the adapter's name), publishes its blocks with
// lora_name and lora_id, lists the adapters under the base model, and
// refuses a model it does not serve.
func TestLoRAAdapters(t *testing.T) {
	e := startEngine(t, func(c *Config) {
		c.LoRAModules = []string{"sql", "chat"}
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsFormat = kvpub.FormatMap
	})
	s := subscribe(t, e, kvpub.FormatMap)
	rng := rand.New(rand.NewPCG(5, 6))
	prompt := words(rng, 200)
	cached := func(model, text string) int {
		return complete(t, e, map[string]any{"model": model, "prompt": text, "max_tokens": 1}).Usage.PromptTokensDetails.CachedTokens
	}
	if got := cached("test-model", prompt); got != 0 {
		t.Fatalf("base, first: %d cached", got)
	}
	for _, c := range []struct {
		model string
		text  string
		some  bool
	}{
		{"sql", prompt, false},                // the base model's blocks are not the adapter's
		{"sql", prompt + " more words", true}, // its own are
		{"chat", prompt, false},               // nor another adapter's
		{"test-model", prompt + " again", true},
	} {
		if got := cached(c.model, c.text); (got > 0) != c.some {
			t.Errorf("%s: %d tokens cached, want some: %v", c.model, got, c.some)
		}
	}
	// A salt never passes for an adapter, nor an adapter for a salt.
	if got := complete(t, e, map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 1, "cache_salt": "sql"}).Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Errorf("salted base request: %d cached from another key", got)
	}

	byName := map[string]int64{}
	timeout := time.After(5 * time.Second)
	for len(byName) < 3 {
		select {
		case b := <-s.ch:
			for _, ev := range b.events {
				if ev.kind == "BlockStored" {
					byName[ev.loraName] = ev.loraID
				}
			}
		case <-timeout:
			t.Fatalf("BlockStored events seen for %v only", byName)
		}
	}
	if want := map[string]int64{"": 0, "sql": 1, "chat": 2}; len(byName) != 3 || byName["sql"] != 1 || byName["chat"] != 2 || byName[""] != 0 {
		t.Errorf("BlockStored lora (name → id) %v, want %v", byName, want)
	}

	resp, err := http.Get(e.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ml struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ml); err != nil || resp.StatusCode != 200 || len(ml.Data) != 3 || ml.Data[0].Parent != nil || ml.Data[1].ID != "sql" || ml.Data[1].Parent == nil || *ml.Data[1].Parent != "test-model" {
		t.Errorf("models: %s", body)
	}
	if r, out := postJSON(t, e.URL()+"/v1/completions", map[string]any{"model": "nope", "prompt": "x", "max_tokens": 1}); r.StatusCode != 404 || !strings.Contains(string(out), "does not exist") {
		t.Errorf("unknown model: %d %s", r.StatusCode, out)
	}
}

func TestLoRAConfig(t *testing.T) {
	for _, tt := range []struct {
		names []string
		err   string
	}{
		{[]string{"a", ""}, "has no name"},
		{[]string{"test-model"}, "base model's name"},
		{[]string{"a", "a"}, "listed twice"},
		{make([]string, maxLoRAModules+1), "at most 1024"},
	} {
		c := testConfig()
		c.LoRAModules = tt.names
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%.40q: %v, want %q", tt.names, err, tt.err)
		}
	}
}
