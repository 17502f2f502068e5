package openai

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestParseResponses(t *testing.T) {
	r, err := ParseResponses([]byte(`{"model":"m","instructions":"be brief","input":"hi","max_output_tokens":7,"stream":true,"previous_response_id":"resp_1","store":false,"priority":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || !r.Stream || r.MaxTokens == nil || *r.MaxTokens != 7 || r.PreviousResponseID != "resp_1" || r.Priority == nil || *r.Priority != 2 ||
		len(r.Messages) != 2 || r.Messages[0].Role != "system" || r.Messages[0].Content.String != "be brief" || r.Messages[1].Role != "user" || r.Messages[1].Content.String != "hi" {
		t.Fatalf("%+v", r)
	}
	if lim := r.OutputLimit(true); lim == nil || *lim != 7 {
		t.Fatalf("output limit %v", lim)
	}
	for _, bad := range []string{
		``, `[]`, `{"model":"m"}`, `{"model":"m","input":[]}`, `{"model":"m","input":5}`,
		`{"model":"m","input":[5]}`, `{"model":"m","input":[{"content":"x"}]}`, `{"model":"m","input":[{"type":"message","content":"x"}]}`,
		`{"model":"m","input":[{"role":"user"}]}`, `{"model":"m","input":"x","max_output_tokens":"7x"}`,
		`{"model":"m","input":"x","previous_response_id":7}`, `{"model":"m","input":"x","input":"y"}`,
		`{"input":[{"type":"function_call","name":"f","arguments":{},"call_id":"c"}]}`,
		`{"input":[{"type":"reasoning","summary":"s"}]}`, `{"input":[{"type":"function_call_output","call_id":1,"output":"o"}]}`,
		`{"input":[{"type":"function_call_output","call_id":"c","output":5}]}`,
		`{"input":"x","tools":{}}`, `{"input":"x","tools":[5]}`, `{"input":"x","reasoning":"high"}`,
	} {
		if _, err := ParseResponses([]byte(bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

// responsesCases are Responses bodies and the chat messages and tools
// vLLM makes of them, computed with vLLM's conversion (responses/
// protocol.py and responses/utils.py of vllm-project/vllm, read in its
// public source) run in a scratch folder against openai-python's own
// types (its 2026-08 snapshot) and pydantic 2.13, the messages as its
// chat parsing reads them (role, content with input_text parts as text,
// reasoning, tool_calls, tool_call_id). A Codex-shaped agent turn; items
// merged into the assistant message before them (reasoning, an output
// message, two calls); an assistant given as plain messages, its list
// content's first part taken, a second reasoning a message of its own;
// a turn opening on a call, a system message among the items; an
// incomplete answer to continue.
var responsesCases = []struct{ body, messages, tools string }{
	{
		body:     `{"model":"m","instructions":"You are a coding agent.","input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"<permissions>workspace-write</permissions>"}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context>cwd=/repo</environment_context>"},{"type":"input_text","text":"fix the failing test"}]},{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Run the tests first."}]},{"type":"function_call","id":"fc_1","name":"shell","arguments":"{\"command\":[\"go\",\"test\",\"./...\"]}","call_id":"call_1"},{"type":"function_call_output","call_id":"call_1","output":"FAIL: TestX"},{"type":"reasoning","id":"rs_2","summary":[],"content":[{"type":"reasoning_text","text":"Look at x.go."}]},{"type":"function_call","name":"read","namespace":"mcp","arguments":"{\"path\":\"x.go\"}","call_id":"call_2"},{"type":"function_call","name":"shell","arguments":"{\"command\":[\"ls\"]}","call_id":"call_3"},{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"package x"}]},{"type":"function_call_output","call_id":"call_3","output":"x.go"},{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"Fixed.","annotations":[]}]},{"role":"user","content":"thanks"}],"tools":[{"type":"function","name":"shell","description":"Runs a command","strict":false,"parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]}},{"type":"web_search"},{"type":"namespace","name":"mcp","description":"files","tools":[{"type":"function","name":"read","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}]}],"reasoning":{"effort":"medium","summary":"auto"},"stream":true}`,
		messages: `[{"role":"system","content":"You are a coding agent."},{"role":"developer","content":[{"type":"text","text":"<permissions>workspace-write</permissions>"}]},{"role":"user","content":[{"type":"text","text":"<environment_context>cwd=/repo</environment_context>"},{"type":"text","text":"fix the failing test"}]},{"role":"assistant","reasoning":"Run the tests first.","tool_calls":[{"id":"call_1","function":{"name":"shell","arguments":"{\"command\":[\"go\",\"test\",\"./...\"]}"},"type":"function"}]},{"role":"tool","content":"FAIL: TestX","tool_call_id":"call_1"},{"role":"assistant","reasoning":"Look at x.go.","tool_calls":[{"id":"call_2","function":{"name":"mcp__read","arguments":"{\"path\":\"x.go\"}"},"type":"function"},{"id":"call_3","function":{"name":"shell","arguments":"{\"command\":[\"ls\"]}"},"type":"function"}]},{"role":"tool","content":[{"type":"text","text":"package x"}],"tool_call_id":"call_2"},{"role":"tool","content":"x.go","tool_call_id":"call_3"},{"role":"assistant","content":"Fixed."},{"role":"user","content":"thanks"}]`,
		tools:    `[{"type":"function","function":{"name":"shell","description":"Runs a command","parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]},"strict":false,"allowed_callers":null,"defer_loading":null,"output_schema":null}},{"type":"function","function":{"name":"mcp__read","description":null,"parameters":{"type":"object","properties":{"path":{"type":"string"}}},"allowed_callers":null,"defer_loading":null,"output_schema":null,"strict":null}}]`,
	},
	{
		body:     `{"input":[{"role":"user","content":"q"},{"type":"reasoning","id":"r","summary":[],"content":[{"type":"reasoning_text","text":"hmm"}]},{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"ans","annotations":[]}]},{"type":"function_call","name":"f","arguments":"{}","call_id":"c2"},{"type":"function_call","name":"g","arguments":"{}","call_id":"c3"},{"type":"function_call_output","call_id":"c2","output":"1"},{"type":"function_call_output","call_id":"c3","output":"2"}]}`,
		messages: `[{"role":"user","content":"q"},{"role":"assistant","content":"ans","reasoning":"hmm","tool_calls":[{"id":"c2","function":{"name":"f","arguments":"{}"},"type":"function"},{"id":"c3","function":{"name":"g","arguments":"{}"},"type":"function"}]},{"role":"tool","content":"1","tool_call_id":"c2"},{"role":"tool","content":"2","tool_call_id":"c3"}]`,
		tools:    ``,
	},
	{
		body:     `{"input":[{"role":"user","content":"q"},{"role":"assistant","content":"plain"},{"type":"function_call","name":"f","arguments":"{}","call_id":"c2","id":"fc_1","status":"completed"},{"role":"assistant","content":"again"},{"type":"reasoning","id":"r2","summary":[{"type":"summary_text","text":"s1"},{"type":"summary_text","text":"s2"}]},{"role":"assistant","content":[{"type":"input_text","text":"p1"},{"type":"input_text","text":"p2"}]},{"type":"reasoning","id":"r3","summary":[]}]}`,
		messages: `[{"role":"user","content":"q"},{"role":"assistant","content":"plain","tool_calls":[{"id":"c2","function":{"name":"f","arguments":"{}"},"type":"function"}]},{"role":"assistant","content":"again","reasoning":"s1"},{"role":"assistant","content":"p1","reasoning":""}]`,
		tools:    ``,
	},
	{
		body:     `{"input":[{"type":"function_call","name":"f","arguments":"{}","call_id":"c"},{"type":"reasoning","id":"r","summary":[]},{"type":"message","role":"system","content":"sys in input"},{"type":"function_call_output","call_id":"c","output":"o"},{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]}`,
		messages: `[{"role":"assistant","reasoning":"","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"},"type":"function"}]},{"role":"system","content":"sys in input"},{"role":"tool","content":"o","tool_call_id":"c"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]`,
		tools:    ``,
	},
	{
		body:     `{"input":[{"role":"user","content":"write a poem"},{"type":"message","role":"assistant","id":"msg_1","status":"incomplete","content":[{"type":"output_text","text":"Roses are","annotations":[]}]}]}`,
		messages: `[{"role":"user","content":"write a poem"},{"role":"assistant","content":"Roses are"}]`,
		tools:    ``,
	},
}

// TestParseResponsesAsVLLM: each case's messages (their objects, which
// the tokenizers render) and tools are vLLM's.
func TestParseResponsesAsVLLM(t *testing.T) {
	for i, c := range responsesCases {
		r, err := ParseResponses([]byte(c.body))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		var want []any
		if err := json.Unmarshal([]byte(c.messages), &want); err != nil {
			t.Fatal(err)
		}
		if len(r.Messages) != len(want) {
			t.Fatalf("case %d: %d messages, want %d", i, len(r.Messages), len(want))
		}
		for k, m := range r.Messages {
			var got any
			if err := json.Unmarshal(m.Raw, &got); err != nil {
				t.Fatalf("case %d message %d: %s: %v", i, k, m.Raw, err)
			}
			if !reflect.DeepEqual(got, want[k]) {
				w, _ := json.Marshal(want[k])
				t.Errorf("case %d message %d:\n got %s\nwant %s", i, k, m.Raw, w)
			}
			if role, _ := want[k].(map[string]any)["role"].(string); m.Role != role {
				t.Errorf("case %d message %d: role %q, want %q", i, k, m.Role, role)
			}
		}
		if string(r.Tools) != c.tools {
			t.Errorf("case %d: tools\n got %s\nwant %s", i, r.Tools, c.tools)
		}
	}
}

// TestResponsesKwargsAndContinue: the reasoning effort sets the template
// kwargs vLLM sets (none and low with their flags; minimal is low;
// enabled alone is medium; an effort vLLM does not know, none), and an
// incomplete last answer is continued without a generation prompt.
func TestResponsesKwargsAndContinue(t *testing.T) {
	for reasoning, want := range map[string]string{
		`{"effort":"high"}`:                 `{"enable_thinking":true,"reasoning_effort":"high"}`,
		`{"effort":"minimal"}`:              `{"enable_thinking":true,"low_effort":true,"reasoning_effort":"low"}`,
		`{"effort":"none"}`:                 `{"enable_thinking":false,"force_nonempty_content":true,"reasoning_effort":"none"}`,
		`{"enabled":true}`:                  `{"enable_thinking":true,"reasoning_effort":"medium"}`,
		`{"enabled":false,"effort":"high"}`: `{"enable_thinking":false,"force_nonempty_content":true,"reasoning_effort":"none"}`,
		`{"effort":"xhigh"}`:                ``,
		`{"summary":"auto"}`:                ``,
		`null`:                              ``,
	} {
		r, err := ParseResponses([]byte(`{"input":"x","reasoning":` + reasoning + `,"chat_template_kwargs":{"enable_thinking":false}}`))
		if err != nil || string(r.ChatTemplateKwargs) != want {
			t.Errorf("reasoning %s: kwargs %s (%v), want %s", reasoning, r.ChatTemplateKwargs, err, want)
		}
	}
	last := responsesCases[len(responsesCases)-1].body
	r, err := ParseResponses([]byte(last))
	if err != nil || !r.ContinueFinalMessage || r.AddGenerationPrompt == nil || *r.AddGenerationPrompt {
		t.Fatalf("%s: not continued (%v)", last, err)
	}
	r, err = ParseResponses([]byte(strings.Replace(last, `"incomplete"`, `"completed"`, 1)))
	if err != nil || r.ContinueFinalMessage || r.AddGenerationPrompt != nil {
		t.Fatalf("a completed answer continued (%v)", err)
	}
}

func FuzzParseResponses(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]}]}`))
	f.Add([]byte(`{"input":"x","instructions":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseResponses(body)
		if err == nil && len(r.Messages) == 0 {
			t.Fatalf("%s: no messages and no error", body)
		}
	})
}
