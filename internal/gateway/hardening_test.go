package gateway

// Regression tests for defects the attack replay (internal/e2e, build tag
// attack) found in the gateway.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/syncbuf"
	"github.com/kvgate/kvgate/internal/tokens"
)

// tokenPrompt is a completion body whose prompt is n times token id.
func tokenPrompt(id, n int, stream bool) string {
	ids := strings.TrimSuffix(strings.Repeat(fmt.Sprintf("%d,", id), n), ",")
	return fmt.Sprintf(`{"model":%q,"prompt":[%s],"max_tokens":2,"stream":%v}`, testModel, ids, stream)
}

// shedGateway runs a gateway over one upstream (1 000 prompt tokens/s, a
// 0.5 s TTFT SLO) whose clock stands still, so the shedding window never
// ends during the test, and without the hold queue (a request too long
// for its SLO is rejected at once; TestHeldWithEarlyRejection holds it). The upstream holds requests carrying X-Hold until
// the client goes away, and tells held on arrival.
func shedGateway(t *testing.T) (url string, held chan struct{}) {
	held = make(chan struct{}, 16)
	up := holdUpstream(t, &atomic.Int64{}, held)
	now := time.Unix(1000, 0)
	cfg := Config{
		Endpoints:    []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}},
		Classes:      []Class{{Name: "standard", Priority: 1, TTFT: 0.5}, {Name: "low", Priority: 0, TTFT: 0.5}},
		DefaultClass: "standard",
		Hold:         HoldConfig{Mode: HoldOff},
	}
	_, url, _ = startGateway(t, cfg, Options{Now: func() time.Time { return now }})
	return url, held
}

// TestOwnSizeRejectionDoesNotShedClass: a request that misses its SLO on
// an idle endpoint by its own size is rejected, but it says nothing about
// the fleet: the next request of its class is served. (Before, any
// rejection shed the class, so one long prompt a second turned the whole
// class away.)
func TestOwnSizeRejectionDoesNotShedClass(t *testing.T) {
	url, _ := shedGateway(t)
	if r := post(t, url+"/v1/completions", tokenPrompt(7, 600, false), nil); r.status != 429 {
		t.Fatalf("600 tokens at 1000 tok/s against a 0.5 s SLO: %d %s", r.status, r.body)
	}
	for range 3 {
		if r := post(t, url+"/v1/completions", tokenPrompt(7, 10, false), nil); r.status != 200 {
			t.Fatalf("a short request after a long one was rejected: %d %s", r.status, r.body)
		}
	}
}

// TestLoadRejectionShedsLowerClasses: a request that misses its SLO
// because of the queue sheds the classes below its own while the window
// lasts: a short request of a lower class that alone would fit is turned
// away. Its own class is not shed: a short request of it that fits is
// served (before, the class shed itself, and in kvgate demo 556 of 561
// rejections were that shedding).
func TestLoadRejectionShedsLowerClasses(t *testing.T) {
	url, held := shedGateway(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(tokenPrompt(7, 200, true)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Hold", "1")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-held: // 0.2 s of prefill in flight
	case <-time.After(30 * time.Second):
		t.Fatal("the first request never reached the upstream")
	}
	// Alone, 250 tokens take 0.25 s (0.375 s with the predictor's 1.5
	// margin for a new endpoint): they miss 0.5 s only behind the queue.
	if r := post(t, url+"/v1/completions", tokenPrompt(8, 250, false), nil); r.status != 429 {
		t.Fatalf("250 tokens behind 200 in flight: %d %s", r.status, r.body)
	}
	r := post(t, url+"/v1/completions", tokenPrompt(7, 10, false), map[string]string{"X-Kvgate-Class": "low"})
	if r.status != 429 || !strings.Contains(r.body, "higher priority is being rejected") {
		t.Fatalf("a short request of a lower class while the class above is shed: %d %s", r.status, r.body)
	}
	if r := post(t, url+"/v1/completions", tokenPrompt(7, 10, false), nil); r.status != 200 {
		t.Fatalf("a short request of the rejected class itself: %d %s", r.status, r.body)
	}
}

// TestPreparedRequestDropsParsedPrompt: once a request has its block keys
// it holds no parsed prompt (token ids are 4 bytes each where the body
// spends 2), only the raw body, the counts and the keys, so that in-flight
// requests past their large-body slot hold about their body.
func TestPreparedRequestDropsParsedPrompt(t *testing.T) {
	g, err := New(Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: "http://127.0.0.1:1", Model: testModel}}}, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		chat bool
		body string
	}{
		{false, tokenPrompt(7, 1000, false)},
		{false, fmt.Sprintf(`{"model":%q,"prompt":["a b c","d e"]}`, testModel)},
		{true, fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello there"}]}`, testModel)},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(tc.body))
		api := apiCompletions
		if tc.chat {
			api = apiChat
		}
		rt, release, err := g.parse(httptest.NewRecorder(), r, api)
		if err != nil {
			t.Fatal(err)
		}
		err = g.prepare(context.Background(), rt)
		release()
		if err != nil {
			t.Fatal(err)
		}
		if rt.promptN == 0 || len(rt.prep.Keys) == 0 && rt.promptN >= 16 {
			t.Fatalf("%s: %d tokens, %d keys", tc.body[:40], rt.promptN, len(rt.prep.Keys))
		}
		if rt.prep.Tokens != nil || rt.req.Prompt.Tokens != nil || rt.req.Prompt.Texts != nil || rt.req.Messages != nil {
			t.Errorf("%.40s: the parsed prompt is kept after prepare", tc.body)
		}
	}
}

