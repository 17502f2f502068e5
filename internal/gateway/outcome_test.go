package gateway

// Regression tests for the outcome label of kvgate_requests_total: what a
// request that fails before it is routed is counted as, and what its
// client is told.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/openai"
)

// outcomes is kvgate_requests_total by outcome (summed over class and
// policy), read from the gateway's registry.
func outcomes(t *testing.T, g *Gateway) map[string]int {
	t.Helper()
	mfs, err := g.met.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v := int(m.GetCounter().GetValue()); lp.GetName() == "outcome" && v > 0 {
					out[lp.GetValue()] += v // the series exported at 0 left out
				}
			}
		}
	}
	return out
}

// outcomesSince is what was counted since before (outcomes).
func outcomesSince(t *testing.T, g *Gateway, before map[string]int) map[string]int {
	t.Helper()
	d := map[string]int{}
	for k, v := range outcomes(t, g) {
		if n := v - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

// fakeTokenizer is an engine's POST /tokenize whose answer the prompt
// chooses: one containing "tok-fail" gets 500; "tok-long" the 400 of a
// vLLM whose /tokenize checks max_model_len; "tok-silent" no answer
// until the caller gives up; "tok-hold" no answer until release is
// closed. Those two tell arrived first. Anything else is tokenized.
type fakeTokenizer struct {
	url     string
	arrived chan struct{}
	release chan struct{}
}

func newFakeTokenizer(t *testing.T) *fakeTokenizer {
	tk := &fakeTokenizer{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt string `json:"prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		switch {
		case strings.Contains(req.Prompt, "tok-fail"):
			http.Error(w, "tokenizer on fire", http.StatusInternalServerError)
			return
		case strings.Contains(req.Prompt, "tok-long"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"This model's maximum context length is 2048 tokens. However, your request has 4301 input tokens. Please reduce the length of the input prompt.","type":"BadRequestError","param":"max_model_len","code":400}}`)
			return
		case strings.Contains(req.Prompt, "tok-silent"), strings.Contains(req.Prompt, "tok-hold"):
			select {
			case tk.arrived <- struct{}{}:
			default: // nobody is counting
			}
			select {
			case <-tk.release:
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Second): // never outlive the test
				return
			}
		}
		ids := make([]int, len(req.Prompt)/4+1)
		for i := range ids {
			ids[i] = i + 1
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids)})
	}))
	t.Cleanup(s.Close)
	tk.url = s.URL
	return tk
}

// tokGateway is a gateway over one upstream answering every completion,
// whose model is tokenized by tk, with mut applied to its config.
func tokGateway(t *testing.T, tk *fakeTokenizer, o Options, mut func(*Config)) (*Gateway, string) {
	t.Helper()
	up := (&capture{}).server(t)
	cfg := Config{
		Endpoints:  []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel}},
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + tk.url},
	}
	if mut != nil {
		mut(&cfg)
	}
	g, url, _ := startGateway(t, cfg, o)
	return g, url
}

