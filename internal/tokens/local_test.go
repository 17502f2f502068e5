package tokens

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// synthTokenizer builds a small byte-level BPE tokenizer.json: the 256
// byte tokens (ids 0–255), then one token per merge in order (ids from
// 256), then the added tokens. edit may change the file before it is
// serialised.
func synthTokenizer(t testing.TB, merges [][2]string, added []addedToken, edit func(map[string]any)) []byte {
	t.Helper()
	vocab := map[string]uint32{}
	for b := 0; b < 256; b++ {
		vocab[string(byteLevelRune[b])] = uint32(b)
	}
	var ms []string
	for _, m := range merges {
		l, r := byteLevelEncode(m[0]), byteLevelEncode(m[1])
		ms = append(ms, l+" "+r)
		if _, ok := vocab[l+r]; !ok {
			vocab[l+r] = uint32(len(vocab))
		}
	}
	f := map[string]any{
		"added_tokens": added,
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": ms, "ignore_merges": false},
	}
	if edit != nil {
		edit(f)
	}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// synthDecode turns ids of a synthTokenizer back into text.
func synthDecode(merges [][2]string, added []addedToken, ids []uint32) string {
	tok := map[uint32]string{}
	for b := 0; b < 256; b++ {
		tok[uint32(b)] = string([]byte{byte(b)})
	}
	next := uint32(256)
	seen := map[string]bool{}
	for _, m := range merges {
		if !seen[m[0]+m[1]] {
			seen[m[0]+m[1]] = true
			tok[next] = m[0] + m[1]
			next++
		}
	}
	for _, a := range added {
		tok[a.ID] = a.Content
	}
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(tok[id])
	}
	return b.String()
}

