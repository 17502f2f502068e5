package openai

import (
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
	items := `{"model":"m","input":[
		{"role":"user","content":"what is 2+2?"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"let me call"}]},
		{"type":"reasoning","summary":[]},
		{"type":"function_call","call_id":"c1","name":"add","arguments":"{\"a\":2,\"b\":2}"},
		{"type":"function_call_output","call_id":"c1","output":"4"},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"and"},{"type":"input_text","text":"thanks"}]}]}`
	r, err = ParseResponses([]byte(items))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range r.Messages {
		text, err := m.Content.Text()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Role+": "+text)
	}
	want := []string{"user: what is 2+2?", "assistant: let me call", `assistant: add({"a":2,"b":2})`, "tool: 4", "user: and\nthanks"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("messages %q, want %q", got, want)
	}
	for _, bad := range []string{
		``, `[]`, `{"model":"m"}`, `{"model":"m","input":[]}`, `{"model":"m","input":5}`,
		`{"model":"m","input":[5]}`, `{"model":"m","input":[{"content":"x"}]}`, `{"model":"m","input":[{"type":"message","content":"x"}]}`,
		`{"model":"m","input":[{"role":"user"}]}`, `{"model":"m","input":"x","max_output_tokens":"7"}`,
		`{"model":"m","input":"x","previous_response_id":7}`, `{"model":"m","input":"x","input":"y"}`,
	} {
		if _, err := ParseResponses([]byte(bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
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
