package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// sglangEngine is a stand-in for an SGLang engine's native /generate: it
// records the paths and bodies it is sent and answers as SGLang does
// (cumulative text and meta_info, streamed as SSE ending in [DONE]).
type sglangEngine struct {
	mu     sync.Mutex
	paths  []string
	bodies []string
}

func (s *sglangEngine) server(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.paths, s.bodies = append(s.paths, r.URL.Path), append(s.bodies, string(b))
		s.mu.Unlock()
		var req struct {
			Stream bool `json:"stream"`
		}
		_ = json.Unmarshal(b, &req)
		if !req.Stream {
			fmt.Fprint(w, `{"text":"decoded","meta_info":{"id":"x","prompt_tokens":3,"completion_tokens":2,"cached_tokens":0,"finish_reason":{"type":"length","length":2}}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i, text := range []string{"de", "decoded"} {
			fmt.Fprintf(w, "data: {\"text\":%q,\"meta_info\":{\"id\":\"x\",\"completion_tokens\":%d}}\n\n", text, i+1)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (s *sglangEngine) last() (path, body string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.paths) == 0 {
		return "", "", 0
	}
	return s.paths[len(s.paths)-1], s.bodies[len(s.bodies)-1], len(s.paths)
}

// TestGenerate: SGLang's native /generate is routed like a completion: its
// text (or input_ids) keyed by block, the body forwarded to the chosen
// engine's /generate as received, its answer relayed (streamed or not);
// a prompt routed once is predicted cached where it went; lora_path picks
// the adapter's endpoints; the model is the fleet's one base model.
func TestGenerate(t *testing.T) {
	a, b := &sglangEngine{}, &sglangEngine{}
	eps := []fleet.Endpoint{{Name: "a", URL: a.server(t), Model: testModel}, {Name: "b", URL: b.server(t), Model: testModel, LoRA: []string{"sql"}}}
	_, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "kvgate", BlockSize: 16}, Options{})
	text := prefix("generate")
	body := `{"text":` + strconv.Quote(text) + `,"sampling_params":{"max_new_tokens":2,"temperature":0},"rid":"r1"}`
	r1 := post(t, url+"/generate", body, nil)
	if r1.status != 200 || !strings.Contains(r1.body, `"decoded"`) {
		t.Fatalf("generate: %d %s", r1.status, r1.body)
	}
	home := map[string]*sglangEngine{"a": a, "b": b}[r1.header.Get(hdrPrefill)]
	if home == nil {
		t.Fatalf("routed to %q", r1.header.Get(hdrPrefill))
	}
	if path, got, _ := home.last(); path != "/generate" || got != body {
		t.Fatalf("forwarded %s %s", path, got)
	}
	stream := `{"text":` + strconv.Quote(text+" and more") + `,"stream":true}`
	r2 := post(t, url+"/generate", stream, nil)
	cached, _ := strconv.Atoi(r2.header.Get(hdrCached))
	if r2.status != 200 || r2.header.Get(hdrPrefill) != r1.header.Get(hdrPrefill) || cached < 1000 || !strings.HasSuffix(r2.body, "data: [DONE]\n\n") {
		t.Fatalf("second: %d to %s predicting %d cached: %s", r2.status, r2.header.Get(hdrPrefill), cached, r2.body)
	}
	ids := `{"input_ids":[1,2,3,4,5],"lora_path":"sql"}`
	for range 3 {
		if r := post(t, url+"/generate", ids, nil); r.status != 200 || r.header.Get(hdrPrefill) != "b" {
			t.Fatalf("lora_path sql: %d to %s %s", r.status, r.header.Get(hdrPrefill), r.body)
		}
	}
	for _, tc := range []struct {
		body   string
		status int
		says   string
	}{
		{`{"sampling_params":{"max_new_tokens":2}}`, 400, "text or input_ids"},
		{`{"text":"hi","sampling_params":{"max_new_tokens":-1}}`, 400, "sampling_params.max_new_tokens must be at least 0, got -1"},
		// 0 is SGLang's prefill-only request: the gateway passes it on
		// (it refused it as vLLM refuses max_tokens 0; walkthrough,
		// 2026-12-04).
		{`{"text":"hi","sampling_params":{"max_new_tokens":0}}`, 200, `"text":"decoded"`},
		{`{"text":"hi","lora_path":"nope"}`, 404, `(lora_path) does not exist.","type":"NotFoundError","param":"lora_path"`},
		{`{"text":"hi","sampling_params":{"n":0}}`, 400, `"param":"sampling_params.n"`},
	} {
		if r := post(t, url+"/generate", tc.body, nil); r.status != tc.status || !strings.Contains(r.body, tc.says) {
			t.Errorf("%s: %d %s", tc.body, r.status, r.body)
		}
	}
	// Two base models: /generate names none, so it is refused.
	two := append(eps, fleet.Endpoint{Name: "c", URL: eps[0].URL, Model: "other"})
	_, url2, _ := startGateway(t, Config{Endpoints: two, Policy: "kvgate", BlockSize: 16}, Options{})
	// It says so in /generate's terms (it asked for a "model" /generate
	// has no field for; walkthrough, 2026-12-04).
	if r := post(t, url2+"/generate", `{"text":"hi"}`, nil); r.status != 400 || !strings.Contains(r.body, "names no model") || !strings.Contains(r.body, `"param":"lora_path"`) {
		t.Fatalf("two models: %d %s", r.status, r.body)
	}
	// A batch's sampling_params and lora_path lists, as SGLang takes them.
	batch := `{"text":["a b c","d e f"],"sampling_params":[{"max_new_tokens":2},{"max_new_tokens":3}],"lora_path":["sql","sql"]}`
	if r := post(t, url+"/generate", batch, nil); r.status != 200 || r.header.Get(hdrPrefill) != "b" {
		t.Fatalf("a batch with lists: %d to %s %s", r.status, r.header.Get(hdrPrefill), r.body)
	}
}

// TestGenerateDisaggregated: /generate runs SGLang's P/D protocol (the
// body with bootstrap fields to both engines, the decode engine's answer
// the client's); a fleet in vLLM's P/D flow refuses it.
func TestGenerateDisaggregated(t *testing.T) {
	pair := &sglangPair{}
	pu, du := pair.servers(t)
	_, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{
		{Name: "p", URL: pu, Model: testModel, Role: fleet.RolePrefill, BootstrapPort: 8998},
		{Name: "d", URL: du, Model: testModel, Role: fleet.RoleDecode},
	}}, Options{})
	r := post(t, url+"/generate", `{"text":"hello there","stream":true,"sampling_params":{"max_new_tokens":4}}`, nil)
	if r.status != 200 || r.header.Get(hdrPrefill) != "p" || r.header.Get(hdrDecode) != "d" || !strings.Contains(r.body, "[DONE]") {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	pair.mu.Lock()
	pb, db := pair.prefill[len(pair.prefill)-1], pair.dec[len(pair.dec)-1]
	pair.mu.Unlock()
	if pb["text"] != "hello there" || pb["bootstrap_host"] != "127.0.0.1" || pb["bootstrap_room"] != db["bootstrap_room"] {
		t.Fatalf("legs: prefill %v, decode %v", pb, db)
	}

	v := &sglangEngine{}
	vu := v.server(t)
	_, urlV, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{
		{Name: "vp", URL: vu, Model: testModel, Role: fleet.RolePrefill},
		{Name: "vd", URL: vu, Model: testModel, Role: fleet.RoleDecode},
	}}, Options{})
	r = post(t, urlV+"/generate", `{"text":"hello there"}`, nil)
	if r.status != 400 || !strings.Contains(r.body, "vLLM's P/D flow") || r.header.Get(hdrPrefill) != "" {
		t.Fatalf("vLLM P/D: %d %v %s", r.status, r.header, r.body)
	}
	if _, _, n := v.last(); n != 0 {
		t.Fatalf("an engine was sent %d requests", n)
	}
}

