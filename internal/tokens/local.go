package tokens

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/text/unicode/norm"
)

// LocalSource is kvgate's local tokenizer: Hugging Face tokenizers'
// byte-level BPE (GPT-2, Llama 3, Qwen 2/2.5/3, DeepSeek V3 and others),
// loaded from the model's tokenizer.json and giving the same ids as the
// engine's tokenizer. A text goes through the same steps as in tokenizers:
//
//  1. added tokens (special tokens such as <|im_start|>) are cut out of the
//     raw text, leftmost-longest, and become their ids;
//  2. the rest is normalized (NFC, NFKC, ... if the file says so), and
//     added tokens marked "normalized" are cut out of that;
//  3. the pre-tokenizer splits it into words: Split patterns (Llama 3's and
//     Qwen's run on a hand-written scanner; others on Go's regexp, with the
//     \s+(?!\S) lookahead Go lacks resolved by hand) and ByteLevel;
//  4. each word's bytes are merged by BPE, lowest merge rank first.
//
// Files it cannot reproduce exactly (another model type, an unsupported
// normalizer or pre-tokenizer step) are refused when loading.
//
// With the model's tokenizer_config.json (or chat_template.jinja) beside
// the file, TokenizeMessages renders conversations with the model's own
// chat template. Safe for concurrent use.
type LocalSource struct {
	added     *addedMatcher // added tokens matched in the raw text
	addedNorm *addedMatcher // "normalized" added tokens, matched after normalizing
	normalize func(string) string
	pre       pipeline
	model     *bpeModel
	// prefix and suffix are the post-processor's ids around a single text.
	prefix, suffix []uint32

	chat *ChatTemplate // nil: no chat template was found
	// cache, when set, holds the ids of rendered chat stretches between
	// added tokens under keys salted with ns (a hash of the files).
	cache *Cache
	ns    uint64
}

// LoadLocal loads a tokenizer from path: a tokenizer.json, or a directory
// holding one. A tokenizer_config.json in the same directory gives the chat
// template and its special tokens; a chat_template.jinja there takes
// precedence over the config's template (as in transformers).
func LoadLocal(path string) (*LocalSource, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	if st.IsDir() {
		path = filepath.Join(path, "tokenizer.json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	s, err := ParseLocal(data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	dir := filepath.Dir(path)
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	jinja, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	if err := s.loadChatTemplate(cfg, string(jinja)); err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, dir)
	}
	return s, nil
}

// tokenizerFile is the part of tokenizer.json LocalSource reads.
type tokenizerFile struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]uint32 `json:"vocab"`
		Merges                  []mergeEntry      `json:"merges"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		Dropout                 *float64          `json:"dropout"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	} `json:"model"`
}

// mergeEntry is one of model.merges: "left right" or [left, right].
type mergeEntry struct {
	str  *string
	pair []string
}

func (m *mergeEntry) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		m.str = &s
		return nil
	}
	return json.Unmarshal(b, &m.pair)
}

