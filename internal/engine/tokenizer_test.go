package engine

import (
	"slices"
	"strings"
	"testing"
)

func TestTokenizer(t *testing.T) {
	tests := []struct {
		text string
		want []string
	}{
		{"", nil},
		{"  \n\t ", nil},
		{"Hello, world!", []string{"Hello", ",", "world", "!"}},
		{"snake_case x2 42", []string{"snake_case", "x2", "42"}},
		{"über café", []string{"über", "café"}},
		{"supercalifragilistic", []string{"supercalifra", "gilistic"}},
		{"a+b", []string{"a", "+", "b"}},
		{"日本", []string{"日本"}},
	}
	for _, tt := range tests {
		got := Tokenize(tt.text)
		want := make([]uint32, len(tt.want))
		for i, w := range tt.want {
			want[i] = tokenID(w)
		}
		if !slices.Equal(got, want) {
			t.Errorf("Tokenize(%q) = %v, want ids of %q", tt.text, got, tt.want)
		}
	}
	// Output filler text tokenizes back to the generated ids.
	var b strings.Builder
	outputText(&b, &request{seed: 7}, 0, 50)
	toks := Tokenize(b.String())
	for i, id := range toks {
		if id != fillerIDs[fillerIndex(7, i)] {
			t.Fatalf("output token %d does not round-trip", i)
		}
	}
	if got := RenderChat([]ChatMessage{{"user", "hi"}}, true); got != "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" {
		t.Errorf("template %q", got)
	}
}

func BenchmarkTokenize(b *testing.B) {
	text := strings.Repeat("The quick brown fox, jumps over the lazy dog. ", 500)
	b.SetBytes(int64(len(text)))
	dst := make([]uint32, 0, 6000)
	for b.Loop() {
		dst = appendTokens(dst[:0], text)
	}
}