// TestOutcomeBeforeRouting: a request that fails before it is routed is
// counted by whose fault it is, and told so. A malformed or refused
// request is bad_request (4xx); a tokenizer that fails, cannot be reached
// or does not answer in time is tokenizer_error, and the client gets 502
// or 504, never a 4xx. (Before, all of them were bad_request, and an
// unknown model unavailable.)
func TestOutcomeBeforeRouting(t *testing.T) {
	tk := newFakeTokenizer(t)
	refused := refusedURL(t)
	mut := func(c *Config) {
		c.HTTP = httpserve.Config{MaxBodyBytes: 4096}
		c.Tokenizers = append(c.Tokenizers, "model=gw-unreachable,source=engine,url="+refused)
	}
	// Only a tokenizer that never answers may time out: the other cases
	// must not depend on how fast a busy machine is.
	type rig struct {
		g   *Gateway
		url string
	}
	var long, short rig
	long.g, long.url = tokGateway(t, tk, Options{TokenizeTimeout: time.Hour}, mut)
	// The short rig's engine is the tokenizer itself: no other engine
	// to ask when it does not answer (a tokenization's tries share its
	// deadline, and the rig's engine answers /tokenize without tokens).
	short.g, short.url = tokGateway(t, tk, Options{TokenizeTimeout: 100 * time.Millisecond}, func(c *Config) {
		mut(c)
		c.Endpoints[0].URL = tk.url
	})
	for _, tc := range []struct {
		name    string
		method  string
		body    string
		hdr     map[string]string
		short   bool // on the gateway with a short tokenize timeout
		status  int
		outcome string
		says    string // in the answer's body
	}{
		{name: "served", body: completion("hello", false, 2), status: 200, outcome: "ok"},
		{name: "malformed JSON", body: `{"model":`, status: 400, outcome: "bad_request"},
		{name: "no prompt", body: `{"model":"` + testModel + `"}`, status: 400, outcome: "bad_request"},
		{name: "bad max_tokens", body: completion("a", false, 0), status: 400, outcome: "bad_request"},
		{name: "unknown class", body: completion("a", false, 1), hdr: map[string]string{"X-Kvgate-Class": "gold"}, status: 400, outcome: "bad_request"},
		{name: "unknown model", body: `{"model":"nope","prompt":"a"}`, status: 404, outcome: "bad_request"},
		{name: "too large", body: completion(strings.Repeat("x", 5000), false, 1), status: 413, outcome: "bad_request"},
		{name: "not POST", method: http.MethodPut, body: completion("a", false, 1), status: 405, outcome: "bad_request"},
		{name: "tokenizer fails", body: completion("tok-fail", false, 1), status: 502, outcome: "tokenizer_error"},
		// The engine's refusal of the prompt is the client's 400, with
		// the engine's message and param (before: a 502, the gateway's).
		{name: "tokenizer refuses the prompt", body: completion("tok-long", false, 1), status: 400, outcome: "bad_request",
			says: `"message":"This model's maximum context length is 2048 tokens. However, your request has 4301 input tokens. Please reduce the length of the input prompt.","type":"BadRequestError","param":"max_model_len"`},
		{name: "tokenizer unreachable", body: `{"model":"gw-unreachable","prompt":"a"}`, status: 502, outcome: "tokenizer_error"},
		{name: "tokenizer times out", body: completion("tok-silent", false, 1), short: true, status: 504, outcome: "tokenizer_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, url := long.g, long.url
			if tc.short {
				g, url = short.g, short.url
			}
			before := outcomes(t, g)
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req, _ := http.NewRequest(method, url+"/v1/completions", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("status %d (%s), want %d", resp.StatusCode, b, tc.status)
			}
			if tc.status != 200 && !strings.Contains(string(b), fmt.Sprintf(`"code":%d`, tc.status)) {
				t.Errorf("not an OpenAI error body with its code: %s", b)
			}
			if !strings.Contains(string(b), tc.says) {
				t.Errorf("answer %s does not say %s", b, tc.says)
			}
			// The outcome is counted before the answer is written.
			if got, want := outcomesSince(t, g, before), map[string]int{tc.outcome: 1}; !maps.Equal(got, want) {
				t.Errorf("counted %v, want %v", got, want)
			}
		})
	}
}

// TestClientGoneBeforeRouting: a client that hangs up while its body is
// read, or while its prompt is being tokenized, is client_gone (before,
// bad_request).
func TestClientGoneBeforeRouting(t *testing.T) {
	tk := newFakeTokenizer(t)
	// A tokenizer timeout far beyond the test: only the client ends the
	// wait.
	g, url := tokGateway(t, tk, Options{TokenizeTimeout: time.Hour}, nil)
	t.Run("hangs up while its body is read", func(t *testing.T) {
		before := outcomes(t, g)
		c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
		c.Close()
		waitFor(t, func() bool { return len(outcomesSince(t, g, before)) > 0 })
		if got, want := outcomesSince(t, g, before), map[string]int{"client_gone": 1}; !maps.Equal(got, want) {
			t.Errorf("counted %v, want %v", got, want)
		}
	})
	t.Run("cancels while tokenized", func(t *testing.T) {
		before := outcomes(t, g)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(completion("tok-silent", false, 1)))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		select {
		case <-tk.arrived:
		case <-time.After(15 * time.Second):
			t.Fatal("the request never reached the tokenizer")
		}
		cancel()
		<-done
		waitFor(t, func() bool { return len(outcomesSince(t, g, before)) > 0 })
		if got, want := outcomesSince(t, g, before), map[string]int{"client_gone": 1}; !maps.Equal(got, want) {
			t.Errorf("counted %v, want %v", got, want)
		}
	})
}

// TestSlowBodyIsBadRequest: a body that does not arrive within the read
// timeout gets 408 and is bad_request, not client_gone: the client is
// still there (net/http cancels the request's context on the deadline all
// the same).
func TestSlowBodyIsBadRequest(t *testing.T) {
	up := (&capture{}).server(t)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel}},
		HTTP: httpserve.Config{ReadTimeout: 50 * time.Millisecond}}
	g, err := New(cfg, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpserve.Deadlines(g.cfg.HTTP, g.Handler()))
	t.Cleanup(srv.Close)
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Headers and the body's first byte, then nothing.
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("status %d, want 408", resp.StatusCode)
	}
	if got, want := outcomes(t, g), map[string]int{"bad_request": 1}; !maps.Equal(got, want) {
		t.Errorf("counted %v, want %v", got, want)
	}
}

