package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// chatOf is the chat messages of r: each its object (Message.Raw) on a
// line.
func chatOf(t *testing.T, r *Request) string {
	t.Helper()
	var got []string
	for _, m := range r.Messages {
		if m.Raw == nil || !json.Valid(m.Raw) {
			t.Fatalf("message %+v without a valid object", m)
		}
		got = append(got, string(m.Raw))
	}
	return strings.Join(got, "\n")
}

// TestParseMessages: a Messages request is the chat request vLLM
// converts it to, message objects and all (role, reasoning, tool_calls
// with their arguments as Python's json.dumps writes them, content).
func TestParseMessages(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		{"string content", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, `{"role":"user","content":"hi"}`},
		{"system string", `{"model":"m","max_tokens":5,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
			`{"role":"system","content":"be brief"}` + "\n" + `{"role":"user","content":"hi"}`},
		{"system blocks joined, billing header dropped, a leading system message after a blank line", `{"model":"m","max_tokens":5,
			"system":[{"type":"text","text":"x-anthropic-billing-header: cc=1;"},{"type":"text","text":"You are "},{"type":"text","text":"terse."}],
			"messages":[{"role":"system","content":"Really."},{"role":"user","content":"hi"}]}`,
			`{"role":"system","content":"You are terse.\n\nReally."}` + "\n" + `{"role":"user","content":"hi"}`},
		{"the top-level system first, whatever the members' order", `{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"B"},{"role":"user","content":"hi"}],"system":"A"}`,
			`{"role":"system","content":"A\n\nB"}` + "\n" + `{"role":"user","content":"hi"}`},
		{"text blocks: one is a string, two are parts", `{"model":"m","max_tokens":5,"messages":[
			{"role":"user","content":[{"type":"text","text":"a"}]},
			{"role":"assistant","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}]}`,
			`{"role":"user","content":"a"}` + "\n" + `{"role":"assistant","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}`},
		{"tool use and its result", `{"model":"m","max_tokens":5,"messages":[
			{"role":"user","content":"2+2?"},
			{"role":"assistant","content":[{"type":"thinking","thinking":"add","signature":"s"},{"type":"text","text":"calling"},{"type":"tool_use","id":"t1","name":"add","input":{"a":2,"b":2.0,"s":"é"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"4"},{"type":"text","text":"ok"}]},{"type":"text","text":"thanks"}]}]}`,
			`{"role":"user","content":"2+2?"}` + "\n" +
				`{"role":"assistant","reasoning":"add","tool_calls":[{"id":"t1","type":"function","function":{"name":"add","arguments":"{\"a\": 2, \"b\": 2.0, \"s\": \"\\u00e9\"}"}}],"content":"calling"}` + "\n" +
				`{"role":"tool","tool_call_id":"t1","content":"4\nok"}` + "\n" + `{"role":"user","content":"thanks"}`},
		{"a user message of tool results only is dropped; an assistant's of calls only has no content", `{"model":"m","max_tokens":5,"messages":[
			{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f"}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}]}]}`,
			`{"role":"user","content":"q"}` + "\n" + `{"role":"assistant","tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]}` + "\n" +
				`{"role":"tool","tool_call_id":"t","content":"r"}`},
		{"an assistant's tool result is text", `{"model":"m","max_tokens":5,"messages":[
			{"role":"assistant","content":[{"type":"tool_result","content":"r"}]},{"role":"user","content":"q"}]}`,
			`{"role":"assistant","content":"Tool result: r"}` + "\n" + `{"role":"user","content":"q"}`},
		{"Claude Code's roles", `{"model":"m","max_tokens":5,"messages":[
			{"role":"ctx","content":[{"type":"text","text":"see"},{"type":"text","text":"what?"}]},{"role":"msg","content":"x"}]}`,
			`{"role":"user","content":[{"type":"text","text":"see"},{"type":"text","text":"what?"}]}` + "\n" + `{"role":"user","content":"x"}`},
		{"an empty assistant message stays, without content; a string's is kept", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[]},{"role":"assistant","content":""}]}`,
			`{"role":"user","content":"q"}` + "\n" + `{"role":"assistant"}` + "\n" + `{"role":"assistant","content":""}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := ParseMessages([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if got := chatOf(t, r); got != c.want {
				t.Fatalf("got\n%s\nwant\n%s", got, c.want)
			}
			if r.Model != "m" || r.MaxTokens == nil || *r.MaxTokens != 5 || string(r.Raw) != c.body {
				t.Fatalf("%+v", r)
			}
		})
	}
	r, err := ParseMessages([]byte(`{"model":"m","max_tokens":9,"stream":true,"temperature":0,"cache_salt":"s","priority":3,"messages":[{"role":"user","content":"q"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// vLLM's Messages API reads neither cache_salt nor priority.
	if !r.Stream || r.CacheSalt != "" || r.Priority != nil || *r.OutputLimit(true) != 9 || r.Tools != nil {
		t.Fatalf("%+v", r)
	}
}

// TestParseMessagesTools: the tools as vLLM converts them (the chat
// API's functions: name, description or null, input_schema as the
// parameters with "type": "object" added last when it has none, strict,
// defer_loading), and chat_template_kwargs read.
func TestParseMessagesTools(t *testing.T) {
	r, err := ParseMessages([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"enable_thinking":false},
		"tools":[{"name":"a","description":"does a","input_schema":{"type":"object","properties":{"x":{"type":"string"}}}},{"name":"b","input_schema":{"properties":{} },"defer_loading":true,"strict":true},{"name":"c","input_schema":{}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"type":"function","function":{"name":"a","description":"does a","parameters":{"type":"object","properties":{"x":{"type":"string"}}},"strict":null,"defer_loading":null}},` +
		`{"type":"function","function":{"name":"b","description":null,"parameters":{"properties":{},"type":"object"},"strict":true,"defer_loading":true}},` +
		`{"type":"function","function":{"name":"c","description":null,"parameters":{"type":"object"},"strict":null,"defer_loading":null}}]`
	if string(r.Tools) != want || string(r.ChatTemplateKwargs) != `{"enable_thinking":false}` {
		t.Fatalf("tools %s\nwant  %s\nkwargs %s", r.Tools, want, r.ChatTemplateKwargs)
	}
	for _, bad := range []string{`"tools":5`, `"tools":[{"name":"a","input_schema":5}]`, `"tools":[{"name":"a"}]`, `"chat_template_kwargs":[1]`} {
		if _, err := ParseMessages([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"}],` + bad + `}`)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
	if r, err := ParseMessages([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"}],"tools":[]}`)); err != nil || r.Tools != nil {
		t.Fatalf("no tools: %v %s", err, r.Tools)
	}
}

// TestMessagesImagesRefused: an image block, at the top or inside a
// tool_result (a screenshot a tool returned: vLLM makes it a user message
// of image parts after the tool's), is refused in the client's terms:
// its own message and block, "image" (it was refused once converted, as
// the next chat message's "image_url" part, and a tool result's was
// dropped unsaid).
func TestMessagesImagesRefused(t *testing.T) {
	for _, c := range []struct{ body, param string }{
		{`{"model":"m","max_tokens":5,"system":"s","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},
			{"role":"user","content":[{"type":"text","text":"look"},{"type":"image","source":{"type":"url","url":"u"}}]}]}`, "messages[2].content[1]"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1",
			"content":[{"type":"text","text":"shot"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}]}]}`, "messages[0].content[0].content[1]"},
	} {
		_, err := ParseMessages([]byte(c.body))
		if e := AsError(err); err == nil || e.Status != http.StatusBadRequest || !strings.HasPrefix(e.Message, c.param+": image blocks are not supported") {
			t.Errorf("want a 400 at %s: %v", c.param, err)
		}
	}
}

func TestParseMessagesRejects(t *testing.T) {
	for _, bad := range []string{
		``, `[]`, `{"model":"m","max_tokens":5}`,
		`{"model":"m","messages":[{"role":"user","content":"q"}]}`,
		`{"model":"m","max_tokens":"5x","messages":[{"role":"user","content":"q"}]}`,
		`{"model":"m","max_tokens":5,"messages":[]}`,
		`{"model":"m","max_tokens":5,"messages":{}}`,
		`{"model":"m","max_tokens":5,"messages":[5]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"tool","content":"q"}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"content":"q"}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user"}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":5}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"text":"no type"}]}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","content":7}]}]}`,
		`{"model":"m","max_tokens":5,"system":5,"messages":[{"role":"user","content":"q"}]}`,
		`{"model":"m","max_tokens":5,"system":[{"type":"text","text":""}],"messages":[{"role":"user","content":[]}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"}],"messages":[]}`,
		// vLLM's Messages request requires the model (served until 2026-12-04).
		`{"max_tokens":5,"messages":[{"role":"user","content":"q"}]}`,
		`{"model":null,"max_tokens":5,"messages":[{"role":"user","content":"q"}]}`,
	} {
		r, err := ParseMessages([]byte(bad))
		var e *Error
		if err == nil {
			t.Errorf("%s parsed: %+v", bad, r)
		} else if e = AsError(err); e.Status != http.StatusBadRequest {
			t.Errorf("%s: status %d", bad, e.Status)
		}
	}
	var blocks []string
	for range maxMessagesBlocks + 1 {
		blocks = append(blocks, `{"type":"text","text":"a"}`)
	}
	body := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[` + strings.Join(blocks, ",") + `]}]}`
	if _, err := ParseMessages([]byte(body)); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("%d blocks: %v", len(blocks), err)
	}
}

func TestMessagesErrors(t *testing.T) {
	for _, c := range []struct {
		err  *Error
		typ  string
		hdrs map[string]string
	}{
		{BadRequest("bad"), "invalid_request_error", nil},
		{NotFound("no"), "not_found_error", nil},
		{TooLarge(10), "request_too_large", nil},
		{&Error{Status: 429, Message: "late", RetryAfter: time.Second, NoRetry: true}, "rate_limit_error", map[string]string{"Retry-After": "1", "X-Should-Retry": "false"}},
		{Unavailable(time.Second, "none"), "overloaded_error", map[string]string{"Retry-After": "1"}},
		{Errorf(http.StatusBadGateway, "down"), "api_error", nil},
		{Errorf(http.StatusGatewayTimeout, "slow"), "timeout_error", nil},
	} {
		rec := httptest.NewRecorder()
		WriteError(MessagesErrors(rec), c.err)
		var body MessagesErrorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != c.err.Status ||
			body.Type != "error" || body.Error.Type != c.typ || body.Error.Message != c.err.Message {
			t.Errorf("%d: %d %s", c.err.Status, rec.Code, rec.Body)
		}
		for k, v := range c.hdrs {
			if got := rec.Header().Get(k); got != v {
				t.Errorf("%d: %s %q, want %q", c.err.Status, k, got, v)
			}
		}
		if strings.Contains(rec.Body.String(), `"code"`) {
			t.Errorf("an OpenAI member in %s", rec.Body)
		}
	}
	// An OpenAI API's writer still gets the OpenAI form.
	rec := httptest.NewRecorder()
	WriteError(rec, BadRequest("bad"))
	if !strings.Contains(rec.Body.String(), `"code":400`) {
		t.Fatal(rec.Body.String())
	}
}

func FuzzParseMessages(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":3,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]}]}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":3,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f","input":null}]}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":3,"system":"s","messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"image"}]}]},{"role":"system","content":"a"},{"role":"assistant","content":"b"},{"role":"system","content":[{"type":"text","text":"c"}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, mode := range []InlineSystem{InlinePreserve, InlineFold, InlineHoist} {
			r, err := ParseMessagesAs(body, mode)
			if err != nil {
				if AsError(err).Status != http.StatusBadRequest {
					t.Fatalf("%v", err)
				}
				return
			}
			if len(r.Messages) == 0 || r.MaxTokens == nil {
				t.Fatalf("parsed without messages or max_tokens: %+v", r)
			}
			for _, m := range r.Messages {
				if m.Role == "" || !json.Valid(m.Raw) {
					t.Fatalf("a message without a role or a valid object: %+v", r.Messages)
				}
			}
			if k := r.ChatTemplateKwargs; k != nil && !json.Valid(k) {
				t.Fatalf("kwargs %s", k)
			}
		}
	})
}

// TestMessagesInlineSystem: system messages inside messages placed as
// each of vLLM's ways places them (its normalize_inline_system, read in
// its public source, and its tests' cases): preserve keeps them in place
// (one after a tool call after the results that answer it; without any
// system prompt it folds), fold merges them into the user turn before
// (its last tool result when it has only results) or after, or a user
// message of their own, hoist joins them all into the system prompt.
func TestMessagesInlineSystem(t *testing.T) {
	call := `{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]}`
	callOut := `{"role":"assistant","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{}"}}]}`
	cases := []struct {
		name, system, messages string
		preserve, fold, hoist  string
	}{
		{"after the user", `"Top."`, `{"role":"user","content":"Hello"},{"role":"system","content":"Hint."}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":"Hello"}|{"role":"system","content":"Hint."}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":"Hello\n\nHint."}`,
			`{"role":"system","content":"Top.Hint."}|{"role":"user","content":"Hello"}`},
		{"leading ones join the prompt", `null`, `{"role":"system","content":"First."},{"role":"user","content":"Hello"},{"role":"system","content":"Second."}`,
			`{"role":"system","content":"First."}|{"role":"user","content":"Hello"}|{"role":"system","content":"Second."}`,
			`{"role":"system","content":"First."}|{"role":"user","content":"Hello\n\nSecond."}`,
			`{"role":"system","content":"First.Second."}|{"role":"user","content":"Hello"}`},
		{"no system prompt: preserve folds", `[{"type":"text","text":"x-anthropic-billing-header: cch=1;"}]`, `{"role":"user","content":"Q"},{"role":"system","content":"S"}`,
			`{"role":"user","content":"Q\n\nS"}`, `{"role":"user","content":"Q\n\nS"}`, `{"role":"system","content":"S"}|{"role":"user","content":"Q"}`},
		{"after the assistant, before the user", `"Top."`, `{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"system","content":"S"},{"role":"user","content":"Q2"}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":"Q"}|{"role":"assistant","content":"A"}|{"role":"system","content":"S"}|{"role":"user","content":"Q2"}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":"Q"}|{"role":"assistant","content":"A"}|{"role":"user","content":"S\n\nQ2"}`,
			`{"role":"system","content":"Top.S"}|{"role":"user","content":"Q"}|{"role":"assistant","content":"A"}|{"role":"user","content":"Q2"}`},
		{"after the assistant, before another, and at the end", `"Top."`, `{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"system","content":"S"},{"role":"assistant","content":"B"},{"role":"system","content":"T"}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":"Q"}|{"role":"assistant","content":"A"}|{"role":"system","content":"S"}|{"role":"assistant","content":"B"}|{"role":"system","content":"T"}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":"Q"}|{"role":"assistant","content":"A"}|{"role":"user","content":"S"}|{"role":"assistant","content":"B"}|{"role":"user","content":"T"}`,
			`{"role":"system","content":"Top.ST"}|{"role":"user","content":"Q"}|{"role":"assistant","content":"A"}|{"role":"assistant","content":"B"}`},
		{"into the last text block", `"Top."`, `{"role":"user","content":[{"type":"text","text":"A"},{"type":"text","text":"B"}]},{"role":"system","content":[{"type":"text","text":"S"}]}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":[{"type":"text","text":"A"},{"type":"text","text":"B"}]}|{"role":"system","content":"S"}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":[{"type":"text","text":"A"},{"type":"text","text":"B\n\nS"}]}`, ``},
		{"after a tool call: after its results", `"Top."`, `{"role":"user","content":"Q"},` + call + `,{"role":"system","content":"S"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"out"}]}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":"Q"}|` + callOut + `|{"role":"tool","tool_call_id":"t1","content":"out"}|{"role":"system","content":"S"}`,
			`{"role":"system","content":"Top."}|{"role":"user","content":"Q"}|` + callOut + `|{"role":"tool","tool_call_id":"t1","content":"out\n\nS"}`, ``},
		{"a user turn of results and text: into the text", `"Top."`, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"out"},{"type":"text","text":"r"}]},{"role":"system","content":"S"}`,
			``, `{"role":"system","content":"Top."}|{"role":"tool","tool_call_id":"t1","content":"out"}|{"role":"user","content":"r\n\nS"}`, ``},
		{"two into a result without text", `"Top."`, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"tool_reference","tool_name":"x"}]}]},{"role":"system","content":"S1"},{"role":"system","content":"S2"}`,
			``, `{"role":"system","content":"Top."}|{"role":"tool","tool_call_id":"t1","content":"S1\n\nS2"}`, ``},
	}
	for _, c := range cases {
		body := `{"model":"m","max_tokens":5,"system":` + c.system + `,"messages":[` + c.messages + `]}`
		for mode, want := range map[InlineSystem]string{InlinePreserve: c.preserve, InlineFold: c.fold, InlineHoist: c.hoist} {
			if want == "" {
				continue
			}
			r, err := ParseMessagesAs([]byte(body), mode)
			if err != nil {
				t.Fatalf("%s, %s: %v", c.name, mode, err)
			}
			if got := strings.ReplaceAll(chatOf(t, r), "\n", "|"); got != want {
				t.Errorf("%s, %s:\n got %s\nwant %s", c.name, mode, got, want)
			}
		}
	}
}

