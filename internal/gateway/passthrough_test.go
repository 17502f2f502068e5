package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestPassthroughTokenize: vLLM's /tokenize reaches an engine through the
// gateway, with the body's model or, when it names none, the fleet's one
// model.
func TestPassthroughTokenize(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, nil)
	_, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}}, Options{})
	for _, body := range []string{`{"model":"` + testModel + `","prompt":"hello there world"}`, `{"prompt":"hello there world"}`} {
		r := post(t, url+"/tokenize", body, nil)
		var tok struct {
			Count  int      `json:"count"`
			Tokens []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal([]byte(r.body), &tok); r.status != 200 || err != nil || tok.Count != 3 || len(tok.Tokens) != 3 || r.header.Get(hdrPrefill) != e.Addr() {
			t.Fatalf("%s: %d %s (%v)", body, r.status, r.body, err)
		}
	}
}

// TestPassthrough: other APIs are forwarded whole (path, query, body) to
// an endpoint of the model, spread over them, retried once elsewhere when
// one fails, and refused with a clear error when the body names no model
// kvgate serves.
func TestPassthrough(t *testing.T) {
	type hit struct{ path, body string }
	var down atomic.Bool
	fake := func(name string, hits chan<- hit) fleet.Endpoint {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if name == "a" && down.Load() {
				http.Error(w, `{"error":"engine sick"}`, http.StatusInternalServerError)
				return
			}
			b, _ := io.ReadAll(r.Body)
			hits <- hit{r.URL.RequestURI(), string(b)}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"object":"list","data":[{"embedding":[0.5]}],"by":"`+name+`"}`)
		}))
		t.Cleanup(s.Close)
		return fleet.Endpoint{Name: name, URL: s.URL, Model: testModel, LoRA: []string{"sql"}}
	}
	hitsA, hitsB := make(chan hit, 16), make(chan hit, 16)
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"engine sick"}`, http.StatusInternalServerError)
	}))
	t.Cleanup(sick.Close)
	eps := []fleet.Endpoint{fake("a", hitsA), fake("b", hitsB), {Name: "other", URL: "http://127.0.0.1:1", Model: "other"},
		{Name: "solo", URL: sick.URL, Model: "solo"}}
	_, url, admin := startGateway(t, Config{Endpoints: eps, Policy: "round-robin"}, Options{})
	body := `{"model":"` + testModel + `","input":["a b c"]}`
	r := post(t, url+"/v1/embeddings?x=1", body, nil)
	if r.status != 200 || !strings.Contains(r.body, `"embedding"`) {
		t.Fatalf("embeddings: %d %s", r.status, r.body)
	}
	var got hit
	select {
	case got = <-hitsA:
	case got = <-hitsB:
	}
	if got.path != "/v1/embeddings?x=1" || got.body != body {
		t.Fatalf("forwarded %+v", got)
	}
	// A forwarded answer carries its request id, as a routed one does
	// (walkthrough with the openai SDK, 2026-12-04).
	if id := r.header.Get("X-Request-Id"); id == "" {
		t.Error("a forwarded answer without X-Request-Id")
	}
	if r := post(t, url+"/v1/embeddings", body, map[string]string{"X-Request-Id": "mine-1"}); r.header.Get("X-Request-Id") != "mine-1" {
		t.Errorf("the client's request id: %q", r.header.Get("X-Request-Id"))
	}
	select { // that request's hit
	case <-hitsA:
	case <-hitsB:
	}
	// One request at a time: none is busier, each takes its turn.
	seen := map[string]int{}
	for range 4 {
		seen[post(t, url+"/v1/embeddings", body, nil).header.Get(hdrPrefill)]++
	}
	if seen["a"] != 2 || seen["b"] != 2 {
		t.Fatalf("endpoints %v", seen)
	}
	for range 4 { // drain
		select {
		case <-hitsA:
		case <-hitsB:
		}
	}
	// An engine answering 5xx: the request goes to the other.
	down.Store(true)
	for range 3 {
		if r := post(t, url+"/v1/score", `{"model":"sql","text_1":"a","text_2":"b"}`, nil); r.status != 200 || r.header.Get(hdrPrefill) != "b" {
			t.Fatalf("with a down: %d from %s: %s", r.status, r.header.Get(hdrPrefill), r.body)
		}
	}
	// The only endpoint of a model unreachable: kvgate says so; answering
	// 5xx: its answer is the client's.
	if r := post(t, url+"/v1/embeddings", `{"model":"other","input":"x"}`, nil); r.status != 502 || !strings.Contains(r.body, "endpoint other failed and no other serves") {
		t.Errorf("an unreachable only endpoint: %d %s", r.status, r.body)
	}
	if r := post(t, url+"/v1/embeddings", `{"model":"solo","input":"x"}`, nil); r.status != 500 || !strings.Contains(r.body, "engine sick") {
		t.Errorf("a sick only endpoint: %d %s", r.status, r.body)
	}
	for _, tt := range []struct {
		path, body string
		status     int
		msg        string
	}{
		{"/v1/embeddings", `{"model":"nope","input":"x"}`, 404, "does not exist"},
		{"/v1/embeddings", `{"input":"x"}`, 400, "model is required: kvgate serves 3 models"},
		{"/v1/embeddings", `not json`, 400, "request body must be a JSON object"},
		// The routed APIs' words, not encoding/json's Go struct
		// (walkthrough, 2026-12-04).
		{"/v1/embeddings", `{"model":123,"input":"x"}`, 400, `"message":"model must be a string, not a number","type":"BadRequestError","param":"model"`},
		{"/v1/responses/resp_unknown/cancel", `{}`, 404, "kvgate routed no answer of that id, and none of its engines keeps one"},
		{"/v1/other", `{}`, 404, "forwards POST /v1/embeddings"},
	} {
		if r := post(t, url+tt.path, tt.body, nil); r.status != tt.status || !strings.Contains(r.body, tt.msg) {
			t.Errorf("%s %s: %d %s", tt.path, tt.body, r.status, r.body)
		}
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, `kvgate_passthrough_requests_total{outcome="ok"} 9`) || !strings.Contains(m, `kvgate_passthrough_requests_total{outcome="refused"} 4`) {
		t.Errorf("passthrough metrics:\n%s", grepLines(m, "kvgate_passthrough"))
	}
}

