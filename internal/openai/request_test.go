package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestParseRequestFields(t *testing.T) {
	body := `{"model":"m","prompt":"hi","max_tokens":9223372036854775807,"max_completion_tokens":5,
		"min_tokens":1.0,"n":1,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},
		"kv_transfer_params":{"do_remote_decode":true},"cache_salt":"s","add_generation_prompt":false,
		"temperature":0.5,"Unknown":[1,{"a":"}"}]}  `
	r, err := ParseRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || r.Prompt.Kind != PromptText || r.Prompt.Texts[0] != "hi" ||
		*r.MaxTokens != 1<<63-1 || *r.MaxCompletionTokens != 5 || *r.MinTokens != 1 || *r.N != 1 ||
		!r.IgnoreEOS || !r.Stream || !r.StreamOptions.IncludeUsage || string(r.KVTransferParams) != `{"do_remote_decode":true}` ||
		r.CacheSalt != "s" || *r.AddGenerationPrompt || string(r.Raw) != body {
		t.Errorf("parsed %+v", r)
	}
	if got := r.OutputLimit(true); *got != 5 {
		t.Errorf("chat output limit %d", *got)
	}
	if got := r.OutputLimit(false); *got != 1<<63-1 {
		t.Errorf("completion output limit %d", *got)
	}
	if !r.Has("temperature") || r.Has("top_p") {
		t.Error("Has")
	}
}

// TestLaxScalars: vLLM reads requests with pydantic in its default (lax)
// mode, which takes "5" or 5.0 for an integer and "yes" or 1 for a
// boolean; the gateway forwards the body as sent, so it must read what the
// engine reads rather than refuse it.
func TestLaxScalars(t *testing.T) {
	ints := []struct {
		v    string
		want int64
	}{
		{`7`, 7}, {`7.0`, 7}, {`-3`, -3}, {`1e3`, 1000}, {`"7"`, 7}, {`" 7 "`, 7}, {`"+7"`, 7},
		{`"-7"`, -7}, {`"7.00"`, 7}, {`"7."`, 7}, {`"1_000"`, 1000}, {`"\u0037"`, 7}, {`true`, 1}, {`false`, 0},
	}
	for _, tt := range ints {
		r, err := ParseRequest([]byte(`{"max_tokens":` + tt.v + `}`))
		if err != nil || r.MaxTokens == nil || *r.MaxTokens != tt.want {
			t.Errorf("max_tokens %s: got %v, %v, want %d", tt.v, r, err, tt.want)
		}
	}
	for _, bad := range []string{`"7.5"`, `""`, `"_7"`, `"7_"`, `"1__0"`, `"--7"`, `"+-7"`, `"0x7"`, `"9223372036854775808"`, `1.5`, `[7]`} {
		if _, err := ParseRequest([]byte(`{"max_tokens":` + bad + `}`)); err == nil {
			t.Errorf("max_tokens %s: accepted", bad)
		}
	}
	bools := []struct {
		v    string
		want bool
	}{
		{`true`, true}, {`false`, false}, {`null`, false}, {`1`, true}, {`0`, false}, {`1.0`, true}, {`0.0`, false},
		{`"true"`, true}, {`"True"`, true}, {`"yes"`, true}, {`"on"`, true}, {`"t"`, true}, {`"Y"`, true}, {`"1"`, true},
		{`"false"`, false}, {`"OFF"`, false}, {`"no"`, false}, {`"n"`, false}, {`"0"`, false}, {`"f"`, false},
	}
	for _, tt := range bools {
		r, err := ParseRequest([]byte(`{"stream":` + tt.v + `}`))
		if err != nil || r.Stream != tt.want {
			t.Errorf("stream %s: got %v, %v, want %v", tt.v, r, err, tt.want)
		}
	}
	for _, bad := range []string{`2`, `-1`, `0.5`, `"2"`, `"yess"`, `""`, `" true"`, `{}`} {
		if _, err := ParseRequest([]byte(`{"stream":` + bad + `}`)); err == nil {
			t.Errorf("stream %s: accepted", bad)
		}
	}
}

