package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
)

// TestContextLengthsApart: in a fleet whose engines have different
// max_model_len, a request only the longer ones hold goes to them (about
// half went to the shorter engine and got its 400: walkthrough,
// 2026-12-04); one no engine holds gets the 400 vLLM would answer.
func TestContextLengthsApart(t *testing.T) {
	small := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.MaxModelLen = 4096 })
	big := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.MaxModelLen = 8192 })
	pr, err := health.New(health.Config{Interval: 20 * time.Millisecond, Timeout: time.Second, NoMetrics: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	_, gw, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(small, fleet.RoleBoth), endpointOf(big, fleet.RoleBoth)},
		Policy: "round-robin"}, Options{Health: pr})
	waitFor(t, func() bool {
		_, a := pr.MaxModelLen(small.Addr())
		_, b := pr.MaxModelLen(big.Addr())
		return a && b
	})
	body := func(n, maxTokens int) string {
		ids := make([]int, n)
		for i := range ids {
			ids[i] = 100 + i%1000
		}
		b, _ := json.Marshal(map[string]any{"model": testModel, "prompt": ids, "max_tokens": maxTokens})
		return string(b)
	}
	for i := range 6 {
		r := post(t, gw+"/v1/completions", body(5000, 2), nil)
		if r.status != 200 || r.header.Get(hdrPrefill) != big.Addr() {
			t.Fatalf("request %d of 5 002 tokens: %d on %s: %s", i, r.status, r.header.Get(hdrPrefill), r.body)
		}
	}
	// Short requests still go to both (round-robin).
	seen := map[string]bool{}
	for range 4 {
		r := post(t, gw+"/v1/completions", body(100, 2), nil)
		seen[r.header.Get(hdrPrefill)] = r.status == 200
	}
	if !seen[small.Addr()] || !seen[big.Addr()] {
		t.Errorf("short requests served on %v, want both engines", seen)
	}
	// One no engine holds, counted in the engine's own ids (token ids
	// here): the gateway answers vLLM's 400 and sends nothing (an engine
	// capping its body below the gateway's reset such a request mid-send,
	// a 502 that had engines ejected: attack replay, 2026-12-05).
	r := post(t, gw+"/v1/completions", body(9000, 2), nil)
	if r.status != 400 || !strings.Contains(r.body, "maximum context length is 8192 tokens. However, you requested 9002 tokens (9000 in the prompt, 2 in the completion)") {
		t.Errorf("a request no engine holds: %d %s, want the gateway's 400", r.status, r.body)
	}
	if e := r.header.Get(hdrPrefill); e != "" {
		t.Errorf("a request no engine holds was sent to %s", e)
	}
}

// TestMultimodalRefusedSayingWhy: an image part is refused by the gateway
// with a message that says the limit is kvgate's, not the model's (it
// read "(text only)"; walkthrough with the openai SDK, 2026-12-04).
func TestMultimodalRefusedSayingWhy(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, nil)
	_, gw, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}}, Options{})
	body := `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`
	r := post(t, gw+"/v1/chat/completions", body, nil)
	if r.status != 400 || !strings.Contains(r.body, `content part type \"image_url\" is not supported: kvgate counts a prompt's tokens`) || !strings.Contains(r.body, "messages[0]") {
		t.Errorf("an image part: %d %s", r.status, r.body)
	}
}
