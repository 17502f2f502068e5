package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
)

func chatAssembler() assembler { return openai.NewAssembler(true) }

// normalAnswer is a non-streamed answer as compared across two calls:
// its id, creation time and cached-token count differ from call to
// call, and members that are null or empty say the same absent.
func normalAnswer(t *testing.T, body string) map[string]any {
	t.Helper()
	var a map[string]any
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("not a JSON answer: %v: %s", err, body)
	}
	dropEmpty(a)
	return a
}

// dropEmpty deletes, at every depth, members that are null or empty
// arrays, and those that differ from call to call: ids, creation times,
// cached-token counts.
func dropEmpty(v any) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			switch k {
			case "id", "created", "created_at", "prompt_tokens_details", "input_tokens_details":
				delete(x, k)
				continue
			}
			if a, ok := e.([]any); e == nil || ok && len(a) == 0 {
				delete(x, k)
				continue
			}
			dropEmpty(e)
		}
	case []any:
		for _, e := range x {
			dropEmpty(e)
		}
	}
}

// TestWholeAnswerMatchesEngine: a request the client did not stream is
// streamed from the engine and answered whole; the answer is the one the
// engine gives the same request unstreamed (chat, completions, the
// Responses and the Messages API, cut by its limit or not; the emulator
// samples one sequence of one prompt: n and batches are openai's
// TestAssembleCompletionsBatch), but for its id, creation time and cache
// hits. The engine is asked for a stream, and the gateway says so in its
// metrics.
func TestWholeAnswerMatchesEngine(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, nil)
	g, url, admin := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}}, Options{})
	defer func() {
		if n := g.wholeBytes.Load(); n != 0 {
			t.Errorf("the answers served still hold %d bytes of the budget", n)
		}
	}()
	for i, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"max_tokens":9`},
		{"/v1/chat/completions", `"messages":[{"role":"user","content":"warm"}],"max_tokens":5,"temperature":0.5,"logprobs":false`},
		{"/v1/completions", `"prompt":"one prompt","max_tokens":4,"stream":false`},
		{"/v1/completions", `"prompt":"a stop word","max_tokens":6,"stop":["zzz"],"seed":3`},
		{"/v1/responses", `"instructions":"be brief","input":"tell me","max_output_tokens":7`},
		{"/v1/responses", `"input":[{"role":"user","content":[{"type":"input_text","text":"all of it"}]}],"max_output_tokens":100`},
		{"/v1/messages", `"system":"be brief","messages":[{"role":"user","content":"hi there"}],"max_tokens":9`},
		{"/v1/messages", `"messages":[{"role":"user","content":[{"type":"text","text":"all of it"}]}],"max_tokens":1000,"temperature":0`},
	} {
		body := `{"model":"` + testModel + `",` + c.body + `}`
		direct := post(t, e.URL()+c.path, body, nil)
		via := post(t, url+c.path, body, nil)
		if direct.status != 200 || via.status != 200 {
			t.Fatalf("%s: engine %d %s, gateway %d %s", c.body, direct.status, direct.body, via.status, via.body)
		}
		if ct := via.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", c.body, ct)
		}
		if got, want := normalAnswer(t, via.body), normalAnswer(t, direct.body); !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\ngateway %v\nengine  %v", c.body, got, want)
		}
		if m := get(t, admin+"/metrics"); !strings.Contains(m, fmt.Sprintf(`kvgate_whole_answers_total{engine="streamed"} %d`, i+1)) {
			t.Errorf("%s: not counted streamed", c.body)
		}
	}
}

// viaBreaker posts body (not streamed) until round-robin sends it to
// the breaker first (it may be retried elsewhere), and returns the
// answer.
func viaBreaker(t *testing.T, url, body string, b *breaker) result {
	t.Helper()
	var r result
	untilBreaker(t, b, func() { r = post(t, url, body, nil) })
	return r
}

// untilBreaker calls send until round-robin sends its request to the
// breaker (the first or the second time).
func untilBreaker(t *testing.T, b *breaker, send func()) {
	t.Helper()
	received := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.bodies)
	}
	for range 2 {
		n := received()
		if send(); received() > n {
			return
		}
	}
	t.Fatal("round-robin never chose the breaker")
}

// wholeChat is a chat answer's text, finish reason and completion tokens.
func wholeChat(t *testing.T, body string) (text, finish string, tokens float64) {
	t.Helper()
	var a struct {
		Choices []struct {
			Message      struct{ Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			CompletionTokens float64 `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(body), &a); err != nil || len(a.Choices) != 1 {
		t.Fatalf("not a chat answer of one choice: %v: %s", err, body)
	}
	return a.Choices[0].Message.Content, a.Choices[0].FinishReason, a.Usage.CompletionTokens
}

