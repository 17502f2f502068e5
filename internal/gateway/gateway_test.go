package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/enginetest"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
	"github.com/kvgate/kvgate/internal/httpserve"
)

const testModel = "gw-model"

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startEngine starts an in-process emulator with KV events on loopback.
func startEngine(t *testing.T, role fleet.Role, mut func(*engine.Config)) *engine.Engine {
	t.Helper()
	return enginetest.Start(t, 50, func(c *engine.Config) {
		c.Model, c.Role = testModel, role
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsReplayEndpoint = "tcp://127.0.0.1:0"
		if mut != nil {
			mut(c)
		}
	})
}

// twoAggregated starts two aggregated engines and returns them with their
// endpoints, in that order.
func twoAggregated(t *testing.T) (e1, e2 *engine.Engine, eps []fleet.Endpoint) {
	t.Helper()
	e1 = startEngine(t, fleet.RoleBoth, nil)
	e2 = startEngine(t, fleet.RoleBoth, nil)
	return e1, e2, []fleet.Endpoint{endpointOf(e1, fleet.RoleBoth), endpointOf(e2, fleet.RoleBoth)}
}

func endpointOf(e *engine.Engine, role fleet.Role) fleet.Endpoint {
	return fleet.Endpoint{Name: e.Addr(), URL: e.URL(), Model: testModel, Role: role,
		Events: e.KVEventsEndpoint(), Replay: e.KVEventsReplayEndpoint(), PrefillSpeed: 20000 * 50}
}

// startGateway runs a gateway over eps and returns its client and admin
// URLs.
func startGateway(t *testing.T, cfg Config, o Options) (*Gateway, string, string) {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet()
	}
	g, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Run(ctx) }()
	srv := httptest.NewServer(g.Handler())
	adm := httptest.NewServer(g.AdminHandler())
	t.Cleanup(func() {
		srv.Close()
		adm.Close()
		cancel()
		<-done
	})
	return g, srv.URL, adm.URL
}

type result struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url string, body string, hdr map[string]string) result {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, string(b)}
}

func completion(prompt string, stream bool, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": maxTokens, "stream": stream})
	return string(b)
}

// prefix is a long shared prefix (well over a few blocks at any block size).
func prefix(tag string) string {
	var b strings.Builder
	for i := 0; i < 300; i++ {
		fmt.Fprintf(&b, "%s word%d ", tag, i)
	}
	return b.String()
}

