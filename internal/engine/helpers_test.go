package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"
)

// testConfig is a small, fast engine: 100x real time.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Model = "test-model"
	cfg.Port = 0
	cfg.TimeScale = 100
	cfg.NumGPUBlocks = 1024
	cfg.RoleSwitchWarmup = time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return cfg
}

func startEngine(t testing.TB, mutate ...func(*Config)) *Engine {
	t.Helper()
	cfg := testConfig()
	for _, m := range mutate {
		m(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// words returns a prompt of n distinct-ish words (n tokens).
func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "w%x", rng.Uint32())
	}
	return b.String()
}

func postJSON(t testing.TB, url string, body any, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, out
}

// getBody GETs url and returns the status and body.
func getBody(t testing.TB, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

type completionResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int    `json:"index"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

func complete(t testing.TB, e *Engine, body map[string]any, hdr ...string) completionResp {
	t.Helper()
	resp, out := postJSON(t, e.URL()+"/v1/completions", body, hdr...)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	var cr completionResp
	if err := json.Unmarshal(out, &cr); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	return cr
}

// sseEvent is one parsed `data:` line and when it arrived.
type sseEvent struct {
	data string
	at   time.Time
}

// readSSE parses an SSE stream strictly: every event is `data: ...` followed
// by a blank line.
func readSSE(t testing.TB, r io.Reader) []sseEvent {
	t.Helper()
	var evs []sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	expectBlank := false
	for sc.Scan() {
		line := sc.Text()
		if expectBlank {
			if line != "" {
				t.Fatalf("SSE: want blank line after event, got %q", line)
			}
			expectBlank = false
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE: unexpected line %q", line)
		}
		evs = append(evs, sseEvent{data, time.Now()})
		expectBlank = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}

func streamRequest(t testing.TB, url string, body any) (*http.Response, []sseEvent, time.Time) {
	t.Helper()
	b, _ := json.Marshal(body)
	start := time.Now()
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp, readSSE(t, resp.Body), start
}

// onScheduler runs f on the engine's scheduler goroutine.
func onScheduler(t testing.TB, e *Engine, f func(s *scheduler)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.sched.do(ctx, func() { f(e.sched) }); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// tryComplete is complete for goroutines other than the test's.
func tryComplete(url string, body map[string]any) (completionResp, error) {
	var c completionResp
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return c, err
	}
	if resp.StatusCode != 200 {
		return c, fmt.Errorf("status %d: %s", resp.StatusCode, out)
	}
	return c, json.Unmarshal(out, &c)
}

// readNamedEvents reads a stream of named events (the Responses and
// Messages APIs'): each event's name and data line.
func readNamedEvents(t *testing.T, r io.Reader) [][2]string {
	t.Helper()
	var out [][2]string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, ok := strings.CutPrefix(sc.Text(), "event: ")
		if !ok {
			continue
		}
		if !sc.Scan() {
			t.Fatal("an event without data")
		}
		data, _ := strings.CutPrefix(sc.Text(), "data: ")
		out = append(out, [2]string{name, data})
	}
	return out
}
