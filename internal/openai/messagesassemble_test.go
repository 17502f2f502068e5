package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// assembleMessages feeds the events' data to a MessagesAssembler.
func assembleMessages(t *testing.T, events ...string) (int, string, error) {
	t.Helper()
	a := &MessagesAssembler{}
	for _, ev := range events {
		if err := a.Event([]byte(ev)); err != nil {
			return 0, "", err
		}
	}
	status, body, err := a.Answer()
	return status, string(body), err
}

// TestAssembleMessage: a stream as vLLM sends it (message_start without
// type and role, the thinking block's signature at its end, a tool call's
// input in pieces, the usage in message_delta) is the message vLLM
// answers unstreamed: every block whole, in its place, the stop reason
// and the usage of the end.
func TestAssembleMessage(t *testing.T) {
	status, body, err := assembleMessages(t,
		`{"type":"message_start","message":{"id":"chatcmpl-1","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":0}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`,
		`{"type":"ping"}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"add "}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"them\n"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me \"call\""}}`,
		`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" é"}}`,
		`{"type":"content_block_stop","index":1}`,
		`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_1","name":"add","input":{}}}`,
		`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"a\": 2, "}}`,
		`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"b\": 2}"}}`,
		`{"type":"content_block_stop","index":2}`,
		`{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"input_tokens":9,"output_tokens":31}}`,
		`{"type":"message_stop"}`)
	want := `{"id":"chatcmpl-1","type":"message","role":"assistant","content":[` +
		`{"type":"thinking","thinking":"add them\n","signature":"abc"},` +
		`{"type":"text","text":"Let me \"call\" é"},` +
		`{"type":"tool_use","id":"call_1","name":"add","input":{"a": 2, "b": 2}}],` +
		`"model":"m","stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":31}}`
	if err != nil || status != 200 || body != want {
		t.Fatalf("%d %v\n%s\nwant\n%s", status, err, body, want)
	}
	if !json.Valid([]byte(body)) {
		t.Fatal("not JSON")
	}
	// The Anthropic API's own form: type and role in message_start, a
	// block started without its text, citations, a usage member only at
	// the end, a stop sequence.
	_, body, err = assembleMessages(t,
		`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"cache_read_input_tokens":0,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{"type":"char_location","cited_text":"x"}}}`,
		`{"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":"END"},"usage":{"output_tokens":2,"server_tool_use":null}}`,
		`{"type":"message_stop"}`)
	want = `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi","citations":[{"type":"char_location","cited_text":"x"}]}],` +
		`"model":"m","stop_reason":"stop_sequence","stop_sequence":"END","usage":{"input_tokens":5,"cache_read_input_tokens":0,"output_tokens":2,"server_tool_use":null}}`
	if err != nil || body != want {
		t.Fatalf("%v\n%s\nwant\n%s", err, body, want)
	}
}

// TestAssembleMessageEnds: an error event is the answer with its type's
// status; a stream without its message_stop, a delta before its block's
// start, a delta of an unknown type and a tool input that is not JSON
// are errors.
func TestAssembleMessageEnds(t *testing.T) {
	start := `{"type":"message_start","message":{"id":"m","content":[],"usage":{"input_tokens":1,"output_tokens":0}}}`
	block := `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	for _, c := range []struct {
		typ    string
		status int
	}{{"overloaded_error", 529}, {"invalid_request_error", 400}, {"BadRequestError", 500}} {
		ev := `{"type":"error","error":{"type":"` + c.typ + `","message":"no"}}`
		status, body, err := assembleMessages(t, start, ev)
		if err != nil || status != c.status || body != ev {
			t.Errorf("%s: %d %s %v", c.typ, status, body, err)
		}
	}
	for _, c := range []struct {
		name   string
		events []string
		want   string
	}{
		{"nothing", nil, "no event"},
		{"no message_stop", []string{start, block, `{"type":"message_delta","delta":{"stop_reason":"end_turn"}}`}, "before its message_stop"},
		{"no message_start", []string{`{"type":"message_stop"}`}, "before its message_stop"},
		{"delta before start", []string{start, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}`}, "before its start"},
		{"unknown delta", []string{start, block, `{"type":"content_block_delta","index":0,"delta":{"type":"audio_delta","audio":"x"}}`}, "of type"},
		{"text not a string", []string{start, block, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":5}}`}, "not a string"},
		{"bad index", []string{start, `{"type":"content_block_start","index":-1,"content_block":{"type":"text"}}`}, "index"},
		{"not JSON", []string{start, `{"type":`}, "not a JSON object"},
		{"tool input not JSON", []string{start, `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","input":{}}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}`, `{"type":"message_stop"}`}, "not JSON"},
	} {
		if _, _, err := assembleMessages(t, c.events...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

func FuzzMessagesAssembler(f *testing.F) {
	f.Add([]byte(`{"type":"message_start","message":{"id":"m","content":[]}}`), []byte(`{"type":"content_block_start","index":0,"content_block":{"type":"text"}}`),
		[]byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a\u00e9"}}`))
	f.Add([]byte(`{"type":"message_delta","delta":{"stop_reason":"x"},"usage":{"output_tokens":3}}`), []byte(`{"type":"message_stop"}`), []byte(`{"type":"ping"}`))
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		asm := &MessagesAssembler{}
		for _, ev := range [][]byte{a, b, c, []byte(`{"type":"message_stop"}`)} {
			if asm.Event(ev) != nil {
				return
			}
		}
		status, body, err := asm.Answer()
		if err == nil && !json.Valid(body) {
			t.Fatalf("%d %s: not JSON", status, body)
		}
	})
}
