package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
	"github.com/kvgate/kvgate/internal/openai"
)

// breaker is an engine that streams words answer words in vLLM's event
// shapes, then fails as fail says: "abort" (the connection breaks, as
// when the engine dies), "eof" (the body ends with neither a finish
// reason nor [DONE], as an engine shutting down may end it), "half" (half
// an event, then the connection breaks), "nonl" (it finishes, its
// [DONE] without a line break after it), "headers" (the stream's
// headers, then the connection breaks: an engine that dies in its
// prefill, as vLLM sends a stream's headers first), or "" (it finishes
// properly).
type breaker struct {
	words int
	fail  string
	// tools: its events are a tool call's, not text.
	tools bool
	// llmd: its events are llm-d-inference-sim's: "usage":null in every
	// one, the role event without content, no logprobs (seen live,
	// 2026-12-03).
	llmd bool
	// interval: words an event (vLLM's --stream-interval; 0 is 1). Asked
	// for continuous usage, every event says how many came so far.
	interval int

	mu     sync.Mutex
	bodies []map[string]any
}

func (b *breaker) server(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet { // health probes
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("breaker: %v", err)
		}
		b.mu.Lock()
		b.bodies = append(b.bodies, body)
		b.mu.Unlock()
		chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
		w.Header().Set("Content-Type", "text/event-stream")
		// A header of its own, which an answer retried elsewhere must not
		// keep.
		w.Header().Set("X-Engine", "breaker")
		if b.fail == "headers" { // dies in its prefill, the stream's headers sent
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		switch b.fail {
		case "firstline": // dies inside its first line
			fmt.Fprint(w, `data: {"id":"first-engine-id","obj`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "empty": // a 200 without a body
			w.WriteHeader(http.StatusOK)
			return
		case "errfirst": // fails before its first event: its error event first
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine fault\",\"type\":\"InternalServerError\",\"code\":500}}\n\ndata: [DONE]\n\n")
			return
		}
		opts, _ := body["stream_options"].(map[string]any)
		continuous := opts["include_usage"] == true && opts["continuous_usage_stats"] == true
		sent := 0 // words
		event := func(choice string) {
			obj := "text_completion"
			if chat {
				obj = "chat.completion.chunk"
			}
			usage := ""
			switch {
			case b.llmd:
				usage, choice = `"usage":null,`, strings.ReplaceAll(choice, `"logprobs":null,`, "")
			case continuous:
				usage = fmt.Sprintf(`"usage":{"prompt_tokens":3,"total_tokens":%d,"completion_tokens":%d},`, 3+sent, sent)
			}
			fmt.Fprintf(w, "data: {\"id\":\"first-engine-id\",\"object\":%q,\"created\":1,\"model\":%q,%s\"choices\":[%s]}\n\n", obj, testModel, usage, choice)
			w.(http.Flusher).Flush()
		}
		switch {
		case chat && b.llmd:
			event(`{"index":0,"finish_reason":null,"delta":{"role":"assistant"}}`)
		case chat:
			event(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`)
		}
		for sent < b.words {
			i := sent
			var words string
			for sent < min(i+max(b.interval, 1), b.words) {
				words += fmt.Sprintf("w%d ", sent)
				sent++
			}
			switch {
			case b.tools:
				event(fmt.Sprintf(`{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":%q}}]},"finish_reason":null}`, words))
			case chat:
				event(fmt.Sprintf(`{"index":0,"delta":{"content":%q},"logprobs":null,"finish_reason":null}`, words))
			default:
				event(fmt.Sprintf(`{"index":0,"text":%q,"logprobs":null,"finish_reason":null,"stop_reason":null}`, words))
			}
		}
		switch b.fail {
		case "abort":
			panic(http.ErrAbortHandler)
		case "badjson":
			fmt.Fprint(w, "data: {not json\n\n")
		case "errevent": // its own error event, as vLLM sends one mid-stream
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine fault\",\"type\":\"InternalServerError\",\"code\":500}}\n\ndata: [DONE]\n\n")
			return
		case "freeze": // silent, the connection open, until the gateway gives up
			<-r.Context().Done()
			return
		case "half":
			fmt.Fprint(w, `data: {"id":"first-engine-id","choi`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "eof":
			return
		}
		event(`{"index":0,"delta":{},"finish_reason":"stop"}`)
		if b.fail == "nonl" {
			fmt.Fprint(w, "data: [DONE]") // no line break after it
			return
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// body is the n-th request body the breaker received.
func (b *breaker) body(t *testing.T, n int) map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.bodies) <= n {
		t.Fatalf("breaker received %d requests, want more than %d", len(b.bodies), n)
	}
	return b.bodies[n]
}

// streamed is a client's reading of an SSE answer.
type streamed struct {
	status   int
	endpoint string
	events   []map[string]any
	text     string
	roles    int
	done     int
	finish   string
	ids      map[string]bool
	usage    map[string]any
	raw      string
	// readErr is how the body ended (nil: whole).
	readErr error
}

func readStream(t *testing.T, url, body string) streamed {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	s := streamed{status: resp.StatusCode, endpoint: resp.Header.Get(hdrPrefill), ids: map[string]bool{}}
	raw, err := io.ReadAll(resp.Body)
	s.raw, s.readErr = string(raw), err
	sc := bufio.NewScanner(strings.NewReader(s.raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			s.done++
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("an event the client cannot read: %q: %v\nstream:\n%s", data, err, s.raw)
		}
		s.events = append(s.events, ev)
		s.ids[fmt.Sprint(ev["id"])] = true
		if u, ok := ev["usage"].(map[string]any); ok {
			s.usage = u
		}
		choices, _ := ev["choices"].([]any)
		for _, c := range choices {
			c := c.(map[string]any)
			if f, ok := c["finish_reason"].(string); ok {
				s.finish = f
			}
			if txt, ok := c["text"].(string); ok {
				s.text += txt
			}
			if d, ok := c["delta"].(map[string]any); ok {
				if d["role"] != nil {
					s.roles++
				}
				if txt, ok := d["content"].(string); ok {
					s.text += txt
				}
			}
		}
	}
	return s
}

// migrationFleet: a breaker and one engine emulator behind a round-robin
// gateway with limit migrations; it returns the gateway's URLs.
func migrationFleet(t *testing.T, b *breaker, limit int) (url, admin string, e *engine.Engine) {
	t.Helper()
	srv := b.server(t)
	e = startEngine(t, fleet.RoleBoth, nil)
	eps := []fleet.Endpoint{{Name: "breaker", URL: srv.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 20000 * 50},
		endpointOf(e, fleet.RoleBoth)}
	_, url, admin = startGateway(t, Config{Endpoints: eps, Policy: "round-robin", MigrationLimit: limit, NoHealthChecks: true}, Options{})
	return url, admin, e
}

// onBreaker sends body until round-robin sends it to the breaker (the
// first or the second time) and returns that answer.
func onBreaker(t *testing.T, url, body string) streamed {
	t.Helper()
	for range 2 {
		if s := readStream(t, url, body); s.endpoint == "breaker" {
			return s
		}
	}
	t.Fatal("round-robin never chose the breaker")
	return streamed{}
}

func TestMigrateChat(t *testing.T) {
	for _, fail := range []string{"abort", "eof", "half", "abort llm-d"} {
		t.Run(fail, func(t *testing.T) {
			b := &breaker{words: 5, fail: strings.TrimSuffix(fail, " llm-d"), llmd: strings.HasSuffix(fail, "llm-d")}
			url, admin, e := migrationFleet(t, b, 1)
			msgs := `"messages":[{"role":"user","content":"tell me"}]`
			body := `{"model":"` + testModel + `",` + msgs + `,"max_tokens":20,"stream":true,"stream_options":{"include_usage":true}}`
			var tok struct{ Count float64 }
			if err := json.Unmarshal([]byte(post(t, e.URL()+"/tokenize", `{"model":"`+testModel+`",`+msgs+`}`, nil).body), &tok); err != nil || tok.Count == 0 {
				t.Fatalf("tokenize: %v", err)
			}
			s := onBreaker(t, url+"/v1/chat/completions", body)
			if s.status != 200 || s.done != 1 || s.roles != 1 || len(s.ids) != 1 || !s.ids["first-engine-id"] {
				t.Fatalf("want one whole stream under the first engine's id: status %d, %d [DONE], %d role events, ids %v\n%s", s.status, s.done, s.roles, s.ids, s.raw)
			}
			before := "w0 w1 w2 w3 w4 "
			if !strings.HasPrefix(s.text, before) || len(s.text) <= len(before) || s.finish != "length" {
				t.Fatalf("want the breaker's words then the emulator's to max_tokens: %q, finish %q", s.text, s.finish)
			}
			if strings.Contains(s.raw, `"choi`+"\n") {
				t.Fatalf("the client got half an event:\n%s", s.raw)
			}
			if s.usage == nil || s.usage["completion_tokens"] != float64(20) || s.usage["prompt_tokens"] != tok.Count ||
				s.usage["total_tokens"] != tok.Count+20 {
				t.Fatalf("want the whole answer's usage (%v prompt tokens, 20 completion tokens): %v", tok.Count, s.usage)
			}
			if m := get(t, admin+"/metrics"); !strings.Contains(m, `kvgate_migrations_total{result="ok"} 1`) {
				t.Errorf("want one migration counted ok")
			}
		})
	}
}

// TestMigrateCountsUsage: an engine that sends three tokens an event
// (vLLM's --stream-interval 3) breaks after six; asked by the gateway for
// the usage in every event, it says six, and the continuation asks for
// the 14 left of 20: the client reads 20 words, one usage (the final
// event it asked for) counting 20. Counted as events, the continuation
// asked for 18 and the client read 24.
func TestMigrateCountsUsage(t *testing.T) {
	b := &breaker{words: 6, interval: 3, fail: "abort"}
	url, _, _ := migrationFleet(t, b, 1)
	body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"tell me"}],"max_tokens":20,"stream":true,"stream_options":{"include_usage":true}}`
	s := onBreaker(t, url+"/v1/chat/completions", body)
	if n := len(strings.Fields(s.text)); n != 20 || !strings.HasPrefix(s.text, "w0 w1 w2 w3 w4 w5 ") || s.done != 1 || s.finish != "length" {
		t.Fatalf("want the breaker's 6 words then 14 of the emulator's: %d words %q, finish %q\n%s", n, s.text, s.finish, s.raw)
	}
	if strings.Count(s.raw, `"usage"`) != 1 || s.usage == nil || s.usage["completion_tokens"] != float64(20) {
		t.Fatalf("want one usage, the final event's, counting 20:\n%s", s.raw)
	}
	if opts, _ := b.body(t, 0)["stream_options"].(map[string]any); opts["continuous_usage_stats"] != true || opts["include_usage"] != true {
		t.Fatalf("the engine was not asked for the usage in every event: %v", opts)
	}
}

// TestRetryAfterHeaders: an engine that sends a stream's headers and
// dies in its prefill (vLLM sends them first) has given the client
// nothing, since the gateway sends the headers with the first body
// bytes: the request is retried elsewhere, whole, with or without
// migration, and the failure is reported to health.
func TestRetryAfterHeaders(t *testing.T) {
	for _, limit := range []int{0, 1} {
		t.Run(fmt.Sprint("migration limit ", limit), func(t *testing.T) {
			b := &breaker{words: 5, fail: "headers"}
			srv := b.server(t)
			e := startEngine(t, fleet.RoleBoth, nil)
			eps := []fleet.Endpoint{{Name: "breaker", URL: srv.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 20000 * 50},
				endpointOf(e, fleet.RoleBoth)}
			// Passive health only: one failure ejects the breaker, and
			// no probe brings it back within the test.
			pr, err := health.New(health.Config{Interval: time.Hour, Timeout: time.Second, EjectAfter: 1, NoMetrics: true, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			_, url, admin := startGateway(t, Config{Endpoints: eps, Policy: "round-robin", MigrationLimit: limit}, Options{Health: pr})
			body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"tell me"}],"max_tokens":20,"stream":true}`
			for i := range 2 { // round-robin: one of the two goes to the breaker first
				s := readStream(t, url+"/v1/chat/completions", body)
				if s.readErr != nil || s.status != 200 || s.done != 1 || s.roles != 1 || len(s.ids) != 1 || s.finish != "length" || s.endpoint == "breaker" {
					t.Fatalf("request %d: want a whole stream from the other engine: status %d, endpoint %s, %d [DONE], %d role events, finish %q, read %v\n%s",
						i, s.status, s.endpoint, s.done, s.roles, s.finish, s.readErr, s.raw)
				}
			}
			b.body(t, 0) // the breaker had one
			m := get(t, admin+"/metrics")
			if !strings.Contains(m, "kvgate_retries_total 1\n") || strings.Contains(m, `kvgate_migrations_total{result="ok"} 1`) {
				t.Errorf("want one retry and no migration:\n%s\n%s", grepLines(m, "kvgate_retries_total"), grepLines(m, "kvgate_migrations_total"))
			}
			if pr.Available("breaker") {
				t.Errorf("want the breaker ejected")
			}
		})
	}
}

