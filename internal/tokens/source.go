package tokens

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Source turns text into token ids for one model. Implementations are safe
// for concurrent use.
type Source interface {
	Tokenize(ctx context.Context, text string) ([]uint32, error)
}

// PromptSource is a Source that tokenizes a prompt with or without the
// tokenizer's special tokens (a BOS token), as vLLM's add_special_tokens
// asks: true by default for a completion's prompt, as an engine adds
// them (vLLM's completions and /tokenize, SGLang's /generate).
type PromptSource interface {
	Source
	TokenizePrompt(ctx context.Context, text string, special bool) ([]uint32, error)
}

// MessagesSource is a Source that can also apply the engine's own chat
// template to a conversation (vLLM's /tokenize with "messages").
type MessagesSource interface {
	Source
	TokenizeMessages(ctx context.Context, msgs []Message) ([]uint32, error)
	// TokenizeChat is TokenizeMessages with the prompt ending as opts
	// says, rendered with its tools and template kwargs
	// (TokenizeMessages is the zero ChatOptions).
	TokenizeChat(ctx context.Context, msgs []Message, opts ChatOptions) ([]uint32, error)
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
	BaseURL string // e.g. http://127.0.0.1:8001; "": Others' only
	Model   string
	Client  *http.Client // default http.DefaultClient
	// Others, when set, names the other engines serving Model that may
	// answer now (EngineFallback); they are asked when BaseURL cannot
	// answer (unreachable, or a 5xx), and first when it is known out.
	Others EngineFallback
}

// EngineFallback returns, for a model, the base URLs of the engines
// serving it that may answer /tokenize now other than configured, and
// whether configured is one of the fleet's engines known to be out. Any
// engine of a model renders and tokenizes as the others do, so one dead
// engine does not take its model's tokenizer with it.
type EngineFallback func(model, configured string) (others []string, configuredOut bool)

// maxTokenizeTries bounds the engines one tokenization asks.
const maxTokenizeTries = 3

type tokenizeRequest struct {
	Model               string          `json:"model"`
	Prompt              *string         `json:"prompt,omitempty"`
	Messages            []Message       `json:"messages,omitempty"`
	AddSpecialTokens    *bool           `json:"add_special_tokens,omitempty"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinal       bool            `json:"continue_final_message,omitempty"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	Kwargs              json.RawMessage `json:"chat_template_kwargs,omitempty"`
}

type tokenizeResponse struct {
	Tokens      *[]int64 `json:"tokens"` // nil: not a /tokenize answer
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
}

// Tokenize implements Source: the text without special tokens
// (TokenizePrompt chooses).
func (s *EngineSource) Tokenize(ctx context.Context, text string) ([]uint32, error) {
	return s.TokenizePrompt(ctx, text, false)
}

// TokenizePrompt implements PromptSource.
func (s *EngineSource) TokenizePrompt(ctx context.Context, text string, special bool) ([]uint32, error) {
	return s.post(ctx, tokenizeRequest{Model: s.Model, Prompt: &text, AddSpecialTokens: &special})
}

// StatusError is a /tokenize answer other than 200.
type StatusError struct {
	URL  string
	Code int
	Body string // its first maxErrorBody bytes
}

// maxErrorBody bounds the part of a /tokenize error answer kept: enough
// for vLLM's error object with its message (a context-length refusal
// names both lengths), which a refusal of the prompt relays.
const maxErrorBody = 4 << 10

func (e *StatusError) Error() string {
	return fmt.Sprintf("tokens: tokenize at %s: status %d: %.200s", e.URL, e.Code, e.Body)
}

// PromptRefused returns the engine's answer when err is its 400 to a
// /tokenize: the engine refused the prompt itself, as vLLM versions whose
// /tokenize checks max_model_len refuse one longer than it (with the
// message and param its completions API would give). A gateway tells the
// client so, as the engine would, rather than call it its own failure.
func PromptRefused(err error) (*StatusError, bool) {
	var se *StatusError
	if errors.As(err, &se) && se.Code == http.StatusBadRequest {
		return se, true
	}
	return nil, false
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
	return s.TokenizeChat(ctx, msgs, ChatOptions{})
}

