package openai

import (
	"strings"
	"testing"
)

func TestParseGenerate(t *testing.T) {
	for _, tc := range []struct {
		body              string
		kind              PromptKind
		model             string
		maxTokens, n      int64 // -1: absent
		stream            bool
		errParam, errText string
	}{
		{body: `{"text":"hello world","sampling_params":{"max_new_tokens":32,"temperature":0}}`, kind: PromptText, maxTokens: 32, n: -1},
		{body: `{"text":["a","b"],"sampling_params":{"n":2},"stream":true}`, kind: PromptTexts, maxTokens: -1, n: 2, stream: true},
		{body: `{"input_ids":[1,2,3],"lora_path":"sql"}`, kind: PromptTokens, model: "sql", maxTokens: -1, n: -1},
		{body: `{"input_ids":[[1,2],[3]],"text":null,"sampling_params":null}`, kind: PromptTokenLists, maxTokens: -1, n: -1},
		// OpenAI's fields mean nothing here: max_tokens and model are the engine's.
		{body: `{"text":"x","max_tokens":5,"model":"m"}`, kind: PromptText, maxTokens: -1, n: -1},
		{body: `{"sampling_params":{}}`, errParam: "text", errText: "text or input_ids is required"},
		{body: `{"text":"a","input_ids":[1]}`, errParam: "input_ids", errText: "not both"},
		{body: `{"text":""}`, errParam: "text", errText: "text must not be empty"},
		{body: `{"text":[1,2]}`, errParam: "text", errText: "text must be a string"},
		{body: `{"text":{}}`, errParam: "text", errText: "text must be a string"},
		{body: `{"input_ids":["a"]}`, errParam: "input_ids", errText: "input_ids must be a list"},
		{body: `{"input_ids":[]}`, errParam: "input_ids", errText: "input_ids must not be empty"},
		{body: `{"input_ids":[1,-2]}`, errParam: "input_ids"},
		{body: `{"input_ids":"1 2"}`, errParam: "input_ids"},
		{body: `{"text":"a","sampling_params":[1]}`, errParam: "sampling_params[0]", errText: "must be an object"},
		// A batch's sampling_params and lora_path as SGLang takes them, a
		// list (refused until 2026-12-04): the largest is planned.
		{body: `{"text":["a","b"],"sampling_params":[{"max_new_tokens":2},{"max_new_tokens":3,"n":2}]}`, kind: PromptTexts, maxTokens: 3, n: 2},
		{body: `{"text":["a","b"],"sampling_params":[{"max_new_tokens":2},{}]}`, kind: PromptTexts, maxTokens: GenerateDefaultMaxNewTokens, n: -1},
		{body: `{"text":["a","b"],"lora_path":["sql","sql"]}`, kind: PromptTexts, model: "sql", maxTokens: -1, n: -1},
		{body: `{"text":["a","b"],"lora_path":["sql","chat"]}`, errParam: "lora_path", errText: "naming one adapter"},
		{body: `{"text":"a","sampling_params":[]}`, errParam: "sampling_params", errText: "a list of them"},
		{body: `{"text":"a","sampling_params":{"max_new_tokens":"many"}}`, errParam: "sampling_params.max_new_tokens"},
		{body: `{"text":"a","sampling_params":{"max_new_tokens":1e400}}`, errParam: "sampling_params.max_new_tokens"},
		{body: `{"text":"a","lora_path":[1]}`, errParam: "lora_path"},
		// Messages in /generate's terms (walkthrough, 2026-12-04).
		{body: `{"text":[]}`, errParam: "text", errText: "text must not be empty"},
		{body: `{"input_ids":[[1,2],3]}`, errParam: "input_ids", errText: "input_ids must be a list of token ids or a list of lists of them"},
		{body: `{"input_embeds":[[0.1,0.2]]}`, errParam: "input_embeds", errText: "not supported"},
		{body: `{"text":"a","lora_path":""}`, errParam: "lora_path"},
		{body: `{"text":"a"} x`, errText: "invalid JSON"},
	} {
		r, err := ParseGenerate([]byte(tc.body))
		if tc.errParam != "" || tc.errText != "" {
			e, ok := err.(*Error)
			if !ok || e.Status != 400 || e.Param != tc.errParam || !strings.Contains(e.Message, tc.errText) {
				t.Errorf("%s: error %#v, want 400 on %q saying %q", tc.body, err, tc.errParam, tc.errText)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.body, err)
			continue
		}
		if r.Prompt.Kind != tc.kind || r.Model != tc.model || r.Stream != tc.stream || !intIs(r.MaxTokens, tc.maxTokens) || !intIs(r.N, tc.n) || string(r.Raw) != tc.body {
			t.Errorf("%s: got %+v", tc.body, r)
		}
	}
}

func intIs(p *int64, want int64) bool {
	if p == nil {
		return want == -1
	}
	return *p == want
}

func FuzzParseGenerate(f *testing.F) {
	for _, s := range []string{`{"text":"hello","sampling_params":{"max_new_tokens":3}}`, `{"input_ids":[[1],[2,3]],"lora_path":"a"}`, `{"text":["a"]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseGenerate(body)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("not an *Error: %v", err)
			}
			return
		}
		if r.Prompt.Check() != nil {
			t.Fatalf("accepted an empty prompt: %s", body)
		}
	})
}
