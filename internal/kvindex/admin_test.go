package kvindex

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/tokens"
)

func TestAdminAPI(t *testing.T) {
	x := New(Config{BlockSize: 4})
	a := mustAdd(t, x, "127.0.0.1:8001", "m")
	mustAdd(t, x, "127.0.0.1:8002", "m")
	set, err := tokens.NewSet([]tokens.Spec{{Source: "estimate", BytesPerToken: 1}}, tokens.NewCache(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	adm := &Admin{Index: x, Tokens: set, Events: func() []EndpointEvents {
		return []EndpointEvents{{Endpoint: "127.0.0.1:8001", Model: "m", Stats: map[string]int{"gaps": 2}}}
	}}
	srv := httptest.NewServer(adm.Handler())
	defer srv.Close()

	ids := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	x.Store(a, 0, TierGPU, tokens.NewHasher(4).Keys(ids, nil))

	post := func(path, body string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out
	}

	code, out := post("/admin/kv/lookup", `{"model":"m","token_ids":[1,2,3,4,5,6,7,8,9,10]}`)
	if code != 200 || out["block_size"].(float64) != 4 {
		t.Fatalf("%d %v", code, out)
	}
	eps := out["endpoints"].([]any)
	first := eps[0].(map[string]any)
	if first["endpoint"] != "127.0.0.1:8001" || first["matched_tokens"].(float64) != 8 || first["tier"] != "gpu" {
		t.Errorf("lookup: %v", out)
	}
	if second := eps[1].(map[string]any); second["matched_tokens"].(float64) != 0 || second["tier"] != "none" {
		t.Errorf("second endpoint: %v", second)
	}

	// Prompt through the tokenizer, then an approximate entry.
	code, out = post("/admin/kv/routed", `{"model":"m","endpoint":"127.0.0.1:8002","prompt":"abcdefghij"}`)
	if code != 200 || out["blocks"].(float64) != 2 {
		t.Fatalf("routed: %d %v", code, out)
	}
	code, out = post("/admin/kv/lookup", `{"model":"m","prompt":"abcdefghijkl"}`)
	first = out["endpoints"].([]any)[0].(map[string]any)
	if code != 200 || first["endpoint"] != "127.0.0.1:8002" || first["matched_tokens"].(float64) != 8 || first["approx"] != true {
		t.Errorf("approx lookup: %d %v", code, out)
	}

	bad := []struct {
		path, body string
		code       int
	}{
		{"/admin/kv/lookup", `{`, 400},
		{"/admin/kv/lookup", `{"model":"m","token_ids":[1]} x`, 400},
		{"/admin/kv/lookup", `{"model":"m","token_ids":[1]}{"model":"m"}`, 400},
		{"/admin/kv/lookup", `[]`, 400},
		{"/admin/kv/lookup", `{"model":"m","token_ids":[4294967296]}`, 400},
		{"/admin/kv/lookup", `{"model":"m","token_ids":"1"}`, 400},
		{"/admin/kv/routed", `{"model":"` + strings.Repeat("m", 2000) + `","endpoint":"e","token_ids":[1]}`, 400},
		{"/admin/kv/lookup", `{"token_ids":[1]}`, 400},
		{"/admin/kv/lookup", `{"model":"m"}`, 400},
		{"/admin/kv/lookup", `{"model":"m","token_ids":[1],"prompt":"x"}`, 400},
		{"/admin/kv/lookup", `{"model":"m","token_ids":[-1]}`, 400},
		{"/admin/kv/lookup", `{"model":"nope","token_ids":[1]}`, 404},
		{"/admin/kv/routed", `{"model":"m","token_ids":[1]}`, 400},
		{"/admin/kv/routed", `{"model":"m","endpoint":"not a host","token_ids":[1,2,3,4]}`, 400},
	}
	for _, b := range bad {
		code, out := post(b.path, b.body)
		e, _ := out["error"].(map[string]any)
		if code != b.code || e == nil || e["message"] == "" || e["code"] != float64(b.code) || e["type"] == "" {
			t.Errorf("%s %s: %d %v, want %d with an OpenAI error body", b.path, b.body, code, out, b.code)
		}
	}
	resp, err := http.Get(srv.URL + "/admin/kv/lookup")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET lookup: %d", resp.StatusCode)
	}

	resp, err = http.Get(srv.URL + "/admin/kv/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Endpoints []struct {
			Endpoint  string         `json:"endpoint"`
			GPUBlocks int            `json:"gpu_blocks"`
			Events    map[string]int `json:"events"`
		} `json:"endpoints"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Endpoints) != 2 || st.Endpoints[0].GPUBlocks != 2 || st.Endpoints[0].Events["gaps"] != 2 {
		t.Errorf("stats: %+v", st)
	}
}

func postBody(t *testing.T, url, body string) (int, openai.ErrorBody) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb openai.ErrorBody
	json.NewDecoder(resp.Body).Decode(&eb)
	return resp.StatusCode, eb
}

// TestAdminLimits: bodies over the cap get 413; /admin/kv/routed registers
// at most MaxRoutedEndpoints endpoints and refuses more with a clear error,
// while endpoints already known still take entries.
func TestAdminLimits(t *testing.T) {
	x := New(Config{BlockSize: 4})
	mustAdd(t, x, "known:1", "m")
	adm := &Admin{Index: x, MaxRoutedEndpoints: 3, Bodies: httpserve.NewBodyLimiter(4096, 1024, 1, 100*time.Millisecond)}
	srv := httptest.NewServer(adm.Handler())
	defer srv.Close()

	ids := "[" + strings.Repeat("1,", 3000) + "1]"
	if code, eb := postBody(t, srv.URL+"/admin/kv/lookup", `{"model":"m","token_ids":`+ids+`}`); code != 413 || eb.Error.Type != "RequestTooLargeError" {
		t.Errorf("large lookup: %d %+v", code, eb.Error)
	}
	for i := 0; i < 2; i++ {
		if code, eb := postBody(t, srv.URL+"/admin/kv/routed", fmt.Sprintf(`{"model":"model-%d","endpoint":"e%d:1","token_ids":[1,2,3,4]}`, i, i)); code != 200 {
			t.Fatalf("routed %d: %d %+v", i, code, eb.Error)
		}
	}
	code, eb := postBody(t, srv.URL+"/admin/kv/routed", `{"model":"model-x","endpoint":"e9:1","token_ids":[1,2,3,4]}`)
	if code != 403 || !strings.Contains(eb.Error.Message, "--max-routed-endpoints") || !strings.Contains(eb.Error.Message, "limit is 3") {
		t.Errorf("routed past the limit: %d %+v", code, eb.Error)
	}
	if n := x.NumEndpoints(); n != 3 {
		t.Errorf("%d endpoints registered, want 3", n)
	}
	// Nothing to record (under one block): no endpoint registered for
	// good (a walkthrough registered any string, blocks 0).
	x2 := New(Config{BlockSize: 4})
	srv2 := httptest.NewServer((&Admin{Index: x2}).Handler())
	defer srv2.Close()
	if code, eb := postBody(t, srv2.URL+"/admin/kv/routed", `{"model":"m","endpoint":"e:1","token_ids":[1,2]}`); code != 200 || x2.NumEndpoints() != 0 {
		t.Errorf("routed under one block: %d %+v, %d endpoints registered", code, eb.Error, x2.NumEndpoints())
	}
	if code, _ := postBody(t, srv.URL+"/admin/kv/routed", `{"model":"m","endpoint":"known:1","token_ids":[1,2,3,4]}`); code != 200 {
		t.Errorf("routed for a known endpoint at the limit: %d", code)
	}
	if err := (&Admin{MaxRoutedEndpoints: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "--max-routed-endpoints") {
		t.Errorf("validate: %v", err)
	}
}

// TestAdminLookupTools: a lookup of a conversation is tokenized as the
// gateway tokenizes a chat request: the engine's /tokenize gets the
// tools, the template kwargs and every message as sent (its tool calls).
func TestAdminLookupTools(t *testing.T) {
	var got struct {
		Messages []map[string]any `json:"messages"`
		Tools    []any            `json:"tools"`
		Kwargs   map[string]any   `json:"chat_template_kwargs"`
	}
	set := tokenizeEngine(t, func(body []byte) int {
		got.Messages, got.Tools, got.Kwargs = nil, nil, nil
		_ = json.Unmarshal(body, &got)
		return 10 + 5*len(got.Tools) // the tools render into the prompt
	})
	x := New(Config{BlockSize: 4})
	mustAdd(t, x, "127.0.0.1:8001", "m")
	srv := httptest.NewServer((&Admin{Index: x, Tokens: set}).Handler())
	defer srv.Close()
	lookup := func(body string) (int, int) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/admin/kv/lookup", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			PromptTokens int `json:"prompt_tokens"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out.PromptTokens
	}
	msgs := `"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]`
	if code, n := lookup(`{"model":"m",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false}}`); code != 200 || n != 15 ||
		len(got.Messages) != 2 || got.Messages[1]["tool_calls"] == nil || len(got.Tools) != 1 || got.Kwargs["enable_thinking"] != false {
		t.Fatalf("with tools: %d, %d tokens; the engine got %+v", code, n, got)
	}
	if code, n := lookup(`{"model":"m",` + msgs + `}`); code != 200 || n != 10 {
		t.Fatalf("without tools: %d, %d tokens", code, n)
	}
	for _, bad := range []string{`"tools":{}`, `"chat_template_kwargs":[1]`, `"messages":[5]`} {
		body := `{"model":"m",` + msgs + `,` + bad + `}`
		if bad == `"messages":[5]` {
			body = `{"model":"m",` + bad + `}`
		}
		if code, _ := lookup(body); code != 400 {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}
}

// TestAdminLookupAsTheEngineTokenizes: a lookup reads vLLM's chat flags
// add_generation_prompt and continue_final_message (and passes them to
// the engine's /tokenize), reads booleans as vLLM does, names a mistyped
// field, and takes a LoRA adapter named as the model (found by a
// walkthrough: the flags were ignored, "garbage" accepted, and an
// adapter's name as the model a 404).
func TestAdminLookupAsTheEngineTokenizes(t *testing.T) {
	var got map[string]any
	set := tokenizeEngine(t, func(body []byte) int {
		got = nil
		_ = json.Unmarshal(body, &got)
		if got["add_generation_prompt"] == true {
			return 13
		}
		return 10
	})
	x := New(Config{BlockSize: 4})
	ep := mustAdd(t, x, "127.0.0.1:8001", "m")
	x.Store(ep, 0, TierGPU, tokens.NewHasher(4).Keys([]uint32{1, 2, 3, 4, 5, 6, 7, 8}, tokens.LoRAExtra("ad1")))
	adm := &Admin{Index: x, Tokens: set, Adapter: func(name string) (string, bool) { return "m", name == "ad1" }}
	srv := httptest.NewServer(adm.Handler())
	defer srv.Close()

	msgs := `"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]`
	cases := []struct {
		flags   string
		code, n int
		gen     any
		cont    any
	}{
		{"", 200, 13, true, false},
		{`"add_generation_prompt":false`, 200, 10, false, false},
		{`"add_generation_prompt":"no"`, 200, 10, false, false},
		{`"add_generation_prompt":false,"continue_final_message":true`, 200, 10, false, true},
		{`"add_generation_prompt":"garbage"`, 400, 0, nil, nil},
		{`"add_generation_prompt":true,"continue_final_message":true`, 400, 0, nil, nil},
	}
	for _, c := range cases {
		body := `{"model":"m",` + msgs
		if c.flags != "" {
			body += "," + c.flags
		}
		code, eb := postBody(t, srv.URL+"/admin/kv/lookup", body+"}")
		if code != c.code {
			t.Errorf("%s: %d %+v, want %d", c.flags, code, eb.Error, c.code)
			continue
		}
		if code != 200 {
			continue
		}
		resp, _ := http.Post(srv.URL+"/admin/kv/lookup", "application/json", strings.NewReader(body+"}"))
		var out LookupResponse
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if out.PromptTokens != c.n || got["add_generation_prompt"] != c.gen || (got["continue_final_message"] == true) != (c.cont == true) {
			t.Errorf("%s: %d tokens, the engine got %v, want %d tokens", c.flags, out.PromptTokens, got, c.n)
		}
	}

	code, eb := postBody(t, srv.URL+"/admin/kv/lookup", `{"model":"m","prompt":123}`)
	if code != 400 || eb.Error.Message != "prompt must be a string, not a number" || eb.Error.Param == nil || *eb.Error.Param != "prompt" {
		t.Errorf("a number as the prompt: %d %+v", code, eb.Error)
	}
	// A list of one string, as vLLM's completions take it, is that string
	// (it was refused); a list of two is refused (walkthrough, 2026-12-04).
	if code, eb := postBody(t, srv.URL+"/admin/kv/lookup", `{"model":"m","prompt":["text"]}`); code != 200 {
		t.Errorf("a list of one prompt: %d %+v", code, eb.Error)
	}
	if code, eb := postBody(t, srv.URL+"/admin/kv/lookup", `{"model":"m","prompt":["a","b"]}`); code != 400 || !strings.Contains(eb.Error.Message, "one prompt, got a list of 2") {
		t.Errorf("a list of two prompts: %d %+v", code, eb.Error)
	}

	resp, err := http.Post(srv.URL+"/admin/kv/lookup", "application/json", strings.NewReader(`{"model":"ad1","token_ids":[1,2,3,4,5,6,7,8,9]}`))
	if err != nil {
		t.Fatal(err)
	}
	var out LookupResponse
	_ = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(out.Endpoints) != 1 || out.Endpoints[0].MatchedTokens != 8 {
		t.Errorf("the adapter named as the model: %d %+v", resp.StatusCode, out)
	}
	// An adapter as the model beside a lora of its own was "no endpoint
	// serves model"; a lora name had no length limit (walkthrough,
	// 2026-12-04).
	code, eb = postBody(t, srv.URL+"/admin/kv/lookup", `{"model":"ad1","lora":"ad2","token_ids":[1]}`)
	if code != 404 || !strings.Contains(eb.Error.Message, `"ad1" is a LoRA adapter of model "m"`) {
		t.Errorf("an adapter as the model with a lora: %d %+v", code, eb.Error)
	}
	code, eb = postBody(t, srv.URL+"/admin/kv/lookup", `{"model":"m","lora":"`+strings.Repeat("a", 1100)+`","token_ids":[1]}`)
	if code != 400 || !strings.Contains(eb.Error.Message, "limited to 1024 bytes") {
		t.Errorf("a 1100-byte lora name: %d %+v", code, eb.Error)
	}
}

// TestAdminLookupPromptRefused: a prompt the engine's /tokenize refuses
// (vLLM versions whose /tokenize checks max_model_len) is the caller's
// 400 with the engine's message and param, not the index's 502.
func TestAdminLookupPromptRefused(t *testing.T) {
	set := tokenizeEngine(t, func(body []byte) int { return -1 })
	x := New(Config{BlockSize: 4})
	mustAdd(t, x, "127.0.0.1:8001", "m")
	srv := httptest.NewServer((&Admin{Index: x, Tokens: set}).Handler())
	defer srv.Close()
	code, eb := postBody(t, srv.URL+"/admin/kv/lookup", `{"model":"m","prompt":"a very long prompt"}`)
	if code != 400 || !strings.Contains(eb.Error.Message, "maximum context length is 2048 tokens") || eb.Error.Param == nil || *eb.Error.Param != "max_model_len" {
		t.Errorf("%d %+v", code, eb.Error)
	}
}

// tokenizeEngine is a tokenizer set over a stand-in engine whose /tokenize
// answers count(body) tokens, or when count is negative refuses the
// prompt as a vLLM that checks max_model_len does.
func tokenizeEngine(t *testing.T, count func(body []byte) int) *tokens.Set {
	t.Helper()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := count(body)
		if n < 0 {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"This model's maximum context length is 2048 tokens. However, your request has 4301 input tokens.","type":"BadRequestError","param":"max_model_len","code":400}}`)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": make([]int, n), "count": n})
	}))
	t.Cleanup(engine.Close)
	set, err := tokens.NewSet([]tokens.Spec{{Source: "engine", URL: engine.URL}}, tokens.NewCache(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return set
}