// TestWholeAnswerEngineFails: the engine of a request answered whole
// fails. The client had nothing of the answer, so it never gets half a
// JSON body: an engine that breaks mid-answer has the request sent again
// from its start on another engine (as an unstreamed request whose
// engine died was before the gateway streamed it), or, with a migration
// limit, continued there (the client gets the breaker's words and the
// rest, its usage the whole answer's); an engine that dies in its
// prefill is retried. The engine was asked for a stream with its usage.
func TestWholeAnswerEngineFails(t *testing.T) {
	chat := `{"model":"` + testModel + `","messages":[{"role":"user","content":"tell me"}],"max_tokens":20}`
	for _, c := range []struct {
		fail  string
		limit int
		// from is the endpoint whose answer the client gets; text a
		// prefix of its text, which has words words; retried, whether
		// the request was sent again from its start.
		from    string
		text    string
		words   int
		retried bool
	}{
		{"abort", 0, "emulator", "", 20, true},
		{"eof", 0, "emulator", "", 20, true},
		{"half", 0, "emulator", "", 20, true},
		{"headers", 0, "emulator", "", 20, true},
		{"nonl", 0, "breaker", "w0 w1 w2 w3 w4 ", 5, false},
		{"", 0, "breaker", "w0 w1 w2 w3 w4 ", 5, false},
		{"abort", 1, "breaker", "w0 w1 w2 w3 w4 ", 20, false},
		{"half", 1, "breaker", "w0 w1 w2 w3 w4 ", 20, false},
	} {
		t.Run(fmt.Sprintf("%s limit %d", c.fail, c.limit), func(t *testing.T) {
			b := &breaker{words: 5, fail: c.fail}
			url, admin, _ := migrationFleet(t, b, c.limit)
			r := viaBreaker(t, url+"/v1/chat/completions", chat, b)
			if from := r.header.Get(hdrPrefill); r.status != 200 || (from == "breaker") != (c.from == "breaker") {
				t.Fatalf("%d from %s, want 200 from the %s: %s", r.status, from, c.from, r.body)
			}
			text, finish, tokens := wholeChat(t, r.body)
			if n := len(strings.Fields(text)); !strings.HasPrefix(text, c.text) || n != c.words || tokens != float64(c.words) || finish == "" {
				t.Fatalf("want %d words from %q with a finish reason and usage: %d words %q, finish %q, usage %v", c.words, c.text, n, text, finish, tokens)
			}
			if c.retried && (strings.HasPrefix(text, "w0") || r.header.Get("X-Engine") != "") {
				t.Fatalf("the retry kept the broken answer's words or headers: %q, X-Engine %q", text, r.header.Get("X-Engine"))
			}
			m := get(t, admin+"/metrics")
			if retried := strings.Contains(m, "kvgate_retries_total 1"); retried != c.retried {
				t.Errorf("retried: %v, want %v", retried, c.retried)
			}
			// One request, one TTFT at most, retried or not (a retry after
			// bytes had come counted it twice).
			var ttfts, requests float64
			for _, line := range strings.Split(m, "\n") {
				f := strings.Fields(line)
				if len(f) != 2 {
					continue
				}
				v, _ := strconv.ParseFloat(f[1], 64)
				switch {
				case strings.HasPrefix(f[0], "kvgate_ttft_seconds_count{"):
					ttfts += v
				case strings.HasPrefix(f[0], "kvgate_requests_total{"):
					requests += v
				}
			}
			if ttfts > requests {
				t.Errorf("%v TTFTs counted for %v requests", ttfts, requests)
			}
			body := b.body(t, 0)
			if opts, _ := body["stream_options"].(map[string]any); body["stream"] != true || opts["include_usage"] != true {
				t.Fatalf("the engine was not asked for a stream with its usage: %v", body)
			}
		})
	}
}

