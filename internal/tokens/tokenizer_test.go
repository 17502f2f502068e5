package tokens

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// fakeEngine serves vLLM's /tokenize with one token per byte.
func fakeEngine(t testing.TB, calls *atomic.Int64) *httptest.Server {
	t.Helper()
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tokenize" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		calls.Add(1)
		var req tokenizeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "m" {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		text := ""
		if req.Prompt != nil {
			text = *req.Prompt
		} else {
			text = "ENGINE:" + builtinTemplates["chatml"].Render(req.Messages)
		}
		ids := make([]int64, len(text))
		for i := range text {
			ids[i] = int64(text[i])
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids), "max_model_len": 8192})
	}))
}

func bytesOf(s string) []uint32 {
	out := make([]uint32, len(s))
	for i := range s {
		out[i] = uint32(s[i])
	}
	return out
}

func TestEngineSourceAndSegmentCache(t *testing.T) {
	var calls atomic.Int64
	srv := fakeEngine(t, &calls)
	defer srv.Close()
	ctx := context.Background()
	tmpl, _ := LookupTemplate("")
	tok := NewTokenizer(&EngineSource{BaseURL: srv.URL, Model: "m"}, tmpl, NewCache(0), false, "m")

	conv := []Message{TextMessage("system", "be brief"), TextMessage("user", "hi")}
	ids, err := tok.Chat(ctx, conv)
	if err != nil {
		t.Fatal(err)
	}
	if want := bytesOf(tmpl.Render(conv)); !reflect.DeepEqual(ids, want) {
		t.Fatalf("chat ids %v, want %v", ids, want)
	}
	first := calls.Load() // system, user, generation prompt
	if first != 3 {
		t.Errorf("%d calls, want 3", first)
	}
	// The conversation grows by two messages: only those are tokenized.
	conv = append(conv, TextMessage("assistant", "hello"), TextMessage("user", "more"))
	if _, err := tok.Chat(ctx, conv); err != nil {
		t.Fatal(err)
	}
	if got := calls.Load() - first; got != 2 {
		t.Errorf("growing conversation: %d new calls, want 2", got)
	}
	// Prompts are cached whole.
	for i := 0; i < 3; i++ {
		if p, err := tok.Prompt(ctx, "abc"); err != nil || !reflect.DeepEqual(p, bytesOf("abc")) {
			t.Fatalf("prompt: %v %v", p, err)
		}
	}
	if got := calls.Load() - first; got != 3 {
		t.Errorf("prompt cache: %d calls", got)
	}
	// Exact chat goes through the engine's template, cached per conversation.
	ex := NewTokenizer(&EngineSource{BaseURL: srv.URL, Model: "m"}, tmpl, NewCache(0), true, "m-exact")
	before := calls.Load()
	a, _ := ex.Chat(ctx, conv)
	b, _ := ex.Chat(ctx, conv)
	if calls.Load()-before != 1 || !reflect.DeepEqual(a, b) || string(rune(a[0])) != "E" {
		t.Errorf("exact chat: %d calls, ids %v", calls.Load()-before, a[:5])
	}
	// Errors are reported, not cached.
	bad := NewTokenizer(&EngineSource{BaseURL: srv.URL, Model: "other"}, tmpl, NewCache(0), false, "other")
	if _, err := bad.Prompt(ctx, "x"); err == nil {
		t.Error("no error for a 400")
	}
}

func TestEstimateSource(t *testing.T) {
	ctx := context.Background()
	s := EstimateSource{BytesPerToken: 4}
	a, _ := s.Tokenize(ctx, "hello world, this is a prompt")
	b, _ := s.Tokenize(ctx, "hello world, this is a different prompt")
	if len(a) != 8 {
		t.Errorf("%d pseudo-tokens for 29 bytes", len(a))
	}
	if !reflect.DeepEqual(a[:5], b[:5]) || reflect.DeepEqual(a[5:], b[5:8]) {
		t.Errorf("prefix property broken: %v vs %v", a, b)
	}
}