// TokenizeChat implements MessagesSource: vLLM's /tokenize takes
// add_generation_prompt, continue_final_message, tools and
// chat_template_kwargs as its chat API does.
func (s *EngineSource) TokenizeChat(ctx context.Context, msgs []Message, opts ChatOptions) ([]uint32, error) {
	gen := opts.Mode == ChatGenerate
	return s.post(ctx, tokenizeRequest{Model: s.Model, Messages: msgs, AddGenerationPrompt: &gen, ContinueFinal: opts.Mode == ChatContinue,
		Tools: opts.Tools, Kwargs: opts.Kwargs})
}

func (s *EngineSource) post(ctx context.Context, req tokenizeRequest) ([]uint32, error) {
	// The tools and message objects go as the client sent them: without
	// HTML escaping (which json.Marshal adds to raw values), so that an
	// engine that renders their bytes renders what its own API got.
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(req); err != nil {
		return nil, fmt.Errorf("tokens: encode tokenize request: %w", err)
	}
	var first error
	engines := s.engines()
	tries := min(len(engines), maxTokenizeTries)
	for i, base := range engines[:tries] {
		tctx, cancel := tryContext(ctx, tries-i)
		ids, err := s.postTo(tctx, base, body.Bytes())
		cancel()
		if err == nil || i+1 == tries || !unanswered(ctx, err) {
			if err != nil && first != nil {
				err = fmt.Errorf("%w (and before it: %v)", err, first)
			}
			return ids, err
		}
		if first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	return nil, fmt.Errorf("tokens: no engine serving model %q can tokenize now", s.Model)
}

// tryContext bounds one of the left tries of a tokenization by its share
// of ctx's deadline (the time left over the tries left): an engine that
// hangs (a frozen API server) leaves the others time to answer, where it
// took the whole deadline (10 s in the gateway) and the request failed
// with the model's other engines healthy.
func tryContext(ctx context.Context, left int) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok || left <= 1 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, time.Until(deadline)/time.Duration(left))
}

// engines lists the base URLs to ask, in order: the configured one, then
// the others (the others first when the configured one is known out).
func (s *EngineSource) engines() []string {
	var out []string
	if s.BaseURL != "" {
		out = append(out, s.BaseURL)
	}
	if s.Others == nil {
		return out
	}
	others, out0 := s.Others(s.Model, s.BaseURL)
	if out0 {
		return append(others, out...)
	}
	return append(out, others...)
}

// unanswered reports whether err is an engine's failure to answer (it is
// unreachable, failed with a 5xx, or did not answer within its try's
// share of the deadline) that another engine may not share;
// not a refusal of the request's form, nor the caller's deadline.
func unanswered(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code >= 500
	}
	return true
}

// postTo asks one engine's /tokenize.
func (s *EngineSource) postTo(ctx context.Context, base string, body []byte) ([]uint32, error) {
	url := strings.TrimRight(base, "/") + "/tokenize"
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
		return nil, &StatusError{URL: url, Code: resp.StatusCode, Body: string(data[:min(len(data), maxErrorBody)])}
	}
	var out tokenizeResponse
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("tokens: decode tokenize response from %s: %w", url, err)
	}
	if out.Tokens == nil {
		return nil, fmt.Errorf("tokens: %s answered without tokens: %.200s", url, data)
	}
	ids := make([]uint32, len(*out.Tokens))
	for i, t := range *out.Tokens {
		if t < 0 || t > 0xffffffff {
			return nil, fmt.Errorf("tokens: token id %d out of range", t)
		}
		ids[i] = uint32(t)
	}
	return ids, nil
}