func mustParse(t testing.TB, data []byte) *LocalSource {
	t.Helper()
	s, err := ParseLocal(data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tokenize(t testing.TB, s *LocalSource, text string) []uint32 {
	t.Helper()
	ids, err := s.Tokenize(context.Background(), text)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestBPEMergeOrder(t *testing.T) {
	// ids: "ab" 256, "bc" 257, "abc" 258, "cd" 259, "bcd" 260
	merges := [][2]string{{"a", "b"}, {"b", "c"}, {"ab", "c"}, {"c", "d"}, {"b", "cd"}}
	s := mustParse(t, synthTokenizer(t, merges, nil, nil))
	for _, tc := range []struct {
		text string
		want []uint32
	}{
		{"abc", []uint32{258}},                   // ab (rank 0) first, then ab+c
		{"bcd", []uint32{257, 'd'}},              // bc (rank 1) beats cd (rank 3); no bc+d merge
		{"abcd", []uint32{258, 'd'}},             // ab, then abc (rank 2) before cd (rank 3)
		{"xbcd", []uint32{'x', 257, 'd'}},        // one word: "xbcd"
		{"abab", []uint32{256, 256}},             // equal ranks: leftmost first
		{"cdcd", []uint32{259, 259}},             // no merge across the pairs
		{"bcbc", []uint32{257, 257}},             // the same pair twice
		{" abc", []uint32{' ', 258}},             // " abc" is one word; no merge with the space
		{"", []uint32{}},                         // nothing
		{"é", []uint32{0xC3, 0xA9}},              // bytes of a rune
		{"a\nb", []uint32{'a', '\n', 'b'}},       // three words
		{"bc", []uint32{257}},                    // a vocabulary word reached by its merge
		{"cd bcd", []uint32{259, ' ', 257, 'd'}}, // " bcd": bc (rank 1) first, so b+cd never happens
	} {
		got := tokenize(t, s, tc.text)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %v, want %v", tc.text, got, tc.want)
		}
	}
}

// TestBPEVocabularyShortcut: a word that is a vocabulary token but that the
// merges do not reach must still be merged (Qwen), unless ignore_merges
// says the whole token wins (Llama 3).
func TestBPEVocabularyShortcut(t *testing.T) {
	// "bc" (rank 0) makes "abc" unreachable: a+bc has no merge, but the
	// token "abc" exists through merge ab+c (ranks 1 and 2).
	merges := [][2]string{{"b", "c"}, {"a", "b"}, {"ab", "c"}}
	s := mustParse(t, synthTokenizer(t, merges, nil, nil))
	if got := tokenize(t, s, "abc"); !slices.Equal(got, []uint32{'a', 256}) {
		t.Errorf("without ignore_merges: %v, want [a bc]", got)
	}
	s = mustParse(t, synthTokenizer(t, merges, nil, func(f map[string]any) {
		f["model"].(map[string]any)["ignore_merges"] = true
	}))
	if got := tokenize(t, s, "abc"); !slices.Equal(got, []uint32{258}) {
		t.Errorf("with ignore_merges: %v, want [abc]", got)
	}
}

func TestAddedTokens(t *testing.T) {
	merges := [][2]string{{"a", "b"}}
	added := []addedToken{
		{ID: 1000, Content: "<|x|>", Special: true},
		{ID: 1001, Content: "<|x|>y", Special: true}, // longest wins
		{ID: 1002, Content: "[L]", LStrip: true},
		{ID: 1003, Content: "[R]", RStrip: true},
		{ID: 1004, Content: "word", SingleWord: true},
	}
	s := mustParse(t, synthTokenizer(t, merges, added, nil))
	for _, tc := range []struct {
		text string
		want []uint32
	}{
		{"ab<|x|>ab", []uint32{256, 1000, 256}},
		{"<|x|>yab", []uint32{1001, 256}},
		{"<|x|", []uint32{'<', '|', 'x', '|'}},
		{"ab  [L]ab", []uint32{256, 1002, 256}},          // lstrip takes the spaces before
		{"ab[R]  ab", []uint32{256, 1003, 256}},          // rstrip takes the spaces after
		{"ab[R]\u3000\t ab", []uint32{256, 1003, 256}},   // any Unicode whitespace
		{"[L][L]", []uint32{1002, 1002}},                 //
		{"a word b", []uint32{'a', ' ', 1004, ' ', 'b'}}, // single word
		{"awordb", []uint32{'a', 'w', 'o', 'r', 'd', 'b'}},
		{"word_", []uint32{'w', 'o', 'r', 'd', '_'}},
	} {
		if got := tokenize(t, s, tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %v, want %v", tc.text, got, tc.want)
		}
	}
}

func TestNormalizerAndNormalizedAddedTokens(t *testing.T) {
	added := []addedToken{{ID: 1000, Content: "\u00e9!", Normalized: true}}
	s := mustParse(t, synthTokenizer(t, nil, added, func(f map[string]any) {
		f["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}}}
	}))
	// "e" + U+0301 composes to U+00E9 under NFC, then matches the token.
	if got := tokenize(t, s, "e\u0301!"); !slices.Equal(got, []uint32{1000}) {
		t.Errorf("normalized added token: %v", got)
	}
	if got := tokenize(t, s, "e\u0301"); !slices.Equal(got, []uint32{0xC3, 0xA9}) {
		t.Errorf("NFC: %v", got)
	}
}

func TestPostProcessor(t *testing.T) {
	added := []addedToken{{ID: 1000, Content: "<s>", Special: true}, {ID: 1001, Content: "</s>", Special: true}}
	data := synthTokenizer(t, nil, added, func(f map[string]any) {
		f["post_processor"] = map[string]any{"type": "Sequence", "processors": []any{
			map[string]any{"type": "ByteLevel"},
			map[string]any{"type": "TemplateProcessing",
				"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}, map[string]any{"SpecialToken": map[string]any{"id": "</s>"}}},
				"special_tokens": map[string]any{"<s>": map[string]any{"ids": []int{1000}}, "</s>": map[string]any{"ids": []int{1001}}}},
		}}
	})
	s := mustParse(t, data)
	if got := tokenize(t, s, "a"); !slices.Equal(got, []uint32{'a'}) {
		t.Errorf("without special tokens: %v", got)
	}
	if got, err := s.TokenizePrompt(context.Background(), "a", true); err != nil || !slices.Equal(got, []uint32{1000, 'a', 1001}) {
		t.Errorf("with special tokens: %v %v", got, err)
	}
}

func TestParseLocalErrors(t *testing.T) {
	bad := map[string]func(map[string]any){
		"unigram model": func(f map[string]any) { f["model"].(map[string]any)["type"] = "Unigram" },
		"dropout":       func(f map[string]any) { f["model"].(map[string]any)["dropout"] = 0.1 },
		"suffix":        func(f map[string]any) { f["model"].(map[string]any)["end_of_word_suffix"] = "</w>" },
		"missing byte":  func(f map[string]any) { delete(f["model"].(map[string]any)["vocab"].(map[string]uint32), "Ā") },
		"bad merge":     func(f map[string]any) { f["model"].(map[string]any)["merges"] = []string{"a"} },
		"unknown merge": func(f map[string]any) { f["model"].(map[string]any)["merges"] = []string{"a zz"} },
		"normalizer":    func(f map[string]any) { f["normalizer"] = map[string]any{"type": "Lowercase"} },
		"no byte level": func(f map[string]any) { f["pre_tokenizer"] = nil },
		"metaspace":     func(f map[string]any) { f["pre_tokenizer"] = map[string]any{"type": "Metaspace"} },
		"split removed": func(f map[string]any) {
			f["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\d`}, "behavior": "Removed"}
		},
		"lookahead": func(f map[string]any) {
			f["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `a(?=b)`}, "behavior": "Isolated"},
				map[string]any{"type": "ByteLevel"}}}
		},
		"empty match": func(f map[string]any) {
			f["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `a*`}, "behavior": "Isolated"},
				map[string]any{"type": "ByteLevel"}}}
		},
		"post processor": func(f map[string]any) { f["post_processor"] = map[string]any{"type": "RobertaProcessing"} },
		"template token": func(f map[string]any) {
			f["post_processor"] = map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}}}
		},
	}
	for name, edit := range bad {
		if _, err := ParseLocal(synthTokenizer(t, [][2]string{{"a", "b"}}, nil, edit)); err == nil {
			t.Errorf("%s: no error", name)
		} else if !strings.HasPrefix(err.Error(), "tokens: ") {
			t.Errorf("%s: unclear error %v", name, err)
		}
	}
	if _, err := ParseLocal([]byte("not json")); err == nil {
		t.Error("no error for a file that is not JSON")
	}
}