func TestParsePromptShapes(t *testing.T) {
	tests := []struct {
		body string
		want Prompt
	}{
		{`{"prompt":"a\u00e9b"}`, Prompt{Kind: PromptText, Texts: []string{"aéb"}}},
		{`{"prompt":["x","y"]}`, Prompt{Kind: PromptTexts, Texts: []string{"x", "y"}}},
		{`{"prompt":[1, 2 ,4294967295]}`, Prompt{Kind: PromptTokens, Tokens: [][]uint32{{1, 2, 4294967295}}}},
		{`{"prompt":[[1],[2,3]]}`, Prompt{Kind: PromptTokenLists, Tokens: [][]uint32{{1}, {2, 3}}}},
		{`{"prompt":null}`, Prompt{}},
		{`{}`, Prompt{}},
	}
	for _, tt := range tests {
		r, err := ParseRequest([]byte(tt.body))
		if err != nil {
			t.Errorf("%s: %v", tt.body, err)
			continue
		}
		if !reflect.DeepEqual(r.Prompt, tt.want) {
			t.Errorf("%s: got %+v want %+v", tt.body, r.Prompt, tt.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, body string
		parse      func([]byte) (*Request, error)
		msg, param string
	}{
		{"empty", ``, ParseRequest, "empty", ""},
		{"spaces", "  \n", ParseRequest, "empty", ""},
		{"bad json", `{"prompt": `, ParseRequest, "invalid JSON", ""},
		{"trailing garbage", `{"prompt":"x"} x`, ParseRequest, "invalid JSON", ""},
		{"two values", `{"prompt":"x"}{}`, ParseRequest, "invalid JSON", ""},
		{"not an object", `[1]`, ParseRequest, "JSON object", ""},
		{"null body", `null`, ParseRequest, "JSON object", ""},
		{"duplicate key", `{"max_tokens":1,"max_tokens":100000}`, ParseRequest, "twice", "max_tokens"},
		{"escaped duplicate", `{"max_tokens":1,"\u006dax_tokens":2}`, ParseRequest, "twice", "max_tokens"},
		{"max_tokens string", `{"max_tokens":"5x"}`, ParseRequest, "integer", "max_tokens"},
		{"max_tokens string fraction", `{"max_tokens":"5.5"}`, ParseRequest, "integer", "max_tokens"},
		{"max_tokens object", `{"max_tokens":{}}`, ParseRequest, "integer", "max_tokens"},
		{"max_tokens fraction", `{"max_tokens":1.5}`, ParseRequest, "integer", "max_tokens"},
		{"max_tokens huge", `{"max_tokens":1e30}`, ParseRequest, "64-bit", "max_tokens"},
		{"stream not bool", `{"stream":2}`, ParseRequest, "boolean", "stream"},
		{"stream word", `{"stream":"maybe"}`, ParseRequest, "boolean", "stream"},
		{"stream list", `{"stream":[]}`, ParseRequest, "boolean", "stream"},
		{"model not string", `{"model":1}`, ParseRequest, "string", "model"},
		{"stream_options", `{"stream_options":true}`, ParseRequest, "stream_options", "stream_options"},
		{"prompt number", `{"prompt":5}`, ParseRequest, "prompt must be", "prompt"},
		{"prompt negative id", `{"prompt":[1,-1]}`, ParseRequest, "prompt[1]", "prompt"},
		{"prompt id too big", `{"prompt":[4294967296]}`, ParseRequest, "[0, 2^32)", "prompt"},
		{"prompt float id", `{"prompt":[1.5]}`, ParseRequest, "integers", "prompt"},
		{"prompt mixed", `{"prompt":["a",1]}`, ParseRequest, "prompt must be", "prompt"},
		{"prompt mixed lists", `{"prompt":[[1],2]}`, ParseRequest, "prompt must be", "prompt"},
		{"prompt bad inner", `{"prompt":[[1],[-2]]}`, ParseRequest, "prompt[1][0]", "prompt"},
		{"messages object", `{"messages":{}}`, ParseRequest, "list of messages", "messages"},
		{"message not object", `{"messages":[1]}`, ParseRequest, "messages[0] must be an object", "messages"},
		{"role number", `{"messages":[{"role":1}]}`, ParseRequest, "messages[0].role", "messages"},
		{"content number", `{"messages":[{"role":"user","content":5}]}`, ParseRequest, "content", "messages"},
		{"missing prompt", `{"model":"m"}`, ParseCompletion, "prompt is required", "prompt"},
		{"empty text", `{"prompt":""}`, ParseCompletion, "must not be empty", "prompt"},
		{"empty ids", `{"prompt":[]}`, ParseCompletion, "prompt must not be empty", "prompt"},
		{"empty inner", `{"prompt":[[1],[]]}`, ParseCompletion, "prompt[1] must not be empty", "prompt"},
		{"empty text in list", `{"prompt":["a",""]}`, ParseCompletion, "prompt[1] must not be empty", "prompt"},
		{"missing messages", `{"prompt":"x"}`, ParseChat, "messages is required", "messages"},
		{"empty messages", `{"messages":[]}`, ParseChat, "non-empty", "messages"},
		{"no role", `{"messages":[{"content":"x"}]}`, ParseChat, "role is required", "messages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.parse([]byte(tt.body))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want an *Error", err)
			}
			if e.Status != http.StatusBadRequest || !strings.Contains(e.Message, tt.msg) || e.Param != tt.param {
				t.Errorf("got %d %q param %q, want 400 containing %q param %q", e.Status, e.Message, e.Param, tt.msg, tt.param)
			}
		})
	}
}