// TestMessagesEffortKwargs: output_config's effort and a disabled
// thinking set the template kwargs vLLM sets (reasoning_effort, and
// enable_thinking unless the client sent it); a budget or adaptive
// thinking sets none.
func TestMessagesEffortKwargs(t *testing.T) {
	for extra, want := range map[string]string{
		`"output_config":{"effort":"high"},"thinking":{"type":"adaptive"}`:                        `{"enable_thinking":true,"reasoning_effort":"high"}`,
		`"thinking":{"type":"disabled"}`:                                                          `{"enable_thinking":false,"reasoning_effort":"none"}`,
		`"thinking":{"type":"disabled"},"output_config":{"effort":"max"}`:                         `{"enable_thinking":false,"reasoning_effort":"none"}`,
		`"output_config":{"effort":"low"},"chat_template_kwargs":{"enable_thinking":false,"x":1}`: `{"enable_thinking":false,"x":1,"reasoning_effort":"low"}`,
		`"chat_template_kwargs":{"reasoning_effort":"low"},"output_config":{"effort":"xhigh"}`:    `{"enable_thinking":true,"reasoning_effort":"xhigh"}`,
		`"thinking":{"type":"enabled","budget_tokens":2048},"chat_template_kwargs":{"k":2}`:       `{"k":2}`,
		`"output_config":{"format":{"type":"json_schema"}}`:                                       ``,
	} {
		r, err := ParseMessages([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"}],` + extra + `}`))
		if err != nil || string(r.ChatTemplateKwargs) != want {
			t.Errorf("%s: kwargs %s (%v), want %s", extra, r.ChatTemplateKwargs, err, want)
		}
	}
	for _, bad := range []string{`"output_config":5`, `"thinking":"on"`, `"output_config":{"effort":5}`} {
		if _, err := ParseMessages([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"}],` + bad + `}`)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

// claudeCodeShaped is a Messages body shaped as Claude Code's (its sizes,
// not its text): a system of three blocks, 24 tools of about 2 KB of
// schema each, and a few turns with a system message among them.
func claudeCodeShaped() []byte {
	var tools []map[string]any
	for i := range 24 {
		props := map[string]any{}
		for k := range 12 {
			props[fmt.Sprintf("param_%d", k)] = map[string]any{"type": "string", "description": strings.Repeat("what the parameter means ", 5)}
		}
		tools = append(tools, map[string]any{"name": fmt.Sprintf("Tool%d", i), "description": strings.Repeat("what the tool does, and when to use it. ", 20),
			"input_schema": map[string]any{"type": "object", "properties": props, "required": []string{"param_0"}, "additionalProperties": false}})
	}
	text := func(s string) []map[string]any { return []map[string]any{{"type": "text", "text": s}} }
	body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 32000, "stream": true,
		"system": []map[string]any{{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"}, {"type": "text", "text": "You are an agent."},
			{"type": "text", "text": strings.Repeat("Follow the instructions. ", 400)}},
		"tools": tools, "thinking": map[string]string{"type": "adaptive"}, "output_config": map[string]string{"effort": "high"},
		"messages": []map[string]any{{"role": "user", "content": text(strings.Repeat("context ", 300))}, {"role": "system", "content": "agent types"},
			{"role": "assistant", "content": text(strings.Repeat("answer ", 200))}, {"role": "user", "content": "go on"}}})
	return body
}

// BenchmarkParseMessages: a Claude-Code-shaped body (about 80 KB, most of
// it tools) converted as vLLM converts it.
func BenchmarkParseMessages(b *testing.B) {
	body := claudeCodeShaped()
	b.SetBytes(int64(len(body)))
	for range b.N {
		if _, err := ParseMessages(body); err != nil {
			b.Fatal(err)
		}
	}
}