// TestRegexSplitPatterns runs Oniguruma patterns the way tokenizers does:
// the GPT-2 split of a ByteLevel pre-tokenizer with use_regex, and
// DeepSeek-style splits without the lookahead.
func TestRegexSplitPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern, text string
		want          []string
	}{
		{gpt2Pattern, "Hello  world's 123!!  ", []string{"Hello", " ", " world", "'s", " 123", "!!", "  "}},
		{gpt2Pattern, "a\n\n b", []string{"a", "\n\n", " b"}},
		{`\p{N}{1,3}`, "ab12345c", []string{"ab", "123", "45", "c"}},
		{`[一-龥]+`, "ab中文cd", []string{"ab", "中文", "cd"}},
		{`\s+(?!\S)|\s+`, "a   b  ", []string{"a", "  ", " ", "b", "  "}},
		{`\w+`, "héllo wörld_1", []string{"héllo", " ", "wörld_1"}},
		{`\u4e00+`, "一一x", []string{"一一", "x"}},
	} {
		sp, err := newRegexSplit(tc.pattern)
		if err != nil {
			t.Fatalf("%q: %v", tc.pattern, err)
		}
		var got []string
		sp.split(tc.text, func(p string) { got = append(got, p) })
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q on %q: %q, want %q", tc.pattern, tc.text, got, tc.want)
		}
	}
	for _, p := range []string{`a(?!b)`, `(?<=a)b`, `^a`, `a\b`, `\S+[\S]`, `(?>a)`} {
		if _, err := newRegexSplit(p); err == nil {
			t.Errorf("%q: no error", p)
		}
	}
}

func collectSplit(sp splitter, s string) []string {
	var out []string
	sp.split(s, func(p string) { out = append(out, p) })
	return out
}

var splitSeeds = []string{
	"Hello, world! It's 12345 o'clock.\n\n  Indented\tline\r\n",
	"  \n \n x", "a \u00a0b\u3000\u3000c", "'S'RE'll'ſ", "😀 😀  😀", "机器 学习。\n", "\xff\xfe bad \xc3",
	"trailing   ", "x \t!", "1 22 333 4444", " !!!\n\n", "\u0085\u2028\u2029\ufeff a",
}

