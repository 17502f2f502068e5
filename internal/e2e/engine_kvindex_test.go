package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/enginetest"
	"github.com/kvgate/kvgate/internal/engine/kvpub"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

const model = "e2e-model"

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startEngine(t *testing.T, format kvpub.Format) *engine.Engine {
	t.Helper()
	cfg := engine.DefaultConfig()
	cfg.Model = model
	cfg.Port = 0
	cfg.TimeScale = 100
	cfg.NumGPUBlocks = 64 // small: evictions happen
	cfg.KVEventsEndpoint = "tcp://127.0.0.1:0"
	cfg.KVEventsReplayEndpoint = "tcp://127.0.0.1:0"
	cfg.KVEventsFormat = format
	cfg.Logger = quiet()
	return startEngineCfg(t, cfg)
}

// startEngineCfg starts an engine and closes it at the end of the test.
func startEngineCfg(t *testing.T, cfg engine.Config) *engine.Engine {
	t.Helper()
	return enginetest.Start(t, cfg.TimeScale, func(c *engine.Config) { *c = cfg })
}

// runSubscriber subscribes idx to engines until the end of the test.
func runSubscriber(t *testing.T, idx *kvindex.Index, engines []kvevents.EngineConfig) *kvevents.Subscriber {
	t.Helper()
	sub, err := kvevents.New(kvevents.Config{Engines: engines, Logger: quiet()}, idx)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return sub
}

func post(t *testing.T, url string, body any, out any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("POST %s: %v in %s", url, err, data)
		}
	}
}

// TestEngineEventsReachIndex runs two emulated engines, one publishing
// vLLM's legacy array events and one the current map form, with engine
// blocks of 16 tokens and a router index of 64-token blocks. A completion
// on one engine must show up in the index as that engine's prefix (and not
// the other's); a prefix-cache reset must clear it.
func TestEngineEventsReachIndex(t *testing.T) {
	engines := []*engine.Engine{startEngine(t, kvpub.FormatArray), startEngine(t, kvpub.FormatMap)}
	idx := kvindex.New(kvindex.Config{BlockSize: 64})
	var ecs []kvevents.EngineConfig
	for _, e := range engines {
		ecs = append(ecs, kvevents.EngineConfig{Name: e.Addr(), Model: model, Events: e.KVEventsEndpoint(), Replay: e.KVEventsReplayEndpoint()})
	}
	sub := runSubscriber(t, idx, ecs)
	time.Sleep(200 * time.Millisecond) // ZMQ subscriptions settle (slow joiner)

	prompt := strings.TrimSpace(strings.Repeat("the quick brown fox jumps over the lazy dog ", 30)) // 270 tokens
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	post(t, engines[0].URL()+"/tokenize", map[string]any{"model": model, "prompt": prompt}, &tok)
	keys := tokens.NewHasher(64).Keys(tok.Tokens, nil)
	wantTokens := len(keys) * 64
	if wantTokens == 0 {
		t.Fatalf("prompt too short: %d tokens", len(tok.Tokens))
	}

	lookup := func() map[string]int {
		got := map[string]int{}
		for _, m := range idx.Lookup(model, keys, nil) {
			name, _, _ := idx.Endpoint(m.Endpoint)
			got[name] = m.Tokens
		}
		return got
	}
	waitFor := func(what string, ok func(map[string]int) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if ok(lookup()) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("%s: index shows %v; subscriber stats %+v", what, lookup(), sub.Stats())
	}

	for i, e := range engines {
		post(t, e.URL()+"/v1/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": 4}, nil)
		waitFor(fmt.Sprintf("engine %d's prefix indexed", i), func(m map[string]int) bool { return m[e.Addr()] == wantTokens })
		if i == 0 {
			if got := lookup()[engines[1].Addr()]; got != 0 {
				t.Fatalf("engine 1 served nothing yet but the index gives it %d tokens", got)
			}
		}
	}

	post(t, engines[0].URL()+"/reset_prefix_cache", map[string]any{}, nil)
	waitFor("reset clears engine 0 only", func(m map[string]int) bool {
		return m[engines[0].Addr()] == 0 && m[engines[1].Addr()] == wantTokens
	})

	// Other prompts push the first out of engine 1's small cache: its
	// BlockRemoved events must take it out of the index.
	for i := range 6 {
		other := strings.Repeat(fmt.Sprintf("filler%d ", i), 200)
		post(t, engines[1].URL()+"/v1/completions", map[string]any{"model": model, "prompt": other, "max_tokens": 1}, nil)
	}
	waitFor("eviction removes the prefix", func(m map[string]int) bool { return m[engines[1].Addr()] < wantTokens })
}