func TestMessages(t *testing.T) {
	r, err := ParseChat([]byte(`{"messages":[{"role":"system","content":null},{"role":"user","content":"hi","name":"x"},
		{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
		{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"", "hi", "a\nb"}
	for i, w := range want {
		if got, err := r.Messages[i].Content.Text(); err != nil || got != w {
			t.Errorf("message %d: %q %v, want %q", i, got, err, w)
		}
	}
	if _, err := r.Messages[3].Content.Text(); err == nil || !strings.Contains(err.Error(), "image_url") {
		t.Errorf("image part: %v", err)
	}
	b, _ := json.Marshal(r.Messages[2])
	if string(b) != `{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}` {
		t.Errorf("marshal %s", b)
	}
}

func TestOpensConversation(t *testing.T) {
	tests := []struct {
		body string
		want bool
	}{
		{`{"messages":[{"role":"user","content":"hi"}]}`, true},
		{`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}`, true},
		{`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"and?"}]}`, false},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure,"}]}`, false}, // a continued answer
		{`{"messages":[{"role":"developer","content":"d"},{"role":"user","content":"q"},{"role":"tool","content":"r"}]}`, true},
	}
	for _, tt := range tests {
		r, err := ParseChat([]byte(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		if got := OpensConversation(r.Messages); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.body, got, tt.want)
		}
	}
	if OpensConversation(nil) {
		t.Error("no messages (a completion) opens no conversation")
	}
}

func TestRewrite(t *testing.T) {
	r, err := ParseRequest([]byte(` { "model" : "m", "prompt":"a,b}", "stream":true , "x":{"y":[1,2]} } `))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		edits []Edit
		want  string
	}{
		{nil, `{"model":"m","prompt":"a,b}","stream":true,"x":{"y":[1,2]}}`},
		{[]Edit{{Key: "stream", Value: json.RawMessage("false")}}, `{"model":"m","prompt":"a,b}","stream":false,"x":{"y":[1,2]}}`},
		{[]Edit{{Key: "model"}, {Key: "x"}}, `{"prompt":"a,b}","stream":true}`},
		{[]Edit{{Key: "new", Value: json.RawMessage(`"v"`)}, {Key: "gone"}}, `{"model":"m","prompt":"a,b}","stream":true,"x":{"y":[1,2]},"new":"v"}`},
		{[]Edit{{Key: "n", Value: json.RawMessage(`1`)}, {Key: "n", Value: json.RawMessage(`2`)}}, `{"model":"m","prompt":"a,b}","stream":true,"x":{"y":[1,2]},"n":2}`},
		{[]Edit{{Key: "stream"}, {Key: "stream", Value: json.RawMessage(`false`)}}, `{"model":"m","prompt":"a,b}","stream":false,"x":{"y":[1,2]}}`},
	}
	for _, tt := range tests {
		if got := string(r.Rewrite(tt.edits...)); got != tt.want {
			t.Errorf("%v:\n got %s\nwant %s", tt.edits, got, tt.want)
		}
	}
	empty, _ := ParseRequest([]byte(`{}`))
	if got := string(empty.Rewrite(Edit{Key: "a", Value: json.RawMessage("1")}, Edit{Key: "b", Value: json.RawMessage("2")})); got != `{"a":1,"b":2}` {
		t.Errorf("empty object: %s", got)
	}
}