// FuzzLlamaSplit checks the hand-written scanner against the same pattern
// run by Go's regexp (with the lookahead resolved by regexSplit).
func FuzzLlamaSplit(f *testing.F) {
	for _, s := range splitSeeds {
		f.Add(s)
	}
	type pair struct {
		fast splitter
		slow *regexSplit
	}
	var pairs []pair
	for _, p := range []struct {
		pattern string
		digits  int
	}{{llama3Pattern, 3}, {qwenPattern, 1}} {
		slow, err := newRegexSplit(p.pattern)
		if err != nil {
			f.Fatal(err)
		}
		pairs = append(pairs, pair{newLlamaSplit(p.digits), slow})
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, p := range pairs {
			fast, slow := collectSplit(p.fast, s), collectSplit(p.slow, s)
			if !slices.Equal(fast, slow) {
				t.Fatalf("%q: scanner %q, regexp %q", s, fast, slow)
			}
			if strings.Join(fast, "") != s {
				t.Fatalf("%q: pieces %q do not cover the text", s, fast)
			}
			for _, piece := range fast {
				if piece == "" {
					t.Fatalf("%q: empty piece", s)
				}
			}
		}
	})
}

// FuzzLocalTokenize: any text tokenizes without error into ids that decode
// back to it (byte-level BPE loses nothing), whatever the added tokens.
func FuzzLocalTokenize(f *testing.F) {
	for _, s := range splitSeeds {
		f.Add(s)
	}
	f.Add("<|x|>[L] word [R]<|x|")
	merges := randomMerges(3, 300)
	added := []addedToken{{ID: 5000, Content: "<|x|>"}, {ID: 5001, Content: "[L]"}, {ID: 5002, Content: "word"}}
	s := mustParse(f, synthTokenizer(f, merges, added, nil))
	f.Fuzz(func(t *testing.T, text string) {
		ids := tokenize(t, s, text)
		if got := synthDecode(merges, added, ids); got != text {
			t.Fatalf("%q decodes to %q (ids %v)", text, got, ids)
		}
	})
}

// randomMerges makes a merge list over a small alphabet, as BPE training
// would: each merge joins two tokens that exist.
func randomMerges(seed uint64, n int) [][2]string {
	rng := rand.New(rand.NewPCG(seed, 1))
	toks := []string{"a", "b", "c", "d", " ", "\n", "\xc3", "\xa9"}
	out := [][2]string{{"\xc3", "\xa9"}} // é
	seen := map[[2]string]bool{out[0]: true}
	toks = append(toks, "é")
	for len(out) < n {
		p := [2]string{toks[rng.IntN(len(toks))], toks[rng.IntN(len(toks))]}
		if seen[p] || len(p[0]+p[1]) > 12 {
			continue
		}
		seen[p] = true
		out = append(out, p)
		toks = append(toks, p[0]+p[1])
	}
	return out
}

// TestMergeHeapMatchesScan: the heap merge of long words gives what the
// quadratic scan gives.
func TestMergeHeapMatchesScan(t *testing.T) {
	s := mustParse(t, synthTokenizer(t, randomMerges(7, 2000), nil, nil))
	rng := rand.New(rand.NewPCG(8, 9))
	alphabet := []string{"a", "b", "c", "d", "é"}
	for i := 0; i < 2000; i++ {
		var b strings.Builder
		for b.Len() < 2+rng.IntN(smallWord-2) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		w := b.String()
		if len(w) > smallWord {
			w = w[:smallWord]
		}
		scan, heap := s.model.merge(w, nil), s.model.mergeHeap(w, nil)
		if !slices.Equal(scan, heap) {
			t.Fatalf("%q: scan %v, heap %v", w, scan, heap)
		}
	}
}

func FuzzNFC(f *testing.F) {
	for _, s := range []string{"e\u0301", "\u1100\u1161\u11a8", "Å\u0327\u0301x", "नमस्ते", "\u0344", "ﬁ\uf900"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		if got, want := nfc(s), norm.NFC.String(s); got != want {
			t.Fatalf("nfc(%q) = %q, want %q", s, got, want)
		}
	})
}