func TestMigrateCompletionsBody(t *testing.T) {
	b, second := &breaker{words: 3, fail: "abort"}, &breaker{words: 4} // the second finishes
	srvA, srvB := b.server(t), second.server(t)
	eps := []fleet.Endpoint{{Name: "breaker", URL: srvA.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6},
		{Name: "second", URL: srvB.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6}}
	_, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "round-robin", MigrationLimit: 1, NoHealthChecks: true}, Options{})
	body := `{"model":"` + testModel + `","prompt":"once upon","min_tokens":4,"stream":true,"echo":true}`
	s := onBreaker(t, url+"/v1/completions", body)
	if s.done != 1 || s.text != "w0 w1 w2 w0 w1 w2 w3 " || s.finish != "stop" {
		t.Fatalf("want the breaker's three words then the second engine's answer: %q %q, %d [DONE]", s.text, s.finish, s.done)
	}
	got := second.body(t, len(second.bodies)-1)
	if got["prompt"] != "once uponw0 w1 w2 " || got["max_tokens"] != float64(13) || got["min_tokens"] != float64(1) || got["echo"] != nil {
		t.Fatalf("continuation body: %v (want the text appended, vLLM's default 16 max_tokens less 3, min_tokens less 3, no echo)", got)
	}
}

func TestMigrateChatBody(t *testing.T) {
	a, second := &breaker{words: 2, fail: "abort"}, &breaker{words: 1}
	srvA, srvB := a.server(t), second.server(t)
	eps := []fleet.Endpoint{{Name: "breaker", URL: srvA.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6},
		{Name: "second", URL: srvB.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6}}
	_, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "round-robin", MigrationLimit: 2, NoHealthChecks: true}, Options{})
	body := `{"model":"` + testModel + `","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_completion_tokens":10,"stream":true}`
	s := onBreaker(t, url+"/v1/chat/completions", body)
	if s.done != 1 || s.text != "w0 w1 w0 " || s.roles != 1 {
		t.Fatalf("stream: %q, %d [DONE], %d role events\n%s", s.text, s.done, s.roles, s.raw)
	}
	got := second.body(t, len(second.bodies)-1)
	msgs, _ := got["messages"].([]any)
	if len(msgs) != 3 || got["continue_final_message"] != true || got["add_generation_prompt"] != false || got["max_completion_tokens"] != float64(8) {
		t.Fatalf("continuation body: %v", got)
	}
	if last := msgs[2].(map[string]any); last["role"] != "assistant" || last["content"] != "w0 w1 " {
		t.Fatalf("want the answer so far as the open assistant message: %v", last)
	}
}

