package tokens

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Source turns text into token ids for one model. Implementations are safe
// for concurrent use.
type Source interface {
	Tokenize(ctx context.Context, text string) ([]uint32, error)
}

// MessagesSource is a Source that can also apply the engine's own chat
// template to a conversation (vLLM's /tokenize with "messages").
type MessagesSource interface {
	Source
	TokenizeMessages(ctx context.Context, msgs []Message) ([]uint32, error)
}

// EstimateSource is the fallback when no tokenizer is configured: one
// pseudo-token per BytesPerToken bytes of text, its id a hash of those
// bytes. Equal text prefixes give equal pseudo-token prefixes, so prefix
// matching works; the ids mean nothing to an engine.
type EstimateSource struct {
	BytesPerToken int // default 4
}

// Tokenize implements Source.
func (s EstimateSource) Tokenize(_ context.Context, text string) ([]uint32, error) {
	return s.tokens(text), nil
}

func (s EstimateSource) tokens(text string) []uint32 {
	n := s.BytesPerToken
	if n <= 0 {
		n = 4
	}
	out := make([]uint32, 0, (len(text)+n-1)/n)
	for i := 0; i < len(text); i += n {
		out = append(out, uint32(xxhash.Sum64String(text[i:min(i+n, len(text))])))
	}
	return out
}

// EngineSource asks an engine's POST /tokenize (vLLM's API).
type EngineSource struct {
	BaseURL string // e.g. http://127.0.0.1:8001
	Model   string
	Client  *http.Client // default http.DefaultClient
	// AddSpecialTokens is sent as add_special_tokens for prompts; chat
	// segments are always tokenized without special tokens.
	AddSpecialTokens bool
}

type tokenizeRequest struct {
	Model               string    `json:"model"`
	Prompt              *string   `json:"prompt,omitempty"`
	Messages            []Message `json:"messages,omitempty"`
	AddSpecialTokens    *bool     `json:"add_special_tokens,omitempty"`
	AddGenerationPrompt *bool     `json:"add_generation_prompt,omitempty"`
}

type tokenizeResponse struct {
	Tokens      []int64 `json:"tokens"`
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
}

// Tokenize implements Source.
func (s *EngineSource) Tokenize(ctx context.Context, text string) ([]uint32, error) {
	add := s.AddSpecialTokens
	return s.post(ctx, tokenizeRequest{Model: s.Model, Prompt: &text, AddSpecialTokens: &add})
}

// tokenizeSegment tokenizes a rendered chat segment (no special tokens
// added: the template already wrote them).
func (s *EngineSource) tokenizeSegment(ctx context.Context, text string) ([]uint32, error) {
	no := false
	return s.post(ctx, tokenizeRequest{Model: s.Model, Prompt: &text, AddSpecialTokens: &no})
}

// StatusError is a /tokenize answer other than 200.
type StatusError struct {
	URL  string
	Code int
	Body string // its first 200 bytes
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("tokens: tokenize at %s: status %d: %s", e.URL, e.Code, e.Body)
}

