package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadResult is what a closed-loop load produced.
type loadResult struct {
	tokens int
	wall   time.Duration
	cpu    time.Duration
}

// runLoad keeps clients requests in flight on each engine until each client
// has sent perClient requests, streaming or not, and measures the process
// CPU time (engines and clients together).
func runLoad(tb testing.TB, engines []*Engine, clients, perClient, prompt, output int, stream bool) loadResult {
	tb.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	cpu0, t0 := cpuTime(), time.Now()
	for ei, e := range engines {
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range perClient {
					body, _ := json.Marshal(map[string]any{
						"prompt": fmt.Sprintf("e%dc%dk%d", ei, c, k) + strings.Repeat(" x", prompt-1), "max_tokens": output, "stream": stream,
					})
					resp, err := hc.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
					if err != nil {
						tb.Error(err)
						return
					}
					n, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || n == 0 {
						tb.Errorf("status %d", resp.StatusCode)
						return
					}
					mu.Lock()
					total += output
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return loadResult{tokens: total, wall: time.Since(t0), cpu: cpuTime() - cpu0}
}

// BenchmarkEmulatedTokenCPU measures the CPU cost per emulated output
// token: one engine at a huge time scale (steps take no wall time) under 32
// concurrent clients, engine and HTTP clients in one process.
func BenchmarkEmulatedTokenCPU(b *testing.B) {
	for _, stream := range []bool{true, false} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			e := startEngine(b, func(c *Config) { c.TimeScale = 1e6; c.NumGPUBlocks = 16384 })
			var tokens int
			var cpu time.Duration
			for b.Loop() {
				r := runLoad(b, []*Engine{e}, 32, 2, 500, 256, stream)
				tokens += r.tokens
				cpu += r.cpu
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(tokens), "cpu-ns/token")
		})
	}
}

// TestSixteenEnginesUnderLoad runs 16 engines in real time (time scale 1)
// with 16 streaming clients each and checks the emulation does not saturate
// a core: process CPU / wall time < 1 (clients included).
func TestSixteenEnginesUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	for _, interval := range []int{1, 4} {
		t.Run(fmt.Sprintf("stream-interval=%d", interval), func(t *testing.T) {
			engines := make([]*Engine, 16)
			for i := range engines {
				engines[i] = startEngine(t, func(c *Config) { c.TimeScale = 1; c.NumGPUBlocks = 4096; c.StreamInterval = interval })
			}
			// 16 engines x 16 streams x 150 tokens: ~1.8 s of modelled time.
			r := runLoad(t, engines, 16, 1, 200, 150, true)
			cores := r.cpu.Seconds() / r.wall.Seconds()
			perTok := float64(r.cpu.Nanoseconds()) / float64(r.tokens)
			t.Logf("16 engines: %d tokens in %v (%.0f tokens/s), CPU %v = %.2f cores, %.0f ns CPU per token (race=%v)",
				r.tokens, r.wall.Round(time.Millisecond), float64(r.tokens)/r.wall.Seconds(), r.cpu.Round(time.Millisecond), cores, perTok, raceEnabled)
			if !raceEnabled && cores >= 1 {
				t.Errorf("emulating 16 engines used %.2f cores", cores)
			}
		})
	}
}

// TestStreamInterval: with --stream-interval 4 an event brings the
// tokens since the last (vLLM's: the first at once, then every 4, the
// rest at the end), and with continuous_usage_stats every event's usage
// counts the tokens so far, the role event's none.
func TestStreamInterval(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.StreamInterval = 4 })
	for _, api := range []string{"completions", "chat/completions"} {
		body := map[string]any{"max_tokens": 10, "stream": true, "stream_options": map[string]any{"include_usage": true, "continuous_usage_stats": true}}
		if api == "completions" {
			body["prompt"] = "chunk me"
		} else {
			body["messages"] = []map[string]string{{"role": "user", "content": "chunk me"}}
		}
		_, evs, _ := streamRequest(t, e.URL()+"/v1/"+api, body)
		words, tokenEvents := 0, 0
		for i, ev := range evs {
			if ev.data == "[DONE]" {
				if i != len(evs)-1 {
					t.Fatalf("%s: [DONE] before the end", api)
				}
				continue
			}
			var c struct {
				Choices []struct {
					Text  string
					Delta struct{ Content, Role string }
				}
				Usage *struct {
					Completion int `json:"completion_tokens"`
				}
			}
			if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
				t.Fatalf("%s: %q: %v", api, ev.data, err)
			}
			if len(c.Choices) == 0 { // the final usage event
				if c.Usage == nil || c.Usage.Completion != 10 {
					t.Fatalf("%s: final usage %+v", api, c.Usage)
				}
				continue
			}
			text := c.Choices[0].Text + c.Choices[0].Delta.Content
			if text != "" {
				tokenEvents++
				words += len(strings.Fields(text))
			}
			if c.Usage == nil || c.Usage.Completion != words {
				t.Fatalf("%s: event %d after %d tokens has usage %+v", api, i, words, c.Usage)
			}
		}
		// The engine's wakes at tokens 1, 4, 8 and 10; a stream that
		// lags merges them, as vLLM's output collector does.
		if words != 10 || tokenEvents < 1 || tokenEvents > 4 {
			t.Fatalf("%s: %d tokens in %d events, want 10 in 1 to 4", api, words, tokenEvents)
		}
	}
	// SGLang's /generate: its events carry the text so far and its
	// count (meta_info.completion_tokens).
	_, evs, _ := streamRequest(t, e.URL()+"/generate", map[string]any{"text": "chunk me", "stream": true, "sampling_params": map[string]any{"max_new_tokens": 10}})
	n := 0
	for _, ev := range evs {
		if ev.data == "[DONE]" {
			continue
		}
		var g generateAnswer
		if err := json.Unmarshal([]byte(ev.data), &g); err != nil {
			t.Fatal(err)
		}
		if len(strings.Fields(g.Text)) != g.MetaInfo.CompletionTokens {
			t.Fatalf("/generate: %q counted %d", g.Text, g.MetaInfo.CompletionTokens)
		}
		n++
	}
	if n < 1 || n > 4 {
		t.Fatalf("/generate: %d events, want 1 to 4", n)
	}
}
