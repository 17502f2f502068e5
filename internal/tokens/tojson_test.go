package tokens

import (
	"encoding/json"
	"testing"
)

// TestPyTojson: the tojson filter writes what transformers' does
// (json.dumps, ensure_ascii=False): members in their order with indent
// too (the library sorted them and escaped <, > and & there: Llama
// 3.1–3.3's tools), floats as Python writes them (1.0, not 1), U+2028 as
// is; the expected texts are Python 3's json.dumps output.
func TestPyTojson(t *testing.T) {
	for _, c := range []struct{ name, filter, value, want string }{
		{"order and no HTML escapes, indented", "tojson(indent=4)",
			`{"type":"function","function":{"name":"f","description":"Use <b>bold</b> & co","parameters":{"type":"object","required":[]}}}`,
			"{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"f\",\n        \"description\": \"Use <b>bold</b> & co\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"required\": []\n        }\n    }\n}"},
		{"a list indented by 2", "tojson(indent=2)", `[1,[2,{}],"x"]`, "[\n  1,\n  [\n    2,\n    {}\n  ],\n  \"x\"\n]"},
		{"floats", "tojson", `[1.0,100.0,-0.0,0.5,1e16,1.5e-05,123.456,1e-4,1e-5,12345678901234567.0,2.5e300]`,
			`[1.0, 100.0, -0.0, 0.5, 1e+16, 1.5e-05, 123.456, 0.0001, 1e-05, 1.2345678901234568e+16, 2.5e+300]`},
		{"integers, booleans and null", "tojson", `{"a":1,"b":-9007199254740993,"c":true,"d":null}`, `{"a": 1, "b": -9007199254740993, "c": true, "d": null}`},
		{"strings", "tojson", `["\u2028 é 中 \"q\" \\ \n \t \u0001 \u007f"]`, "[\"\u2028 é 中 \\\"q\\\" \\\\ \\n \\t \\u0001 \u007f\"]"},
		{"separators", "tojson(separators=(',', ':'))", `{"a":[1,2]}`, `{"a":[1,2]}`},
		{"sort_keys", "tojson(sort_keys=true)", `{"b":1,"a":2}`, `{"a": 2, "b": 1}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := NewChatTemplate("{{ messages[0].content_value | "+c.filter+" }}", nil)
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := json.Marshal(map[string]json.RawMessage{"role": json.RawMessage(`"user"`), "content": json.RawMessage(`"x"`), "content_value": json.RawMessage(c.value)})
			got, err := tmpl.RenderChat([]Message{ObjectMessage("user", "x", msg)}, ChatOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

// TestToolArgumentsParsed: an assistant's tool call arguments reach the
// template as an object, as vLLM parses them (chat_utils
// _postprocess_messages), whatever the client's spacing; none or "" an
// empty object; a string that is not JSON stays a string.
func TestToolArgumentsParsed(t *testing.T) {
	tmpl, err := NewChatTemplate(`{%- for m in messages %}{%- for tc in m.tool_calls or [] %}{{ tc.function.arguments | tojson }};{%- endfor %}{%- endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := json.RawMessage(`{"role":"assistant","content":null,"tool_calls":[` +
		`{"id":"a","type":"function","function":{"name":"f","arguments":"{\"city\":\"Paris\",\"n\":1.0}"}},` +
		`{"id":"b","type":"function","function":{"name":"g","arguments":""}},` +
		`{"id":"c","type":"function","function":{"name":"h"}},` +
		`{"id":"d","type":"function","function":{"name":"i","arguments":"not json"}}]}`)
	got, err := tmpl.RenderChat([]Message{ObjectMessage("assistant", "", msg)}, ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"city": "Paris", "n": 1.0};{};{};"not json";`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestTojsonInMacro: the filter reaches a macro's body too (templates
// render tools in macros).
func TestTojsonInMacro(t *testing.T) {
	tm, err := NewChatTemplate(`{%- macro show(x) %}{{ x | tojson(indent=1) }}{%- endmacro %}{%- for m in messages %}{{ show([m.content, 1.0]) }}{%- endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := tm.Render([]Message{TextMessage("user", "a<b")}, false)
	if want := "[\n \"a<b\",\n 1.0\n]"; err != nil || out != want {
		t.Errorf("%q %v, want %q", out, err, want)
	}
}
