package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
)

// viaBreakerStream sends a streamed body until round-robin sends it to the
// breaker (the first or the second time) and returns what the client read.
func viaBreakerStream(t *testing.T, url, body string, b *breaker) streamed {
	t.Helper()
	var s streamed
	untilBreaker(t, b, func() { s = readStream(t, url, body) })
	return s
}

// TestBrokenBeforeTheClientHadAByte: an engine that fails before the
// client has any byte of its answer is retried on another engine, however
// it failed: inside its stream's first line (which the tap holds back
// until whole: the client had no byte, yet the gateway took the answer
// as begun and the client got an empty reply, no status), with a 200 and
// no body (the client got an empty 200 counted ok, or with migration
// another engine's SSE under the first's JSON headers), or, for an
// answer assembled whole, with an event that is not JSON (a 502 while
// another engine was free). Found by a walkthrough with a misbehaving
// fake engine (2026-12-04).
func TestBrokenBeforeTheClientHadAByte(t *testing.T) {
	chat := func(stream bool) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"tell me"}],"max_tokens":20,"stream":%v}`, testModel, stream)
	}
	for _, c := range []struct {
		fail   string
		stream bool
		limit  int
	}{
		{"firstline", true, 0}, {"firstline", true, 1}, {"firstline", false, 0},
		{"empty", true, 0}, {"empty", true, 1}, {"empty", false, 0}, {"empty", false, 1},
		{"badjson", false, 0},
		// The engine's own 5xx error event, before or after tokens: an
		// answer assembled whole has no byte at the client yet (it got
		// the engine's 500, counted ok).
		{"errevent", false, 0},
		// The same before the answer's first event, streamed too: the
		// client got a 200 and the event, which the SDK raised without
		// a status (and so did not retry).
		{"errfirst", true, 0}, {"errfirst", false, 0},
	} {
		t.Run(fmt.Sprintf("%s stream=%v limit %d", c.fail, c.stream, c.limit), func(t *testing.T) {
			b := &breaker{words: 5, fail: c.fail}
			url, admin, e := migrationFleet(t, b, c.limit)
			var from, ct, text string
			if c.stream {
				s := viaBreakerStream(t, url+"/v1/chat/completions", chat(true), b)
				if s.status != 200 || s.readErr != nil || s.done != 1 || s.finish == "" {
					t.Fatalf("status %d, read %v, %d [DONE], finish %q:\n%s", s.status, s.readErr, s.done, s.finish, s.raw)
				}
				from, text = s.endpoint, s.text
				ct = "text/event-stream"
			} else {
				r := viaBreaker(t, url+"/v1/chat/completions", chat(false), b)
				if r.status != 200 {
					t.Fatalf("%d %s", r.status, r.body)
				}
				from, ct = r.header.Get(hdrPrefill), r.header.Get("Content-Type")
				text, _, _ = wholeChat(t, r.body)
				if r.header.Get("X-Engine") != "" {
					t.Errorf("the breaker's header reached the client")
				}
			}
			if from != e.Addr() || strings.HasPrefix(text, "w0") || text == "" {
				t.Errorf("answered by %q with %q; want the emulator's answer", from, text)
			}
			if got := ct; !strings.HasPrefix(got, "text/event-stream") && c.stream || !c.stream && !strings.HasPrefix(got, "application/json") {
				t.Errorf("Content-Type %q", got)
			}
			m := get(t, admin+"/metrics")
			if !strings.Contains(m, "kvgate_retries_total 1") || !strings.Contains(m, `kvgate_requests_total{class="standard",model="gw-model",outcome="ok"`) {
				t.Errorf("want one retry and an ok outcome:\n%s", grepLines(m, "kvgate_re"))
			}
		})
	}
}

// TestBrokenAloneIsAnError: with nowhere to retry, a streaming client
// whose engine broke before it had any byte gets a 502 naming the engine
// and why (it got an empty reply), and one whose stream ended cleanly but before its
// answer's end (no finish reason, no [DONE]) reads an incomplete body and
// is counted a broken stream (it was counted ok).
func TestBrokenAloneIsAnError(t *testing.T) {
	for _, fail := range []string{"firstline", "empty", "eof", "errfirst"} {
		t.Run(fail, func(t *testing.T) {
			b := &breaker{words: 5, fail: fail}
			srv := b.server(t)
			eps := []fleet.Endpoint{{Name: "breaker", URL: srv.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 20000 * 50}}
			_, url, admin := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true}, Options{})
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"x"}],"max_tokens":20,"stream":true}`, testModel)
			switch fail {
			case "eof":
				s := readStream(t, url+"/v1/chat/completions", body)
				if s.status != 200 || s.readErr == nil || s.done != 0 {
					t.Fatalf("want a body that breaks: status %d, read %v, %d [DONE]", s.status, s.readErr, s.done)
				}
			case "errfirst": // the engine's own error, with its status
				r := post(t, url+"/v1/chat/completions", body, nil)
				if r.status != 500 || !strings.HasPrefix(r.body, `{"error":{"message":"engine fault"`) ||
					!strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
					t.Fatalf("want the engine's 500: %d %v %s", r.status, r.header, r.body)
				}
			default:
				r := post(t, url+"/v1/chat/completions", body, nil)
				if r.status != http.StatusBadGateway || !containsAll(r.body, `"code":502`, "endpoint breaker: ") ||
					!strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
					t.Fatalf("want a 502 saying why: %d %v %s", r.status, r.header, r.body)
				}
			}
			m := get(t, admin+"/metrics")
			want := "broken_stream"
			if fail == "empty" || fail == "errfirst" {
				want = "upstream_error" // it failed before its first byte
			}
			if !counted(m, want) || counted(m, "ok") || !strings.Contains(m, "kvgate_retries_total 0") {
				t.Errorf("want %s, not ok, and no retry counted:\n%s", want, grepLines(m, "kvgate_re"))
			}
			// A failed answer meets no SLO (a stream broken after its
			// first byte was counted met).
			for _, line := range strings.Split(m, "\n") {
				if strings.HasPrefix(line, "kvgate_ttft_slo_met_total{") && !strings.HasSuffix(line, " 0") {
					t.Errorf("counted met: %s", line)
				}
			}
		})
	}
}