func TestMigrateNot(t *testing.T) {
	cases := []struct {
		name  string
		b     *breaker
		limit int
		body  string
		// tried: the stream is of a kind migrated (the attempt counts
		// failed); a prompt of token ids is not.
		tried bool
	}{
		{"limit 0", &breaker{words: 3, fail: "abort"}, 0, `"messages":[{"role":"user","content":"x"}],"max_tokens":20`, false},
		{"tool calls", &breaker{words: 3, fail: "abort", tools: true}, 1, `"messages":[{"role":"user","content":"x"}],"max_tokens":20`, true},
		{"token-id prompt", &breaker{words: 3, fail: "abort"}, 1, `"prompt":[101,102,103],"max_tokens":20`, false},
		{"nothing left", &breaker{words: 3, fail: "abort"}, 1, `"messages":[{"role":"user","content":"x"}],"max_tokens":3`, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url, admin, _ := migrationFleet(t, c.b, c.limit)
			path := "/v1/chat/completions"
			if strings.Contains(c.body, `"prompt"`) {
				path = "/v1/completions"
			}
			s := onBreaker(t, url+path, `{"model":"`+testModel+`",`+c.body+`,"stream":true}`)
			if s.done != 0 || s.finish != "" {
				t.Fatalf("want the broken stream as it broke, not continued:\n%s", s.raw)
			}
			if s.readErr == nil {
				t.Fatal("the client read a short answer to its end: want the body to break, as the engine's did")
			}
			if len(c.b.bodies) != 1 {
				t.Fatalf("the breaker got %d requests, want 1", len(c.b.bodies))
			}
			m := get(t, admin+"/metrics")
			if strings.Contains(m, `kvgate_migrations_total{result="ok"}`) {
				t.Errorf("counted a migration")
			}
			if failed := strings.Contains(m, `kvgate_migrations_total{result="failed"} 1`); failed != c.tried {
				t.Errorf("failed migration counted: %v, want %v", failed, c.tried)
			}
		})
	}
}

