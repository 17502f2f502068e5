package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzValid requires valid to agree with json.Valid on every input.
func FuzzValid(f *testing.F) {
	for _, s := range []string{
		``, ` `, `{}`, `[]`, `{"a":1}`, ` {"a" : [1, -2.5e+3, "x\u00e9\n", true, false, null, {}]} `,
		`{"a":1,}`, `[1,]`, `{"a"}`, `{"a":}`, `{1:2}`, `[01]`, `[-]`, `[1.]`, `[1e]`, `"\x"`, `"\u12"`,
		"\"\x01\"", "\"\xff\"", `tru`, `truex`, `nul`, `[1 2]`, `{"a":1}{}`, `[}`, `{]`, `"abc`,
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		`0`, `-0`, `-01`, `1E5`, `1e-5`, `[1,[2,{"x":[3]}]]`, "\t\r\n1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := valid(b), json.Valid(b); got != want {
			t.Fatalf("valid(%q) = %v, json.Valid %v", b, got, want)
		}
	})
}

func BenchmarkValid(b *testing.B) {
	body := chatBody()
	b.Run("valid", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			valid(body)
		}
	})
	b.Run("baseline-json.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			json.Valid(body)
		}
	})
}