// writeModelDir writes a synthetic tokenizer.json and tokenizer_config.json
// into a directory.
func writeModelDir(t *testing.T, config map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	added := []addedToken{{ID: 1000, Content: "<s>", Special: true}, {ID: 1001, Content: "<|turn|>", Special: true}, {ID: 1002, Content: "<|end|>", Special: true}}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), synthTokenizer(t, [][2]string{{"h", "i"}}, added, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	if config != nil {
		data, _ := json.Marshal(config)
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const testTemplate = `{{ bos_token }}{% for m in messages %}<|turn|>{{ m.role }}: {{ m.content | trim }}<|end|>{% endfor %}{% if add_generation_prompt %}<|turn|>assistant: {% endif %}`

func TestLocalChatTemplate(t *testing.T) {
	ctx := context.Background()
	msgs := []Message{TextMessage("system", " be brief "), TextMessage("user", "hi")}
	wantText := "<s><|turn|>system: be brief<|end|><|turn|>user: hi<|end|><|turn|>assistant: "

	dir := writeModelDir(t, map[string]any{"bos_token": map[string]any{"content": "<s>"}, "eos_token": "<|end|>", "chat_template": testTemplate})
	ls, err := LoadLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	text, err := ls.chat.Render(msgs, true)
	if err != nil || text != wantText {
		t.Fatalf("rendered %q, %v; want %q", text, err, wantText)
	}
	ids, err := ls.TokenizeMessages(ctx, msgs)
	if err != nil || !reflect.DeepEqual(ids, tokenize(t, ls, wantText)) || ids[0] != 1000 {
		t.Fatalf("TokenizeMessages %v %v", ids, err)
	}

	// A named-template list; chat_template.jinja beside it wins.
	dir = writeModelDir(t, map[string]any{"bos_token": "<s>", "chat_template": []any{
		map[string]any{"name": "tool_use", "template": "tools"}, map[string]any{"name": "default", "template": testTemplate}}})
	if ls, err = LoadLocal(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	if text, _ := ls.chat.Render(msgs, false); !strings.HasPrefix(text, "<s><|turn|>system") || strings.HasSuffix(text, "assistant: ") {
		t.Errorf("default named template: %q", text)
	}
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("J{{ messages|length }}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ls, err = LoadLocal(dir); err != nil {
		t.Fatal(err)
	}
	if text, _ := ls.chat.Render(msgs, true); text != "J2" {
		t.Errorf("chat_template.jinja: %q", text)
	}

	// Errors: a template that raises, a bad template, a bad config.
	dir = writeModelDir(t, map[string]any{"chat_template": `{{ raise_exception("roles must alternate") }}`})
	if ls, err = LoadLocal(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := ls.TokenizeMessages(ctx, msgs); err == nil || !strings.Contains(err.Error(), "roles must alternate") {
		t.Errorf("raise_exception: %v", err)
	}
	if _, err := LoadLocal(writeModelDir(t, map[string]any{"chat_template": "{% for %}"})); err == nil {
		t.Error("no error for a broken template")
	}
	if _, err := LoadLocal(writeModelDir(t, map[string]any{"chat_template": []any{map[string]any{"name": "x", "template": "y"}}})); err == nil {
		t.Error("no error without a default template")
	}
	noTmpl, err := LoadLocal(writeModelDir(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if noTmpl.HasChatTemplate() {
		t.Error("chat template without a config")
	}
	if _, err := noTmpl.TokenizeMessages(ctx, msgs); err == nil {
		t.Error("TokenizeMessages without a template")
	}
}

// TestSpecLocalUsesModelTemplate: source=local renders chats with the
// file's template unless template= names one; the chat stretches are
// cached, so a growing conversation tokenizes only what is new.
func TestSpecLocalUsesModelTemplate(t *testing.T) {
	ctx := context.Background()
	dir := writeModelDir(t, map[string]any{"bos_token": "<s>", "chat_template": testTemplate})
	long := strings.Repeat("hi there ", 10)
	msgs := []Message{TextMessage("system", long), TextMessage("user", long+"?")}
	cache := NewCache(0)
	set, err := NewSet([]Spec{
		{Model: "own", Source: "local", File: dir},
		{Model: "over", Source: "local", File: dir, Template: "chatml"},
	}, cache, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := LoadLocal(dir)
	own, err := set.For("own").Chat(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	text, _ := ls.chat.Render(msgs, true)
	if want := tokenize(t, ls, text); !slices.Equal(own, want) {
		t.Errorf("own template: %v, want %v", own, want)
	}
	over, err := set.For("over").Chat(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	chatml, _ := LookupTemplate("chatml")
	if want := tokenize(t, ls, chatml.Render(msgs)); !slices.Equal(over, want) {
		t.Errorf("template=chatml: %v, want %v", over, want)
	}

	_, misses, _ := cache.Stats()
	msgs = append(msgs, TextMessage("assistant", long+"!"), TextMessage("user", long+"."))
	if _, err := set.For("own").Chat(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	_, misses2, _ := cache.Stats()
	// One miss for the new conversation, two for the two new messages; the
	// first two messages' stretches are hits.
	if got := misses2 - misses; got != 3 {
		t.Errorf("growing conversation: %d cache misses, want 3", got)
	}

	if _, err := NewSet([]Spec{{Model: "m", Source: "local", File: writeModelDir(t, nil), ExactChat: func() *bool { b := true; return &b }()}}, nil, nil, nil); err == nil {
		t.Error("exact_chat=true accepted for a file without a chat template")
	}
	if _, err := NewSet([]Spec{{Model: "m", Source: "local", File: filepath.Join(dir, "missing.json")}}, nil, nil, nil); err == nil {
		t.Error("missing file accepted")
	}
}

// TestLocalConcurrent uses one LocalSource (with a cache) from several
// goroutines; go test -race checks it shares nothing unsafely.
func TestLocalConcurrent(t *testing.T) {
	dir := writeModelDir(t, map[string]any{"bos_token": "<s>", "chat_template": testTemplate})
	ls, err := LoadLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	ls.cache = NewCache(1 << 10)
	ctx := context.Background()
	msgs := []Message{TextMessage("user", strings.Repeat("hi there, how are you? ", 5))}
	want, _ := ls.TokenizeMessages(ctx, msgs)
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func() {
			for i := 0; i < 50; i++ {
				got, err := ls.TokenizeMessages(ctx, msgs)
				if err == nil && !slices.Equal(got, want) {
					err = errors.New("concurrent TokenizeMessages gave other ids")
				}
				if err == nil {
					_, err = ls.Tokenize(ctx, "hi <|turn|> there")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < 4; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestByteLevelUseRegexDefault: a ByteLevel pre-tokenizer without a
// use_regex key splits as GPT-2 does, as Hugging Face's tokenizers
// defaults the key to true; false turns the split off (it was read as
// false when absent: GPT-2-era files lost their word split).
func TestByteLevelUseRegexDefault(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want []string
	}{
		{`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true}`, []string{"a", "\n\n", " b"}},
		{`{"type":"ByteLevel","add_prefix_space":false,"use_regex":true}`, []string{"a", "\n\n", " b"}},
		{`{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}`, []string{"a\n\n b"}},
	} {
		var byteLevel bool
		pl, err := parsePreTokenizer(json.RawMessage(c.raw), &byteLevel)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		pl.run("a\n\n b", func(p string) { got = append(got, p) })
		if !byteLevel || !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.raw, got, c.want)
		}
	}
}

// TestSentencePieceRefusedClearly: a SentencePiece-style tokenizer
// (Llama 2, Gemma: the Replace and Prepend normalizers) is refused saying
// what it is and what to use instead (the message named only the
// normalizer).
func TestSentencePieceRefusedClearly(t *testing.T) {
	for _, raw := range []string{
		`{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]}`,
		`{"type":"Replace","pattern":{"String":" "},"content":"▁"}`,
	} {
		_, err := parseNormalizer(json.RawMessage(raw))
		if err == nil || !strings.Contains(err.Error(), "SentencePiece") || !strings.Contains(err.Error(), "source=engine") {
			t.Errorf("%s: %v", raw, err)
		}
	}
}