// ParseLocal parses a tokenizer.json (see LocalSource). It has no chat
// template; LoadLocal adds the one beside the file.
func ParseLocal(data []byte) (*LocalSource, error) {
	var f tokenizerFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokens: parse tokenizer.json: %w", err)
	}
	mo := &f.Model
	if mo.Type != "BPE" && !(mo.Type == "" && len(mo.Merges) > 0) {
		return nil, fmt.Errorf("tokens: tokenizer.json model type %q: only byte-level BPE is supported", mo.Type)
	}
	if len(mo.Vocab) == 0 {
		return nil, errors.New("tokens: tokenizer.json has an empty model.vocab")
	}
	if mo.Dropout != nil && *mo.Dropout != 0 {
		return nil, errors.New("tokens: BPE dropout makes tokenization random; not supported")
	}
	if (mo.ContinuingSubwordPrefix != nil && *mo.ContinuingSubwordPrefix != "") || (mo.EndOfWordSuffix != nil && *mo.EndOfWordSuffix != "") {
		return nil, errors.New("tokens: BPE with subword prefixes or word suffixes is not supported")
	}
	s := &LocalSource{ns: xxhash.Sum64(data)}
	var err error
	if s.normalize, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	byteLevel := false
	if s.pre, err = parsePreTokenizer(f.PreTokenizer, &byteLevel); err != nil {
		return nil, err
	}
	if !byteLevel {
		return nil, errors.New("tokens: tokenizer.json has no ByteLevel pre-tokenizer: only byte-level BPE is supported")
	}
	if s.prefix, s.suffix, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	merges, err := parseMerges(mo.Merges)
	if err != nil {
		return nil, err
	}
	if s.model, err = newBPEModel(mo.Vocab, merges, mo.IgnoreMerges); err != nil {
		return nil, err
	}
	var raw, normalized []addedToken
	for _, t := range f.AddedTokens {
		if t.Normalized && s.normalize != nil {
			t.Content = s.normalize(t.Content)
			normalized = append(normalized, t)
		} else {
			raw = append(raw, t)
		}
	}
	s.added, s.addedNorm = newAddedMatcher(raw), newAddedMatcher(normalized)
	return s, nil
}

// component is the common shape of tokenizer.json's pipeline parts.
type component struct {
	Type string `json:"type"`
	// Sequence
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	// Split
	Pattern struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior string `json:"behavior"`
	Invert   bool   `json:"invert"`
	// ByteLevel
	AddPrefixSpace bool `json:"add_prefix_space"`
	// UseRegex is nil when absent: true, as Hugging Face's tokenizers
	// defaults it (serde default_true); files written before the key
	// existed (GPT-2-era tokenizer.json) lack it, and read as false they
	// lost the GPT-2 word split (134 of 468 texts matched the reference).
	UseRegex *bool `json:"use_regex"`
	// TemplateProcessing
	Single []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
}

func parseComponent(raw json.RawMessage) (*component, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("tokens: tokenizer.json: %w", err)
	}
	return &c, nil
}

// parseNormalizer returns the normalizer (nil: none). Only the Unicode
// normal forms are supported: the byte-level BPE families use nothing else.
func parseNormalizer(raw json.RawMessage) (func(string) string, error) {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return nfc, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Sequence":
		var fs []func(string) string
		for _, n := range c.Normalizers {
			f, err := parseNormalizer(n)
			if err != nil {
				return nil, err
			}
			if f != nil {
				fs = append(fs, f)
			}
		}
		switch len(fs) {
		case 0:
			return nil, nil
		case 1:
			return fs[0], nil
		}
		return func(s string) string {
			for _, f := range fs {
				s = f(s)
			}
			return s
		}, nil
	}
	if c.Type == "Replace" || c.Type == "Prepend" {
		// SentencePiece's "▁" for spaces: Llama 2, Gemma, Mistral's
		// first tokenizers and others. The message said only that the
		// normalizer was unknown.
		return nil, fmt.Errorf("tokens: normalizer %q is SentencePiece's space handling (Llama 2, Gemma, Mistral v1 and their kin): source=local reads byte-level BPE tokenizers only; use source=engine for this model", c.Type)
	}
	return nil, fmt.Errorf("tokens: normalizer %q is not supported (NFC, NFD, NFKC, NFKD, Sequence)", c.Type)
}

