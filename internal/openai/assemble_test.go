package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// assemble feeds events (data payloads) and returns the answer.
func assemble(t *testing.T, chat bool, events ...string) (int, string, error) {
	t.Helper()
	a := NewAssembler(chat)
	for _, e := range events {
		if err := a.Event([]byte(e)); err != nil {
			return 0, "", err
		}
	}
	status, body, err := a.Answer()
	if err == nil && !json.Valid(body) {
		t.Fatalf("answer is not JSON: %s", body)
	}
	return status, string(body), err
}

// sameJSON fails unless got and want are the same JSON value.
func sameJSON(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("got is not JSON: %v: %s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want is not JSON: %v: %s", err, want)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestAssembleChat(t *testing.T) {
	// vLLM's chat stream: the role event, text events, the finish
	// event, the usage event, [DONE].
	status, got, err := assemble(t, true,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"lo \"you\"\n"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"é"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}`,
		`[DONE]`)
	if err != nil || status != 200 {
		t.Fatalf("status %d, err %v", status, err)
	}
	sameJSON(t, got, `{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m",
		"choices":[{"index":0,"message":{"role":"assistant","content":"Hello \"you\"\né"},"logprobs":null,"finish_reason":"length","stop_reason":null}],
		"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}`)
	if !strings.HasPrefix(got, `{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m","choices":[`) {
		t.Errorf("members out of the stream's order: %s", got)
	}
}

func TestAssembleCompletionsBatch(t *testing.T) {
	// Two prompts × n 2: choices 0–3 interleaved, out of order.
	events := []string{}
	for _, tok := range []string{"a", "b", "c"} {
		for _, i := range []string{"3", "1", "0", "2"} {
			events = append(events, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":`+i+`,"text":"`+tok+i+`","logprobs":null,"finish_reason":null}]}`)
		}
	}
	for _, i := range []string{"0", "1", "2", "3"} {
		events = append(events, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":`+i+`,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":"\n"}]}`)
	}
	_, got, err := assemble(t, false, append(events, `[DONE]`)...)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[`
	for i, n := range []string{"0", "1", "2", "3"} {
		if i > 0 {
			want += ","
		}
		want += `{"index":` + n + `,"text":"a` + n + `b` + n + `c` + n + `","logprobs":null,"finish_reason":"stop","stop_reason":"\n"}`
	}
	sameJSON(t, got, want+`]}`)
}

func TestAssembleLogprobsReasoningTools(t *testing.T) {
	_, got, err := assemble(t, true,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"think"},"logprobs":{"content":[{"token":"t","logprob":-0.5,"top_logprobs":[{"token":"t","logprob":-0.5}]}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"ing","content":"ok"},"logprobs":{"content":[{"token":"o","logprob":-1,"top_logprobs":[]}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\""}}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":"tool_calls"}]}`,
		`[DONE]`)
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, got, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,
		"message":{"role":"assistant","reasoning_content":"thinking","content":"ok","tool_calls":[
			{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},
			{"index":1,"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}]},
		"logprobs":{"content":[{"token":"t","logprob":-0.5,"top_logprobs":[{"token":"t","logprob":-0.5}]},{"token":"o","logprob":-1,"top_logprobs":[]}]},
		"finish_reason":"tool_calls"}]}`)
}

func TestAssembleCompletionLogprobs(t *testing.T) {
	// vLLM's completion logprobs in a stream: each event's arrays,
	// text_offset counted from the answer's start.
	_, got, err := assemble(t, false,
		`{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ab","logprobs":{"text_offset":[0,1],"token_logprobs":[-1,-2],"tokens":["a","b"],"top_logprobs":[{"a":-1},{"b":-2}]},"finish_reason":null}]}`,
		`{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"c","logprobs":{"text_offset":[2],"token_logprobs":[-3],"tokens":["c"],"top_logprobs":[{"index":-3}]},"finish_reason":"length"}]}`,
		`[DONE]`)
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, got, `{"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"abc",
		"logprobs":{"text_offset":[0,1,2],"token_logprobs":[-1,-2,-3],"tokens":["a","b","c"],"top_logprobs":[{"a":-1},{"b":-2},{"index":-3}]},
		"finish_reason":"length"}]}`)
}

func TestAssembleEnds(t *testing.T) {
	ev := func(finish string) string {
		return `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":` + finish + `}]}`
	}
	for _, tc := range []struct {
		name   string
		events []string
		status int
		err    bool
	}{
		{"done", []string{ev("null"), ev(`"stop"`), "[DONE]"}, 200, false},
		{"finished without [DONE]", []string{ev("null"), ev(`"stop"`)}, 200, false},
		{"cut", []string{ev("null"), ev("null")}, 0, true},
		{"nothing", nil, 0, true},
		{"only [DONE]", []string{"[DONE]"}, 0, true},
		{"error event", []string{ev("null"), `{"error":{"object":"error","message":"boom","type":"BadRequestError","code":400}}`, "[DONE]"}, 400, false},
		{"nested error", []string{`{"error":{"error":{"message":"x","code":503}}}`}, 503, false},
		{"error without a code", []string{`{"error":{"message":"x"}}`}, 500, false},
		{"older error shape", []string{ev("null"), `{"object":"error","message":"boom","type":"InternalServerError","param":null,"code":503}`, "[DONE]"}, 503, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, err := assemble(t, true, tc.events...)
			if (err != nil) != tc.err || status != tc.status {
				t.Fatalf("status %d err %v, want %d err %v (%s)", status, err, tc.status, tc.err, body)
			}
			if tc.status >= 400 && !strings.HasPrefix(body, `{"error":{`) {
				t.Errorf("error answer %s", body)
			}
		})
	}
}