// TestFailedEngineIs502: when the engines refuse the connection or answer
// 5xx (the first choice and the retry), the client gets the last one's
// failure with an OpenAI error body: 502 Bad Gateway for the refused
// connection, the engine's own 500 with its message, never a 500 as if
// the gateway itself had failed.
func TestFailedEngineIs502(t *testing.T) {
	fivexx := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "engine on fire", http.StatusInternalServerError)
	}))
	t.Cleanup(fivexx.Close)
	refused := refusedURL(t)
	// Two endpoints, so that the retry goes to the other one and fails
	// too.
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "fivexx", URL: fivexx.URL, Model: testModel}, {Name: "refused", URL: refused, Model: testModel}}}
	_, url, _ := startGateway(t, cfg, Options{})
	for range 4 {
		r := post(t, url+"/v1/completions", completion("hi", false, 2), nil)
		refused := r.status == http.StatusBadGateway && containsAll(r.body, `"error"`, `"code":502`, "endpoint refused")
		fivexx := r.status == http.StatusInternalServerError && containsAll(r.body, `"error"`, `"code":500`, "endpoint fivexx: engine on fire")
		if !refused && !fivexx {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
}

// TestLoneFailedEngineAnswers: with no other endpoint to retry on, the
// client hears the engine's failure as the engine gave it: its 503, its
// message and its Retry-After, in an OpenAI error body naming it; not a
// 503 of kvgate's saying that no endpoint is healthy while the one that
// failed still is (before 2026-12-02), nor a 502 that dropped the
// engine's status and its Retry-After (until 2026-12-04).
func TestLoneFailedEngineAnswers(t *testing.T) {
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "7")
		http.Error(w, `{"error":{"message":"The server is overloaded or not ready yet."}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(busy.Close)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "busy", URL: busy.URL, Model: testModel}}}
	_, url, admin := startGateway(t, cfg, Options{})
	r := post(t, url+"/v1/completions", completion("hi", false, 2), nil)
	if r.status != http.StatusServiceUnavailable || !containsAll(r.body, `"code":503`, "endpoint busy: The server is overloaded") ||
		r.header.Get("Retry-After") != "7" {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	if m := get(t, admin+"/metrics"); !counted(m, "upstream_error") || counted(m, "unavailable") {
		t.Errorf("not counted as an upstream error:\n%s", m)
	}
}

// TestClientGoneIsNoEngineFailure: clients that give up on a slow engine
// do not count against its health (their requests were called off, the
// engine did not fail); an engine that runs out of upstream_timeout does.
func TestClientGoneIsNoEngineFailure(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(time.Second):
		}
	}))
	t.Cleanup(slow.Close)
	for _, tt := range []struct {
		name    string
		timeout time.Duration // upstream_timeout
		counted bool
	}{{"clients gone", 0, false}, {"upstream timeout", 50 * time.Millisecond, true}} {
		pr, err := health.New(health.Config{Interval: time.Hour, EjectAfter: 2, NoMetrics: true, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pr.Close() })
		cfg := Config{Endpoints: []fleet.Endpoint{{Name: "slow", URL: slow.URL, Model: testModel}}, UpstreamTimeout: tt.timeout}
		_, url, _ := startGateway(t, cfg, Options{Health: pr})
		for range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(completion("hi", false, 2)))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
			cancel()
		}
		st, _ := pr.State("slow")
		if counted := st.PassiveFailures > 0; counted != tt.counted {
			t.Errorf("%s: %d passive failures", tt.name, st.PassiveFailures)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestUpstreamTimeoutWholeRequest: --upstream-timeout bounds the whole
// proxied request, its retry included: an unstreamed answer that runs
// out of it on one engine is not given the whole timeout again on the
// next (a client that set 1 s waited 2 s), and the client gets a 504.
func TestUpstreamTimeoutWholeRequest(t *testing.T) {
	var started atomic.Int64
	slow := func() *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet { // health probes
				return
			}
			started.Add(1)
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; ; i++ { // a word every 50 ms, never ending
				fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w%d \"},\"finish_reason\":null}]}\n\n", testModel, i)
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := slow(), slow()
	eps := []fleet.Endpoint{{Name: "a", URL: a.URL, Model: testModel, Role: fleet.RoleBoth}, {Name: "b", URL: b.URL, Model: testModel, Role: fleet.RoleBoth}}
	const timeout = time.Second
	// With migration too: a stream cut by the timeout is not continued
	// (it was, failed at once, and the client got a 502).
	for _, limit := range []int{0, 1} {
		_, url, _ := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true, UpstreamTimeout: timeout, MigrationLimit: limit}, Options{})
		begin := time.Now()
		r := post(t, url+"/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"x"}],"max_tokens":1000}`, nil)
		took := time.Since(begin)
		if r.status != http.StatusGatewayTimeout {
			t.Fatalf("migration limit %d: status %d %s; want 504", limit, r.status, r.body)
		}
		// Each attempt given the whole timeout took 2 s; one bound, 1 s
		// and the retry's instant failure.
		if took >= 2*timeout-100*time.Millisecond {
			t.Fatalf("migration limit %d: took %v with a %v upstream timeout (%d attempts)", limit, took, timeout, started.Load())
		}
	}
}