// TestPassthroughCountsInFlight: forwarded requests count towards
// max_inflight: beyond it the client gets 429 and no engine is asked.
func TestPassthroughCountsInFlight(t *testing.T) {
	hold, arrived := make(chan struct{}), make(chan struct{}, 4)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-hold
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(s.Close)
	t.Cleanup(func() { close(hold) })
	_, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{{Name: "a", URL: s.URL, Model: testModel}}, MaxInflight: 1}, Options{})
	done := make(chan result, 1)
	go func() { done <- post(t, url+"/v1/embeddings", `{"model":"`+testModel+`","input":"x"}`, nil) }()
	<-arrived
	if r := post(t, url+"/v1/embeddings", `{"model":"`+testModel+`","input":"y"}`, nil); r.status != 429 || !strings.Contains(r.body, "more than 1 requests in flight") {
		t.Fatalf("second request: %d %s", r.status, r.body)
	}
	if len(arrived) != 0 {
		t.Fatal("the refused request reached the engine")
	}
	hold <- struct{}{}
	if r := <-done; r.status != 200 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
}

// TestPassthroughAudio: the audio APIs' multipart forms are forwarded
// byte for byte with their own content type (boundary), to an endpoint of
// the model their "model" field names; a form without one goes to the
// fleet's one model, one that does not parse gets 400.
func TestPassthroughAudio(t *testing.T) {
	type hit struct{ path, ctype, body string }
	hits := make(chan hit, 4)
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hits <- hit{r.URL.Path, r.Header.Get("Content-Type"), string(b)}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"text":"hello"}`)
	}))
	t.Cleanup(eng.Close)
	_, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{{Name: "w", URL: eng.URL, Model: "whisper"}}}, Options{})
	form := func(fields map[string]string) (string, string) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		fw, _ := mw.CreateFormFile("file", "a.wav")
		fw.Write([]byte("RIFF\x00\x01binary audio\r\n--not-a-boundary"))
		for k, v := range fields {
			mw.WriteField(k, v)
		}
		mw.Close()
		return b.String(), mw.FormDataContentType()
	}
	send := func(path, body, ctype string) result {
		return post(t, url+path, body, map[string]string{"Content-Type": ctype})
	}
	for _, tc := range []struct {
		path   string
		fields map[string]string
	}{
		{"/v1/audio/transcriptions", map[string]string{"model": "whisper", "language": "en"}},
		{"/v1/audio/translations", nil}, // the fleet's one model
	} {
		body, ctype := form(tc.fields)
		r := send(tc.path, body, ctype)
		if r.status != 200 || r.body != `{"text":"hello"}` {
			t.Fatalf("%s: %d %s", tc.path, r.status, r.body)
		}
		got := <-hits
		if got.path != tc.path || got.ctype != ctype || got.body != body {
			t.Fatalf("%s forwarded as %q, %q, body equal %v", tc.path, got.path, got.ctype, got.body == body)
		}
	}
	body, ctype := form(map[string]string{"model": "nope"})
	if r := send("/v1/audio/transcriptions", body, ctype); r.status != 404 {
		t.Fatalf("unknown model: %d %s", r.status, r.body)
	}
	for _, bad := range []struct{ body, ctype string }{
		{"no form here", "multipart/form-data; boundary=xyz"},
		{body, "multipart/form-data"},
		{strings.Replace(body, "nope", strings.Repeat("m", maxFormModel+1), 1), ctype},
	} {
		if r := send("/v1/audio/transcriptions", bad.body, bad.ctype); r.status != 400 {
			t.Fatalf("%q: %d %s", bad.ctype, r.status, r.body)
		}
	}
	select {
	case h := <-hits:
		t.Fatalf("a refused form reached the engine: %s", h.path)
	default:
	}
}

// FuzzFormModel: whatever form a client sends, reading its model field
// neither panics nor returns more than maxFormModel bytes.
func FuzzFormModel(f *testing.F) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	mw.WriteField("model", "whisper")
	mw.Close()
	f.Add(b.Bytes(), mw.Boundary())
	f.Add([]byte("--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--x--\r\n"), "x")
	f.Fuzz(func(t *testing.T, body []byte, boundary string) {
		m, err := formModel(body, boundary)
		if err == nil && len(m) > maxFormModel {
			t.Fatalf("model of %d bytes", len(m))
		}
	})
}