// TestLargeBodyWaitIsOverloaded: a large body that finds no large-body
// slot within its wait gets 503 with Retry-After and is counted
// overloaded (before, bad_request).
func TestLargeBodyWaitIsOverloaded(t *testing.T) {
	tk := newFakeTokenizer(t)
	g, url := tokGateway(t, tk, Options{TokenizeTimeout: time.Hour}, func(c *Config) {
		c.HTTP = httpserve.Config{LargeBodyBytes: 1024, MaxLargeBodies: 1, LargeBodyWait: 50 * time.Millisecond}
	})
	pad := strings.Repeat("word ", 400) // 2 000 bytes: a large body
	first := make(chan result, 1)
	go func() { first <- post(t, url+"/v1/completions", completion("tok-hold "+pad, false, 1), nil) }()
	select {
	case <-tk.arrived: // the first holds the only slot while it is tokenized
	case <-time.After(15 * time.Second):
		t.Fatal("the first request never reached the tokenizer")
	}
	before := outcomes(t, g)
	r := post(t, url+"/v1/completions", completion(pad, false, 1), nil)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Errorf("no slot: %d %v %s", r.status, r.header, r.body)
	}
	if got, want := outcomesSince(t, g, before), map[string]int{"overloaded": 1}; !maps.Equal(got, want) {
		t.Errorf("counted %v, want %v", got, want)
	}
	close(tk.release)
	if r := <-first; r.status != 200 {
		t.Fatalf("the request holding the slot: %d %s", r.status, r.body)
	}
}

// TestEngineRefusalIsRelayedNotLearned: an engine's 4xx (vLLM's 400 for a
// prompt beyond the model's context) reaches the client as the engine
// wrote it, counts as engine_refused (not ok), is not retried elsewhere,
// and its instant first byte does not train the predictor as a prefill.
func TestEngineRefusalIsRelayedNotLearned(t *testing.T) {
	var seen atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		seen.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"message":"This model's maximum context length is 2048 tokens.","type":"BadRequestError","code":400}}`)
	}))
	t.Cleanup(up.Close)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "a", URL: up.URL, Model: testModel, PrefillSpeed: 1000},
		{Name: "b", URL: up.URL + "/", Model: testModel, PrefillSpeed: 1000}}}
	g, url, admin := startGateway(t, cfg, Options{})
	before := outcomes(t, g)
	for range 4 {
		r := post(t, url+"/v1/completions", tokenPrompt(7, 50, true), nil)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, "maximum context length") {
			t.Fatalf("engine refusal: %d %s", r.status, r.body)
		}
	}
	if got := outcomesSince(t, g, before); got["engine_refused"] != 4 || len(got) != 1 {
		t.Fatalf("outcomes %v, want 4 engine_refused", got)
	}
	if seen.Load() != 4 {
		t.Fatalf("the engines saw %d requests, want 4 (no retry)", seen.Load())
	}
	for _, e := range adminEndpoints(t, admin) {
		if e.Predictor != nil && e.Predictor.Samples != 0 {
			t.Errorf("endpoint %s: %d predictor samples from refusals", e.Name, e.Predictor.Samples)
		}
	}
}

func TestHoldOutcome(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{"client left", gone, context.Canceled, outcomeClientGone},
		{"held past its deadline", context.Background(), openai.Unavailable(time.Second, "no endpoint"), outcomeUnavailable},
		{"queue full", context.Background(), openai.TooManyRequests(time.Second, "full"), outcomeHoldFull},
		{"queue refused", context.Background(), openai.Errorf(http.StatusInternalServerError, "kvgate: bad held request"), outcomeInternalError},
	} {
		if got := holdOutcome(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// counted reports whether the metrics text m counts a request of outcome
// (a series at 0, exported from the start, is none).
func counted(m, outcome string) bool {
	for _, line := range strings.Split(m, "\n") {
		if strings.HasPrefix(line, "kvgate_requests_total{") && strings.Contains(line, `outcome="`+outcome+`"`) && !strings.HasSuffix(line, " 0") {
			return true
		}
	}
	return false
}

// refusedURL is the URL of a loopback port nothing listens on: a
// connection there is refused at once.
func refusedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "http://" + ln.Addr().String()
}