// parsePreTokenizer flattens the pre-tokenizer into splitters and reports
// whether it holds a ByteLevel step.
func parsePreTokenizer(raw json.RawMessage, byteLevel *bool) (pipeline, error) {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		var pl pipeline
		for _, p := range c.PreTokenizers {
			sub, err := parsePreTokenizer(p, byteLevel)
			if err != nil {
				return nil, err
			}
			pl = append(pl, sub...)
		}
		return pl, nil
	case "ByteLevel":
		*byteLevel = true
		var pl pipeline
		if c.AddPrefixSpace {
			pl = append(pl, prefixSpace{})
		}
		if c.UseRegex == nil || *c.UseRegex {
			sp, err := newRegexSplit(gpt2Pattern)
			if err != nil {
				return nil, err
			}
			pl = append(pl, sp)
		}
		return pl, nil
	case "Split":
		if c.Behavior != "Isolated" || c.Invert {
			return nil, fmt.Errorf("tokens: Split pre-tokenizer with behavior %q invert %v is not supported (Isolated only)", c.Behavior, c.Invert)
		}
		switch {
		case c.Pattern.Regex != nil && *c.Pattern.Regex == llama3Pattern:
			return pipeline{newLlamaSplit(3)}, nil
		case c.Pattern.Regex != nil && *c.Pattern.Regex == qwenPattern:
			return pipeline{newLlamaSplit(1)}, nil
		case c.Pattern.Regex != nil:
			sp, err := newRegexSplit(*c.Pattern.Regex)
			if err != nil {
				return nil, err
			}
			return pipeline{sp}, nil
		case c.Pattern.String != nil && *c.Pattern.String != "":
			sp, err := newRegexSplit(quoteOniguruma(*c.Pattern.String))
			if err != nil {
				return nil, err
			}
			return pipeline{sp}, nil
		}
		return nil, errors.New("tokens: Split pre-tokenizer without a pattern")
	}
	return nil, fmt.Errorf("tokens: pre-tokenizer %q is not supported (Sequence, Split, ByteLevel)", c.Type)
}