// FuzzParseRequest checks that no body crashes the parser, that what it
// accepts is what encoding/json reads for the same keys, and that rewritten
// bodies are valid JSON that parse back to the same fields.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello","max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3],"max_tokens":9223372036854775807}`,
		`{"prompt":[[1,2],[3]],"min_tokens":2}`,
		`{"prompt":["a","b"],"n":1}`,
		`{"messages":[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"x"}]}],"max_completion_tokens":3}`,
		`{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_host":"h","remote_port":1,"remote_block_ids":[1,2]}}`,
		`{"prompt":"a\"b\\","x":"\\\"","y":[{"z":"]}"}]}`,
		`{"max_tokens":1,"max_tokens":2}`,
		`{"prompt":"x"} trailing`,
		`{"prompt":[-1]}`,
		`[]`, `null`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseRequest(body)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Status != http.StatusBadRequest {
				t.Fatalf("error %v is not a 400 *Error", err)
			}
			return
		}
		var ref map[string]json.RawMessage
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatalf("accepted a body encoding/json rejects: %v", err)
		}
		if len(ref) != len(r.members) {
			t.Fatalf("%d members, encoding/json sees %d", len(r.members), len(ref))
		}
		for _, m := range r.members {
			if v, ok := ref[m.key]; !ok || !json.Valid(v) || string(v) != string(body[m.v0:m.v1]) {
				t.Fatalf("member %q: %q, encoding/json %q", m.key, body[m.v0:m.v1], v)
			}
		}
		if v, ok := ref["max_tokens"]; ok && !isNull(v) {
			var n int64
			if json.Unmarshal(v, &n) == nil && *r.MaxTokens != n {
				t.Fatalf("max_tokens %d, encoding/json %d", *r.MaxTokens, n)
			}
		}
		for _, out := range [][]byte{r.Rewrite(), r.PrefillBody(), r.StripRoutingParams()} {
			r2, err := ParseRequest(out)
			if err != nil {
				t.Fatalf("rewritten body %q does not parse: %v", out, err)
			}
			if r2.Model != r.Model || !reflect.DeepEqual(r2.Prompt, r.Prompt) || r2.CacheSalt != r.CacheSalt {
				t.Fatalf("rewrite changed fields: %q -> %q", body, out)
			}
		}
		pre, _ := ParseRequest(r.PrefillBody())
		if pre.Stream || pre.StreamOptions != nil || *pre.MaxTokens != 1 || pre.MinTokens != nil {
			t.Fatalf("prefill body %q", r.PrefillBody())
		}
		if kv, err := ParseKVTransferParams(pre.KVTransferParams); err != nil || !kv.DoRemoteDecode {
			t.Fatalf("prefill kv_transfer_params %s: %v", pre.KVTransferParams, err)
		}
		if s, _ := ParseRequest(r.StripRoutingParams()); s.KVTransferParams != nil || s.Has("kv_transfer_params") {
			t.Fatalf("strip left kv_transfer_params")
		}
		_, _ = ParseKVTransferParams(r.KVTransferParams)
	})
}

func TestDecodeObject(t *testing.T) {
	var v struct {
		Role string `json:"role"`
	}
	if err := DecodeObject([]byte(` {"role":"decode"} `), &v); err != nil || v.Role != "decode" {
		t.Errorf("%+v %v", v, err)
	}
	for _, b := range []string{``, ` `, `{"role":"decode"} x`, `{"role":"a"}{"role":"b"}`, `[]`, `null`, `{"role":5}`} {
		var e *Error
		if err := DecodeObject([]byte(b), &v); !errors.As(err, &e) || e.Status != 400 {
			t.Errorf("%q: %v, want a 400", b, err)
		}
	}
}

func TestPlainString(t *testing.T) {
	for raw, want := range map[string]bool{`"abc def"`: true, `"a\"b"`: false, `"a\nb"`: false, `5`: false, `"é"`: true, "\"\xff\"": false} {
		s, ok := plainString([]byte(raw))
		if ok != want || (ok && `"`+s+`"` != raw) {
			t.Errorf("%s: %q %v", raw, s, ok)
		}
	}
}

// chatBody is a chat request of about 4 000 tokens of text (20 KB).
func chatBody() []byte {
	words := strings.Repeat("lorem ipsum dolor sit amet, ", 730)
	b, _ := json.Marshal(map[string]any{
		"model": "m", "max_tokens": 64, "stream": true, "stream_options": map[string]any{"include_usage": true},
		"messages": []map[string]any{{"role": "system", "content": "You are helpful."}, {"role": "user", "content": words}},
	})
	return b
}

// BenchmarkParseChat parses a 20 KB chat request; the baseline is
// encoding/json into a struct with the same fields, as the engine parsed
// requests before.
func BenchmarkParseChat(b *testing.B) {
	body := chatBody()
	b.Run("openai.ParseChat", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, err := ParseChat(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline-json.Unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var r struct {
				Model         string `json:"model"`
				MaxTokens     *int   `json:"max_tokens"`
				Stream        bool   `json:"stream"`
				StreamOptions *struct {
					IncludeUsage bool `json:"include_usage"`
				} `json:"stream_options"`
				Messages []struct {
					Role    string          `json:"role"`
					Content json.RawMessage `json:"content"`
				} `json:"messages"`
			}
			if err := json.Unmarshal(body, &r); err != nil {
				b.Fatal(err)
			}
			for _, m := range r.Messages {
				var s string
				json.Unmarshal(m.Content, &s)
			}
		}
	})
	b.Run("PrefillBody", func(b *testing.B) {
		r, _ := ParseChat(body)
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			r.PrefillBody()
		}
	})
}
