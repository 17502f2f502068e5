package tokens

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// conversation returns a conversation of n messages: a system prompt,
// then user and assistant turns.
func conversation(n int, seed int) []Message {
	msgs := []Message{TextMessage("system", fmt.Sprintf("You are assistant %d. Answer briefly and cite sources.", seed))}
	for i := 1; i < n; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		msgs = append(msgs, TextMessage(role, fmt.Sprintf("turn %d of conversation %d: some words about the topic at hand", i, seed)))
	}
	return msgs
}

// engineIDs is what fakeEngine answers for a conversation.
func engineIDs(msgs []Message) []uint32 {
	return bytesOf("ENGINE:" + builtinTemplates["chatml"].Render(msgs))
}

// TestExactChatGrowingConversation: a conversation growing turn by turn
// costs one engine call per turn, none for a repeated one, and the cache
// holds about its final length, not every turn's copy of the prefix.
func TestExactChatGrowingConversation(t *testing.T) {
	var calls atomic.Int64
	srv := fakeEngine(t, &calls)
	defer srv.Close()
	ctx := context.Background()
	cache := NewCache(0)
	set, err := NewSet([]Spec{{Model: "m", Source: "engine", URL: srv.URL}}, cache, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tk := set.For("m")
	const turns = 20
	conv := conversation(2*turns, 1)
	sum := 0
	for n := 2; n <= len(conv); n += 2 {
		for range 2 { // the lookup, then the routed request
			ids, err := tk.Chat(ctx, conv[:n])
			if err != nil {
				t.Fatal(err)
			}
			if want := engineIDs(conv[:n]); !reflect.DeepEqual(ids, want) {
				t.Fatalf("turn %d: ids differ from the engine's", n/2)
			}
		}
		sum += len(engineIDs(conv[:n]))
	}
	if calls.Load() != turns {
		t.Errorf("%d engine calls for %d turns, want one per turn", calls.Load(), turns)
	}
	_, _, held := cache.Stats()
	final := len(engineIDs(conv))
	if held > final+turns*len("<|im_start|>assistant\n") {
		t.Errorf("cache holds %d ids for a conversation of %d (every turn whole: %d)", held, final, sum)
	}
	t.Logf("cache holds %d ids; final conversation %d; every turn whole would be %d", held, final, sum)
}

// TestExactChatCacheEviction: conversations sharing prefixes in a cache
// too small for them: every answer equals the engine's and the cache stays
// within its bound.
func TestExactChatCacheEviction(t *testing.T) {
	var calls atomic.Int64
	srv := fakeEngine(t, &calls)
	defer srv.Close()
	ctx := context.Background()
	const max = 6000
	cache := NewCache(max)
	tk := NewTokenizer(&EngineSource{BaseURL: srv.URL, Model: "m"}, builtinTemplates["chatml"], cache, true, "m")
	rng := rand.New(rand.NewPCG(1, 2))
	convs := make([][]Message, 6)
	for i := range convs {
		convs[i] = conversation(30, i)
	}
	tails := 0
	for range 400 {
		c := convs[rng.IntN(len(convs))]
		n := 1 + rng.IntN(len(c))
		ids, err := tk.Chat(ctx, c[:n])
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ids, engineIDs(c[:n])) {
			t.Fatalf("conversation of %d messages: ids differ from the engine's", n)
		}
		if _, _, held := cache.Stats(); held > max {
			t.Fatalf("cache holds %d ids, bound %d", held, max)
		}
		cache.mu.Lock()
		for _, el := range cache.m {
			if el.Value.(*cacheEntry).base != nil {
				tails++
			}
		}
		cache.mu.Unlock()
	}
	if tails == 0 {
		t.Error("no conversation was cached as a tail of an earlier turn")
	}
	// Every entry's bases are cached.
	cache.mu.Lock()
	defer cache.mu.Unlock()
	for _, el := range cache.m {
		for b := el.Value.(*cacheEntry).base; b != nil; b = b.Value.(*cacheEntry).base {
			if cache.m[b.Value.(*cacheEntry).key] != b {
				t.Fatal("an entry's base was evicted before it")
			}
		}
	}
}