// TestNoRetryPastTheUpstreamTimeout: an engine that hangs until
// --upstream-timeout runs out is the one the client hears of (504 naming
// it); the other engine is neither sent the request with no time left
// nor blamed for it (it was, and health ejected healthy engines so).
func TestNoRetryPastTheUpstreamTimeout(t *testing.T) {
	hang := hangingEngine(t)
	var other atomic.Int64
	c := &capture{}
	healthy := c.server(t)
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			other.Add(1)
		}
		healthy.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(counting.Close)
	eps := []fleet.Endpoint{{Name: "hang", URL: hang.URL, Model: testModel}, {Name: "healthy", URL: counting.URL, Model: testModel}}
	pr, err := health.New(health.Config{Interval: time.Hour, EjectAfter: 100, NoMetrics: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	_, url, admin := startGateway(t, Config{Endpoints: eps, Policy: "round-robin", UpstreamTimeout: 300 * time.Millisecond}, Options{Health: pr})
	sent := 0
	for range 4 {
		before := other.Load()
		r := post(t, url+"/v1/completions", completion("hi", false, 2), nil)
		if other.Load() > before {
			continue // round-robin chose the healthy engine
		}
		sent++
		if r.status != http.StatusGatewayTimeout || !strings.Contains(r.body, "endpoint hang") || r.header.Get(hdrPrefill) != "hang" {
			t.Fatalf("want hang's 504: %d %v %s", r.status, r.header, r.body)
		}
	}
	if sent == 0 {
		t.Fatal("round-robin never chose the hanging engine")
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, "kvgate_retries_total 0") {
		t.Errorf("a retry with no time left:\n%s", grepLines(m, "kvgate_retries_total"))
	}
	if st, _ := pr.State("healthy"); st.PassiveFailures != 0 {
		t.Errorf("the healthy engine was blamed: %d passive failures", st.PassiveFailures)
	}
	if st, _ := pr.State("hang"); st.PassiveFailures != sent {
		t.Errorf("the hanging engine: %d passive failures, want %d", st.PassiveFailures, sent)
	}
}

// TestPassthroughUpstreamTimeout: --upstream-timeout bounds a forwarded
// request (/tokenize, embeddings, ...) as it bounds a routed one: a
// hanging engine's /tokenize is a 504 at the timeout (the client waited
// until it gave up).
func TestPassthroughUpstreamTimeout(t *testing.T) {
	hang := hangingEngine(t)
	eps := []fleet.Endpoint{{Name: "hang", URL: hang.URL, Model: testModel}}
	_, url, _ := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true, UpstreamTimeout: 200 * time.Millisecond}, Options{})
	start := time.Now()
	r := post(t, url+"/tokenize", `{"model":"`+testModel+`","prompt":"hi"}`, nil)
	if took := time.Since(start); r.status != http.StatusGatewayTimeout || took > 5*time.Second || !strings.Contains(r.body, "hang") {
		t.Fatalf("want a 504 naming the engine at the timeout: %d after %v: %s", r.status, took, r.body)
	}
}