// TestWholeAnswerNowhereToRetry: an engine that breaks an answer
// assembled whole, with no other engine to send it to, is a 502 saying
// why (outcome broken_stream), never half a JSON body.
func TestWholeAnswerNowhereToRetry(t *testing.T) {
	for _, fail := range []string{"abort", "eof"} {
		b := &breaker{words: 5, fail: fail}
		srv := b.server(t)
		eps := []fleet.Endpoint{{Name: "breaker", URL: srv.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 20000 * 50}}
		_, url, admin := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true}, Options{})
		r := post(t, url+"/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"x"}],"max_tokens":20}`, nil)
		var e struct{ Error struct{ Message string } }
		if err := json.Unmarshal([]byte(r.body), &e); r.status != 502 || err != nil || !strings.Contains(e.Error.Message, "stream broken") {
			t.Fatalf("%s: want a 502 saying why: %d %s", fail, r.status, r.body)
		}
		if m := get(t, admin+"/metrics"); !counted(m, "broken_stream") {
			t.Errorf("%s: not counted a broken stream", fail)
		}
	}
}

// TestWholeAnswerFail: a whole answer that failed before the client had
// any of it is a 502 saying why, or a 504 when the upstream timeout ran
// out; once the client has the answer's headers, nothing more is said.
func TestWholeAnswerFail(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
	}{
		{errors.New("connection reset"), 502},
		{fmt.Errorf("%w: %w", errStreamBroken, context.DeadlineExceeded), 504},
	} {
		rec := httptest.NewRecorder()
		a := newWholeAnswer(rec, chatAssembler, &atomic.Int64{})
		if !a.fail(c.err) || rec.Code != c.status || !strings.Contains(rec.Body.String(), c.err.Error()) {
			t.Errorf("%v: %d %s", c.err, rec.Code, rec.Body)
		}
		if a.fail(c.err) {
			t.Errorf("%v: told twice", c.err)
		}
	}
}

// TestWholeAnswerBudget: the answers being assembled share a byte
// budget; an event past it fails its answer (the client is told), and
// an answer's bytes come back when it ends.
func TestWholeAnswerBudget(t *testing.T) {
	var budget atomic.Int64
	budget.Store(wholeBudget - 100)
	ev := "data: " + `{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}` + "\n\n"
	a := newWholeAnswer(httptest.NewRecorder(), chatAssembler, &budget)
	a.Header().Set("Content-Type", "text/event-stream")
	a.WriteHeader(http.StatusOK)
	if _, err := a.Write([]byte(ev)); err != nil || budget.Load() <= wholeBudget-100 {
		t.Fatalf("within the budget: %v, %d held", err, budget.Load())
	}
	if _, err := a.Write([]byte(ev)); !errors.Is(err, errWholeBudget) {
		t.Fatalf("past the budget: %v", err)
	}
	a.release()
	if budget.Load() != wholeBudget-100 {
		t.Fatalf("released: %d", budget.Load())
	}
}

// fakeEngine answers every POST with answer and keeps the bodies.
type fakeEngine struct {
	answer func(w http.ResponseWriter)
	mu     sync.Mutex
	bodies []map[string]any
}