// BenchmarkExactChatHit: a cached 40-message conversation held as tails of
// its earlier turns (as a growing conversation leaves it), against the
// same conversation cached whole under a key of its rendered text (the
// previous design).
func BenchmarkExactChatHit(b *testing.B) {
	var calls atomic.Int64
	srv := fakeEngine(b, &calls)
	defer srv.Close()
	ctx := context.Background()
	conv := conversation(40, 1)
	tk := NewTokenizer(&EngineSource{BaseURL: srv.URL, Model: "m"}, builtinTemplates["chatml"], NewCache(0), true, "m")
	for n := 2; n <= len(conv); n += 2 {
		if _, err := tk.Chat(ctx, conv[:n]); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("tails", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := tk.Chat(ctx, conv); err != nil {
				b.Fatal(err)
			}
		}
	})
	// As the gateway asks since 2026-12-04: each message with its object,
	// and an agent's tools (about 30 KB, Claude Code's order of size).
	objs := make([]Message, len(conv))
	for i, m := range conv {
		raw, _ := json.Marshal(map[string]string{"role": m.Role, "content": m.Text()})
		objs[i] = ObjectMessage(m.Role, m.Text(), raw)
	}
	var tools []map[string]any
	for i := range 60 {
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{"name": fmt.Sprint("tool", i),
			"description": strings.Repeat("Does one thing well. ", 20), "parameters": map[string]any{"type": "object"}}})
	}
	opts := ChatOptions{}
	opts.Tools, _ = json.Marshal(tools)
	for n := 2; n <= len(objs); n += 2 {
		if _, err := tk.ChatAs(ctx, objs[:n], opts); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("tails-objects-tools", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := tk.ChatAs(ctx, objs, opts); err != nil {
				b.Fatal(err)
			}
		}
	})
	whole := engineIDs(conv)
	flat := NewCache(0)
	b.Run("whole-rendered-key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			key := xxhash.Sum64String(tk.tmpl.Render(conv))
			ids, ok := flat.get(key)
			if !ok {
				flat.put(key, whole)
				ids = whole
			}
			_ = append([]uint32(nil), ids...)
		}
	})
	b.Run("miss-engine-call", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := (&EngineSource{BaseURL: srv.URL, Model: "m"}).TokenizeMessages(ctx, conv); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestExactChatDefaultAndFallback: source=engine renders chats with the
// engine by default (exact_chat=false opts out); an engine that refuses
// "messages" makes the tokenizer fall back on the template.
func TestExactChatDefaultAndFallback(t *testing.T) {
	var calls atomic.Int64
	srv := fakeEngine(t, &calls)
	defer srv.Close()
	ctx := context.Background()
	conv := conversation(3, 7)
	tmpl := builtinTemplates["chatml"]
	no := false
	for _, tc := range []struct {
		spec Spec
		want []uint32
	}{
		{Spec{Model: "m", Source: "engine", URL: srv.URL}, engineIDs(conv)},
		{Spec{Model: "m", Source: "engine", URL: srv.URL, ExactChat: &no}, bytesOf(tmpl.Render(conv))},
	} {
		set, err := NewSet([]Spec{tc.spec}, NewCache(0), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := set.For("m").Chat(ctx, conv)
		if err != nil || !reflect.DeepEqual(ids, tc.want) {
			t.Errorf("exact_chat %v: ids %v (%v)", tc.spec.ExactChat, ids, err)
		}
	}
	if sp, err := ParseSpec("model=m,source=engine,url=http://x,exact_chat=false"); err != nil || sp.ExactChat == nil || *sp.ExactChat {
		t.Errorf("exact_chat=false parsed as %+v, %v", sp, err)
	}

	// An engine whose /tokenize takes prompts only.
	var refused atomic.Int64
	promptOnly := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req tokenizeRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Prompt == nil {
			refused.Add(1)
			http.Error(w, `{"error":"prompt is required"}`, http.StatusBadRequest)
			return
		}
		ids := make([]int64, len(*req.Prompt))
		for i := range ids {
			ids[i] = int64((*req.Prompt)[i])
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": ids, "count": len(ids)})
	}))
	defer promptOnly.Close()
	tk := NewTokenizer(&EngineSource{BaseURL: promptOnly.URL, Model: "m"}, tmpl, NewCache(0), true, "m")
	// Its warning goes to the logger given (the default one ignored
	// kvgate serve's --log-level and format).
	var logged bytes.Buffer
	tk.log = slog.New(slog.NewTextHandler(&logged, nil))
	for range 3 {
		ids, err := tk.Chat(ctx, conv)
		if err != nil || !reflect.DeepEqual(ids, bytesOf(tmpl.Render(conv))) {
			t.Fatalf("fallback: %v %v", ids, err)
		}
	}
	if refused.Load() != 2 {
		t.Errorf("engine asked %d times for a conversation it refuses, want twice (the first and a plain one)", refused.Load())
	}
	if !strings.Contains(logged.String(), "level=WARN msg=\"tokens: the engine refused a conversation") {
		t.Errorf("the warning not on the tokenizer's logger: %q", logged.String())
	}
	// A failure that is not a refusal is an error, not a fallback.
	srv.Close()
	tk = NewTokenizer(&EngineSource{BaseURL: srv.URL, Model: "m"}, tmpl, NewCache(0), true, "m2")
	if _, err := tk.Chat(ctx, conv); err == nil {
		t.Error("no error from an engine that is down")
	}
}

