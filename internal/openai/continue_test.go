package openai

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestContinuation(t *testing.T) {
	cases := []struct {
		name   string
		chat   bool
		body   string
		text   string
		tokens int
		want   map[string]any // top-level keys of the continuation (nil: absent)
		err    string
	}{
		{name: "chat", chat: true, text: "Once ", tokens: 2,
			body: `{"model":"m","messages":[{"role":"user","content":"story"}],"max_tokens":10,"min_tokens":3,"stream":true,"temperature":0.5}`,
			want: map[string]any{"max_tokens": 8.0, "min_tokens": 1.0, "continue_final_message": true, "add_generation_prompt": false,
				"stream": true, "temperature": 0.5, "model": "m",
				"messages": []any{map[string]any{"role": "user", "content": "story"}, map[string]any{"role": "assistant", "content": "Once "}}}},
		{name: "chat, max_completion_tokens, min_tokens spent", chat: true, text: "a b c d", tokens: 4,
			body: `{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":5,"min_tokens":2}`,
			want: map[string]any{"max_completion_tokens": 1.0, "min_tokens": 0.0, "max_tokens": nil}},
		{name: "chat without a bound stays without", chat: true, text: "a", tokens: 1,
			body: `{"messages":[{"role":"user","content":"x"}]}`,
			want: map[string]any{"max_tokens": nil, "max_completion_tokens": nil}},
		{name: "chat continuing its final message", chat: true, text: " and more", tokens: 2,
			body: `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"Sure"}],"continue_final_message":true,"add_generation_prompt":false}`,
			want: map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}, map[string]any{"role": "assistant", "content": "Sure and more"}}}},
		{name: "final message of parts", chat: true, text: "a", tokens: 1,
			body: `{"messages":[{"role":"assistant","content":[{"type":"text","text":"S"}]}],"continue_final_message":true}`,
			err:  "no string content"},
		{name: "completion", text: " world", tokens: 1,
			body: `{"prompt":"hello","echo":true,"prompt_logprobs":1,"logprobs":2}`,
			want: map[string]any{"prompt": "hello world", "max_tokens": 15.0, "echo": nil, "prompt_logprobs": nil, "logprobs": 2.0}},
		{name: "completion, a list of one prompt", text: "!", tokens: 1, body: `{"prompt":["hi"],"max_tokens":4}`,
			want: map[string]any{"prompt": "hi!", "max_tokens": 3.0}},
		{name: "token ids", text: "x", tokens: 1, body: `{"prompt":[1,2,3]}`, err: "token ids"},
		{name: "a batch", text: "x", tokens: 1, body: `{"prompt":["a","b"]}`, err: "token ids"},
		{name: "n", chat: true, text: "x", tokens: 1, body: `{"messages":[{"role":"user","content":"x"}],"n":2}`, err: "more than one"},
		{name: "nothing left", chat: true, text: "x y", tokens: 2, body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":2}`, err: "nothing to generate"},
		{name: "completion's default spent", text: "x", tokens: 16, body: `{"prompt":"p"}`, err: "nothing to generate"},
		{name: "max_tokens at the int64 floor", chat: true, text: "x", tokens: 5,
			body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":-9223372036854775808}`, err: "max_tokens -9223372036854775808"},
		{name: "min_tokens at the int64 floor kept as sent", chat: true, text: "x", tokens: 5,
			body: `{"messages":[{"role":"user","content":"x"}],"max_tokens":10,"min_tokens":-9223372036854775808}`,
			want: map[string]any{"min_tokens": -9223372036854775808.0, "max_tokens": 5.0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := ParseRequest([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			r.Prompt, r.Messages = Prompt{}, nil // as the gateway lets them go: the raw body is what counts
			out, err := r.Continuation(c.chat, c.text, c.tokens)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ParseRequest(out); err != nil {
				t.Fatalf("the continuation does not parse: %v\n%s", err, out)
			}
			var got map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			for k, v := range c.want {
				g, _ := json.Marshal(got[k])
				w, _ := json.Marshal(v)
				if string(g) != string(w) {
					t.Errorf("%s: %s, want %s", k, g, w)
				}
			}
		})
	}
}

func TestContinueFinalMessageParsed(t *testing.T) {
	r, err := ParseRequest([]byte(`{"messages":[{"role":"assistant","content":"x"}],"continue_final_message":true,"add_generation_prompt":false}`))
	if err != nil || !r.ContinueFinalMessage {
		t.Fatalf("%v %+v", err, r)
	}
	for _, body := range []string{
		`{"continue_final_message":true,"add_generation_prompt":true}`,
		`{"add_generation_prompt":true,"continue_final_message":true}`,
	} {
		if _, err := ParseRequest([]byte(body)); err == nil || AsError(err).Status != 400 {
			t.Errorf("%s: %v, want vLLM's 400", body, err)
		}
	}
	if _, err := ParseRequest([]byte(`{"continue_final_message":"maybe"}`)); err == nil {
		t.Error("a string continue_final_message was accepted")
	}
}

func TestParseStreamChunk(t *testing.T) {
	cases := []struct {
		data                  string
		text                  string
		other, finished, role bool
	}{
		{`{"id":"a","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, "", false, false, true},
		{`{"choices":[{"index":0,"delta":{"content":"hi"},"logprobs":{"content":[{"token":"hi"}]},"finish_reason":null}]}`, "hi", false, false, false},
		{`{"choices":[{"index":0,"text":" there","finish_reason":"length"}]}`, " there", false, true, false},
		{`{"choices":[{"index":0,"delta":{"content":"\u00e9\n"}}]}`, "\u00e9\n", false, false, false},
		{`{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}`, "", true, false, false},
		{`{"choices":[{"index":0,"delta":{"reasoning":"hmm","content":null}}]}`, "", true, false, false},
		{`{"choices":[{"index":0,"delta":{"reasoning_content":null,"content":"a"}}]}`, "a", false, false, false},
		{`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}`, "", true, false, false},
		{`{"choices":[{"index":0,"delta":{"content":"a","tool_calls":[]}}]}`, "a", false, false, false},
		{`{"choices":[{"index":1,"text":"b"}]}`, "", true, false, false},
		{`{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]}`, "a", true, false, false},
		{`{"choices":[],"usage":{"prompt_tokens":3}}`, "", false, false, false},
	}
	for _, c := range cases {
		ch, err := ParseStreamChunk([]byte(c.data))
		if err != nil {
			t.Fatal(err)
		}
		want := c.text // escapes decoded: "\u00e9\n" is "é\n"
		if string(ch.Text) != want || ch.Other != c.other || ch.Finished != c.finished || ch.Role != c.role {
			t.Errorf("%s: %+v, want %q other %v finished %v role %v", c.data, ch, want, c.other, c.finished, c.role)
		}
	}
	for _, bad := range []string{`{"choices":`, `[1,2]`, ``, `"text"`} {
		if _, err := ParseStreamChunk([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if c, _ := ParseStreamChunk([]byte(`{"usage":null,"error":{"message":"x"}}`)); c.Usage != nil || string(c.Error) != `{"message":"x"}` {
		t.Errorf("usage %q error %q", c.Usage, c.Error)
	}
	older := `{"object":"error","message":"boom","code":500}` // vLLM's older error shape
	if c, _ := ParseStreamChunk([]byte(older)); string(c.Error) != older {
		t.Errorf("older error shape: Error %q", c.Error)
	}
}

// FuzzParseStreamChunk: events written by encoding/json (any text, any
// index, reasoning, tool calls, finish) read back as encoding/json reads
// them.
func FuzzParseStreamChunk(f *testing.F) {
	f.Add("hé\"\\\n\u2028", "", uint8(0), true, false, false)
	f.Add("", "think", uint8(1), false, true, true)
	f.Fuzz(func(t *testing.T, text, reasoning string, index uint8, chat, tools, finish bool) {
		choice := map[string]any{"index": int(index) % 3, "logprobs": nil, "finish_reason": nil}
		if finish {
			choice["finish_reason"] = "stop"
		}
		if chat {
			delta := map[string]any{"content": text}
			if reasoning != "" {
				delta["reasoning_content"] = reasoning
			}
			if tools {
				delta["tool_calls"] = []any{map[string]any{"index": 0}}
			}
			choice["delta"] = delta
		} else {
			choice["text"] = text
		}
		data, err := json.Marshal(map[string]any{"id": "x" + text, "choices": []any{choice}})
		if err != nil {
			t.Skip()
		}
		c, err := ParseStreamChunk(data)
		if err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		first := int(index)%3 == 0
		wantText := ""
		if first {
			var back struct {
				Choices []struct {
					Text  string `json:"text"`
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
			}
			json.Unmarshal(data, &back)
			wantText = back.Choices[0].Text + back.Choices[0].Delta.Content
		}
		var id string
		json.Unmarshal(c.ID, &id)
		wantOther := !first || chat && (reasoning != "" || tools)
		if string(c.Text) != wantText || c.Other != wantOther || c.Finished != (finish && first) || c.IDString() != id {
			t.Fatalf("%s: text %q other %v finished %v id %q; want %q %v %v %q", data, c.Text, c.Other, c.Finished, c.IDString(), wantText, wantOther, finish && first, id)
		}
	})
}

// TestWithoutUsage: an event loses its usage member and the comma that
// joined it, whatever its place, and stays the same JSON otherwise.
func TestWithoutUsage(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"id":"a","choices":[],"usage":{"completion_tokens":3}}`, `{"id":"a","choices":[]}`},
		{`{"usage":{"completion_tokens":3},"id":"a"}`, `{"id":"a"}`},
		{`{"id":"a", "usage" : {"a":[1,{"b":"}"}]} , "x":1}`, `{"id":"a" , "x":1}`},
		{`{"usage":null}`, `{}`},
		{` { "usage" : 1 } `, ` {  } `},
		{`{"id":"a"}`, `{"id":"a"}`},
		{`{"choices":[{"usage":1}]}`, `{"choices":[{"usage":1}]}`}, // only the top level's
	}
	for _, c := range cases {
		ch, err := ParseStreamChunk([]byte(c.in))
		if err != nil {
			t.Fatal(err)
		}
		if got := string(ch.AppendWithoutUsage(nil, []byte(c.in))); got != c.want {
			t.Errorf("%s: %s, want %s", c.in, got, c.want)
		}
	}
}

// FuzzWithoutUsage: an object written by encoding/json, usage among
// members of any names, reads back without usage and otherwise equal.
func FuzzWithoutUsage(f *testing.F) {
	f.Add("id", "zz", "text", true)
	f.Add("a", "", "usagf", false)
	f.Fuzz(func(t *testing.T, k1, k2, text string, usage bool) {
		m := map[string]any{k1: text, k2: []any{map[string]any{"usage": text}}}
		if usage {
			m["usage"] = map[string]any{"completion_tokens": len(text), "x": text}
		}
		data, err := json.Marshal(m)
		if err != nil {
			t.Skip()
		}
		c, err := ParseStreamChunk(data)
		if err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		out := c.AppendWithoutUsage(nil, data)
		var back map[string]any
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("%s -> %s: %v", data, out, err)
		}
		delete(m, "usage")
		w, _ := json.Marshal(m)
		var want map[string]any
		json.Unmarshal(w, &want)
		if !reflect.DeepEqual(back, want) {
			t.Fatalf("%s -> %s, want %s", data, out, w)
		}
		if n, ok := UsageCompletion(c.Usage); usage && (!ok || n != len(text)) {
			t.Fatalf("%s: completion tokens %d %v, want %d", data, n, ok, len(text))
		}
	})
}