func TestSpecsAndSet(t *testing.T) {
	sp, err := ParseSpec("model=m,source=estimate,bytes_per_token=3,template=llama3")
	if err != nil || sp.Model != "m" || sp.BytesPerToken != 3 || sp.Template != "llama3" {
		t.Fatalf("%+v %v", sp, err)
	}
	placed, err := NewSet([]Spec{must(ParseSpec("model=f,inline_system=fold")), must(ParseSpec("model=h,inline_system=hoist"))}, nil, nil, nil)
	if err != nil || placed.For("f").InlineSystem() != openai.InlineFold || placed.For("h").InlineSystem() != openai.InlineHoist || placed.For("x").InlineSystem() != openai.InlinePreserve {
		t.Fatalf("inline system placements not kept: %v", err)
	}
	for _, bad := range []string{"model", "source=engine,foo=1", "bytes_per_token=x", "inline_system=top"} {
		if _, err := ParseSpec(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := NewSet([]Spec{{Model: "m", Source: "engine"}}, nil, nil, nil); err == nil {
		t.Error("engine without url accepted")
	}
	if _, err := NewSet([]Spec{{Model: "m", Template: "nope"}}, nil, nil, nil); err == nil {
		t.Error("unknown template accepted")
	}
	set, err := NewSet([]Spec{sp}, NewCache(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, _ := set.For("m").Prompt(ctx, "abcdef")
	b, _ := set.For("other").Prompt(ctx, "abcdef")
	if len(a) != 2 || len(b) != 2 { // 3 and 4 bytes per token
		t.Errorf("per-model sources: %d %d", len(a), len(b))
	}
	msgs := []Message{{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]`)}}
	if got := msgs[0].Text(); got != "a\nb" {
		t.Errorf("parts: %q", got)
	}
}

// TestSharedCacheKeepsModelsApart: two models with different tokenizers
// share one cache and must never get each other's ids.
func TestSharedCacheKeepsModelsApart(t *testing.T) {
	cache := NewCache(0)
	set, err := NewSet([]Spec{{Model: "a", BytesPerToken: 4}, {Model: "b", BytesPerToken: 2}}, cache, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	text := "the same text for both models"
	a, _ := set.For("a").Prompt(context.Background(), text)
	b, _ := set.For("b").Prompt(context.Background(), text)
	if len(a) == len(b) {
		t.Fatalf("model b got model a's ids from the shared cache: %d and %d tokens", len(a), len(b))
	}
}

func TestPrepare(t *testing.T) {
	set, err := NewSet(nil, NewCache(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	text := strings.Repeat("abcd", 40) // 40 estimate tokens
	p, err := set.Prepare(ctx, "m", Input{Prompt: &text}, 16)
	if err != nil || len(p.Tokens) != 40 || len(p.Keys) != 2 {
		t.Fatalf("%d tokens %d keys %v", len(p.Tokens), len(p.Keys), err)
	}
	ids, err := set.Prepare(ctx, "m", Input{TokenIDs: p.Tokens}, 16)
	if err != nil || ids.Keys[1] != p.Keys[1] {
		t.Fatal("token ids and the prompt they came from must give the same keys", err)
	}
	if p.EngineIDs || !ids.EngineIDs {
		t.Fatalf("engine ids: estimated %v, given %v; want false, true", p.EngineIDs, ids.EngineIDs)
	}
	lora, _ := set.Prepare(ctx, "m", Input{TokenIDs: p.Tokens, LoRA: "x"}, 16)
	if lora.Keys[0] == p.Keys[0] {
		t.Fatal("a LoRA adapter must change the keys")
	}
	for _, in := range []Input{{}, {Prompt: &text, TokenIDs: []uint32{1}}} {
		if _, err := set.Prepare(ctx, "m", in, 16); err != ErrNoInput {
			t.Errorf("%+v: %v", in, err)
		}
	}
	if _, err := set.Prepare(ctx, "m", Input{Prompt: &text}, 0); err == nil {
		t.Error("block size 0 accepted")
	}
}

// TestEngineIDs: a tokenizer gives the engine's own ids for prompts unless
// it estimates, and for conversations only while it renders them with the
// engine's own chat template.
func TestEngineIDs(t *testing.T) {
	engine := &EngineSource{BaseURL: "http://127.0.0.1:1", Model: "m"}
	tests := []struct {
		name          string
		tk            *Tokenizer
		refused       bool // the engine refused a conversation once
		prompt, chats bool
	}{
		{"estimate", NewTokenizer(EstimateSource{}, builtinTemplates["chatml"], nil, true, "e"), false, false, false},
		{"engine, exact chats", NewTokenizer(engine, builtinTemplates["chatml"], nil, true, "a"), false, true, true},
		{"engine, chats by template", NewTokenizer(engine, builtinTemplates["chatml"], nil, false, "b"), false, true, false},
		{"engine that refused a chat", NewTokenizer(engine, builtinTemplates["chatml"], nil, true, "c"), true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.tk.noMessages.Store(tt.refused)
			if got := tt.tk.engineIDs(false); got != tt.prompt {
				t.Errorf("engine ids for prompts %v, want %v", got, tt.prompt)
			}
			if got := tt.tk.engineIDs(true); got != tt.chats {
				t.Errorf("engine ids for chats %v, want %v", got, tt.chats)
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestEngineSourceFallback: a model's source=engine tokenizer asks the
// model's other engines when its configured one cannot answer (down, or
// a 5xx), first when the fleet knows it is out, not on a refusal of the
// request's form (a 4xx: every engine would refuse it), never past the
// caller's deadline, and without url= it asks the model's engines.
func TestEngineSourceFallback(t *testing.T) {
	answer := func(code int, calls *atomic.Int64) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if code != http.StatusOK {
				http.Error(w, "no", code)
				return
			}
			fmt.Fprint(w, `{"tokens":[7,8,9],"count":3}`)
		}))
	}
	var okCalls, badCalls, refusing atomic.Int64
	ok := answer(http.StatusOK, &okCalls)
	defer ok.Close()
	failing := answer(http.StatusServiceUnavailable, &badCalls)
	defer failing.Close()
	refuser := answer(http.StatusBadRequest, &refusing)
	defer refuser.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	cases := []struct {
		name       string
		configured string
		others     []string
		out        bool
		want       bool  // tokens come back
		ok, bad    int64 // calls each
	}{
		{"configured answers", ok.URL, []string{failing.URL}, false, true, 1, 0},
		{"configured unreachable", deadURL, []string{ok.URL}, false, true, 1, 0},
		{"configured fails with a 5xx", failing.URL, []string{ok.URL}, false, true, 1, 1},
		{"configured out: others first", failing.URL, []string{ok.URL}, true, true, 1, 0},
		{"no url: the model's engines", "", []string{deadURL, ok.URL}, false, true, 1, 0},
		{"every engine down", deadURL, []string{failing.URL}, false, false, 0, 1},
		{"no engine at all", "", nil, false, false, 0, 0},
		{"a refusal is the request's", refuser.URL, []string{ok.URL}, false, false, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			okCalls.Store(0)
			badCalls.Store(0)
			var asked []string
			fb := func(model, configured string) ([]string, bool) {
				asked = append(asked, model+"|"+configured)
				return tc.others, tc.out
			}
			set, err := NewSet([]Spec{{Model: "m", Source: "engine", URL: tc.configured}}, nil, nil, fb)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := set.For("m").src.Tokenize(context.Background(), "hello")
			if got := err == nil; got != tc.want {
				t.Fatalf("tokens %v, err %v; want tokens %v", ids, err, tc.want)
			}
			if tc.want && !reflect.DeepEqual(ids, []uint32{7, 8, 9}) {
				t.Fatalf("ids %v", ids)
			}
			if okCalls.Load() != tc.ok || badCalls.Load() != tc.bad {
				t.Fatalf("calls: answering %d, failing %d; want %d, %d", okCalls.Load(), badCalls.Load(), tc.ok, tc.bad)
			}
			if len(asked) != 1 || asked[0] != "m|"+tc.configured {
				t.Fatalf("fallback asked %v", asked)
			}
		})
	}
	t.Run("a hung engine", func(t *testing.T) {
		// A frozen API server: it takes the request and never answers.
		hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		}))
		defer hung.Close()
		okCalls.Store(0)
		set, err := NewSet([]Spec{{Model: "m", Source: "engine", URL: hung.URL}}, nil, nil,
			func(string, string) ([]string, bool) { return []string{ok.URL}, false })
		if err != nil {
			t.Fatal(err)
		}
		const deadline = 2 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		ids, err := set.For("m").src.Tokenize(ctx, "hello")
		// The hung engine has half the deadline (two engines to ask),
		// the other answers at once: it took the whole deadline and
		// failed.
		if err != nil || !reflect.DeepEqual(ids, []uint32{7, 8, 9}) || okCalls.Load() != 1 {
			t.Fatalf("ids %v, err %v after %v, %d calls; want the other engine's answer", ids, err, time.Since(start), okCalls.Load())
		}
	})
	t.Run("deadline", func(t *testing.T) {
		okCalls.Store(0)
		set, err := NewSet([]Spec{{Model: "m", Source: "engine", URL: ok.URL}}, nil, nil,
			func(string, string) ([]string, bool) { return []string{ok.URL}, false })
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := set.For("m").src.Tokenize(ctx, "hello"); err == nil || okCalls.Load() != 0 {
			t.Fatalf("err %v after %d calls; want the caller's deadline, no call", err, okCalls.Load())
		}
	})
	// Without a fleet (kvgate kvindex) url= is required, as is a model
	// for the fallback.
	if _, err := NewSet([]Spec{{Model: "m", Source: "engine"}}, nil, nil, nil); err == nil {
		t.Fatal("source=engine without url= and without a fleet accepted")
	}
	if _, err := NewSet([]Spec{{Source: "engine"}}, nil, nil, func(string, string) ([]string, bool) { return nil, false }); err == nil {
		t.Fatal("a default source=engine without url= accepted")
	}
}

// TestPromptSpecialTokens: a completion's prompt is tokenized with the
// tokenizer's special tokens unless the request says otherwise, each way
// cached apart: the engine is asked with add_special_tokens as the
// request wants it.
func TestPromptSpecialTokens(t *testing.T) {
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			AddSpecialTokens *bool `json:"add_special_tokens"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.AddSpecialTokens != nil && *req.AddSpecialTokens {
			asked = append(asked, "special")
			fmt.Fprint(w, `{"tokens":[1,7,8]}`)
			return
		}
		asked = append(asked, "plain")
		fmt.Fprint(w, `{"tokens":[7,8]}`)
	}))
	defer srv.Close()
	set, err := NewSet([]Spec{{Model: "m", Source: "engine", URL: srv.URL}}, NewCache(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	text := "hello"
	for _, tc := range []struct {
		no   bool
		want []uint32
	}{{false, []uint32{1, 7, 8}}, {true, []uint32{7, 8}}, {false, []uint32{1, 7, 8}}, {true, []uint32{7, 8}}} {
		p, err := set.Prepare(context.Background(), "m", Input{Prompt: &text, NoSpecialTokens: tc.no}, 16)
		if err != nil || !reflect.DeepEqual(p.Tokens, tc.want) {
			t.Fatalf("no special tokens %v: %v %v, want %v", tc.no, p.Tokens, err, tc.want)
		}
	}
	if !reflect.DeepEqual(asked, []string{"special", "plain"}) {
		t.Fatalf("the engine was asked %v; want once each way (then cached)", asked)
	}
}
