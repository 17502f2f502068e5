package engine

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestGenerateAPI: SGLang's native /generate is answered as SGLang answers
// it (the text and meta_info; streamed, the text so far in each event and
// [DONE]), with max_new_tokens honoured, 128 tokens at most without it, a
// repeated prompt's prefix cached, lora_path naming an adapter.
func TestGenerateAPI(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.LoRAModules = []string{"sql"} })
	type answer struct {
		Text     string `json:"text"`
		MetaInfo struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			CachedTokens     int `json:"cached_tokens"`
			FinishReason     *struct {
				Type string `json:"type"`
			} `json:"finish_reason"`
		} `json:"meta_info"`
	}
	text := strings.Repeat("the quick brown fox jumps ", 40)
	gen := func(body map[string]any) answer {
		resp, b := postJSON(t, e.URL()+"/generate", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%v: %d %s", body, resp.StatusCode, b)
		}
		var a answer
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		return a
	}
	a := gen(map[string]any{"text": text, "sampling_params": map[string]any{"max_new_tokens": 5}})
	if a.MetaInfo.CompletionTokens != 5 || len(strings.Fields(a.Text)) != 5 || a.MetaInfo.PromptTokens != len(Tokenize(text)) ||
		a.MetaInfo.FinishReason == nil || a.MetaInfo.FinishReason.Type != "length" {
		t.Fatalf("first: %+v", a)
	}
	if b := gen(map[string]any{"text": text, "sampling_params": map[string]any{"max_new_tokens": 1}}); b.MetaInfo.CachedTokens < 160 {
		t.Fatalf("the repeated prompt: %d cached of %d", b.MetaInfo.CachedTokens, b.MetaInfo.PromptTokens)
	}
	if c := gen(map[string]any{"input_ids": []int{5, 6, 7, 8}}); c.MetaInfo.CompletionTokens < 1 || c.MetaInfo.CompletionTokens > 128 {
		t.Fatalf("without max_new_tokens: %d tokens", c.MetaInfo.CompletionTokens)
	}
	if d := gen(map[string]any{"text": text, "lora_path": "sql", "sampling_params": map[string]any{"max_new_tokens": 1}}); d.MetaInfo.CachedTokens != 0 {
		t.Fatalf("an adapter's prompt found the base model's cache: %d cached", d.MetaInfo.CachedTokens)
	}
	resp, evs, _ := streamRequest(t, e.URL()+"/generate", map[string]any{"text": "hello world", "stream": true, "sampling_params": map[string]any{"max_new_tokens": 3}})
	if resp.StatusCode != 200 || len(evs) != 4 || evs[3].data != "[DONE]" {
		t.Fatalf("stream: %d %v", resp.StatusCode, evs)
	}
	var last answer
	for i, ev := range evs[:3] {
		var s answer
		if err := json.Unmarshal([]byte(ev.data), &s); err != nil || s.MetaInfo.CompletionTokens != i+1 || len(strings.Fields(s.Text)) != i+1 {
			t.Fatalf("event %d: %s (%v)", i, ev.data, err)
		}
		last = s
	}
	if last.MetaInfo.FinishReason == nil || last.MetaInfo.FinishReason.Type != "length" {
		t.Fatalf("last event: %+v", last)
	}
	for _, tc := range []struct {
		body   map[string]any
		status int
	}{
		{map[string]any{"text": "hi", "lora_path": "nope"}, 404},
		{map[string]any{"sampling_params": map[string]any{}}, 400},
		{map[string]any{"text": "hi", "sampling_params": map[string]any{"n": 2}}, 400},
	} {
		if resp, b := postJSON(t, e.URL()+"/generate", tc.body); resp.StatusCode != tc.status {
			t.Errorf("%v: %d %s", tc.body, resp.StatusCode, b)
		}
	}
	// A list of one prompt is answered with a list of one answer, as
	// SGLang answers any list; the rid names the answer, and a length
	// stop says its length (walkthrough, 2026-12-04).
	resp, b := postJSON(t, e.URL()+"/generate", map[string]any{"text": []string{"hi there"}, "rid": "myrid1", "sampling_params": map[string]any{"max_new_tokens": 3}})
	var list []struct {
		MetaInfo struct {
			ID           string `json:"id"`
			FinishReason struct {
				Type   string `json:"type"`
				Length int    `json:"length"`
			} `json:"finish_reason"`
		} `json:"meta_info"`
	}
	if err := json.Unmarshal(b, &list); resp.StatusCode != 200 || err != nil || len(list) != 1 || list[0].MetaInfo.ID != "myrid1" {
		t.Errorf("a batch of one: %d %s (%v)", resp.StatusCode, b, err)
	} else if fr := list[0].MetaInfo.FinishReason; fr.Type != "length" || fr.Length != 3 {
		t.Errorf("a length stop: %+v, want length 3", fr)
	}
	// SGLang's field and words for max_new_tokens (they were vLLM's
	// max_tokens'), and 0, SGLang's prefill-only request, said to be
	// beyond the emulator.
	for _, tc := range []struct {
		n    int
		says string
	}{{-1, "max_new_tokens must be at least 0, got -1"}, {0, "(a prefill-only request) is not emulated"}} {
		resp, b := postJSON(t, e.URL()+"/generate", map[string]any{"text": "hi", "sampling_params": map[string]any{"max_new_tokens": tc.n}})
		if resp.StatusCode != 400 || !strings.Contains(string(b), tc.says) || !strings.Contains(string(b), `"param":"sampling_params.max_new_tokens"`) {
			t.Errorf("max_new_tokens %d: %d %s", tc.n, resp.StatusCode, b)
		}
	}
	p := startEngine(t, func(c *Config) { c.Role = fleet.RolePrefill })
	if resp, b := postJSON(t, p.URL()+"/generate", map[string]any{"text": "hi"}); resp.StatusCode != 400 || !strings.Contains(string(b), "aggregated only") {
		t.Errorf("prefill role: %d %s", resp.StatusCode, b)
	}
}