// TestGenerateThroughEngines: /generate in front of engine emulators with
// KV events: a conversation's next prompt goes where its prefix is
// cached, and the engine finds there what the gateway predicted.
func TestGenerateThroughEngines(t *testing.T) {
	_, _, eps := twoAggregated(t)
	g, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "kvgate", BlockSize: 16,
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + eps[0].URL}}, Options{})
	waitSubscribed(t, g)
	text := prefix("engines")
	var home string
	for turn := range 3 {
		text += fmt.Sprintf(" turn %d of the conversation", turn)
		r := post(t, url+"/generate", `{"text":`+strconv.Quote(text)+`,"sampling_params":{"max_new_tokens":2}}`, nil)
		var a struct {
			MetaInfo struct {
				PromptTokens int `json:"prompt_tokens"`
				CachedTokens int `json:"cached_tokens"`
			} `json:"meta_info"`
		}
		if err := json.Unmarshal([]byte(r.body), &a); r.status != 200 || err != nil {
			t.Fatalf("turn %d: %d %s", turn, r.status, r.body)
		}
		predicted, _ := strconv.Atoi(r.header.Get(hdrCached))
		if turn == 0 {
			home = r.header.Get(hdrPrefill)
			continue
		}
		// The engine caches whole 16-token blocks: the gateway predicts
		// its cached blocks of the prompt, the engine reports them.
		if r.header.Get(hdrPrefill) != home || a.MetaInfo.CachedTokens < a.MetaInfo.PromptTokens/2 || predicted != a.MetaInfo.CachedTokens {
			t.Fatalf("turn %d: to %s (home %s), predicted %d cached, the engine %d of %d", turn, r.header.Get(hdrPrefill), home, predicted, a.MetaInfo.CachedTokens, a.MetaInfo.PromptTokens)
		}
	}
}
