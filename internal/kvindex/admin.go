package kvindex

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"unicode"

	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/tokens"
)

// Tokenizers gives the tokenizer of a model; *tokens.Set implements it.
type Tokenizers interface {
	For(model string) *tokens.Tokenizer
}

// EndpointEvents is one endpoint's event-stream counters, shown beside its
// index counts by the admin stats.
type EndpointEvents struct {
	Endpoint string
	Model    string
	Stats    any
}

// Admin serves the index's admin API:
//
//	POST /admin/kv/lookup  {"model":"m","token_ids":[...]} | {"model":"m","prompt":"..."} |
//	                       {"model":"m","messages":[...]}, optional "lora":"name"
//	   → {"block_size":16,"prompt_tokens":n,"prompt_blocks":b,
//	      "endpoints":[{"endpoint":"127.0.0.1:8001","matched_tokens":4096,"tier":"gpu",...}]}
//	POST /admin/kv/routed  the same request plus "endpoint":"host:port": record an
//	                       approximate entry (what a router would do after routing)
//	GET  /admin/kv/stats   per-endpoint block counts and event-stream counters
//	GET  /health           200 while the process serves (a liveness probe)
//
// Errors are OpenAI-style error bodies (package openai) with a 4xx or 5xx
// status. Bodies are capped (413 beyond) and large ones processed a few at
// a time (Bodies); /admin/kv/routed registers a new endpoint only while
// fewer than MaxRoutedEndpoints are registered.
type Admin struct {
	Index  *Index
	Tokens Tokenizers              // nil: only token_ids requests
	Events func() []EndpointEvents // nil: no event counters
	Extra  func() map[string]any   // optional additions to stats
	// Bodies reads request bodies; nil means httpserve's defaults with a
	// cap of DefaultMaxBodyBytes.
	Bodies *httpserve.BodyLimiter
	// MaxRoutedEndpoints: /admin/kv/routed for an endpoint not yet
	// registered is refused (403) once this many endpoints are registered;
	// 0 means DefaultMaxRoutedEndpoints.
	MaxRoutedEndpoints int
	// Adapter gives the base model of a LoRA adapter named as a
	// request's model (ok false: not an adapter); nil: no adapters.
	Adapter func(name string) (base string, ok bool)
}

// Defaults of the admin API's limits.
const (
	// DefaultMaxBodyBytes caps lookup and routed bodies: a 1 M-token
	// prompt as token ids is about 7 MiB.
	DefaultMaxBodyBytes = 16 << 20
	// DefaultMaxRoutedEndpoints bounds the endpoints /admin/kv/routed may
	// make the index register (each new model costs about 20 KB).
	DefaultMaxRoutedEndpoints = 1024
	// maxNameBytes bounds endpoint and model names from the wire.
	maxNameBytes = 1024
)

// Validate checks the admin API's settings, naming their flags.
func (a *Admin) Validate() error {
	if a.MaxRoutedEndpoints < 0 || a.MaxRoutedEndpoints > MaxEndpoints {
		return fmt.Errorf("--max-routed-endpoints must be in [0, %d] (0: default %d), got %d", MaxEndpoints, DefaultMaxRoutedEndpoints, a.MaxRoutedEndpoints)
	}
	return nil
}