func TestAggregatedStreamingAndAffinity(t *testing.T) {
	e1, _, eps := twoAggregated(t)
	cfg := Config{
		Endpoints:  eps,
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + e1.URL()},
		BlockSize:  32, // the engines use 16: the key map bridges them
		Policy:     "kvgate",
	}
	g, url, admin := startGateway(t, cfg, Options{})
	waitSubscribed(t, g)
	// Non-streaming.
	r := post(t, url+"/v1/completions", completion(prefix("alpha")+" first question", false, 4), nil)
	if r.status != 200 || !strings.Contains(r.body, `"choices"`) {
		t.Fatalf("non-streaming: %d %s", r.status, r.body)
	}
	home := r.header.Get(hdrPrefill)
	for _, h := range []string{hdrPrefill, hdrDecode, hdrCached, hdrPredicted, hdrHeld, hdrReason} {
		if r.header.Get(h) == "" {
			t.Errorf("missing response header %s", h)
		}
	}
	// Wait until the engine's KV events reached the index.
	waitFor(t, func() bool {
		var st struct {
			Endpoints []EndpointState `json:"endpoints"`
		}
		getJSON(t, admin+"/admin/endpoints", &st)
		for _, e := range st.Endpoints {
			if e.Name == home && e.KVBlocks > 0 {
				return true
			}
		}
		return false
	})
	// The same conversation prefix lands where its blocks are, streamed.
	for i := 0; i < 4; i++ {
		r = post(t, url+"/v1/completions", completion(prefix("alpha")+fmt.Sprintf(" question %d", i), true, 8), nil)
		if r.status != 200 || !strings.Contains(r.body, "data: [DONE]") {
			t.Fatalf("streaming: %d %s", r.status, r.body)
		}
		if got := r.header.Get(hdrPrefill); got != home {
			t.Fatalf("turn %d went to %s, its prefix is on %s (reason %q)", i, got, home, r.header.Get(hdrReason))
		}
		if r.header.Get(hdrCached) == "0" {
			t.Fatalf("turn %d: no cached tokens reported", i)
		}
	}
	// Chat through the gateway.
	chat := `{"model":"` + testModel + `","messages":[{"role":"user","content":"hello there"}],"max_tokens":3}`
	if r = post(t, url+"/v1/chat/completions", chat, nil); r.status != 200 {
		t.Fatalf("chat: %d %s", r.status, r.body)
	}
	var models struct {
		Data []struct{ ID string } `json:"data"`
	}
	getJSON(t, url+"/v1/models", &models)
	if len(models.Data) != 1 || models.Data[0].ID != testModel {
		t.Fatalf("models: %+v", models)
	}
	// One model's card (OpenAI's and SGLang's retrieve), and the 405s of
	// a wrong method with their Allow (a forwarded path's was the
	// catch-all's 404; walkthrough with the openai SDK, 2026-12-04).
	var card struct{ ID, Object string }
	getJSON(t, url+"/v1/models/"+testModel, &card)
	if card.ID != testModel || card.Object != "model" {
		t.Errorf("GET /v1/models/%s: %+v", testModel, card)
	}
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/v1/models/nope", 404, ""},
		{http.MethodGet, "/v1/chat/completions", 405, "POST"},
		{http.MethodGet, "/tokenize", 405, "POST"},
		{http.MethodPut, "/v1/embeddings", 405, "POST"},
	} {
		req, _ := http.NewRequest(c.method, url+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d, Allow %q; want %d, %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), c.status, c.allow)
		}
	}
	metrics := get(t, admin+"/metrics")
	for _, m := range []string{`kvgate_requests_total{class="standard",model="gw-model",outcome="ok",policy="kvgate"} 6`, "kvgate_decision_seconds_bucket", "kvgate_prefix_hit_tokens_total", "kvgate_endpoint_inflight_requests"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}

func TestStreamingIsNotBuffered(t *testing.T) {
	// An upstream that sends one SSE event, then waits for the test to
	// see it through the gateway before finishing.
	seen := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"first\":true}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-seen:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel}}}
	_, url, _ := startGateway(t, cfg, Options{})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(completion("hi", true, 2)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, "first") {
		t.Fatalf("first event not passed through before the stream ended: %q %v", line, err)
	}
	close(seen)
}

func TestPrefillDecodeTwoLegs(t *testing.T) {
	p := startEngine(t, fleet.RolePrefill, nil)
	d := startEngine(t, fleet.RoleDecode, nil)
	cfg := Config{
		Endpoints:  []fleet.Endpoint{endpointOf(p, fleet.RolePrefill), endpointOf(d, fleet.RoleDecode)},
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + p.URL()},
	}
	_, url, _ := startGateway(t, cfg, Options{})
	for _, stream := range []bool{false, true} {
		r := post(t, url+"/v1/completions", completion(prefix("pd"), stream, 6), nil)
		if r.status != 200 {
			t.Fatalf("stream=%v: %d %s", stream, r.status, r.body)
		}
		if r.header.Get(hdrPrefill) != p.Addr() || r.header.Get(hdrDecode) != d.Addr() {
			t.Fatalf("legs: prefill %s decode %s", r.header.Get(hdrPrefill), r.header.Get(hdrDecode))
		}
		if stream && !strings.Contains(r.body, "[DONE]") {
			t.Fatalf("stream: %s", r.body)
		}
		// The prefill engine's own cached count (its leg's usage): 0 for
		// the first request, the prompt's full blocks for the second.
		n, err := strconv.Atoi(r.header.Get(hdrPrefillCached))
		if err != nil || (stream && n <= 0) || (!stream && n != 0) {
			t.Fatalf("stream=%v: %s %q", stream, hdrPrefillCached, r.header.Get(hdrPrefillCached))
		}
	}
}