// TestExactChatOneRefusal: an engine that refuses one conversation (its
// template refuses its tools, or its roles' order) but takes conversations
// is not given up on: that conversation is rendered with the template,
// and the next is exact again; the engine is asked about a plain
// conversation once, not at every refusal. Until 2026-12-04 one refused
// conversation made every later one use the template: a client could
// turn a gateway's exact tokenization off for everyone.
func TestExactChatOneRefusal(t *testing.T) {
	var plain atomic.Int64
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req tokenizeRequest
		switch err := json.NewDecoder(r.Body).Decode(&req); {
		case err != nil:
			http.Error(w, "bad", http.StatusBadRequest)
			return
		case req.Prompt != nil: // the template's segments
			_ = json.NewEncoder(w).Encode(map[string]any{"tokens": bytesOf(*req.Prompt), "count": len(*req.Prompt)})
			return
		}
		if len(req.Messages) == 1 && req.Messages[0].Text() == "hi" {
			plain.Add(1)
		}
		if len(req.Tools) > 0 {
			http.Error(w, `{"error":"tools[0].function.name: Field required"}`, http.StatusBadRequest)
			return
		}
		text := "ENGINE:"
		for _, m := range req.Messages {
			text += m.Role + "=" + m.Text() + ";"
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": bytesOf(text), "count": len(text)})
	}))
	defer engine.Close()
	tmpl := builtinTemplates["chatml"]
	tk := NewTokenizer(&EngineSource{BaseURL: engine.URL, Model: "m"}, tmpl, NewCache(0), true, "m")
	ctx := context.Background()
	conv := []Message{TextMessage("user", "q")}
	exact := bytesOf("ENGINE:user=q;")
	for i := range 3 {
		bad := ChatOptions{Tools: json.RawMessage(fmt.Sprintf(`[{"type":"function","function":{"n":%d}}]`, i))}
		ids, err := tk.ChatAs(ctx, conv, bad)
		if err != nil || !reflect.DeepEqual(ids, bytesOf(tmpl.Render(conv))) {
			t.Fatalf("refused conversation %d: %v (%v), want the template's", i, ids, err)
		}
		if ids, err := tk.ChatAs(ctx, conv, ChatOptions{}); err != nil || !reflect.DeepEqual(ids, exact) {
			t.Fatalf("after refusal %d: %v (%v), want the engine's", i, ids, err)
		}
	}
	if plain.Load() != 1 || !tk.exactChats() {
		t.Fatalf("asked about a plain conversation %d times, want once; exact %v", plain.Load(), tk.exactChats())
	}
}

