package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
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

	status, body := getBody(t, e.URL()+"/v1/models")
	var ml struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ml); err != nil || status != 200 || len(ml.Data) != 3 || ml.Data[0].Parent != nil || ml.Data[1].ID != "sql" || ml.Data[1].Parent == nil || *ml.Data[1].Parent != "test-model" {
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

// TestMaxLoRAs: with --max-loras 1, a request for a second adapter waits
// while the first adapter's request runs, a base model request and the
// running adapter's do not, and vllm:lora_requests_info says which
// adapters run and wait; the waiting one runs once the first is gone.
func TestMaxLoRAs(t *testing.T) {
	e := startEngine(t, func(c *Config) {
		c.LoRAModules, c.MaxLoRAs, c.TimeScale = []string{"sql", "chat"}, 1, 10
	})
	post := func(ctx context.Context, model string, maxTokens int) error {
		b, _ := json.Marshal(map[string]any{"model": model, "prompt": "select the rows", "max_tokens": maxTokens})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", bytes.NewReader(b))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		return err
	}
	state := func() (running, waiting []string) {
		onScheduler(t, e, func(s *scheduler) {
			for _, r := range s.running {
				running = append(running, r.loraName)
			}
			for _, r := range s.waiting {
				waiting = append(waiting, r.loraName)
			}
		})
		return running, waiting
	}
	long, stop := context.WithCancel(context.Background())
	defer stop()
	sqlDone := make(chan error, 1)
	go func() { sqlDone <- post(long, "sql", 15000) }() // a long decode, cancelled below
	waitFor(t, "the sql request to run", func() bool { r, _ := state(); return slices.Equal(r, []string{"sql"}) })
	chatDone := make(chan error, 1)
	go func() { chatDone <- post(context.Background(), "chat", 2) }()
	waitFor(t, "the chat request to wait", func() bool { _, w := state(); return slices.Equal(w, []string{"chat"}) })
	// Neither the base model nor the running adapter waits for a slot.
	for _, model := range []string{"test-model", "sql"} {
		if err := post(context.Background(), model, 2); err != nil {
			t.Fatalf("%s: %v", model, err)
		}
	}
	if r, w := state(); !slices.Equal(r, []string{"sql"}) || !slices.Equal(w, []string{"chat"}) {
		t.Fatalf("after the others: running %q, waiting %q", r, w)
	}
	_, metrics := getBody(t, e.URL()+"/metrics")
	if want := `vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql",waiting_lora_adapters="chat"}`; !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	stop()
	<-sqlDone
	select {
	case err := <-chatDone:
		if err != nil {
			t.Fatalf("chat: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the chat request never ran once the sql request was gone")
	}
}

// TestAnswersNameTheirModel: as vLLM, an answer names the model the
// request named, an adapter's name for an adapter (streamed and not),
// and an event's usage with continuous_usage_stats holds the counts
// alone, the cache hits coming with the final usage.
func TestAnswersNameTheirModel(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.LoRAModules = []string{"sql"} })
	for _, model := range []string{"test-model", "sql"} {
		if got := complete(t, e, map[string]any{"model": model, "prompt": "hello there", "max_tokens": 2}).Model; got != model {
			t.Errorf("unstreamed answer for %s names %s", model, got)
		}
		resp, err := http.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(
			`{"model":%q,"prompt":"hello there","max_tokens":3,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, model)))
		if err != nil {
			t.Fatal(err)
		}
		evs := readSSE(t, resp.Body)
		resp.Body.Close()
		for i, ev := range evs {
			if ev.data == "[DONE]" {
				continue
			}
			var c struct {
				Model   string                     `json:"model"`
				Choices []json.RawMessage          `json:"choices"`
				Usage   map[string]json.RawMessage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
				t.Fatal(err)
			}
			if c.Model != model {
				t.Errorf("%s: event %d names %s", model, i, c.Model)
			}
			_, details := c.Usage["prompt_tokens_details"]
			if final := len(c.Choices) == 0; details != final {
				t.Errorf("%s: event %d (final usage %v) has prompt_tokens_details: %v: %s", model, i, final, details, ev.data)
			}
		}
	}
}