func (f *fakeEngine) server(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.mu.Unlock()
		f.answer(w)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestWholeAnswerAsItCame: what the engine did not stream goes to the
// client as it came: its refusal (a 400), a JSON answer from an engine
// that ignored stream, an error event in its stream (its status, its
// body); a request with a key a stream cannot answer exactly (echo) goes
// as the client sent it, and so does every request with
// NoStreamUpstream.
func TestWholeAnswerAsItCame(t *testing.T) {
	const refusal = `{"error":{"message":"too long","type":"BadRequestError","code":400}}`
	const plain = `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"as is","finish_reason":"stop"}]}`
	sse := func(events ...string) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, e := range events {
				fmt.Fprintf(w, "data: %s\n\n", e)
			}
		}
	}
	jsonAnswer := func(status int, body string) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		}
	}
	event := `{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","finish_reason":null}]}`
	for _, c := range []struct {
		name   string
		answer func(w http.ResponseWriter)
		body   string
		asSent bool
		status int
		want   string
		// streamed: the engine was asked for a stream.
		streamed bool
	}{
		{"refused", jsonAnswer(400, refusal), `"prompt":"x"`, false, 400, refusal, true},
		{"stream ignored", jsonAnswer(200, plain), `"prompt":"x"`, false, 200, plain, true},
		{"error event", sse(event, `{"error":{"object":"error","message":"engine fault","type":"InternalServerError","code":503}}`, "[DONE]"), `"prompt":"x"`, false, 503, "engine fault", true},
		{"echo", jsonAnswer(200, plain), `"prompt":"x","echo":true`, false, 200, plain, false},
		{"no_stream_upstream", jsonAnswer(200, plain), `"prompt":"x"`, true, 200, plain, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeEngine{answer: c.answer}
			srv := f.server(t)
			eps := []fleet.Endpoint{{Name: "fake", URL: srv.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 1e6}}
			g, url, _ := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true, NoStreamUpstream: c.asSent}, Options{})
			r := post(t, url+"/v1/completions", `{"model":"`+testModel+`",`+c.body+`}`, nil)
			if n := g.wholeBytes.Load(); n != 0 {
				t.Errorf("the answer served still holds %d bytes of the budget", n)
			}
			if r.status != c.status || !strings.Contains(r.body, c.want) {
				t.Fatalf("status %d %s, want %d with %s", r.status, r.body, c.status, c.want)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if streamed := f.bodies[0]["stream"] == true; streamed != c.streamed {
				t.Fatalf("engine asked for a stream: %v, want %v (%v)", streamed, c.streamed, f.bodies[0])
			}
		})
	}
}