// TestEngineSourceSendsAsSent: the tools, kwargs and message objects
// reach the engine's /tokenize as the client sent them, without the HTML
// escapes json.Marshal adds (an engine that renders their bytes, as
// kvgate's emulator did, rendered "\u003c" where the client's own request
// had "<": found with Codex CLI's tools, whose descriptions hold tags).
func TestEngineSourceSendsAsSent(t *testing.T) {
	var got []byte
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": []int{1}, "count": 1})
	}))
	defer engine.Close()
	src := &EngineSource{BaseURL: engine.URL, Model: "m"}
	tools := json.RawMessage(`[{"type":"function","function":{"name":"f","description":"<agent> & co"}}]`)
	obj := json.RawMessage(`{"role":"user","content":"<x>"}`)
	_, err := src.TokenizeChat(context.Background(), []Message{ObjectMessage("user", "<x>", obj)},
		ChatOptions{Mode: ChatGenerate, Tools: tools, Kwargs: json.RawMessage(`{"k":"<&>"}`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{string(tools), string(obj), `{"k":"<&>"}`} {
		if !bytes.Contains(got, []byte(want)) {
			t.Errorf("the engine got %s, without %s", got, want)
		}
	}
}

// TestChatAlternative: a conversation the engine refuses (4xx), or the
// model's own template raises on, is rendered as its Alternative when it
// has one (a Messages request's system messages folded, as vLLM folds
// them for a template that refuses them in place), and Prepare says so;
// a failure that is not a refusal is not.
func TestChatAlternative(t *testing.T) {
	ctx := context.Background()
	inline := []Message{TextMessage("system", "s"), TextMessage("user", "q"), TextMessage("system", "note")}
	folded := []Message{TextMessage("system", "s"), TextMessage("user", "q\n\nnote")}
	alt := func() []Message { return folded }
	var status atomic.Int64
	status.Store(http.StatusBadRequest)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req tokenizeRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		for i, m := range req.Messages {
			if i > 0 && m.Role == "system" {
				http.Error(w, `{"error":"System message must be at the beginning."}`, int(status.Load()))
				return
			}
		}
		text := "E:" + builtinTemplates["chatml"].Render(req.Messages)
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": bytesOf(text), "count": len(text)})
	}))
	defer engine.Close()
	set, err := NewSet([]Spec{{Model: "m", Source: "engine", URL: engine.URL}}, NewCache(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := bytesOf("E:" + builtinTemplates["chatml"].Render(folded))
	p, err := set.Prepare(ctx, "m", Input{Messages: inline, Chat: ChatOptions{Alternative: alt}}, 16)
	if err != nil || !p.Alternative || !reflect.DeepEqual(p.Tokens, want) {
		t.Fatalf("refused by the engine: alternative %v, %v", p.Alternative, err)
	}
	if p, err := set.Prepare(ctx, "m", Input{Messages: folded, Chat: ChatOptions{Alternative: alt}}, 16); err != nil || p.Alternative {
		t.Fatalf("taken as it is: alternative %v, %v", p.Alternative, err)
	}
	status.Store(http.StatusInternalServerError) // a failure, not a refusal
	if _, err := set.Prepare(ctx, "m", Input{Messages: append(inline, TextMessage("user", "x")), Chat: ChatOptions{Alternative: alt}}, 16); err == nil {
		t.Fatal("a failing engine's answer replaced by the alternative")
	}

	// The model's own template raising on a system message in place.
	dir := writeModelDir(t, map[string]any{"chat_template": `{% for m in messages %}{% if m.role == "system" and not loop.first %}` +
		`{{ raise_exception("System message must be at the beginning.") }}{% endif %}<|turn|>{{ m.role }}: {{ m.content }}<|end|>{% endfor %}`})
	local, err := NewSet([]Spec{{Model: "m", Source: "local", File: dir + "/tokenizer.json"}}, NewCache(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := local.Prepare(ctx, "m", Input{Messages: inline, Chat: ChatOptions{Alternative: alt}}, 16); err != nil || !p.Alternative || len(p.Tokens) == 0 {
		t.Fatalf("raised by the template: alternative %v, %v", p.Alternative, err)
	}
	if _, err := local.Prepare(ctx, "m", Input{Messages: inline}, 16); err == nil {
		t.Fatal("the raise without an alternative hidden")
	}
}