// Handler returns the admin API's handler.
func (a *Admin) Handler() http.Handler {
	if a.Bodies == nil {
		a.Bodies = httpserve.Config{}.BodyLimiter(DefaultMaxBodyBytes)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/admin/kv/lookup", a.lookup)
	mux.HandleFunc("/admin/kv/routed", a.routed)
	mux.HandleFunc("/admin/kv/stats", a.stats)
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		// Not "GET /health": the catch-all below took every other method
		// of it as a 404.
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			openai.WriteError(w, methodNotAllowed(w, "GET, HEAD"))
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openai.WriteError(w, openai.NotFound("the KV index serves POST /admin/kv/lookup, POST /admin/kv/routed, GET /admin/kv/stats and GET /health; not %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// adapterOf is Adapter's answer for name (false without adapters).
func (a *Admin) adapterOf(name string) (string, bool) {
	if a.Adapter == nil {
		return "", false
	}
	return a.Adapter(name)
}

// methodNotAllowed answers a request of another method than allow's.
func methodNotAllowed(w http.ResponseWriter, allow string) error {
	w.Header().Set("Allow", allow)
	return openai.Errorf(http.StatusMethodNotAllowed, "use %s", allow)
}

type lookupRequest struct {
	Model    string     `json:"model"`
	TokenIDs *tokenIDs  `json:"token_ids"`
	Prompt   *onePrompt `json:"prompt"`
	// AddSpecialTokens: the prompt with the tokenizer's special tokens
	// (absent: true, as an engine tokenizes a completion's prompt). Read
	// as vLLM reads a boolean (openai.ParseOptBool).
	AddSpecialTokens json.RawMessage `json:"add_special_tokens"`
	// Messages, Tools and ChatTemplateKwargs are a chat request's, as
	// the gateway tokenizes them: each message the object sent;
	// AddGenerationPrompt and ContinueFinalMessage end its prompt as
	// vLLM's chat flags do.
	Messages             []json.RawMessage `json:"messages"`
	Tools                json.RawMessage   `json:"tools"`
	ChatTemplateKwargs   json.RawMessage   `json:"chat_template_kwargs"`
	AddGenerationPrompt  json.RawMessage   `json:"add_generation_prompt"`
	ContinueFinalMessage json.RawMessage   `json:"continue_final_message"`
	LoRA                 string            `json:"lora"`
	Endpoint             string            `json:"endpoint"` // routed only
}

// onePrompt is a lookup's text prompt: a string, or a list of one string
// as vLLM's completions take a batch of prompts (a lookup reads one).
type onePrompt string

func (p *onePrompt) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*p = onePrompt(s)
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err == nil {
		if len(list) != 1 {
			return openai.BadRequest("prompt: a lookup reads one prompt, got a list of %d", len(list)).WithParam("prompt")
		}
		*p = onePrompt(list[0])
		return nil
	}
	return &json.UnmarshalTypeError{Value: jsonKindOf(b), Type: reflect.TypeOf("")} // json names the field
}

// jsonKindOf names the JSON value b starts with, as encoding/json's type
// errors do.
func jsonKindOf(b []byte) string {
	switch t := bytes.TrimLeft(b, " \t\r\n"); {
	case len(t) == 0:
		return "value"
	case t[0] == '"':
		return "string"
	case t[0] == '[':
		return "array"
	case t[0] == '{':
		return "object"
	case t[0] == 't' || t[0] == 'f':
		return "bool"
	case t[0] == 'n':
		return "null"
	}
	return "number"
}

// specialTokens reports whether a prompt is tokenized with the
// tokenizer's special tokens (add_special_tokens, default true).
func (req *lookupRequest) specialTokens() (bool, error) {
	b, err := openai.ParseOptBool("add_special_tokens", req.AddSpecialTokens)
	return b == nil || *b, err
}

// chatMode is how the conversation's prompt ends, from vLLM's flags
// add_generation_prompt and continue_final_message.
func (req *lookupRequest) chatMode() (tokens.ChatMode, error) {
	gen, err := openai.ParseOptBool("add_generation_prompt", req.AddGenerationPrompt)
	if err != nil {
		return 0, err
	}
	cont, err := openai.ParseOptBool("continue_final_message", req.ContinueFinalMessage)
	switch {
	case err != nil:
		return 0, err
	case cont != nil && *cont && gen != nil && *gen:
		return 0, openai.BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.").WithParam("continue_final_message")
	case cont != nil && *cont:
		return tokens.ChatContinue, nil
	case gen != nil && !*gen:
		return tokens.ChatNoPrompt, nil
	}
	return tokens.ChatGenerate, nil
}

// chat is the request's conversation as the gateway gives it to its
// tokenizer: every message with its object, how it ends, the tools and
// kwargs.
func (req *lookupRequest) chat() ([]tokens.Message, tokens.ChatOptions, error) {
	msgs := make([]tokens.Message, len(req.Messages))
	for i, raw := range req.Messages {
		var m tokens.Message
		if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &m) != nil {
			return nil, tokens.ChatOptions{}, openai.BadRequest("messages[%d] must be a message object", i).WithParam("messages")
		}
		msgs[i] = tokens.ObjectMessage(m.Role, m.Text(), raw)
	}
	mode, err := req.chatMode()
	if err != nil {
		return nil, tokens.ChatOptions{}, err
	}
	opts := tokens.ChatOptions{Mode: mode}
	if t := req.Tools; len(t) > 0 && string(t) != "null" && string(t) != "[]" {
		if t[0] != '[' {
			return nil, opts, openai.BadRequest("tools must be a list of tools").WithParam("tools")
		}
		opts.Tools = t
	}
	if k := req.ChatTemplateKwargs; len(k) > 0 && string(k) != "null" {
		if k[0] != '{' {
			return nil, opts, openai.BadRequest("chat_template_kwargs must be an object").WithParam("chat_template_kwargs")
		}
		opts.Kwargs = k
	}
	return msgs, opts, nil
}

// tokenIDs decodes a list of token ids straight into uint32s.
type tokenIDs []uint32

func (t *tokenIDs) UnmarshalJSON(b []byte) error {
	ids, err := openai.ParseTokenIDs(b, "token_ids")
	*t = ids
	return err
}

// LookupEndpoint is one endpoint in a lookup response.
type LookupEndpoint struct {
	Endpoint      string `json:"endpoint"`
	MatchedTokens int    `json:"matched_tokens"`
	MatchedBlocks int    `json:"matched_blocks"`
	GPUTokens     int    `json:"gpu_tokens"`
	Tier          string `json:"tier"`
	Approx        bool   `json:"approx,omitempty"`
}

// LookupResponse is the lookup response.
type LookupResponse struct {
	BlockSize    int              `json:"block_size"`
	PromptTokens int              `json:"prompt_tokens"`
	PromptBlocks int              `json:"prompt_blocks"`
	Endpoints    []LookupEndpoint `json:"endpoints"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// keysOf parses a lookup/routed request and computes its block keys. The
// caller calls release when done with the keys (a large body's slot).
func (a *Admin) keysOf(w http.ResponseWriter, r *http.Request) (req lookupRequest, n int, keys []tokens.BlockKey, release func(), err error) {
	release = func() {}
	if r.Method != http.MethodPost {
		return req, 0, nil, release, methodNotAllowed(w, http.MethodPost)
	}
	body, release, err := a.Bodies.Read(w, r)
	if err != nil {
		return req, 0, nil, release, err
	}
	if err := openai.DecodeObject(body, &req); err != nil {
		return req, 0, nil, release, err
	}
	switch {
	case req.Model == "":
		return req, 0, nil, release, openai.BadRequest(`"model" is required`).WithParam("model")
	case len(req.Model) > maxNameBytes || len(req.Endpoint) > maxNameBytes || len(req.LoRA) > maxNameBytes:
		return req, 0, nil, release, openai.BadRequest("model, lora and endpoint names are limited to %d bytes", maxNameBytes)
	}
	if req.LoRA == "" && a.Adapter != nil && len(a.Index.Endpoints(req.Model)) == 0 {
		// A LoRA adapter named as the model, as vLLM's clients name it:
		// its base model's blocks keyed with the adapter.
		if base, ok := a.Adapter(req.Model); ok {
			req.Model, req.LoRA = base, req.Model
		}
	}
	given := 0
	for _, ok := range []bool{req.TokenIDs != nil, req.Prompt != nil, req.Messages != nil} {
		if ok {
			given++
		}
	}
	if given != 1 {
		return req, 0, nil, release, openai.BadRequest(`give exactly one of "token_ids", "prompt" or "messages"`)
	}
	var ids []uint32
	switch {
	case req.TokenIDs != nil:
		ids = *req.TokenIDs
	case a.Tokens == nil:
		return req, 0, nil, release, openai.BadRequest(`no tokenizer configured: send "token_ids"`)
	default:
		tk := a.Tokens.For(req.Model)
		if req.Prompt != nil {
			special, serr := req.specialTokens()
			if serr != nil {
				return req, 0, nil, release, serr
			}
			ids, err = tk.PromptAs(r.Context(), string(*req.Prompt), special)
		} else {
			msgs, opts, cerr := req.chat()
			if cerr != nil {
				return req, 0, nil, release, cerr
			}
			ids, err = tk.ChatAs(r.Context(), msgs, opts)
		}
		if err != nil {
			if se, ok := tokens.PromptRefused(err); ok {
				return req, 0, nil, release, openai.EngineError(http.StatusBadRequest, "tokenize: ", []byte(se.Body))
			}
			if e := openai.AsError(err); e.Status == http.StatusGatewayTimeout {
				return req, 0, nil, release, openai.Errorf(http.StatusGatewayTimeout, "tokenize: %v", err)
			}
			return req, 0, nil, release, openai.Errorf(http.StatusBadGateway, "tokenize: %v", err) // the tokenizer backend failed
		}
	}
	h := tokens.NewHasher(a.Index.BlockSize())
	return req, len(ids), h.Keys(ids, tokens.LoRAExtra(req.LoRA)), release, nil
}

func (a *Admin) lookup(w http.ResponseWriter, r *http.Request) {
	req, n, keys, release, err := a.keysOf(w, r)
	defer release()
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	if len(a.Index.Endpoints(req.Model)) == 0 {
		if base, ok := a.adapterOf(req.Model); ok {
			// An adapter named as the model beside a "lora" of its own.
			openai.WriteError(w, openai.NotFound("%q is a LoRA adapter of model %q: give it as the model alone, or \"model\": %q with \"lora\": %q", req.Model, base, base, req.Model).WithParam("model"))
			return
		}
		openai.WriteError(w, openai.NotFound("no endpoint serves model %q", req.Model).WithParam("model"))
		return
	}
	ms := a.Index.Lookup(req.Model, keys, nil)
	resp := LookupResponse{BlockSize: a.Index.BlockSize(), PromptTokens: n, PromptBlocks: len(keys),
		Endpoints: make([]LookupEndpoint, 0, len(ms))}
	for _, m := range ms {
		name, _, _ := a.Index.Endpoint(m.Endpoint)
		resp.Endpoints = append(resp.Endpoints, LookupEndpoint{
			Endpoint: name, MatchedTokens: m.Tokens, MatchedBlocks: m.Blocks,
			GPUTokens: m.GPUBlocks * a.Index.BlockSize(), Tier: m.Tier.String(), Approx: m.Approx,
		})
	}
	sort.SliceStable(resp.Endpoints, func(i, j int) bool {
		return resp.Endpoints[i].MatchedTokens > resp.Endpoints[j].MatchedTokens
	})
	writeJSON(w, http.StatusOK, resp)
}

func (a *Admin) routed(w http.ResponseWriter, r *http.Request) {
	req, _, keys, release, err := a.keysOf(w, r)
	defer release()
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	if req.Endpoint == "" {
		openai.WriteError(w, openai.BadRequest(`"endpoint" is required`).WithParam("endpoint"))
		return
	}
	if strings.IndexFunc(req.Endpoint, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		openai.WriteError(w, openai.BadRequest(`"endpoint" must be an endpoint's name (HOST:PORT), without spaces or control characters`).WithParam("endpoint"))
		return
	}
	if len(keys) == 0 {
		// A prompt shorter than a block: nothing to record, and no
		// endpoint registered for it (a registration is for good).
		writeJSON(w, http.StatusOK, map[string]any{"endpoint": req.Endpoint, "blocks": 0})
		return
	}
	limit := a.MaxRoutedEndpoints
	if limit == 0 {
		limit = DefaultMaxRoutedEndpoints
	}
	id, err := a.Index.AddEndpointLimited(req.Endpoint, req.Model, limit)
	if err != nil {
		e := openai.Errorf(http.StatusForbidden, "cannot register endpoint %q for model %q: %v (--max-routed-endpoints)", req.Endpoint, req.Model, err)
		e.Type = "LimitExceededError"
		openai.WriteError(w, e.WithParam("endpoint"))
		return
	}
	a.Index.Routed(id, keys)
	writeJSON(w, http.StatusOK, map[string]any{"endpoint": req.Endpoint, "blocks": len(keys)})
}

// StatsEndpoint is one endpoint in the stats response.
type StatsEndpoint struct {
	EndpointStats
	Events any `json:"events,omitempty"`
}

func (a *Admin) stats(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		openai.WriteError(w, methodNotAllowed(w, http.MethodGet))
		return
	}
	ev := map[string]any{}
	if a.Events != nil {
		for _, e := range a.Events() {
			ev[e.Endpoint+"\x00"+e.Model] = e.Stats
		}
	}
	eps := []StatsEndpoint{} // [] rather than null without endpoints
	for _, s := range a.Index.Stats() {
		eps = append(eps, StatsEndpoint{EndpointStats: s, Events: ev[s.Endpoint+"\x00"+s.Model]})
	}
	out := map[string]any{"block_size": a.Index.BlockSize(), "endpoints": eps, "index": a.Index.Mem()}
	if a.Extra != nil {
		for k, v := range a.Extra() {
			out[k] = v
		}
	}
	writeJSON(w, http.StatusOK, out)
}