// refused reports whether the engine refused the request's form (rather
// than failing): 400, 404, 405, 415, 422.
func (e *StatusError) refused() bool {
	switch e.Code {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed,
		http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// TokenizeMessages implements MessagesSource: the engine renders the
// conversation with its own chat template.
func (s *EngineSource) TokenizeMessages(ctx context.Context, msgs []Message) ([]uint32, error) {
	yes := true
	return s.post(ctx, tokenizeRequest{Model: s.Model, Messages: msgs, AddGenerationPrompt: &yes})
}

func (s *EngineSource) post(ctx context.Context, req tokenizeRequest) ([]uint32, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("tokens: encode tokenize request: %w", err)
	}
	url := strings.TrimRight(s.BaseURL, "/") + "/tokenize"
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	c := s.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("tokens: tokenize at %s: %w", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("tokens: read tokenize response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &StatusError{URL: url, Code: resp.StatusCode, Body: string(data[:min(len(data), 200)])}
	}
	var out tokenizeResponse
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("tokens: decode tokenize response: %w", err)
	}
	ids := make([]uint32, len(out.Tokens))
	for i, t := range out.Tokens {
		if t < 0 || t > 0xffffffff {
			return nil, fmt.Errorf("tokens: token id %d out of range", t)
		}
		ids[i] = uint32(t)
	}
	return ids, nil
}

// LocalSource is kvgate's local tokenizer: greedy longest match against a
// vocabulary, with byte fallback. It loads either
//
//   - a Hugging Face tokenizer.json: model.vocab (token → id) and
//     added_tokens are used; for byte-level vocabularies (GPT-2, Llama 3,
//     Qwen: tokens spelled with "Ġ" for space) the text is first mapped
//     through the byte-level alphabet; or
//   - a plain vocabulary file: one token per line, the line number (from
//     0) is its id; "\n", "\t", "\\" and "\s" (space) escapes are allowed.
//
// It applies no BPE merges, so its ids approximate a real tokenizer's (most
// words come out identical; rare ones split differently). For ids that
// must equal the engine's, use EngineSource. Bytes not covered by the
// vocabulary map to "<0xNN>" tokens when the vocabulary has them, else to
// id len(vocab)+byte.
type LocalSource struct {
	vocab     map[string]uint32
	maxLen    int
	byteLevel bool
	byteIDs   [256]uint32
}

// LoadLocal reads a tokenizer file (see LocalSource).
func LoadLocal(path string) (*LocalSource, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	return ParseLocal(data)
}

// ParseLocal parses tokenizer file contents (see LocalSource).
func ParseLocal(data []byte) (*LocalSource, error) {
	s := &LocalSource{vocab: map[string]uint32{}}
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		var hf struct {
			Model struct {
				Vocab map[string]uint32 `json:"vocab"`
			} `json:"model"`
			AddedTokens []struct {
				ID      uint32 `json:"id"`
				Content string `json:"content"`
			} `json:"added_tokens"`
		}
		if err := json.Unmarshal(data, &hf); err != nil {
			return nil, fmt.Errorf("tokens: parse tokenizer.json: %w", err)
		}
		if len(hf.Model.Vocab) == 0 {
			return nil, errors.New("tokens: tokenizer.json has no model.vocab (only vocabulary-based models are supported)")
		}
		s.vocab = hf.Model.Vocab
		for _, a := range hf.AddedTokens {
			s.vocab[a.Content] = a.ID
		}
		_, g := s.vocab["Ġ"]
		_, gthe := s.vocab["Ġthe"]
		s.byteLevel = g || gthe
	} else {
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		id := uint32(0)
		for sc.Scan() {
			tok := unescapeVocab(strings.TrimRight(sc.Text(), "\r"))
			if tok != "" {
				if _, dup := s.vocab[tok]; !dup {
					s.vocab[tok] = id
				}
			}
			id++
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("tokens: read vocabulary: %w", err)
		}
		if len(s.vocab) == 0 {
			return nil, errors.New("tokens: empty vocabulary")
		}
	}
	maxID := uint32(0)
	for tok, id := range s.vocab {
		if n := len(tok); n > s.maxLen {
			s.maxLen = n
		}
		maxID = max(maxID, id)
	}
	s.maxLen = min(s.maxLen, 64)
	for b := 0; b < 256; b++ {
		if id, ok := s.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			s.byteIDs[b] = id
		} else {
			s.byteIDs[b] = maxID + 1 + uint32(b)
		}
	}
	return s, nil
}

func unescapeVocab(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	r := strings.NewReplacer(`\n`, "\n", `\t`, "\t", `\s`, " ", `\\`, `\`)
	return r.Replace(s)
}

// byteLevelAlphabet is GPT-2's byte → printable rune mapping.
func byteLevelAlphabet() [256]rune {
	var m [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}

// Tokenize implements Source.
func (s *LocalSource) Tokenize(_ context.Context, text string) ([]uint32, error) {
	src := text
	if s.byteLevel {
		alpha := byteLevelAlphabet()
		var b strings.Builder
		b.Grow(len(text) * 2)
		for i := 0; i < len(text); i++ {
			b.WriteRune(alpha[text[i]])
		}
		src = b.String()
	}
	out := make([]uint32, 0, len(src)/4+1)
	for i := 0; i < len(src); {
		n := min(s.maxLen, len(src)-i)
		matched := false
		for ; n > 0; n-- {
			if id, ok := s.vocab[src[i:i+n]]; ok && utf8.ValidString(src[i:i+n]) {
				out = append(out, id)
				i += n
				matched = true
				break
			}
		}
		if matched {
			continue
		}
		if s.byteLevel {
			// One byte-level rune that is not in the vocabulary: fall back
			// on the original byte.
			r, size := utf8.DecodeRuneInString(src[i:])
			b := byte(r)
			if r >= 256 {
				for bb, rr := range byteLevelAlphabet() {
					if rr == r {
						b = byte(bb)
					}
				}
			}
			out = append(out, s.byteIDs[b])
			i += size
			continue
		}
		out = append(out, s.byteIDs[src[i]])
		i++
	}
	return out, nil
}
