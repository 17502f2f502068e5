package engine

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
)

func TestPrefillDecodeTwoLegs(t *testing.T) {
	pre := startEngine(t, func(c *Config) { c.Role = fleet.RolePrefill; c.KVHoldTimeout = time.Hour })
	dec := startEngine(t, func(c *Config) {
		c.Role = fleet.RoleDecode
		c.TimeScale = 1                      // real time: HTTP overhead under -race stays small against the 200 ms
		c.Perf.PrefillTokensPerSec = 500     // a local prefill of 100 tokens would take 200 ms
		c.Perf.KVTransferTokensPerSec = 5000 // the transfer takes 20 ms
	})
	rng := rand.New(rand.NewPCG(11, 12))
	prompt := words(rng, 100)

	// Leg 1, as the proxy sends it.
	leg1 := map[string]any{
		"model": "test-model", "prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{
			"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
			"remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
		},
	}
	r1 := complete(t, pre, leg1, "X-Request-Id", "pd-1")
	kv := r1.KVTransferParams
	if kv == nil || kv["do_remote_prefill"] != true || kv["do_remote_decode"] != false ||
		kv["remote_engine_id"] != pre.Config().EngineID || kv["tp_size"] != 1.0 {
		t.Fatalf("leg 1 kv_transfer_params %v", kv)
	}
	host, port := pre.hostPort()
	if kv["remote_host"] != host || kv["remote_port"] != float64(port) {
		t.Errorf("remote address %v:%v, want %s:%d", kv["remote_host"], kv["remote_port"], host, port)
	}
	// One list per KV-cache group, with remote_num_tokens, as vLLM's
	// NixlConnector answers now (walkthrough against vLLM's source,
	// 2026-12-04: flat before).
	groups, _ := kv["remote_block_ids"].([]any)
	if ids, _ := groups[0].([]any); len(groups) != 1 || len(ids) != 7 { // ceil(101/16)
		t.Errorf("remote_block_ids %v", kv["remote_block_ids"])
	}
	if kv["remote_num_tokens"] != float64(r1.Usage.PromptTokens) {
		t.Errorf("remote_num_tokens %v, prompt %d", kv["remote_num_tokens"], r1.Usage.PromptTokens)
	}
	if r1.Usage.CompletionTokens != 1 {
		t.Errorf("leg 1 generated %d tokens", r1.Usage.CompletionTokens)
	}
	// The prefill engine holds the blocks for the decode engine.
	var held int
	onScheduler(t, pre, func(s *scheduler) { held = s.pool.total() - s.pool.numFree })
	if held != 7 {
		t.Errorf("prefill engine holds %d blocks, want 7", held)
	}

	// Leg 2: the decode engine skips the prefill.
	leg2 := map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 20, "stream": true, "kv_transfer_params": kv}
	b, _ := json.Marshal(leg2)
	req, _ := http.NewRequest(http.MethodPost, dec.URL()+"/v1/completions", strings.NewReader(string(b)))
	req.Header.Set("X-Request-Id", "pd-1")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	evs := readSSE(t, resp.Body)
	resp.Body.Close()
	if len(evs) != 21 || evs[20].data != "[DONE]" {
		t.Fatalf("leg 2 stream: %d events", len(evs))
	}
	// TTFT = transfer (20 ms) + one decode step (10 ms), far below the
	// 200 ms a local prefill would take.
	ttft := evs[0].at.Sub(start).Seconds() * dec.cfg.TimeScale
	want := dec.cfg.Perf.TransferTime(100) + dec.cfg.Perf.DecodeStepTime(1, 100)
	if ttft < want || ttft > 0.75*dec.cfg.Perf.PrefillTime(100) {
		t.Errorf("decode TTFT %.4f s modelled, want about %.4f (a prefill would be %.3f)", ttft, want, dec.cfg.Perf.PrefillTime(100))
	}
	if v := metricValue(t, dec, "vllm:prompt_tokens_total"); v != 100 {
		t.Errorf("decode prompt tokens %v", v)
	}
	// The decode engine released the prefill engine's hold.
	waitFor(t, "hold released", func() bool {
		onScheduler(t, pre, func(s *scheduler) { held = s.pool.total() - s.pool.numFree })
		return held == 0
	})
	// Its cache now has the prompt's blocks: a local request hits them.
	c := complete(t, dec, map[string]any{"prompt": prompt + " more", "max_tokens": 1})
	if c.Usage.PromptTokensDetails.CachedTokens != 96 {
		t.Errorf("decode engine cached %d prompt tokens", c.Usage.PromptTokensDetails.CachedTokens)
	}

	// Wrong legs are clear 400s.
	for _, tt := range []struct {
		name string
		e    *Engine
		body map[string]any
		msg  string
	}{
		{"remote decode on decode engine", dec, leg1, "role is decode"},
		{"remote prefill on prefill engine", pre, leg2, "role is prefill"},
		{"missing fields", dec, map[string]any{"prompt": "x", "kv_transfer_params": map[string]any{"do_remote_prefill": true, "remote_engine_id": "p"}}, "missing remote_host, remote_port, remote_block_ids"},
	} {
		resp, out := postJSON(t, tt.e.URL()+"/v1/completions", tt.body)
		if resp.StatusCode != 400 || !strings.Contains(string(out), tt.msg) {
			t.Errorf("%s: %d %s", tt.name, resp.StatusCode, out)
		}
	}
}