// A whole stream whose [DONE] has no line break after it is not taken
// for a broken one: the client gets it as sent, nothing is migrated.
func TestMigrateNotAfterDone(t *testing.T) {
	b := &breaker{words: 3, fail: "nonl"}
	url, admin, _ := migrationFleet(t, b, 1)
	s := onBreaker(t, url+"/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"x"}],"stream":true}`)
	if s.readErr != nil || s.done != 1 || s.text != "w0 w1 w2 " || s.finish != "stop" || !strings.HasSuffix(s.raw, "data: [DONE]") {
		t.Fatalf("want the breaker's whole stream as sent: %v\n%s", s.readErr, s.raw)
	}
	if len(b.bodies) != 1 || strings.Contains(get(t, admin+"/metrics"), "kvgate_migrations_total") {
		t.Fatalf("a finished stream was migrated: %d requests to the breaker", len(b.bodies))
	}
}

// A continuation the engine refuses (an engine without
// continue_final_message, say) leaves the client's stream as it broke:
// none of the refusal's body reaches it.
func TestMigrateRefused(t *testing.T) {
	a := &breaker{words: 2, fail: "abort"}
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"message":"continue_final_message is not supported","code":400}}`)
	}))
	t.Cleanup(refuse.Close)
	eps := []fleet.Endpoint{{Name: "breaker", URL: a.server(t).URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6},
		{Name: "refuses", URL: refuse.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6}}
	_, url, admin := startGateway(t, Config{Endpoints: eps, Policy: "round-robin", MigrationLimit: 1, NoHealthChecks: true}, Options{})
	s := onBreaker(t, url+"/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"x"}],"stream":true}`)
	if s.done != 0 || strings.Contains(s.raw, "not supported") || s.text != "w0 w1 " || s.readErr == nil {
		t.Fatalf("want the breaker's stream as it broke and nothing of the refusal:\n%s", s.raw)
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, `kvgate_migrations_total{result="failed"} 1`) {
		t.Errorf("want the failed migration counted")
	}
}

