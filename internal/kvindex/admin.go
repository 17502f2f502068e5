package kvindex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"

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
//
// Errors are JSON {"error": "..."} with a 4xx status.
type Admin struct {
	Index  *Index
	Tokens Tokenizers              // nil: only token_ids requests
	Events func() []EndpointEvents // nil: no event counters
	Extra  func() map[string]any   // optional additions to stats
}

// Handler returns the admin API's handler.
func (a *Admin) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/admin/kv/lookup", a.lookup)
	mux.HandleFunc("/admin/kv/routed", a.routed)
	mux.HandleFunc("/admin/kv/stats", a.stats)
	return mux
}

type lookupRequest struct {
	Model    string           `json:"model"`
	TokenIDs []int64          `json:"token_ids"`
	Prompt   *string          `json:"prompt"`
	Messages []tokens.Message `json:"messages"`
	LoRA     string           `json:"lora"`
	Endpoint string           `json:"endpoint"` // routed only
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

type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	code := http.StatusBadGateway // the tokenizer backend failed
	var he *httpError
	switch {
	case errors.As(err, &he):
		code = he.code
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		code = http.StatusGatewayTimeout
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// keysOf parses a lookup/routed request and computes its block keys.
func (a *Admin) keysOf(r *http.Request) (lookupRequest, int, []tokens.BlockKey, error) {
	var req lookupRequest
	if r.Method != http.MethodPost {
		return req, 0, nil, &httpError{http.StatusMethodNotAllowed, "use POST"}
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<20))
	if err := dec.Decode(&req); err != nil {
		return req, 0, nil, badRequest("invalid JSON body: %v", err)
	}
	if req.Model == "" {
		return req, 0, nil, badRequest(`"model" is required`)
	}
	given := 0
	if req.TokenIDs != nil {
		given++
	}
	if req.Prompt != nil {
		given++
	}
	if req.Messages != nil {
		given++
	}
	if given != 1 {
		return req, 0, nil, badRequest(`give exactly one of "token_ids", "prompt" or "messages"`)
	}
	var ids []uint32
	switch {
	case req.TokenIDs != nil:
		ids = make([]uint32, len(req.TokenIDs))
		for i, t := range req.TokenIDs {
			if t < 0 || t > 0xffffffff {
				return req, 0, nil, badRequest("token_ids[%d] = %d is out of range", i, t)
			}
			ids[i] = uint32(t)
		}
	default:
		if a.Tokens == nil {
			return req, 0, nil, badRequest(`no tokenizer configured: send "token_ids"`)
		}
		tk := a.Tokens.For(req.Model)
		var err error
		if req.Prompt != nil {
			ids, err = tk.Prompt(r.Context(), *req.Prompt)
		} else {
			ids, err = tk.Chat(r.Context(), req.Messages)
		}
		if err != nil {
			return req, 0, nil, fmt.Errorf("tokenize: %w", err)
		}
	}
	h := tokens.NewHasher(a.Index.BlockSize())
	return req, len(ids), h.Keys(ids, tokens.LoRAExtra(req.LoRA)), nil
}

func (a *Admin) lookup(w http.ResponseWriter, r *http.Request) {
	req, n, keys, err := a.keysOf(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if len(a.Index.Endpoints(req.Model)) == 0 {
		writeErr(w, &httpError{http.StatusNotFound, fmt.Sprintf("no endpoint serves model %q", req.Model)})
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
	req, _, keys, err := a.keysOf(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if req.Endpoint == "" {
		writeErr(w, badRequest(`"endpoint" is required`))
		return
	}
	id, err := a.Index.AddEndpoint(req.Endpoint, req.Model)
	if err != nil {
		writeErr(w, badRequest("%v", err))
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
		writeErr(w, &httpError{http.StatusMethodNotAllowed, "use GET"})
		return
	}
	ev := map[string]any{}
	if a.Events != nil {
		for _, e := range a.Events() {
			ev[e.Endpoint+"\x00"+e.Model] = e.Stats
		}
	}
	var eps []StatsEndpoint
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