func TestUsageCompletion(t *testing.T) {
	cases := []struct {
		usage string
		n     int
		ok    bool
	}{
		{`{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}`, 3, true},
		{`{"completion_tokens":0}`, 0, true},
		{`{"completion_tokens":-1}`, -1, false},
		{`{"completion_tokens":1.5}`, -1, false},
		{`{"completion_tokens":99999999999}`, -1, false},
		{`{"completion_tokens":"3"}`, -1, false},
		{`{"prompt_tokens":5}`, -1, false},
		{`null`, -1, false},
		{``, -1, false},
	}
	for _, c := range cases {
		if n, ok := UsageCompletion([]byte(c.usage)); n != c.n || ok != c.ok {
			t.Errorf("%s: %d %v, want %d %v", c.usage, n, ok, c.n, c.ok)
		}
	}
}

func TestAskUsageEvents(t *testing.T) {
	cases := []struct{ body, want string }{
		{`{"model":"m","stream":true}`, `{"include_usage":true,"continuous_usage_stats":true}`},
		{`{"model":"m","stream":true,"stream_options":null}`, `{"include_usage":true,"continuous_usage_stats":true}`},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":[1]}}`, `{"include_usage":true,"continuous_usage_stats":true,"x":[1]}`},
	}
	for _, c := range cases {
		r, err := ParseRequest([]byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		r.AskUsageEvents()
		if final, cont := r.UsageEvents(); !final || !cont {
			t.Errorf("%s: usage events %v %v", c.body, final, cont)
		}
		back, err := ParseRequest(r.Raw)
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		var got, want any
		json.Unmarshal(back.value("stream_options"), &got)
		json.Unmarshal([]byte(c.want), &want)
		if fmt.Sprint(got) != fmt.Sprint(want) || back.Model != "m" || !back.Stream {
			t.Errorf("%s: %s", c.body, r.Raw)
		}
		if final, cont := back.UsageEvents(); !final || !cont {
			t.Errorf("%s: usage events %v %v", c.body, final, cont)
		}
	}
	r, _ := ParseRequest([]byte(`{"model":"m","stream_options":{"continuous_usage_stats":true}}`))
	if final, cont := r.UsageEvents(); final || cont {
		t.Errorf("continuous_usage_stats without include_usage: %v %v (vLLM: neither)", final, cont)
	}
}
