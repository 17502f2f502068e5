package openai

import (
	"encoding/json"
	"testing"
)

func TestAnswerUsage(t *testing.T) {
	cases := []struct {
		body string
		n    int
		ok   bool
	}{
		{`{"id":"a","choices":[{"text":"hi"}],"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}`, 3, true},
		{`{"usage":{"completion_tokens" : 120 , "x":1}}`, 120, true},
		{`{"text":"x","meta_info":{"prompt_tokens":4,"completion_tokens":7,"cached_tokens":0}}`, 7, true},
		{`{"choices":[{"message":{"content":"{\"completion_tokens\":99}"}}],"usage":{"completion_tokens":12}}`, 12, true},
		{`{"choices":[{"message":{"content":"{\"completion_tokens\":99}"}}]}`, 0, false},
		{`{"usage":{"completion_tokens":null}}`, 0, false},
		{`{"usage":{"completion_tokens":12345678901}}`, 0, false},
		{`{"choices":[]}`, 0, false},
	}
	for _, c := range cases {
		for _, step := range []int{1, 2, 7, 1 << 20} {
			var u AnswerUsage
			for p := []byte(c.body); len(p) > 0; {
				k := min(step, len(p))
				u.Scan(p[:k])
				p = p[k:]
			}
			if n, ok := u.Count(); n != c.n || ok != c.ok {
				t.Errorf("%s in reads of %d: %d %v, want %d %v", c.body, step, n, ok, c.n, c.ok)
			}
		}
	}
}

// FuzzAnswerUsage: a body written by encoding/json, any text in it, read
// in reads of any size, gives its usage's completion tokens.
func FuzzAnswerUsage(f *testing.F) {
	f.Add(`say "completion_tokens": 5`, uint32(3), uint8(1))
	f.Fuzz(func(t *testing.T, text string, n uint32, step uint8) {
		body, err := json.Marshal(map[string]any{"choices": []any{map[string]any{"text": text}}, "usage": map[string]any{"completion_tokens": n % 1e9}})
		if err != nil {
			t.Skip()
		}
		var u AnswerUsage
		for p := body; len(p) > 0; {
			k := min(max(int(step), 1), len(p))
			u.Scan(p[:k])
			p = p[k:]
		}
		if got, ok := u.Count(); !ok || got != int(n%1e9) {
			t.Fatalf("%s: %d %v, want %d", body, got, ok, n%1e9)
		}
	})
}
