package openai

import (
	"encoding/json"
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
		{"system blocks joined, billing header dropped, system messages after", `{"model":"m","max_tokens":5,
			"system":[{"type":"text","text":"x-anthropic-billing-header: cc=1;"},{"type":"text","text":"You are "},{"type":"text","text":"terse."}],
			"messages":[{"role":"system","content":" Really."},{"role":"user","content":"hi"}]}`,
			`{"role":"system","content":"You are terse. Really."}` + "\n" + `{"role":"user","content":"hi"}`},
		{"the top-level system first, whatever the members' order", `{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"B"},{"role":"user","content":"hi"}],"system":"A"}`,
			`{"role":"system","content":"AB"}` + "\n" + `{"role":"user","content":"hi"}`},
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
		{"image kept as a part, Claude Code's roles", `{"model":"m","max_tokens":5,"messages":[
			{"role":"ctx","content":[{"type":"image","source":{"type":"url","url":"u"}},{"type":"text","text":"what?"}]},{"role":"msg","content":"x"}]}`,
			`{"role":"user","content":[{"type":"image_url","text":""},{"type":"text","text":"what?"}]}` + "\n" + `{"role":"user","content":"x"}`},
		{"an empty assistant message stays", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[]}]}`,
			`{"role":"user","content":"q"}` + "\n" + `{"role":"assistant","content":""}`},
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
// parameters with "type": "object" added last when it has none,
// defer_loading), and chat_template_kwargs read.
func TestParseMessagesTools(t *testing.T) {
	r, err := ParseMessages([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"enable_thinking":false},
		"tools":[{"name":"a","description":"does a","input_schema":{"type":"object","properties":{"x":{"type":"string"}}}},{"name":"b","input_schema":{"properties":{} },"defer_loading":true},{"name":"c","input_schema":{}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"type":"function","function":{"name":"a","description":"does a","parameters":{"type":"object","properties":{"x":{"type":"string"}}},"defer_loading":null}},` +
		`{"type":"function","function":{"name":"b","description":null,"parameters":{"properties":{},"type":"object"},"defer_loading":true}},` +
		`{"type":"function","function":{"name":"c","description":null,"parameters":{"type":"object"},"defer_loading":null}}]`
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

func TestParseMessagesRejects(t *testing.T) {
	for _, bad := range []string{
		``, `[]`, `{"model":"m","max_tokens":5}`,
		`{"model":"m","messages":[{"role":"user","content":"q"}]}`,
		`{"model":"m","max_tokens":"5","messages":[{"role":"user","content":"q"}]}`,
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
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseMessages(body)
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
			if m.Role == "" {
				t.Fatalf("a message without a role: %+v", r.Messages)
			}
		}
	})
}