func TestPrefillHoldExpires(t *testing.T) {
	pre := startEngine(t, func(c *Config) { c.Role = fleet.RolePrefill; c.KVHoldTimeout = 2 * time.Second }) // 20 ms real
	r := complete(t, pre, map[string]any{"prompt": "hold these blocks please", "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true}})
	if r.KVTransferParams == nil {
		t.Fatal("no kv_transfer_params")
	}
	waitFor(t, "hold expiry", func() bool {
		var held int
		onScheduler(t, pre, func(s *scheduler) { held = s.pool.total() - s.pool.numFree })
		return held == 0
	})
}

func TestRoleSwitch(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.TimeScale = 10; c.RoleSwitchWarmup = time.Second }) // 100 ms real warm-up
	done := make(chan error, 1)
	go func() {
		_, err := tryComplete(e.URL(), map[string]any{"prompt": "busy engine", "max_tokens": 20}) // ~20 ms real
		done <- err
	}()
	waitFor(t, "request in flight", func() bool { return e.InFlight() == 1 })

	resp, out := postJSON(t, e.URL()+"/admin/role", map[string]any{"role": "prefill"})
	var st RoleStatus
	json.Unmarshal(out, &st)
	if resp.StatusCode != http.StatusAccepted || st.State != stateDraining || st.TargetRole == nil || *st.TargetRole != fleet.RolePrefill || st.Role != fleet.RoleBoth {
		t.Fatalf("switch: %d %s", resp.StatusCode, out)
	}
	// New work is refused while draining.
	resp, out = postJSON(t, e.URL()+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": 1})
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(out), "switching role") {
		t.Errorf("during switch: %d %s", resp.StatusCode, out)
	}
	// A second switch conflicts.
	if resp, _ := postJSON(t, e.URL()+"/admin/role", map[string]any{"role": "decode"}); resp.StatusCode != http.StatusConflict {
		t.Errorf("second switch: %d", resp.StatusCode)
	}
	// The running request completes normally.
	if err := <-done; err != nil {
		t.Fatalf("request in flight during switch: %v", err)
	}
	drained := time.Now()
	waitFor(t, "new role", func() bool { return e.RoleStatus().State == stateServing })
	if w := time.Since(drained); w < 80*time.Millisecond {
		t.Errorf("warm-up took %v, want ~100ms", w)
	}
	resp, out = func() (*http.Response, []byte) {
		r, err := http.Get(e.URL() + "/admin/role")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var b strings.Builder
		buf := make([]byte, 512)
		n, _ := r.Body.Read(buf)
		b.Write(buf[:n])
		return r, []byte(b.String())
	}()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/role after switch: %d %s", resp.StatusCode, out)
	}
	st = RoleStatus{}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("GET /admin/role after switch: %v: %s", err, out)
	}
	if st.Role != fleet.RolePrefill || st.State != stateServing || st.TargetRole != nil {
		t.Errorf("after switch: %s", out)
	}
	// Serving again, in the new role.
	complete(t, e, map[string]any{"prompt": "after", "max_tokens": 1})
	if resp, _ := postJSON(t, e.URL()+"/admin/role", map[string]any{"role": "sideways"}); resp.StatusCode != 400 {
		t.Errorf("bad role: %d", resp.StatusCode)
	}
}