// TestHalfAFleet: a disaggregated model with only prefill endpoints up is
// an outage: 503 with Retry-After, outcome unavailable, and /ready says
// so; never early rejection's 429 telling the client not to retry (it
// was, with or without early rejection). With only decode endpoints up,
// they serve requests alone (the engine gets the request as the client
// sent it, no kv_transfer_params), as a decode endpoint serves a short
// prompt under local_prefill_tokens.
func TestHalfAFleet(t *testing.T) {
	for _, role := range []fleet.Role{fleet.RolePrefill, fleet.RoleDecode} {
		for _, early := range []bool{true, false} {
			c := &capture{}
			up := c.server(t)
			cfg := Config{Endpoints: []fleet.Endpoint{{Name: "half", URL: up.URL, Model: testModel, Role: role}}, NoHealthChecks: true}
			cfg.EarlyReject = &early
			_, url, admin := startGateway(t, cfg, Options{})
			r := post(t, url+"/v1/completions", completion("hello there", false, 2), nil)
			resp, err := http.Get(url + "/ready")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			c.mu.Lock()
			bodies := append([]string(nil), c.bodies...)
			c.mu.Unlock()
			if role == fleet.RoleDecode {
				if r.status != 200 || !strings.Contains(r.header.Get(hdrReason), "decode endpoints serve requests alone") || resp.StatusCode != 200 ||
					len(bodies) != 1 || strings.Contains(bodies[0], "kv_transfer_params") {
					t.Errorf("decode only, early rejection %v: %d %v %s; /ready %d; the engine got %q", early, r.status, r.header, r.body, resp.StatusCode, bodies)
				}
				continue
			}
			if r.status != 503 || r.header.Get("Retry-After") == "" || r.header.Get("X-Should-Retry") == "false" || !strings.Contains(r.body, "cannot be served now") {
				t.Errorf("prefill only, early rejection %v: %d %v %s", early, r.status, r.header, r.body)
			}
			if m := get(t, admin+"/metrics"); !counted(m, "unavailable") {
				t.Error("prefill only: not counted unavailable")
			}
			if resp.StatusCode != 503 || len(bodies) != 0 {
				t.Errorf("prefill only: /ready %d, the engine got %d requests", resp.StatusCode, len(bodies))
			}
		}
	}
}

// TestRequestWithoutModel: a chat or completion that names no model is
// served by the fleet's one base model, as vLLM serves it with its own;
// with several models it is a 400 saying so.
func TestRequestWithoutModel(t *testing.T) {
	c := &capture{}
	up := c.server(t)
	one := []fleet.Endpoint{{Name: "a", URL: up.URL, Model: testModel}}
	_, url, _ := startGateway(t, Config{Endpoints: one, NoHealthChecks: true}, Options{})
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
		if path == "/v1/completions" {
			body = `{"prompt":"hi","max_tokens":2}`
		}
		if r := post(t, url+path, body, nil); r.status != 200 {
			t.Errorf("%s without model, one model served: %d %s", path, r.status, r.body)
		}
	}
	two := append(one, fleet.Endpoint{Name: "b", URL: up.URL, Model: "other"})
	_, url, _ = startGateway(t, Config{Endpoints: two, NoHealthChecks: true}, Options{})
	if r := post(t, url+"/v1/completions", `{"prompt":"hi","max_tokens":2}`, nil); r.status != 400 || !strings.Contains(r.body, "model") {
		t.Errorf("without model, two models served: %d %s", r.status, r.body)
	}
}