// FuzzStreamTap: whatever an engine sends, in whatever reads, the tap
// passes a stream's lines through unchanged: all of them when its body
// ends cleanly (eof), up to the last line break when it breaks; and a
// continuation that breaks leaves the client whole lines.
func FuzzStreamTap(f *testing.F) {
	f.Add([]byte("data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\ndata: [DONE]"), uint8(7), false, true)
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\r\n\r\ndata: {\"choi"), uint8(3), true, false)
	f.Add([]byte(": keepalive\n\ndata: not json\n\n"), uint8(1), true, true)
	f.Fuzz(func(t *testing.T, in []byte, step uint8, cont, clean bool) {
		rec := httptest.NewRecorder()
		// A client that asked for every usage: nothing is taken out.
		tap := newStreamTap(rec, tapRequest(t, `{"include_usage":true,"continuous_usage_stats":true}`), 10, 1, true)
		if cont {
			tap.WriteHeader(http.StatusOK)
			tap.continueOn()
			tap.WriteHeader(http.StatusOK)
		}
		n := max(int(step), 1)
		for p := in; len(p) > 0; {
			k := min(n, len(p))
			if w, err := tap.Write(p[:k]); w != k || err != nil {
				t.Fatalf("Write took %d of %d: %v", w, k, err)
			}
			p = p[k:]
		}
		if clean {
			tap.eof()
		}
		out := rec.Body.Bytes()
		if cont {
			if !clean && len(out) > 0 && out[len(out)-1] != '\n' {
				t.Fatalf("a broken continuation's output ends mid-line: %q", out)
			}
			return
		}
		if want := in[:bytes.LastIndexByte(in, '\n')+1]; clean && !bytes.Equal(out, in) || !clean && !bytes.Equal(out, want) {
			t.Fatalf("clean %v: the client got %q of %q", clean, out, in)
		}
	})
}