// quoteOniguruma escapes a literal string for translateOniguruma.
func quoteOniguruma(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\', '.', '+', '*', '?', '(', ')', '|', '[', ']', '{', '}', '^', '$':
			b = append(b, '\\', c)
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// parsePostProcessor returns the ids a single text gets before and after
// it when special tokens are added.
func parsePostProcessor(raw json.RawMessage) (prefix, suffix []uint32, err error) {
	c, err := parseComponent(raw)
	if err != nil || c == nil {
		return nil, nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil, nil // offsets only
	case "Sequence":
		for _, p := range c.Processors {
			pre, suf, err := parsePostProcessor(p)
			if err != nil {
				return nil, nil, err
			}
			// Each processor wraps what the previous ones produced.
			prefix = append(pre, prefix...)
			suffix = append(suffix, suf...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		seen := false
		for _, it := range c.Single {
			switch {
			case it.Sequence != nil:
				if seen {
					return nil, nil, errors.New("tokens: TemplateProcessing with the sequence twice")
				}
				seen = true
			case it.SpecialToken != nil:
				st, ok := c.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("tokens: TemplateProcessing names unknown special token %q", it.SpecialToken.ID)
				}
				if seen {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			}
		}
		if !seen {
			return nil, nil, errors.New("tokens: TemplateProcessing without the sequence")
		}
		return prefix, suffix, nil
	}
	return nil, nil, fmt.Errorf("tokens: post-processor %q is not supported (ByteLevel, TemplateProcessing, Sequence)", c.Type)
}

// Tokenize implements Source: the text without special tokens
// (TokenizePrompt chooses).
func (s *LocalSource) Tokenize(ctx context.Context, text string) ([]uint32, error) {
	return s.TokenizePrompt(ctx, text, false)
}

// TokenizePrompt implements PromptSource: special adds the
// post-processor's special tokens (a BOS token) around the text; rendered
// chats never get them (the template writes its own).
func (s *LocalSource) TokenizePrompt(_ context.Context, text string, special bool) ([]uint32, error) {
	out := make([]uint32, 0, len(text)/3+len(s.prefix)+len(s.suffix)+1)
	if special {
		out = append(out, s.prefix...)
	}
	out = s.appendText(out, text, false)
	if special {
		out = append(out, s.suffix...)
	}
	return out, nil
}

// appendText appends text's ids. With cached, the ids of long stretches
// between added tokens go through the cache (when one is set).
func (s *LocalSource) appendText(out []uint32, text string, cached bool) []uint32 {
	s.added.split(text, func(t string) {
		if cached {
			out = s.appendCached(out, t)
		} else {
			out = s.appendSpan(out, t)
		}
	}, func(a addedToken) {
		out = append(out, a.ID)
	})
	return out
}

// appendSpan appends the ids of text holding no raw-matched added token.
func (s *LocalSource) appendSpan(out []uint32, t string) []uint32 {
	if s.normalize != nil {
		t = s.normalize(t)
	}
	words := func(w string) {
		s.pre.run(w, func(word string) { out = s.model.word(word, out) })
	}
	s.addedNorm.split(t, words, func(a addedToken) { out = append(out, a.ID) })
	return out
}

// minCached is the shortest stretch worth a cache lookup.
const minCached = 48

func (s *LocalSource) appendCached(out []uint32, t string) []uint32 {
	if s.cache == nil || len(t) < minCached {
		return s.appendSpan(out, t)
	}
	d := xxhash.New()
	var ns [9]byte
	binary.LittleEndian.PutUint64(ns[:8], s.ns)
	ns[8] = 'l'
	_, _ = d.Write(ns[:])
	_, _ = d.WriteString(t)
	key := d.Sum64()
	if ids, ok := s.cache.get(key); ok {
		return append(out, ids...)
	}
	ids := s.appendSpan(nil, t)
	s.cache.put(key, ids)
	return append(out, ids...)
}

// HasChatTemplate reports whether the tokenizer has its model's chat
// template (TokenizeMessages works).
func (s *LocalSource) HasChatTemplate() bool { return s.chat != nil }

// TokenizeMessages implements MessagesSource: the conversation is rendered
// with the model's chat template (with the generation prompt, as vLLM's
// chat endpoints do) and tokenized without adding special tokens. Stretches
// between added tokens (about one per message) are cached when the source
// has a cache, so a growing conversation tokenizes only its new messages.
func (s *LocalSource) TokenizeMessages(ctx context.Context, msgs []Message) ([]uint32, error) {
	return s.TokenizeChat(ctx, msgs, ChatOptions{})
}

// TokenizeChat implements MessagesSource: the template renders with
// add_generation_prompt for ChatGenerate only, and for ChatContinue the
// text is cut after the final message's, as transformers does.
func (s *LocalSource) TokenizeChat(_ context.Context, msgs []Message, opts ChatOptions) ([]uint32, error) {
	if s.chat == nil {
		return nil, errors.New("tokens: the local tokenizer has no chat template (no tokenizer_config.json or chat_template.jinja beside tokenizer.json)")
	}
	text, err := s.chat.RenderChat(msgs, opts)
	if err != nil {
		return nil, err
	}
	if opts.Mode == ChatContinue && len(msgs) > 0 {
		text = ContinueCut(text, msgs[len(msgs)-1].Text())
	}
	return s.appendText(make([]uint32, 0, len(text)/3+1), text, true), nil
}

// loadLocalSpec loads sp.File for build: the shared cache holds rendered
// chat stretches, and conversations are rendered with the model's own chat
// template when it has one and sp names none (template= overrides it).
func loadLocalSpec(sp Spec, cache *Cache) (*LocalSource, bool, error) {
	ls, err := LoadLocal(sp.File)
	if err != nil {
		return nil, false, err
	}
	ls.cache = cache
	if sp.Template != "" {
		return ls, false, nil
	}
	if ls.chat == nil && sp.ExactChat != nil && *sp.ExactChat {
		return nil, false, fmt.Errorf("tokens: model %q: exact_chat=true, but %s has no chat template beside it", sp.Model, sp.File)
	}
	return ls, ls.chat != nil, nil
}