func TestAssembleRejects(t *testing.T) {
	a := NewAssembler(true)
	if err := a.Event([]byte(`{"a":`)); err == nil {
		t.Error("an event that is not JSON was taken")
	}
	if err := a.Event([]byte(`[1]`)); err == nil {
		t.Error("an event that is not an object was taken")
	}
	a = NewAssembler(true)
	big := `{"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 1<<20) + `"}}]}`
	var err error
	for i := 0; i <= MaxAssembled>>20 && err == nil; i++ {
		err = a.Event([]byte(big))
	}
	if !errors.Is(err, ErrAssembledTooLarge) {
		t.Errorf("past the bound: %v", err)
	}
	// A choice an index, more than any answer has: refused, not a
	// quadratic search nor unbounded memory.
	var b strings.Builder
	b.WriteString(`{"choices":[`)
	for i := range maxIndexed + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"index":%d,"text":"x"}`, i)
	}
	b.WriteString(`]}`)
	if err := NewAssembler(false).Event([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("%d choices: %v", maxIndexed+1, err)
	}
}

func TestWholeFromStream(t *testing.T) {
	for _, tc := range []struct {
		body string
		chat bool
		want string
	}{
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":3,"temperature":0,"logprobs":true,"top_logprobs":2}`, true, ""},
		{`{"model":"m","prompt":"x","max_tokens":3,"n":2,"stop":["\n"],"seed":1}`, false, ""},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":false}`, true, ""},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`, true, "stream"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, true, "tools"},
		{`{"model":"m","prompt":"x","echo":true}`, false, "echo"},
		{`{"model":"m","prompt":"x","logprobs":2}`, false, "logprobs"},
		{`{"model":"m","prompt":"x","best_of":2}`, false, "best_of"},
		{`{"model":"m","prompt":"x","prompt_logprobs":1}`, false, "prompt_logprobs"},
		{`{"model":"m","prompt":"x","stream_options":{"include_usage":true}}`, false, "stream_options"},
		{`{"model":"m","prompt":"x","messages":[]}`, false, "messages"},
		{`{"model":"m","messages":[],"prompt":"x"}`, true, "prompt"},
		{`{"model":"m","prompt":"x","some_new_field":1}`, false, "some_new_field"},
		// Members that ask for nothing beyond the default.
		{`{"model":"m","prompt":"x","echo":false,"best_of":1,"suffix":null,"stream_options":null}`, false, ""},
		{`{"model":"m","messages":[],"tools":[],"tool_choice":null}`, true, ""},
		{`{"model":"m","prompt":"x","best_of":2}`, false, "best_of"},
		{`{"model":"m","prompt":"x","logprobs":null}`, false, ""},
		// Routing members, which the gateway strips before any engine
		// sees the body.
		{`{"model":"m","prompt":"x","kv_transfer_params":{"do_remote_decode":true},"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":2}`, false, ""},
	} {
		r, err := ParseRequest([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if got := r.WholeFromStream(tc.chat); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.body, got, tc.want)
		}
	}
}