// TestPrefillParamsPassThrough: leg 2 carries the prefill engine's
// kv_transfer_params byte for byte, whatever its KV connector put there
// (here llm-d-inference-sim's placeholders, captured from it: string
// block ids, no remote_request_id, which an earlier gateway refused with
// a 502), and an answer that does not ask for a remote prefill is a 502
// that reaches no decode engine. A prefill that stopped at its first
// token has no params by design (vLLM's NixlConnector keeps KV only for
// a request stopped at its length): the decode engine computes the
// prompt, as vLLM's own proxy has it (this was a 502 with two prefill
// endpoints, walkthrough 2026-12-05). A prefill's 4xx is the client's,
// at once: no other prefill is tried.
func TestPrefillParamsPassThrough(t *testing.T) {
	const llmdSim = `{"do_remote_decode":false,"do_remote_prefill":true,"remote_engine_id":"DUMMY_ID","remote_block_ids":["DUMMY_ID"],"remote_host":"DUMMY","remote_port":1234,"tp_size":1}`
	type answer struct {
		status         int
		params, finish string
	}
	var ans atomic.Value
	var prefills atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		prefills.Add(1)
		a := ans.Load().(answer)
		if a.status != 200 {
			w.WriteHeader(a.status)
			fmt.Fprint(w, `{"error":{"message":"prefill says no","type":"BadRequestError"}}`)
			return
		}
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","kv_transfer_params":%s,"choices":[{"index":0,"text":"a","finish_reason":%q}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, a.params, a.finish)
	})
	pre1, pre2 := httptest.NewServer(handler), httptest.NewServer(handler)
	t.Cleanup(pre1.Close)
	t.Cleanup(pre2.Close)
	dec := &capture{}
	cfg := Config{Endpoints: []fleet.Endpoint{
		{Name: "p1", URL: pre1.URL, Model: testModel, Role: fleet.RolePrefill},
		{Name: "p2", URL: pre2.URL, Model: testModel, Role: fleet.RolePrefill},
		{Name: "d", URL: dec.server(t).URL, Model: testModel, Role: fleet.RoleDecode},
	}}
	_, url, _ := startGateway(t, cfg, Options{})
	for _, tt := range []struct {
		answer
		status   int
		prefills int32  // 0: any
		leg2     string // what leg 2 carries ("": the params verbatim)
	}{
		{answer{200, llmdSim, "length"}, 200, 1, ""},
		{answer{200, `{"do_remote_prefill":true,"remote_engine_id":"p","remote_block_ids":[4,5],"remote_host":"10.0.0.2","remote_port":5600,"remote_handshake_port":6000}`, "length"}, 200, 1, ""},
		{answer{200, `{"do_remote_decode":true,"do_remote_prefill":false}`, "length"}, 502, 0, ""},
		{answer{200, `"DUMMY"`, "length"}, 502, 0, ""},
		{answer{200, "null", "length"}, 502, 0, ""}, // no KV connector
		{answer{200, "null", "stop"}, 200, 1, "none"},
		{answer{400, "", ""}, 400, 1, ""},
	} {
		ans.Store(tt.answer)
		prefills.Store(0)
		dec.mu.Lock()
		before := len(dec.bodies)
		dec.mu.Unlock()
		r := post(t, url+"/v1/completions", completion("hello there", false, 4), nil)
		if r.status != tt.status {
			t.Fatalf("%+v: %d %s", tt.answer, r.status, r.body)
		}
		if n := prefills.Load(); tt.prefills > 0 && n != tt.prefills {
			t.Errorf("%+v: %d prefill legs, want %d", tt.answer, n, tt.prefills)
		}
		dec.mu.Lock()
		sent := dec.bodies[before:]
		dec.mu.Unlock()
		switch {
		case tt.status != 200 && len(sent) != 0:
			t.Errorf("%+v: the decode engine was sent %s", tt.answer, sent)
		case tt.status == 200 && len(sent) != 1:
			t.Errorf("%+v: leg 2 sent %d times", tt.answer, len(sent))
		case tt.status == 200 && tt.leg2 == "" && !strings.Contains(sent[0], `"kv_transfer_params":`+tt.params):
			t.Errorf("%+v: leg 2 was %q, want the params verbatim", tt.answer, sent)
		case tt.status == 200 && tt.leg2 == "none" && (strings.Contains(sent[0], "kv_transfer_params") || !strings.Contains(sent[0], `"max_tokens":4`)):
			t.Errorf("%+v: leg 2 was %q, want the client's body without params", tt.answer, sent)
		}
	}
	// A batch of prompts: vLLM's prefill would answer with the first
	// prompt's params alone, so the decode engine computes the batch.
	ans.Store(answer{200, llmdSim, "length"})
	prefills.Store(0)
	dec.mu.Lock()
	before := len(dec.bodies)
	dec.mu.Unlock()
	batch := `{"model":"` + testModel + `","prompt":["a b c","d e f"],"max_tokens":4}`
	r := post(t, url+"/v1/completions", batch, nil)
	dec.mu.Lock()
	sent := dec.bodies[before:]
	dec.mu.Unlock()
	if r.status != 200 || prefills.Load() != 0 || len(sent) != 1 || !strings.Contains(sent[0], `"prompt":["a b c","d e f"]`) || strings.Contains(sent[0], "kv_transfer_params") || r.header.Get(hdrPrefill) != "d" ||
		!strings.Contains(r.header.Get(hdrReason), "batch of 2 prompts") {
		t.Errorf("batch: %d, %d prefill legs, decode sent %q, prefill %q, reason %q", r.status, prefills.Load(), sent, r.header.Get(hdrPrefill), r.header.Get(hdrReason))
	}
}

