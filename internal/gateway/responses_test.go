package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
)

// TestResponses: the Responses API through the gateway, in front of two
// emulated engines with a response store, round-robin between them. A
// request continuing a response (previous_response_id) goes to the
// engine that made it, every time, streamed or not (the other engine
// would answer 404, as an unknown id's engine does); GET of a response
// reaches it there; the prompt is keyed as a chat's, so a second request
// with the same instructions is predicted cached; the planner's traffic
// hears the answers' output tokens, with their latencies (the
// unstreamed request is streamed from its engine, whole.go).
func TestResponses(t *testing.T) {
	store := func(c *engine.Config) { c.ResponsesStore = true }
	a, b := startEngine(t, fleet.RoleBoth, store), startEngine(t, fleet.RoleBoth, store)
	tr := &answers{}
	cfg := Config{Endpoints: []fleet.Endpoint{endpointOf(a, fleet.RoleBoth), endpointOf(b, fleet.RoleBoth)}, Policy: "round-robin", NoHealthChecks: true}
	_, url, _ := startGateway(t, cfg, Options{Traffic: tr})
	instructions := prefix("responses")
	first := post(t, url+"/v1/responses", `{"model":"`+testModel+`","instructions":`+strconv.Quote(instructions)+`,"input":"hello","max_output_tokens":4}`, nil)
	var o struct{ ID string }
	if first.status != 200 || json.Unmarshal([]byte(first.body), &o) != nil || !strings.HasPrefix(o.ID, "resp_") {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	home := first.header.Get(hdrPrefill)
	// Streamed from the engine and answered whole (whole.go): heard with
	// its latencies.
	waitFor(t, func() bool { return tr.output.Load() == 4 })
	if tr.untimed.Load() != 0 {
		t.Errorf("the traffic heard %d output tokens without latencies, want 0", tr.untimed.Load())
	}
	for i := range 4 {
		body := fmt.Sprintf(`{"model":%q,"input":"and then %d?","previous_response_id":%q,"max_output_tokens":3,"stream":%v}`, testModel, i, o.ID, i%2 == 1)
		r := post(t, url+"/v1/responses", body, nil)
		if r.status != 200 || r.header.Get(hdrPrefill) != home {
			t.Fatalf("continuation %d: %d from %s, want 200 from %s: %s", i, r.status, r.header.Get(hdrPrefill), home, r.body)
		}
	}
	if r := get(t, url+"/v1/responses/"+o.ID); !strings.Contains(r, o.ID) || !strings.Contains(r, `"object":"response"`) {
		t.Fatalf("GET: %s", r)
	}
	// The second request with the same instructions is keyed as the
	// first: cached where the first went (predicted from the routed
	// request's blocks).
	second := post(t, url+"/v1/responses", `{"model":"`+testModel+`","instructions":`+strconv.Quote(instructions)+`,"input":"hi again","max_output_tokens":2}`, nil)
	if cached, _ := strconv.Atoi(second.header.Get(hdrCached)); second.status != 200 || (second.header.Get(hdrPrefill) == home) != (cached > 0) {
		t.Fatalf("second: %d on %s (first on %s) predicting %d cached", second.status, second.header.Get(hdrPrefill), home, cached)
	}
	// A streamed answer's id is learned from its stream.
	s := post(t, url+"/v1/responses", `{"model":"`+testModel+`","input":"stream","max_output_tokens":5,"stream":true}`, nil)
	i := strings.Index(s.body, `"id":"resp_`)
	if s.status != 200 || i < 0 || !strings.Contains(s.body, "event: response.completed") {
		t.Fatalf("stream: %d %s", s.status, s.body)
	}
	id := s.body[i+6 : i+6+strings.IndexByte(s.body[i+6:], '"')]
	for range 2 {
		if r := post(t, url+"/v1/responses", `{"model":"`+testModel+`","input":"more","previous_response_id":"`+id+`"}`, nil); r.status != 200 || r.header.Get(hdrPrefill) != s.header.Get(hdrPrefill) {
			t.Fatalf("after the stream: %d from %s, want %s", r.status, r.header.Get(hdrPrefill), s.header.Get(hdrPrefill))
		}
	}
	if r := post(t, url+"/v1/responses", `{"model":"`+testModel+`","input":"x","previous_response_id":"resp_unknown"}`, nil); r.status != 404 {
		t.Fatalf("an id no engine keeps: %d %s", r.status, r.body)
	}
}

// TestResponsesFirstToken: vLLM sends a Responses stream's created and
// in_progress events before its prefill; the gateway takes the first text
// delta as the first token (its TTFT, the prefill's end), its tokens the
// usage's output tokens (two a delta here), and the answer as complete at
// response.completed.
func TestResponsesFirstToken(t *testing.T) {
	checkFirstTokenEvent(t, "/v1/responses", `{"model":"`+testModel+`","input":"x","stream":true}`,
		[][2]string{{"response.created", `,"response":{"id":"resp_abc","status":"in_progress"}`}, {"response.in_progress", `,"response":{"id":"resp_abc","status":"in_progress"}`}},
		"response.output_text.delta", func(i int) string { return fmt.Sprintf(`,"delta":"w%d x%d"`, i, i) },
		[][2]string{{"response.output_text.done", `,"text":"w0 … w9"`},
			{"response.completed", `,"response":{"id":"resp_abc","status":"completed","usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":23}}`}})
}

// checkFirstTokenEvent runs a stream of named events from a stand-in
// engine through the gateway: the events before (sent at once, before a
// prefill of 0.5 s), ten events of type token (token(i) their data after
// the type, two tokens each, 10 ms apart, each sent once the client has
// the one before), then the events after, whose usage counts 20 output
// tokens. The gateway must take the first token event as the first
// token (a TTFT of 0.5 s), the usage's 20 tokens as the answer's (a
// TPOT of 90 ms over 19), and the answer as complete (ok).
func checkFirstTokenEvent(t *testing.T, path, body string, before [][2]string, token string, data func(i int) string, after [][2]string) {
	t.Helper()
	clock := &atomic.Int64{}
	clock.Store(time.Unix(1000, 0).UnixNano())
	ack := make(chan struct{}, 1) // the client has the token event before
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		ev := func(typ, data string) {
			fmt.Fprintf(w, "event: %s\ndata: {\"type\":%q%s}\n\n", typ, typ, data)
			w.(http.Flusher).Flush()
		}
		for _, e := range before {
			ev(e[0], e[1])
		}
		time.Sleep(20 * time.Millisecond)
		clock.Add(int64(500 * time.Millisecond)) // the prefill
		for i := range 10 {
			ev(token, data(i))
			select {
			case <-ack:
			case <-time.After(10 * time.Second):
				return
			}
			if i < 9 {
				clock.Add(int64(10 * time.Millisecond))
			}
		}
		for _, e := range after {
			ev(e[0], e[1])
		}
	}))
	t.Cleanup(up.Close)
	tr := &answers{}
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}}, NoHealthChecks: true}
	_, url, admin := startGateway(t, cfg, Options{Now: func() time.Time { return time.Unix(0, clock.Load()) }, Traffic: tr})
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"type":"`+token+`"`) {
			ack <- struct{}{}
		}
	}
	resp.Body.Close()
	waitFor(t, func() bool { return tr.output.Load() > 0 })
	if tr.output.Load() != 20 {
		t.Errorf("the traffic heard %d output tokens, want the usage's 20", tr.output.Load())
	}
	m := get(t, admin+"/metrics")
	var sum float64
	for _, l := range strings.Split(m, "\n") {
		if strings.HasPrefix(l, "kvgate_ttft_seconds_sum") {
			fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &sum)
		}
	}
	if sum < 0.499 || sum > 0.501 {
		t.Fatalf("TTFT %v s, want the first %s's 0.5 s (the events before came at 0):\n%s", sum, token, grepLines(m, "kvgate_ttft_seconds"))
	}
	if tp, want := adminEndpoints(t, admin)[0].TPOT, 0.09/19; tp < want*0.99 || tp > want*1.01 {
		t.Errorf("TPOT %v, want %v (20 tokens in 90 ms)", tp, want)
	}
	if !strings.Contains(m, `kvgate_requests_total{class="standard",model="gw-model",outcome="ok"`) {
		t.Errorf("not counted ok:\n%s", grepLines(m, "kvgate_requests_total"))
	}
}

// TestResponsesRetryInPrefill: an engine that sends a Responses stream's
// created and in_progress events (vLLM sends them before its prefill) and
// dies in its prefill has sent the client nothing: the gateway holds
// those events until the first text delta, and retries the request
// elsewhere, whose whole stream the client reads.
func TestResponsesRetryInPrefill(t *testing.T) {
	checkRetryInPrefill(t, "/v1/responses", `{"model":"`+testModel+`","input":"x","max_output_tokens":3,"stream":true}`,
		"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_dead\"}}\n\n"+
			"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_dead\"}}\n\n",
		"resp_dead", "event: response.created", "event: response.completed")
}

// checkRetryInPrefill: an engine that sends its stream's first events
// (dead, naming deadID) and dies before any token has sent the client
// nothing: the gateway holds those events until the first token's, and
// retries the request elsewhere, whose whole stream (one first event,
// its last) the client reads.
func checkRetryInPrefill(t *testing.T, path, body, dead, deadID, first, last string) {
	t.Helper()
	dies := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, dead)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(dies.Close)
	e := startEngine(t, fleet.RoleBoth, nil)
	eps := []fleet.Endpoint{{Name: "dies", URL: dies.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6}, endpointOf(e, fleet.RoleBoth)}
	_, url, admin := startGateway(t, Config{Endpoints: eps, Policy: "round-robin", NoHealthChecks: true}, Options{})
	for i := range 2 { // round-robin: one of the two goes to the dying engine first
		r := post(t, url+path, body, nil)
		if r.status != 200 || r.header.Get(hdrPrefill) == "dies" || strings.Contains(r.body, deadID) ||
			strings.Count(r.body, first) != 1 || !strings.Contains(r.body, last) {
			t.Fatalf("request %d: want one whole stream from the emulator: %d from %s\n%s", i, r.status, r.header.Get(hdrPrefill), r.body)
		}
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, "kvgate_retries_total 1\n") {
		t.Errorf("want one retry:\n%s", grepLines(m, "kvgate_retries_total"))
	}
}

// TestResponseHoldersBounded: the newest maxResponseHolders ids are kept.
func TestResponseHoldersBounded(t *testing.T) {
	h := newResponseHolders()
	for i := range maxResponseHolders + 10 {
		h.learn(fmt.Sprint("resp_", i), "e")
	}
	h.learn("resp_5", "f") // forgotten: learned again as new, resp_10 the oldest goes
	if len(h.byID) != maxResponseHolders || h.holder("resp_10") != "" || h.holder("resp_11") != "e" || h.holder("resp_5") != "f" ||
		h.holder(fmt.Sprint("resp_", maxResponseHolders+9)) != "e" {
		t.Fatalf("%d ids kept; resp_10 %q, resp_11 %q, resp_5 %q", len(h.byID), h.holder("resp_10"), h.holder("resp_11"), h.holder("resp_5"))
	}
	h.learn(strings.Repeat("x", maxResponseID+1), "e")
	if h.holder(strings.Repeat("x", maxResponseID+1)) != "" {
		t.Fatal("an id beyond maxResponseID kept")
	}
}

// TestResponsesFoundByAsking: a gateway that did not route an answer (it
// started after it: a replica of a rolling restart) finds the engine that
// keeps it by asking (GET /v1/responses/{id}), and sends its GET and the
// requests continuing it there; it was a 404, and a continuation went
// where routing sent it. An id no engine keeps is a 404, and is not asked
// for again for a while.
func TestResponsesFoundByAsking(t *testing.T) {
	store := func(c *engine.Config) { c.ResponsesStore = true }
	a, b := startEngine(t, fleet.RoleBoth, store), startEngine(t, fleet.RoleBoth, store)
	cfg := Config{Endpoints: []fleet.Endpoint{endpointOf(a, fleet.RoleBoth), endpointOf(b, fleet.RoleBoth)}, Policy: "round-robin", NoHealthChecks: true}
	_, before, _ := startGateway(t, cfg, Options{})
	var ids []string
	homes := map[string]string{}
	for i := range 2 { // round-robin: one on each engine
		r := post(t, before+"/v1/responses", fmt.Sprintf(`{"model":%q,"input":"hello %d","max_output_tokens":2}`, testModel, i), nil)
		var o struct{ ID string }
		if r.status != 200 || json.Unmarshal([]byte(r.body), &o) != nil {
			t.Fatalf("answer %d: %d %s", i, r.status, r.body)
		}
		ids, homes[o.ID] = append(ids, o.ID), r.header.Get(hdrPrefill)
	}
	g, after, _ := startGateway(t, cfg, Options{})
	for _, id := range ids {
		resp, err := http.Get(after + "/v1/responses/" + id)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(hdrPrefill) != homes[id] || !strings.Contains(string(body), id) {
			t.Errorf("GET %s through a gateway that did not route it: %d from %s, want 200 from %s", id, resp.StatusCode, resp.Header.Get(hdrPrefill), homes[id])
		}
		for i := range 2 {
			r := post(t, after+"/v1/responses", fmt.Sprintf(`{"model":%q,"input":"more %d","previous_response_id":%q,"max_output_tokens":2}`, testModel, i, id), nil)
			if r.status != 200 || r.header.Get(hdrPrefill) != homes[id] {
				t.Errorf("continuing %s: %d from %s, want 200 from %s: %s", id, r.status, r.header.Get(hdrPrefill), homes[id], r.body)
			}
		}
	}
	for range 2 {
		if r := post(t, after+"/v1/responses", `{"model":"`+testModel+`","input":"x","previous_response_id":"resp_unknown"}`, nil); r.status != 404 {
			t.Fatalf("an id no engine keeps: %d %s", r.status, r.body)
		}
	}
	if g.respMisses.ask("resp_unknown", g.now()) {
		t.Error("an id no engine kept would be asked for again at once")
	}
}