func TestStreamInstead(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","prompt":"x"}`,
		`{"model":"m","stream":false,"prompt":"x"}`,
		`{"model":"m","stream":null,"prompt":"x"}`,
	} {
		r, err := ParseRequest([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		r.StreamInstead()
		again, err := ParseRequest(r.Raw)
		if err != nil || !r.Stream || !again.Stream || again.Prompt.Texts[0] != "x" {
			t.Errorf("%s -> %s (stream %v, err %v)", body, r.Raw, r.Stream, err)
		}
	}
}

func FuzzAssembler(f *testing.F) {
	f.Add(`{"id":"c","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`, `{"choices":[{"index":1,"text":"b","logprobs":{"x":[1]}}],"usage":{"a":1}}`, true)
	f.Add(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`, `{"error":{"code":"x"}}`, false)
	f.Add(`{"type":"response.output_text.delta","delta":"a"}`, `{"type":"response.completed","response":{"id":"r"}}`, false)
	f.Fuzz(func(t *testing.T, e1, e2 string, chat bool) {
		a := NewAssembler(chat)
		for _, e := range []string{e1, e2, e1, "[DONE]"} {
			if a.Event([]byte(e)) != nil {
				a = NewAssembler(chat) // no answer
				break
			}
		}
		var r ResponsesAssembler
		for _, e := range []string{e1, e2} {
			if r.Event([]byte(e)) != nil {
				break
			}
		}
		for _, asm := range []interface {
			Answer() (int, []byte, error)
		}{a, &r} {
			status, body, err := asm.Answer()
			if err != nil {
				continue
			}
			if !json.Valid(body) {
				t.Fatalf("answer %d is not JSON: %s", status, body)
			}
			if status != 200 && (status < 400 || status > 599) {
				t.Fatalf("status %d", status)
			}
		}
	})
}

func TestResponsesAssembler(t *testing.T) {
	resp := func(status string) string {
		return `{"id":"resp_1","object":"response","status":"` + status + `","output":[{"type":"message","content":[{"type":"output_text","text":"hi there"}]}],"usage":{"input_tokens":3,"output_tokens":2}}`
	}
	head := []string{
		`{"type":"response.created","sequence_number":0,"response":` + resp("in_progress") + `}`,
		`{"type":"response.in_progress","sequence_number":1,"response":` + resp("in_progress") + `}`,
		`{"type":"response.output_text.delta","sequence_number":2,"delta":"hi"}`,
		`{"type":"response.output_text.delta","sequence_number":3,"delta":" there"}`,
	}
	for _, tc := range []struct {
		name   string
		events []string
		status int
		want   string
	}{
		{"completed", append(head, `{"type":"response.completed","sequence_number":4,"response":`+resp("completed")+`}`), 200, resp("completed")},
		{"incomplete", append(head, `{"type":"response.incomplete","sequence_number":4,"response":`+resp("incomplete")+`}`), 200, resp("incomplete")},
		{"failed", append(head, `{"type":"response.failed","sequence_number":4,"response":`+resp("failed")+`}`), 200, resp("failed")},
		// An error event is the answer in the shape clients read (the
		// event itself read as no body to the OpenAI SDK).
		{"error", append(head, `{"type":"error","code":429,"message":"slow down"}`), 429, `{"error":{"code":429,"message":"slow down","param":null,"type":"server_error"}}`},
		{"error with a code name", append(head, `{"type":"error","code":"server_error","message":"boom","param":null,"sequence_number":7}`), 500,
			`{"error":{"code":"server_error","message":"boom","param":null,"type":"server_error"}}`},
		{"nested error", append(head, `{"type":"error","error":{"message":"x","code":503}}`), 503, `{"type":"error","error":{"message":"x","code":503}}`},
		{"cut", head, 0, ""},
		{"nothing", nil, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a ResponsesAssembler
			for _, e := range tc.events {
				if err := a.Event([]byte(e)); err != nil {
					t.Fatal(err)
				}
			}
			status, body, err := a.Answer()
			if status != tc.status || (err != nil) != (tc.status == 0) || string(body) != tc.want {
				t.Fatalf("status %d err %v body %s; want %d %s", status, err, body, tc.status, tc.want)
			}
		})
	}
	var a ResponsesAssembler
	if err := a.Event([]byte(`{"type":"response.completed","response":null}`)); err == nil {
		t.Error("a final event without its response was taken")
	}
}

func TestWholeResponsesFromStream(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m","input":"x"}`: "",
		`{"model":"m","input":"x","background":false,"tools":[],"store":true}`:     "",
		`{"model":"m","input":"x","background":true}`:                              "background",
		`{"model":"m","input":"x","stream":true}`:                                  "stream",
		`{"model":"m","input":"x","stream_options":{"include_obfuscation":false}}`: "stream_options",
	} {
		r, err := ParseResponses([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if got := r.WholeResponsesFromStream(); got != want {
			t.Errorf("%s: %q, want %q", body, got, want)
		}
	}
}