// BenchmarkWholeAnswer: what answering whole from a stream costs the
// gateway per 500-token answer (vLLM's events, each with the usage the
// gateway asks for), against the same stream tapped for a streaming
// client, and against relaying the engine's own non-streamed answer,
// one write (the cost before: the gateway learned nothing from it).
func BenchmarkWholeAnswer(b *testing.B) {
	events := chatStreamEvents(500)
	for i, ev := range events {
		if strings.Contains(ev, `"choices":[{`) {
			events[i] = strings.Replace(ev, "]}\n\n", fmt.Sprintf(`],"usage":{"prompt_tokens":5,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n", 5+max(i-1, 0), max(i-1, 0)), 1)
		}
	}
	b.Run("non-streamed-relay", func(b *testing.B) {
		a := newWholeAnswer(&discardWriter{h: http.Header{}}, chatAssembler, &atomic.Int64{})
		a.asm.Event([]byte(strings.TrimPrefix(strings.TrimSpace(events[1]), "data: ")))
		for _, ev := range events[2:] {
			a.asm.Event([]byte(strings.TrimPrefix(strings.TrimSpace(ev), "data: ")))
		}
		_, answer, err := a.asm.Answer()
		if err != nil {
			b.Fatal(err)
		}
		w := &discardWriter{h: http.Header{}}
		rc := http.NewResponseController(w)
		for range b.N {
			if err := writeFlush(w, rc, answer); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/answer")
	})
	for _, whole := range []bool{false, true} {
		name := "streamed-tap"
		if whole {
			name = "whole-from-stream"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				var out http.ResponseWriter = &discardWriter{h: http.Header{"Content-Type": {"text/event-stream"}}}
				var a *wholeAnswer
				if whole {
					a = newWholeAnswer(out, chatAssembler, &atomic.Int64{})
					out = a
				}
				tap := newStreamTap(out, tapRequest(b, "null"), 5, 1, false)
				if whole {
					tap.final, tap.continuous = true, true
				}
				tap.WriteHeader(http.StatusOK)
				for _, ev := range events {
					if _, err := tap.Write([]byte(ev)); err != nil {
						b.Fatal(err)
					}
				}
				if whole {
					if err := a.finish(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/answer")
		})
	}
}

// BenchmarkWholeMessage: answering a Messages API request whole from its
// 500-token stream (vLLM's events: message_start, one text delta a
// token, message_delta, message_stop), as BenchmarkWholeAnswer's
// whole-from-stream does a chat answer.
func BenchmarkWholeMessage(b *testing.B) {
	events := []string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"chatcmpl-1\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"}
	for i := range 500 {
		events = append(events, fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" word%d\"}}\n\n", i))
	}
	events = append(events, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":5,\"output_tokens\":500}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	fresh := func() assembler { return &openai.MessagesAssembler{} }
	for range b.N {
		a := newWholeAnswer(&discardWriter{h: http.Header{"Content-Type": {"text/event-stream"}}}, fresh, &atomic.Int64{})
		a.WriteHeader(http.StatusOK)
		for _, ev := range events {
			if _, err := a.Write([]byte(ev)); err != nil {
				b.Fatal(err)
			}
		}
		if err := a.finish(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/answer")
}

// FuzzWholeAnswer: any bytes an engine streams (chat, Responses or
// Messages), in reads of any size, give the client one JSON answer (the
// assembled one, or a 502 saying why), and give back their share of the
// budget.
func FuzzWholeAnswer(f *testing.F) {
	f.Add([]byte("data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"), uint8(7), uint8(0))
	f.Add([]byte("data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\"}}\n\n"), uint8(3), uint8(1))
	f.Add([]byte(": keepalive\n\ndata: not json\n\ndata: {\"choi"), uint8(1), uint8(0))
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[]}}\n\n"+
		"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"+
		"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\ndata: {\"type\":\"message_stop\"}\n\n"), uint8(5), uint8(2))
	// api: the answer's API (mod 3): chat, the Responses or the Messages API.
	f.Fuzz(func(t *testing.T, in []byte, step, api uint8) {
		var budget atomic.Int64
		fresh := chatAssembler
		switch api % 3 {
		case 1:
			fresh = func() assembler { return &openai.ResponsesAssembler{} }
		case 2:
			fresh = func() assembler { return &openai.MessagesAssembler{} }
		}
		rec := httptest.NewRecorder()
		a := newWholeAnswer(rec, fresh, &budget)
		a.Header().Set("Content-Type", "text/event-stream")
		a.WriteHeader(http.StatusOK)
		var err error
		for p, n := in, max(int(step), 1); len(p) > 0 && err == nil; {
			k := min(n, len(p))
			_, err = a.Write(p[:k])
			p = p[k:]
		}
		if err == nil {
			err = a.finish()
		}
		if err != nil && !a.fail(err) {
			t.Fatalf("a failed answer the client was not told of: %v", err)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("the client got %d %q", rec.Code, rec.Body.Bytes())
		}
		if a.release(); budget.Load() != 0 {
			t.Fatalf("%d bytes of the budget kept", budget.Load())
		}
	})
}