// TestContinueFinalMessageSpace: an answer that continues a final
// message ending in a word begins with a space, as a real tokenizer's
// next word token does (migration sends the text so far so), streamed or
// not; a fresh answer, or one continuing text that ends in a space,
// begins with its word.
func TestContinueFinalMessageSpace(t *testing.T) {
	e := startEngine(t)
	for _, c := range []struct {
		last  string
		cont  bool
		space bool
	}{{"once upon a", true, true}, {"once upon a ", true, false}, {"", false, false}} {
		msgs := []map[string]any{{"role": "user", "content": "tell me"}}
		body := map[string]any{"model": e.cfg.Model, "max_tokens": 3}
		if c.cont {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": c.last})
			body["continue_final_message"], body["add_generation_prompt"] = true, false
		}
		body["messages"] = msgs
		_, raw := postJSON(t, e.URL()+"/v1/chat/completions", body)
		var a struct {
			Choices []struct{ Message struct{ Content string } }
		}
		if err := json.Unmarshal(raw, &a); err != nil || len(a.Choices) != 1 {
			t.Fatalf("%s", raw)
		}
		text := a.Choices[0].Message.Content
		if strings.HasPrefix(text, " ") != c.space || len(strings.Fields(text)) != 3 {
			t.Errorf("continuing %q: %q", c.last, text)
		}
		body["stream"] = true
		_, raw = postJSON(t, e.URL()+"/v1/chat/completions", body)
		streamed := ""
		for _, line := range strings.Split(string(raw), "\n") {
			var ev struct {
				Choices []struct{ Delta struct{ Content string } }
			}
			if d, ok := strings.CutPrefix(line, "data: "); ok && json.Unmarshal([]byte(d), &ev) == nil && len(ev.Choices) > 0 {
				streamed += ev.Choices[0].Delta.Content
			}
		}
		if streamed != text {
			t.Errorf("continuing %q: streamed %q, unstreamed %q", c.last, streamed, text)
		}
	}
}

// TestCompletionContinuesItsWord: a completion's answer to a text prompt
// that ends in a word begins with a space, as a real tokenizer's next word
// token does: a migrated completion (the text so far appended to its
// prompt) read "ametadipiscing" at the join. A prompt that ends in a
// space, or a prompt of token ids, is answered from its word.
func TestCompletionContinuesItsWord(t *testing.T) {
	e := startEngine(t)
	for _, c := range []struct {
		prompt any
		space  bool
	}{{"once upon a", true}, {"once upon a ", false}, {[]int{5, 6, 7}, false}} {
		_, raw := postJSON(t, e.URL()+"/v1/completions", map[string]any{"model": e.cfg.Model, "prompt": c.prompt, "max_tokens": 3})
		var a struct{ Choices []struct{ Text string } }
		if err := json.Unmarshal(raw, &a); err != nil || len(a.Choices) != 1 {
			t.Fatalf("%s", raw)
		}
		if text := a.Choices[0].Text; strings.HasPrefix(text, " ") != c.space || len(strings.Fields(text)) != 3 {
			t.Errorf("prompt %v: %q", c.prompt, text)
		}
	}
}
