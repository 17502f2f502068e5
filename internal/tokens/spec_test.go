package tokens

import (
	"strings"
	"testing"
)

// TestSpecChecks: a tokenizer spec's url= and bytes_per_token are checked
// when the set is built, naming the fault (a walkthrough's url=notaurl
// started cleanly, then failed every lookup with 502), and Estimated says
// which tokenizers are the byte estimate.
func TestSpecChecks(t *testing.T) {
	cases := []struct {
		spec, err string
	}{
		{"model=m,source=engine,url=notaurl", "not an engine's address"},
		{"model=m,source=engine,url=ftp://h:1", "not an engine's address"},
		{"model=m,source=engine,url=http://", "not an engine's address"},
		{"model=m,source=engine,url=http://127.0.0.1:8001", ""},
		{"model=m,source=engine,url=https://engine.example/v1x", ""},
		// The OpenAI base URL was taken, and every lookup was a 404 at
		// …/v1/tokenize (walkthrough, 2026-12-04).
		{"model=m,source=engine,url=http://127.0.0.1:8001/v1", "not its OpenAI base URL"},
		{"model=m,source=engine,url=http://127.0.0.1:8001/v1/", "not its OpenAI base URL"},
		{"model=m,source=engine,url=http://proxy:80/engines/a/v1", "not its OpenAI base URL"},
		{"model=m,source=engine,url=http://proxy:80/engines/a", ""},
		{"model=m,source=engine,url=http://127.0.0.1:8001?x=1", "not its OpenAI base URL"},
		{"bytes_per_token=0", "want 1 to 1024"},
		{"bytes_per_token=4096", "want 1 to 1024"},
		{"bytes_per_token=3", ""},
	}
	for _, c := range cases {
		sp, err := ParseSpec(c.spec)
		if err == nil {
			_, err = NewSet([]Spec{sp}, nil, nil, nil)
		}
		if (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want %q", c.spec, err, c.err)
		}
	}
	set, err := NewSet([]Spec{{Model: "m", Source: "engine", URL: "http://127.0.0.1:1"}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if set.For("m").Estimated() || !set.For("other").Estimated() {
		t.Error("Estimated: want false for the engine's tokenizer, true for the default estimate")
	}
}