// TestWarnsOfEventsNoPromptMatches: engines that publish KV events behind
// the default byte-estimate tokenizer index blocks no text prompt finds;
// the gateway says so once per model, and not when the model has a real
// tokenizer (a walkthrough of kvgate kvindex met all-zero lookups and no
// word of why).
func TestWarnsOfEventsNoPromptMatches(t *testing.T) {
	eps := []fleet.Endpoint{
		{Name: "a", URL: "http://127.0.0.1:1", Model: testModel, Events: "tcp://127.0.0.1:2"},
		{Name: "b", URL: "http://127.0.0.1:3", Model: testModel, Events: "tcp://127.0.0.1:4"},
		{Name: "c", URL: "http://127.0.0.1:5", Model: "other"},
	}
	for _, tc := range []struct {
		toks []string
		want int
	}{
		{nil, 1},
		{[]string{"model=" + testModel + ",source=engine,url=http://127.0.0.1:1"}, 0},
	} {
		var buf bytes.Buffer
		g, err := New(Config{Endpoints: eps, Tokenizers: tc.toks}, Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.SetEndpoints(eps[:2]); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(buf.String(), "tokenizer is the byte estimate"); n != tc.want || tc.want == 1 && !strings.Contains(buf.String(), "model="+testModel) {
			t.Errorf("tokenizers %v: %d warnings, want %d:\n%s", tc.toks, n, tc.want, buf.String())
		}
	}
}

// TestShedderKeepsModelsApart: a rejection sheds the lower classes of its
// own model's fleet only; another model's fleet is another fleet (a
// walkthrough saw an idle model's standard requests turned away because
// another model's interactive ones were).
func TestShedderKeepsModelsApart(t *testing.T) {
	var s shedder
	s.reject("m", 2, 10)
	for _, c := range []struct {
		model string
		prio  int
		now   float64
		shed  bool
	}{
		{"m", 1, 10.5, true},   // a lower class of the same model
		{"m", 2, 10.5, false},  // its own class
		{"m2", 1, 10.5, false}, // another model
		{"m", 1, 11.5, false},  // the window is over
	} {
		if got := s.shedding(c.model, c.prio, c.now); got != c.shed {
			t.Errorf("%s priority %d at %.1f: shedding %v, want %v", c.model, c.prio, c.now, got, c.shed)
		}
	}
}

// TestUnknownClassEchoIsBounded: an unknown class name comes back in the
// 400 cut to maxClassEcho bytes (a 60 000-byte header came back whole).
func TestUnknownClassEchoIsBounded(t *testing.T) {
	g, err := New(Config{Endpoints: []fleet.Endpoint{{Name: "a", URL: "http://127.0.0.1:1", Model: testModel}}}, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	r.Header.Set("X-Kvgate-Class", strings.Repeat("x", 60000))
	_, err = g.classOf(r)
	if err == nil || len(err.Error()) > 300 || !strings.Contains(err.Error(), "known: standard") {
		t.Errorf("%d bytes: %.200v", len(fmt.Sprint(err)), err)
	}
}

// TestReadyAfterAModelLeaves: a model whose every endpoint left the fleet
// (renamed, a canary deleted) no longer keeps the gateway unready; a
// model whose endpoints are listed but none is healthy still does (found
// by a walkthrough of discovery: /ready stayed 503 until a restart).
func TestReadyAfterAModelLeaves(t *testing.T) {
	eps := []fleet.Endpoint{
		{Name: "a", URL: upstreamOK(t), Model: testModel},
		{Name: "b", URL: upstreamOK(t), Model: "m2"},
	}
	g, url, admin := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true}, Options{})
	ready := func() int {
		t.Helper()
		resp, err := http.Get(url + "/ready")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := ready(); c != 200 {
		t.Fatalf("both models served: /ready %d", c)
	}
	if err := g.SetEndpoints(eps[:1]); err != nil {
		t.Fatal(err)
	}
	if c := ready(); c != 200 {
		t.Errorf("m2's endpoint gone: /ready %d, want 200", c)
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, `kvgate_endpoint_eligible{endpoint="a",model="`+testModel+`"} 1`) {
		t.Errorf("no eligible gauge for a:\n%s", m)
	}
}

// upstreamOK is an engine stand-in that answers every request with 200.
func upstreamOK(t *testing.T) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, `{"choices":[{"text":"hi"}]}`)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// TestNewURLDropsTheBlocks: an endpoint that keeps its name but gets
// another URL is another engine; the blocks indexed for the old one are
// dropped (a walkthrough saw 560 of 573 tokens claimed cached on an
// engine that had none).
func TestNewURLDropsTheBlocks(t *testing.T) {
	eps := []fleet.Endpoint{{Name: "e", URL: "http://127.0.0.1:1", Model: testModel}, {Name: "f", URL: "http://127.0.0.1:3", Model: testModel}}
	g, err := New(Config{Endpoints: eps, NoHealthChecks: true}, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	keys := tokens.NewHasher(16).Keys(make([]uint32, 64), nil)
	blocks := func(name string) int {
		id := g.members[name].kvID
		for _, m := range g.idx.Lookup(testModel, keys, nil) {
			if m.Endpoint == id {
				return m.Blocks
			}
		}
		return -1
	}
	g.idx.Routed(g.members["e"].kvID, keys)
	g.idx.Routed(g.members["f"].kvID, keys)
	eps[1].Role = fleet.RolePrefill // changed, same URL: its blocks stay
	eps[0].URL = "http://127.0.0.1:2"
	if err := g.SetEndpoints(eps); err != nil {
		t.Fatal(err)
	}
	if e, f := blocks("e"), blocks("f"); e != 0 || f != 4 {
		t.Errorf("after e's new URL: e holds %d blocks (want 0), f %d (want 4)", e, f)
	}
	// Its events socket changed (here: given one): another stream says
	// what it holds; its blocks of before go (removing the socket kept
	// them claimed for ever: walkthrough, 2026-12-04).
	eps[1].Events = "tcp://127.0.0.1:9"
	if err := g.SetEndpoints(eps); err != nil {
		t.Fatal(err)
	}
	if f := blocks("f"); f > 0 {
		t.Errorf("after f's events changed: f holds %d blocks, want 0", f)
	}
}

// TestWarnsOfSharedURL: two endpoint names at one engine's URL are warned
// of once (one engine's load counted as two; a walkthrough met it in
// silence); data-parallel ranks, which share their engine's API, are not.
func TestWarnsOfSharedURL(t *testing.T) {
	var buf bytes.Buffer
	eps := []fleet.Endpoint{
		{Name: "a", URL: "http://127.0.0.1:1", Model: testModel},
		{Name: "b", URL: "http://127.0.0.1:1/", Model: testModel},
		{Name: "r", URL: "http://127.0.0.1:2", Model: testModel, DPSize: 2},
	}
	g, err := New(Config{Endpoints: eps}, Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetEndpoints(eps); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "several endpoints at one URL"); n != 1 || strings.Contains(buf.String(), "127.0.0.1:2") {
		t.Errorf("%d warnings:\n%s", n, buf.String())
	}
}

// TestAppliedConfig: what runs after a reload is the running config with
// the new file's reloadable fields, by restartFields' rule: classes and
// early_reject from the new file, policy and hold.max_requests kept.
func TestAppliedConfig(t *testing.T) {
	on, off := true, false
	run := &Config{Policy: "kvgate", EarlyReject: &on, Classes: []Class{{Name: "a"}}, Hold: HoldConfig{MaxRequests: 10, Min: 1}}
	next := &Config{Policy: "round-robin", EarlyReject: &off, Classes: []Class{{Name: "b"}}, Hold: HoldConfig{MaxRequests: 20, Min: 2}}
	got := applied(run, next)
	if got.Policy != "kvgate" || *got.EarlyReject || got.Classes[0].Name != "b" || got.Hold.MaxRequests != 10 || got.Hold.Min != 2 {
		t.Errorf("applied: %+v", got)
	}
	if r := restartFields(run, next); !slices.Equal(r, []string{"policy", "hold.max_requests"}) {
		t.Errorf("restart fields %v", r)
	}
}

// TestBackFromOutDropsApproximateBlocks: an endpoint without KV events
// that the health checks took out and brought back may have restarted
// with an empty cache: what kvgate's routing put in the index for it is
// dropped; an endpoint that stayed in keeps its own (a walkthrough met a
// restarted engine claimed to hold 992 cached tokens, predicted at 2.5 ms
// for a 131 ms answer).
func TestBackFromOutDropsApproximateBlocks(t *testing.T) {
	var down atomic.Bool
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer flaky.Close()
	steady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	defer steady.Close()
	pr, err := health.New(health.Config{Interval: 10 * time.Millisecond, Timeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	eps := []fleet.Endpoint{{Name: "e", URL: flaky.URL, Model: testModel}, {Name: "f", URL: steady.URL, Model: testModel}}
	g, err := New(Config{Endpoints: eps}, Options{Logger: quiet(), Health: pr})
	if err != nil {
		t.Fatal(err)
	}
	keys := tokens.NewHasher(16).Keys(make([]uint32, 64), nil)
	blocks := func(name string) int {
		g.mu.Lock()
		id := g.members[name].kvID
		g.mu.Unlock()
		for _, m := range g.idx.Lookup(testModel, keys, nil) {
			if m.Endpoint == id {
				return m.Blocks
			}
		}
		return 0
	}
	available := func(name string) bool { return pr.Available(name) }
	waitFor(t, func() bool { return available("e") && available("f") })
	g.mu.Lock()
	g.idx.Routed(g.members["e"].kvID, keys)
	g.idx.Routed(g.members["f"].kvID, keys)
	g.mu.Unlock()
	down.Store(true)
	waitFor(t, func() bool { return !available("e") })
	g.refresh()
	if e := blocks("e"); e != 4 {
		t.Fatalf("while out: e holds %d blocks, want its 4 kept (it may come back as it was)", e)
	}
	down.Store(false)
	waitFor(t, func() bool { return available("e") })
	g.refresh()
	if e, f := blocks("e"), blocks("f"); e != 0 || f != 4 {
		t.Errorf("back from out: e holds %d blocks (want 0), f %d (want 4)", e, f)
	}
}

// TestNoProbesStillEjects: with the active checks off (kvgate serve
// --no-health-checks) an endpoint whose requests fail is still ejected,
// and the metrics say so, where every request went to it first for good
// (round-robin: 14 of 14 first tried there, the endpoint "eligible").
func TestNoProbesStillEjects(t *testing.T) {
	_, url, admin := deadBesideLive(t, health.Config{NoProbes: true, Logger: quiet()}, quiet())
	for i := range 10 {
		if r := post(t, url+"/v1/completions", completion(fmt.Sprintf("q %d", i), false, 2), nil); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	m := get(t, admin+"/metrics")
	if !strings.Contains(m, `kvgate_endpoint_eligible{endpoint="dead",model="`+testModel+`"} 0`) || strings.Contains(m, "kvgate_endpoint_healthy{") {
		t.Errorf("dead not ejected, or a healthy gauge without checks:\n%s", grepLines(m, "kvgate_endpoint_"))
	}
	var retries int
	for _, line := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(line, "kvgate_retries_total "); ok {
			retries, _ = strconv.Atoi(v)
		}
	}
	if retries > health.DefaultEjectAfter {
		t.Errorf("%d retries: the dead endpoint kept being tried", retries)
	}
}

// TestPassiveEjectionEndIsTold: the end of a passive ejection is logged
// (nothing told it: the active checks log their own recoveries).
func TestPassiveEjectionEndIsTold(t *testing.T) {
	var logged syncbuf.Buffer
	pr, url, _ := deadBesideLive(t, health.Config{NoProbes: true, EjectBase: 50 * time.Millisecond, Logger: quiet()},
		slog.New(slog.NewTextHandler(&logged, nil)))
	for i := 0; pr.Available("dead"); i++ { // until its failures eject it
		if i > 50 {
			t.Fatal("the dead endpoint never ejected")
		}
		post(t, url+"/v1/completions", completion(fmt.Sprintf("q %d", i), false, 2), nil)
	}
	waitFor(t, func() bool { return strings.Contains(logged.String(), "endpoint back from its passive ejection") })
	if !strings.Contains(logged.String(), "endpoint=dead") {
		t.Errorf("not named:\n%s", logged.String())
	}
}

// deadBesideLive is a round-robin gateway over a live engine and an
// endpoint "dead" that refuses connections, with the prober hc and its
// own logger log; it returns the prober and the gateway's URLs.
func deadBesideLive(t *testing.T, hc health.Config, log *slog.Logger) (*health.Prober, string, string) {
	t.Helper()
	e1 := startEngine(t, fleet.RoleBoth, nil)
	pr, err := health.New(hc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pr.Close)
	eps := []fleet.Endpoint{endpointOf(e1, fleet.RoleBoth), {Name: "dead", URL: refusedURL(t), Model: testModel}}
	_, url, admin := startGateway(t, Config{Endpoints: eps, Policy: "round-robin", NoHealthChecks: true}, Options{Health: pr, Logger: log})
	return pr, url, admin
}

// TestMetricsFromTheStart: the request series of every outcome, class and
// the policy are exported at 0 before any request (rate() lost the first
// event), the classes' TTFT targets are bucket bounds of the TTFT
// histogram (2 s fell inside 1.28–2.56), and an answer within its target
// counts in kvgate_ttft_slo_met_total (attainment could not be read).
func TestMetricsFromTheStart(t *testing.T) {
	e1 := startEngine(t, fleet.RoleBoth, nil)
	classes := []Class{{Name: "interactive", Priority: 2, TTFT: 1.5}, {Name: "batch", Priority: 0}}
	base := Config{Endpoints: []fleet.Endpoint{endpointOf(e1, fleet.RoleBoth)}, Policy: "kvgate", Classes: classes}
	g, url, admin := startGateway(t, base, Options{})
	m := get(t, admin+"/metrics")
	for _, want := range []string{
		`kvgate_requests_total{class="interactive",model="gw-model",outcome="ok",policy="kvgate"} 0`,
		`kvgate_requests_total{class="batch",model="gw-model",outcome="upstream_error",policy="kvgate"} 0`,
		`kvgate_requests_total{class="",model="",outcome="tokenizer_error",policy="kvgate"} 0`,
		`kvgate_rejections_total{class="interactive"} 0`,
		`kvgate_ttft_seconds_bucket{class="interactive",model="gw-model",le="1.5"} 0`,
		`kvgate_ttft_slo_met_total{class="interactive",model="gw-model"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("before any request, no %s", want)
		}
	}
	hdr := map[string]string{"X-Kvgate-Class": "interactive"}
	if r := post(t, url+"/v1/completions", completion("hello there", true, 2), hdr); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// A model the fleet does not serve is counted under model "": a
	// client's names make no series.
	if r := post(t, url+"/v1/completions", `{"model":"nope-7","prompt":"a"}`, nil); r.status != 404 {
		t.Fatalf("unknown model: %d", r.status)
	}
	m = get(t, admin+"/metrics")
	if strings.Contains(m, "nope-7") || !strings.Contains(m, `model="",outcome="bad_request",policy="kvgate"} 1`) {
		t.Errorf("the unknown model's request:\n%s", grepLines(m, "bad_request"))
	}
	if !strings.Contains(m, `kvgate_ttft_slo_met_total{class="interactive",model="gw-model"} 1`) || !strings.Contains(m, `kvgate_requests_total{class="interactive",model="gw-model",outcome="ok",policy="kvgate"} 1`) {
		t.Errorf("after one answer in time:\n%s", grepLines(m, "interactive"))
	}
	// A class a reload adds is exported at 0 too (it was not until its
	// first request; walkthrough, 2026-12-04).
	next := base
	next.Classes = append(slices.Clone(classes), Class{Name: "premium", Priority: 3, TTFT: 0.3})
	next.DefaultClass = "batch"
	if _, err := g.Reload(next); err != nil {
		t.Fatal(err)
	}
	m = get(t, admin+"/metrics")
	for _, want := range []string{
		`kvgate_requests_total{class="premium",model="gw-model",outcome="rejected",policy="kvgate"} 0`,
		`kvgate_rejections_total{class="premium"} 0`,
		`kvgate_ttft_slo_met_total{class="premium",model="gw-model"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("after the reload, no %s", want)
		}
	}
}

// TestBackFromOutForgetsTheSpeed: an endpoint the health checks bring back
// from out may have restarted as another engine: what the predictor
// learned of it starts again (one restarted 4× faster kept its old speed
// and was left idle).
func TestBackFromOutForgetsTheSpeed(t *testing.T) {
	e1 := startEngine(t, fleet.RoleBoth, nil)
	target, _ := url.Parse(e1.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	var down atomic.Bool
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() && r.URL.Path == "/health" {
			http.Error(w, "restarting", http.StatusServiceUnavailable)
			return
		}
		// The body is read whole first (as in dprank_test.go): streamed
		// on, the server closed it under the proxy once the engine's
		// answer began, and the transport dropped the upstream connection
		// mid-answer ("use of closed network connection": a 502 in 3 of
		// 40 runs on a busy machine).
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()
	pr, err := health.New(health.Config{Interval: 10 * time.Millisecond, Timeout: time.Second, NoMetrics: true, NoModels: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	ep := fleet.Endpoint{Name: "e", URL: front.URL, Model: testModel, PrefillSpeed: 20000 * 50}
	g, gw, admin := startGateway(t, Config{Endpoints: []fleet.Endpoint{ep}}, Options{Health: pr})
	waitFor(t, func() bool { return pr.Available("e") })
	samples := func() int {
		for _, st := range adminEndpoints(t, admin) {
			if st.Name == "e" && st.Predictor != nil {
				return st.Predictor.Samples
			}
		}
		return -1
	}
	for i := range 6 {
		if r := post(t, gw+"/v1/completions", completion(fmt.Sprintf("story %d %s", i, strings.Repeat("w ", 200)), true, 2), nil); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	waitFor(t, func() bool { return samples() > 0 })
	down.Store(true)
	waitFor(t, func() bool { return !pr.Available("e") })
	g.refresh()
	down.Store(false)
	waitFor(t, func() bool { return pr.Available("e") })
	g.refresh()
	if n := samples(); n != 0 {
		t.Errorf("back from out: %d samples of its own kept, want 0", n)
	}
}

// TestEngineThatLostItsCacheIsNotClaimed: an engine without KV events that
// answers a prompt the index claimed cached with none cached (a restart
// too quick for the health checks; here its cache reset) loses its
// approximate entries: the next prompt routed there before is no longer
// claimed cached (every request after such a restart was claimed, and
// predicted in 3 ms for 130).
func TestEngineThatLostItsCacheIsNotClaimed(t *testing.T) {
	for _, api := range []string{"completions", "chat", "pd"} {
		t.Run(api, func(t *testing.T) {
			role := fleet.RoleBoth
			if api == "pd" { // its prefill leg's count (it was not read)
				role = fleet.RolePrefill
			}
			e1 := startEngine(t, role, nil)
			ep := endpointOf(e1, role)
			ep.Events, ep.Replay = "", ""
			eps := []fleet.Endpoint{ep}
			if api == "pd" {
				eps = append(eps, endpointOf(startEngine(t, fleet.RoleDecode, nil), fleet.RoleDecode))
			}
			_, gw, _ := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true}, Options{})
			claimed := func(prompt string, stream bool) int {
				t.Helper()
				path, body := "/v1/completions", completion(prompt, stream, 2)
				if api == "chat" {
					b, _ := json.Marshal(map[string]any{"model": testModel, "messages": []map[string]string{{"role": "user", "content": prompt}},
						"max_tokens": 2, "stream": stream, "stream_options": map[string]bool{"include_usage": stream}})
					path, body = "/v1/chat/completions", string(b)
					if !stream {
						body = strings.Replace(body, `,"stream_options":{"include_usage":false}`, "", 1)
					}
				}
				r := post(t, gw+path, body, nil)
				if r.status != 200 {
					t.Fatalf("%d %s", r.status, r.body)
				}
				n, _ := strconv.Atoi(r.header.Get("X-Kvgate-Cached-Tokens"))
				return n
			}
			a, b, c := prefix("a")+" question a", prefix("b")+" question b", prefix("c")+" question c"
			claimed(a, false)
			claimed(b, false)
			claimed(c, false)
			if n := claimed(c, true); n == 0 {
				t.Fatal("a prompt routed before not claimed cached")
			}
			resp, err := http.Post(e1.URL()+"/reset_prefix_cache", "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			// One miss may be a conversation evicted whole; two in a row
			// say the engine lost its cache.
			for _, p := range []string{a, b} {
				if n := claimed(p, false); n == 0 {
					t.Fatal("the index should still claim it (nothing told it yet)")
				}
			}
			if n := claimed(c, false); n != 0 {
				t.Errorf("after the engine answered two claimed prompts with nothing cached, c still claimed %d cached tokens", n)
			}
		})
	}
}

// TestExplainKeptOnTheHolder: a choice kept on its prefix's holder beyond
// the conversation balance (its cost +Inf there) is explained by the copy,
// not as "cost +Inf vs next best" (a walkthrough read it as the worst
// endpoint chosen).
func TestExplainKeptOnTheHolder(t *testing.T) {
	g := &Gateway{policy: "kvgate"}
	s := &sched.Snapshot{Endpoints: []sched.Endpoint{{Name: "e1"}, {Name: "e2"}}}
	d := &sched.Decision{Admit: true, Prefill: 0, CachedTokens: 16, PredictedTTFT: 0.005, Costs: []float64{math.Inf(1), 0.013}, CopyTokens: 16, CopyTo: 1}
	got := g.explain(s, d, 18)
	if strings.Contains(got, "Inf") || !strings.Contains(got, "kept on its prefix's holder, its first 16 tokens copied to e2") {
		t.Errorf("%q", got)
	}
	d.Costs[0], d.CopyTokens = 0.01, 0
	if got := g.explain(s, d, 18); !strings.Contains(got, "cost 0.01 vs next best e2 0.013") {
		t.Errorf("%q", got)
	}
}

// TestEngineAPIKey: engines run with an API key (vLLM's --api-key) are
// sent it on every request kvgate makes, its clients' (which carry none)
// and its own (the probes' /v1/models); GET /admin/config says it is set,
// not what it is. Without it, the clients' requests got the engines' 401
// and the probes' adapter listing failed.
func TestEngineAPIKey(t *testing.T) {
	e1 := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.APIKey = "sk-engines" })
	for _, key := range []string{"", "sk-engines"} {
		t.Run("key="+key, func(t *testing.T) {
			var logged syncbuf.Buffer
			pr, err := health.New(health.Config{Interval: 10 * time.Millisecond, Timeout: time.Second, APIKey: key, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			_, gw, admin := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(e1, fleet.RoleBoth)}, EngineAPIKey: key}, Options{Health: pr})
			want := 200
			if key == "" {
				want = 401
			}
			if r := post(t, gw+"/v1/completions", completion("hello", false, 2), nil); r.status != want {
				t.Fatalf("%d %s, want %d", r.status, r.body, want)
			}
			waitFor(t, func() bool {
				st, _ := pr.State(e1.Addr())
				return st.Probes >= 12 // every fifth lists /v1/models
			})
			st, _ := pr.State(e1.Addr())
			if listed := st.ModelsError == ""; listed != (key != "") {
				t.Errorf("models listing error %q with key %q", st.ModelsError, key)
			}
			// Without the key it is told, once (it was a silent outage).
			if n := strings.Count(logged.String(), "refuses kvgate's requests without an API key"); n != map[bool]int{true: 1, false: 0}[key == ""] {
				t.Errorf("told %d times with key %q:\n%s", n, key, logged.String())
			}
			if key != "" {
				if c := get(t, admin+"/admin/config"); strings.Contains(c, key) || !strings.Contains(c, "engine_api_key: <set>") {
					t.Errorf("/admin/config shows the key, or not that it is set:\n%s", c)
				}
			}
		})
	}
}