// capture is an upstream that records what it was sent.
type capture struct {
	mu     sync.Mutex
	bodies []string
	hdrs   []http.Header
}

func (c *capture) server(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.bodies = append(c.bodies, string(b))
		c.hdrs = append(c.hdrs, r.Header.Clone())
		c.mu.Unlock()
		fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestClientInputIsCheckedAndSanitised(t *testing.T) {
	c := &capture{}
	up := c.server(t)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel}}, HTTP: httpserve.Config{MaxBodyBytes: 4096}}
	_, url, _ := startGateway(t, cfg, Options{})
	body := `{"model":"` + testModel + `","prompt":"hi","max_tokens":2,"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.9.9.9","remote_port":1,"remote_engine_id":"x","remote_block_ids":[1]}}`
	r := post(t, url+"/v1/completions", body, map[string]string{"X-Kvgate-Prefill-Endpoint": "evil", "X-Prefiller-Host-Port": "10.9.9.9:1"})
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	c.mu.Lock()
	sent, hdr := c.bodies[0], c.hdrs[0]
	c.mu.Unlock()
	if strings.Contains(sent, "kv_transfer_params") || strings.Contains(sent, "10.9.9.9") {
		t.Fatalf("client kv_transfer_params reached the engine: %s", sent)
	}
	if hdr.Get("X-Prefiller-Host-Port") != "" || hdr.Get("X-Kvgate-Prefill-Endpoint") != "" {
		t.Fatalf("internal headers reached the engine: %v", hdr)
	}
	for _, tt := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"model":`, 400, "invalid JSON"},
		{`{"model":"` + testModel + `","prompt":"a"} trailing`, 400, ""},
		{`{"model":"nope","prompt":"a"}`, 404, "does not exist"},
		{`{"model":"` + testModel + `","prompt":"` + strings.Repeat("x", 5000) + `"}`, 413, "larger than"},
		{`{"model":"` + testModel + `","prompt":"a","max_tokens":0}`, 400, "max_tokens"},
		{`{"model":"` + testModel + `","prompt":"a","n":0}`, 400, "n must be at least 1"},
		{`{"model":"` + testModel + `","prompt":""}`, 400, "empty"},
	} {
		r := post(t, url+"/v1/completions", tt.body, nil)
		if r.status != tt.status || !strings.Contains(r.body, tt.want) || !strings.Contains(r.body, `"error"`) {
			t.Errorf("%.40q: %d %s, want %d with %q", tt.body, r.status, r.body, tt.status, tt.want)
		}
	}
	if r := post(t, url+"/v1/completions", completion("a", false, 1), map[string]string{"X-Kvgate-Class": "gold"}); r.status != 400 || !strings.Contains(r.body, "unknown SLO class") {
		t.Errorf("unknown class: %d %s", r.status, r.body)
	}
}

func TestRejectionUnderOverloadSparesHigherPriority(t *testing.T) {
	c := &capture{}
	up := c.server(t)
	cfg := Config{
		Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}},
		Classes: []Class{
			{Name: "interactive", Priority: 2, TTFT: 60},
			{Name: "standard", Priority: 1, TTFT: 0.5},
		},
		// kvgate's hold would serve what misses its SLO even alone on this
		// idle, quiet fleet (docs/policies.md).
		Policy: "cache-only",
	}
	_, url, _ := startGateway(t, cfg, Options{})
	long := strings.Repeat("word ", 4000) // ~5000 estimate tokens: 5 s at 1000 tok/s
	r := post(t, url+"/v1/completions", completion(long, false, 2), nil)
	if r.status != 429 || r.header.Get("Retry-After") == "" || r.header.Get("X-Should-Retry") != "false" || !strings.Contains(r.body, "rejected before any compute") {
		t.Fatalf("standard class, 5 s predicted against 0.5 s: %d %v %s", r.status, r.header, r.body)
	}
	// A rejection names the request (the client's id, or one kvgate
	// made) and says nothing of a routing that did not happen.
	if id := r.header.Get("X-Request-Id"); !strings.HasPrefix(id, "kvgate-") || r.header.Get("X-Kvgate-Prefill-Endpoint") != "" {
		t.Errorf("the 429's X-Request-Id %q, X-Kvgate-Prefill-Endpoint %q", id, r.header.Get("X-Kvgate-Prefill-Endpoint"))
	}
	if r := post(t, url+"/v1/completions", completion(long, false, 2), map[string]string{"X-Request-Id": "client-7"}); r.status != 429 || r.header.Get("X-Request-Id") != "client-7" {
		t.Errorf("a rejection with the client's id: %d, X-Request-Id %q", r.status, r.header.Get("X-Request-Id"))
	}
	r = post(t, url+"/v1/completions", completion(long, false, 2), map[string]string{"X-Kvgate-Class": "interactive"})
	if r.status != 200 {
		t.Fatalf("interactive class must pass: %d %s", r.status, r.body)
	}
	c.mu.Lock()
	n := len(c.bodies)
	c.mu.Unlock()
	if n != 1 {
		t.Fatalf("the rejected request reached the engine: %d requests upstream", n)
	}
}

func TestEngineDownRetriesElsewhere(t *testing.T) {
	e1, e2, eps := twoAggregated(t)
	cfg := Config{Endpoints: eps, Policy: "round-robin"}
	g, url, admin := startGateway(t, cfg, Options{})
	e1.Close()
	for i := 0; i < 6; i++ {
		r := post(t, url+"/v1/completions", completion(fmt.Sprintf("question %d", i), i%2 == 0, 3), nil)
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		if r.header.Get(hdrPrefill) != e2.Addr() {
			t.Fatalf("request %d served by %s", i, r.header.Get(hdrPrefill))
		}
	}
	// Nothing leaks: every in-flight counter is back to zero.
	waitFor(t, func() bool {
		for _, st := range g.endpointStates() {
			if st.Load.InflightRequests != 0 || st.Load.InflightUncached != 0 {
				return false
			}
		}
		return true
	})
	if m := get(t, admin+"/metrics"); !strings.Contains(m, "kvgate_retries_total ") || strings.Contains(m, "kvgate_retries_total 0") {
		t.Errorf("want retries counted in /metrics")
	}
}

func TestSetEndpointsAddsAndRemoves(t *testing.T) {
	c1, c2 := &capture{}, &capture{}
	u1, u2 := c1.server(t), c2.server(t)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "a", URL: u1.URL, Model: testModel}}}
	g, url, _ := startGateway(t, cfg, Options{})
	if err := g.SetEndpoints([]fleet.Endpoint{{Name: "b", URL: u2.URL, Model: testModel}}); err != nil {
		t.Fatal(err)
	}
	if r := post(t, url+"/v1/completions", completion("x", false, 1), nil); r.header.Get(hdrPrefill) != "b" {
		t.Fatalf("served by %q after a was replaced by b", r.header.Get(hdrPrefill))
	}
	// Pod churn leaks nothing: a's index endpoint is gone.
	for _, s := range g.idx.Stats() {
		if s.Endpoint == "a" {
			t.Fatalf("removed endpoint still in the index: %+v", s)
		}
	}
	if err := g.SetEndpoints([]fleet.Endpoint{{Name: "b", Model: testModel, URL: "ftp://x"}}); err == nil {
		t.Fatal("a bad endpoint list must be refused")
	}
	if r := post(t, url+"/v1/completions", completion("x", false, 1), nil); r.status != 200 {
		t.Fatalf("after a refused update the old list serves: %d", r.status)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 15 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(get(t, url)), v); err != nil {
		t.Fatal(err)
	}
}

// TestHealthTakesEndpointsOutAndBack: an endpoint whose /health fails
// leaves the snapshot and comes back when it recovers; a dead engine the
// proxy keeps failing on is ejected.
func TestHealthTakesEndpointsOutAndBack(t *testing.T) {
	var sick atomic.Bool
	mk := func(name string, flaky bool) fleet.Endpoint {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/health" && flaky && sick.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			io.Copy(io.Discard, r.Body)
			fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
		}))
		t.Cleanup(s.Close)
		return fleet.Endpoint{Name: name, URL: s.URL, Model: testModel}
	}
	eps := []fleet.Endpoint{mk("a", true), mk("b", false)}
	pr, err := health.New(health.Config{Interval: 20 * time.Millisecond, Timeout: time.Second, NoMetrics: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	g, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "round-robin"}, Options{Health: pr})
	sick.Store(true)
	waitFor(t, func() bool {
		for _, st := range g.endpointStates() {
			if st.Name == "a" {
				return !st.Eligible
			}
		}
		return false
	})
	for i := 0; i < 4; i++ {
		if r := post(t, url+"/v1/completions", completion("x", false, 1), nil); r.header.Get(hdrPrefill) != "b" {
			t.Fatalf("sick endpoint served request %d", i)
		}
	}
	sick.Store(false)
	waitFor(t, func() bool {
		seen := map[string]bool{}
		for i := 0; i < 4; i++ {
			seen[post(t, url+"/v1/completions", completion("x", false, 1), nil).header.Get(hdrPrefill)] = true
		}
		return seen["a"] && seen["b"]
	})
}

// TestClientDisconnectCancelsUpstream: a client that goes away mid-stream
// cancels the engine's request, and nothing stays counted in flight.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	cancelled := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(10 * time.Second):
		}
	}))
	defer up.Close()
	g, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel}}}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(completion("x", true, 100)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(resp.Body).ReadString('\n')
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine's request was not cancelled")
	}
	waitFor(t, func() bool {
		st := g.endpointStates()
		return g.inflight.Load() == 0 && st[0].Load.InflightRequests == 0 && st[0].Load.InflightUncached == 0
	})
}

// TestConditionalDisaggregation: in a P/D fleet a request whose uncached
// part on the decode endpoint is short runs there alone.
func TestConditionalDisaggregation(t *testing.T) {
	p := startEngine(t, fleet.RolePrefill, nil)
	d := startEngine(t, fleet.RoleDecode, nil)
	cfg := Config{
		Endpoints:          []fleet.Endpoint{endpointOf(p, fleet.RolePrefill), endpointOf(d, fleet.RoleDecode)},
		Tokenizers:         []string{"model=" + testModel + ",source=engine,url=" + p.URL()},
		LocalPrefillTokens: 64,
	}
	_, url, _ := startGateway(t, cfg, Options{})
	short := post(t, url+"/v1/completions", completion("a short prompt", false, 3), nil)
	if short.status != 200 || short.header.Get(hdrPrefill) != d.Addr() || short.header.Get(hdrDecode) != d.Addr() {
		t.Fatalf("short prompt: %d prefill %s decode %s: %s", short.status, short.header.Get(hdrPrefill), short.header.Get(hdrDecode), short.body)
	}
	// Its reason speaks of the endpoint that served it.
	if why := short.header.Get(hdrReason); !strings.Contains(why, "decode endpoint "+d.Addr()+" computes the prompt itself") {
		t.Errorf("short prompt's reason: %s", why)
	}
	long := post(t, url+"/v1/completions", completion(prefix("long"), false, 3), nil)
	if long.status != 200 || long.header.Get(hdrPrefill) != p.Addr() || long.header.Get(hdrDecode) != d.Addr() {
		t.Fatalf("long prompt: %d prefill %s decode %s", long.status, long.header.Get(hdrPrefill), long.header.Get(hdrDecode))
	}
}

// TestRoleChangeUnderTraffic: changing an endpoint's role (a planner's
// switch) while requests flow races with nothing (go test -race) and
// loses no request.
func TestRoleChangeUnderTraffic(t *testing.T) {
	c := &capture{}
	up := c.server(t)
	eps := func(role fleet.Role) []fleet.Endpoint {
		return []fleet.Endpoint{{Name: "a", URL: up.URL, Model: testModel}, {Name: "b", URL: up.URL, Model: testModel, Role: role}}
	}
	g, url, _ := startGateway(t, Config{Endpoints: eps(fleet.RoleBoth)}, Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 50; i++ {
			role := fleet.RoleBoth
			if i%2 == 0 {
				role = fleet.RolePrefill
			}
			if err := g.SetEndpoints(eps(role)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; i < 40; i++ {
		if r := post(t, url+"/v1/completions", completion("x", false, 1), nil); r.status != 200 && r.status != 502 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	<-done
}

// gauge is the value of the sample named name (with its labels) on the
// admin server's /metrics.
func gauge(t *testing.T, admin, name string) (float64, error) {
	t.Helper()
	m := get(t, admin+"/metrics")
	i := strings.Index(m, name+" ")
	if i < 0 {
		return 0, fmt.Errorf("/metrics lacks %s", name)
	}
	var v float64
	_, err := fmt.Sscan(m[i+len(name):], &v)
	return v, err
}

// waitSubscribed waits until the gateway's KV-event subscriber has made
// its handshake with every engine it follows. An engine publishes a
// request's KV events once: a subscriber not yet connected never hears
// of them, and a test whose few requests come first would wait for
// blocks in vain (on a loaded CI machine the handshake once took longer
// than the test's one request).
func waitSubscribed(t *testing.T, g *Gateway) {
	t.Helper()
	waitFor(t, func() bool {
		st := g.sub.Stats()
		for _, e := range st {
			if e.Connects < 1 {
				return false
			}
		}
		return len(st) > 0
	})
}

// waitIndexed waits until every batch of KV events engine e published
// has reached g's index (quiet: its claims are then the engine's).
func waitIndexed(t *testing.T, g *Gateway, e *engine.Engine) {
	t.Helper()
	waitFor(t, func() bool {
		next := e.KVEventsSeq()
		for _, st := range g.sub.Stats() {
			if st.Endpoint == e.Addr() {
				return next == 0 || st.LastSeq != nil && *st.LastSeq+1 >= next
			}
		}
		return false
	})
}