// tapRequest is a streamed chat request with stream_options opts.
func tapRequest(t testing.TB, opts string) *openai.Request {
	t.Helper()
	req, err := openai.ParseRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":` + opts + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestTapUsage: the engines are asked for the usage in every event,
// which counts the tokens the client had (several an event here, as
// vLLM's --stream-interval sends them); the client gets the usage it
// asked for: none, the final event, or every event's.
func TestTapUsage(t *testing.T) {
	ev := func(choices, usage string) string {
		return `data: {"id":"a","object":"chat.completion.chunk","created":1,"model":"m","choices":[` + choices + `],"usage":` + usage + "}\n\n"
	}
	u := func(n int) string {
		return fmt.Sprintf(`{"prompt_tokens":4,"total_tokens":%d,"completion_tokens":%d}`, 4+n, n)
	}
	stream := ev(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`, u(0)) +
		ev(`{"index":0,"delta":{"content":"one"},"logprobs":null,"finish_reason":null}`, u(1)) +
		ev(`{"index":0,"delta":{"content":" two three four"},"logprobs":null,"finish_reason":null}`, u(4))
	end := ev(`{"index":0,"delta":{"content":" five"},"logprobs":null,"finish_reason":"stop"}`, u(5)) + ev("", u(5)) + "data: [DONE]\n\n"
	cases := []struct {
		opts            string
		usages, onlyUse int // events with a usage, usage-only events
	}{
		{`null`, 0, 0},
		{`{"include_usage":true}`, 1, 1},
		{`{"include_usage":true,"continuous_usage_stats":true}`, 5, 1},
		{`{"continuous_usage_stats":true}`, 0, 0}, // vLLM: only with include_usage
	}
	for _, c := range cases {
		req := tapRequest(t, c.opts)
		rec := httptest.NewRecorder()
		tap := newStreamTap(rec, req, 4, 1, true)
		if final, cont := req.UsageEvents(); !final || !cont {
			t.Fatalf("%s: the engine is not asked for the usage in every event", c.opts)
		}
		tap.WriteHeader(http.StatusOK)
		tap.Write([]byte(stream))
		if tap.tokens != 4 || tap.text.String() != "one two three four" {
			t.Fatalf("%s: %d tokens %q, want the usage's 4", c.opts, tap.tokens, tap.text.String())
		}
		tap.Write([]byte(end))
		out := rec.Body.String()
		usages, only := strings.Count(out, `"usage":`), strings.Count(out, `"choices":[],"usage"`)
		if usages != c.usages || only != c.onlyUse || strings.Count(out, "data: ") != 5+c.onlyUse || !strings.HasSuffix(out, "}\n\ndata: [DONE]\n\n") {
			t.Errorf("%s: %d usages, %d usage events, want %d and %d:\n%s", c.opts, usages, only, c.usages, c.onlyUse, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" && !json.Valid([]byte(data)) {
				t.Errorf("%s: invalid event %q", c.opts, data)
			}
		}
	}
}

// discardWriter is a client that reads everything at once.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) Flush()                      {}

// BenchmarkStreamTap: what --migration-limit costs a stream, its tap
// reading every event, against writing the stream through as relay
// does without it; one event a read (an engine's pace) and 16. With
// usage: every event carries the usage the gateway asked the engine
// for, which the tap takes out for a client that did not ask.
func BenchmarkStreamTap(b *testing.B) {
	plain := chatStreamEvents(500)
	withUsage := make([]string, len(plain))
	for i, ev := range plain {
		withUsage[i] = ev
		if strings.Contains(ev, `"choices":[{`) {
			withUsage[i] = strings.Replace(ev, "]}\n\n", fmt.Sprintf(`],"usage":{"prompt_tokens":5,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n", 5+max(i-1, 0), max(i-1, 0)), 1)
		}
	}
	for _, c := range []struct {
		name   string
		events []string
		per    int
	}{{"", plain, 1}, {"", plain, 16}, {"usage/", withUsage, 1}, {"usage/", withUsage, 16}} {
		events, per := c.events, c.per
		var reads [][]byte
		for i := 0; i < len(events); i += per {
			reads = append(reads, []byte(strings.Join(events[i:min(i+per, len(events))], "")))
		}
		b.Run(fmt.Sprintf("%swrite-through/%d-per-read", c.name, per), func(b *testing.B) {
			w := &discardWriter{h: http.Header{}}
			rc := http.NewResponseController(w)
			for range b.N {
				for _, r := range reads {
					if err := writeFlush(w, rc, r); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
		})
		b.Run(fmt.Sprintf("%stap/%d-per-read", c.name, per), func(b *testing.B) {
			for range b.N {
				tap := newStreamTap(&discardWriter{h: http.Header{}}, tapRequest(b, "null"), 5, 1, true)
				tap.WriteHeader(http.StatusOK)
				for _, r := range reads {
					if _, err := tap.Write(r); err != nil {
						b.Fatal(err)
					}
				}
				if !tap.done || tap.tokens != 500 {
					b.Fatal(tap.tokens)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
		})
	}
}

// A P/D fleet: the decode engine streaming an answer stops mid-answer
// (closed); the continuation runs both legs again, on the prefill
// engine and the other decode engine, and the client reads one whole
// answer.
func TestMigratePrefillDecode(t *testing.T) {
	slow := func(c *engine.Config) { c.TimeScale = 1 } // 10 ms a token: the close comes long before the end
	p := startEngine(t, fleet.RolePrefill, nil)
	d1, d2 := startEngine(t, fleet.RoleDecode, slow), startEngine(t, fleet.RoleDecode, slow)
	decoders := map[string]*engine.Engine{d1.Addr(): d1, d2.Addr(): d2}
	cfg := Config{
		Endpoints:      []fleet.Endpoint{endpointOf(p, fleet.RolePrefill), endpointOf(d1, fleet.RoleDecode), endpointOf(d2, fleet.RoleDecode)},
		Tokenizers:     []string{"model=" + testModel + ",source=engine,url=" + p.URL()},
		MigrationLimit: 1, NoHealthChecks: true,
	}
	_, url, admin := startGateway(t, cfg, Options{})
	body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"` + prefix("pdm") + `"}],"max_tokens":200,"stream":true}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := decoders[resp.Header.Get(hdrDecode)]
	if first == nil {
		t.Fatalf("decode endpoint %q", resp.Header.Get(hdrDecode))
	}
	var text strings.Builder
	tokens, done := 0, 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done++
			continue
		}
		c, err := openai.ParseStreamChunk([]byte(data))
		if err != nil {
			t.Fatalf("%q: %v", data, err)
		}
		if len(c.Text) > 0 {
			tokens++
			text.Write(c.Text)
			if tokens == 10 {
				go first.Close() // the decode engine goes away mid-answer
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("the client's stream broke after %d tokens: %v", tokens, err)
	}
	if tokens != 200 || done != 1 {
		t.Fatalf("want 200 tokens and one [DONE]: %d tokens, %d [DONE]", tokens, done)
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, `kvgate_migrations_total{result="ok"} 1`) {
		t.Errorf("want one migration counted ok")
	}
}

// An engine that breaks a stream mid-answer is reported to the health
// prober, as a refused connection is: with eject_after 1 it is ejected,
// and the next requests go elsewhere.
func TestBrokenStreamEjects(t *testing.T) {
	a, second := &breaker{words: 2, fail: "abort"}, &breaker{words: 1}
	eps := []fleet.Endpoint{{Name: "breaker", URL: a.server(t).URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6},
		{Name: "second", URL: second.server(t).URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6}}
	pr, err := health.New(health.Config{Interval: time.Hour, Timeout: time.Second, EjectAfter: 1, NoMetrics: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	_, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "round-robin"}, Options{Health: pr})
	body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"x"}],"stream":true}`
	if s := onBreaker(t, url+"/v1/chat/completions", body); s.readErr == nil {
		t.Fatal("the stream did not break")
	}
	for i := range 4 {
		if s := readStream(t, url+"/v1/chat/completions", body); s.endpoint != "second" {
			t.Fatalf("request %d went to %q after the breaker broke a stream", i, s.endpoint)
		}
	}
}