// TestEmptyRefusalKeepsItsStatus: an engine's refusal without a body
// (a 4xx and nothing after) reaches the client with its status, streamed
// or answered whole, though no body byte ever commits it.
func TestEmptyRefusalKeepsItsStatus(t *testing.T) {
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(refuse.Close)
	eps := []fleet.Endpoint{{Name: "refuse", URL: refuse.URL, Model: testModel}}
	_, url, _ := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true}, Options{})
	for _, stream := range []bool{true, false} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"x"}],"max_tokens":2,"stream":%v}`, testModel, stream)
		if r := post(t, url+"/v1/chat/completions", body, nil); r.status != http.StatusNotFound {
			t.Errorf("stream=%v: %d %q, want the engine's 404", stream, r.status, r.body)
		}
	}
}

// TestNamedStreamCutShort: a Responses or Messages stream that ends
// cleanly before its end (no response.completed, .incomplete, .failed or
// error; no message_stop or error) is broken_stream, its client's
// connection ended without the body's end, and its engine reported, as a
// chat stream's is: passed on as whole, the SDKs read it as served (a
// Responses answer "in_progress"), and it counted ok.
func TestNamedStreamCutShort(t *testing.T) {
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.HasSuffix(r.URL.Path, "/responses") {
			fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n")
			fmt.Fprint(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"alpha \"}\n\n")
			return
		}
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":3,\"output_tokens\":0}}}\n\n")
		fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"alpha \"}}\n\n")
	}))
	t.Cleanup(cut.Close)
	eps := []fleet.Endpoint{{Name: "cut", URL: cut.URL, Model: testModel}}
	_, url, admin := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true}, Options{})
	for _, c := range []struct{ path, body string }{
		{"/v1/responses", `{"model":"` + testModel + `","input":"hi","max_output_tokens":5,"stream":true}`},
		{"/v1/messages", messagesBody("s", "hi", 5, true)},
	} {
		resp, err := http.Post(url+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		raw, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || rerr == nil || !strings.Contains(string(raw), "alpha") {
			t.Errorf("%s: want the stream so far and a broken body: %d, read %v:\n%s", c.path, resp.StatusCode, rerr, raw)
		}
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, `outcome="broken_stream",policy="kvgate"} 2`) {
		t.Errorf("want two broken streams:\n%s", grepLines(m, "kvgate_requests_total"))
	}
}

// TestHeldRequestIsRetried: a request the hold released (it fits
// nowhere: its prompt misses the SLO even alone) whose engine fails
// before its first byte is sent to the other engine, neither held nor
// rejected again (the client was admitted): it got the engine's failure,
// because its retry would have been held; live, a long prompt's 502
// with another prefill engine idle.
func TestHeldRequestIsRetried(t *testing.T) {
	fail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, `{"error":{"message":"engine on fire"}}`, http.StatusInternalServerError)
	}))
	t.Cleanup(fail.Close)
	e := startEngine(t, fleet.RoleBoth, nil)
	ok := endpointOf(e, fleet.RoleBoth)
	ok.PrefillSpeed = 100
	early := false
	eps := []fleet.Endpoint{{Name: "fail", URL: fail.URL, Model: testModel, PrefillSpeed: 100}, ok}
	_, url, admin := startGateway(t, Config{Endpoints: eps, Policy: "round-robin", EarlyReject: &early, NoHealthChecks: true,
		Classes: []Class{{Name: "standard", TTFT: 0.5}}, Hold: HoldConfig{Mode: HoldOn}}, Options{})
	for i := range 2 { // round-robin: one of the two goes to the failing engine first
		r := post(t, url+"/v1/completions", completion(prefix(fmt.Sprint("held", i)), false, 2), nil)
		if r.status != 200 || r.header.Get(hdrPrefill) != e.Addr() {
			t.Fatalf("%d from %q (%s): %s", r.status, r.header.Get(hdrPrefill), r.header.Get(hdrReason), r.body)
		}
	}
	m := get(t, admin+"/metrics")
	if !strings.Contains(m, "kvgate_retries_total 1") || !strings.Contains(m, "kvgate_held_total 2") {
		t.Errorf("want both held and one retry:\n%s", grepLines(m, "kvgate_"))
	}
}

// hangingEngine takes every request and answers nothing until its client
// goes (health probes, GETs, are answered at once).
func hangingEngine(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body) // net/http hears the connection close only once the body is read
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return srv
}
