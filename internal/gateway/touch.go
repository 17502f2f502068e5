package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/prometheus/client_golang/prometheus"
)

// Touches of held requests' cached prefixes (sched.Scheduler.TouchHeld,
// docs/policies.md): the release loop's touch pass picks them, and the
// gateway sends each as a real request, the prefix's token ids and one
// token more to POST /v1/completions with max_tokens 1, accounted in the
// load as a one-token prefill on its endpoint.

// maxPrefixRequests bounds each model fleet's prefix requests in flight
// (touches, and copies ahead of the conversation balance: copy.go): one
// touch pass's worth. A touch is one token of work, and copies are made
// only on an idle fleet; more than that in flight means an engine is not
// answering, and more would only queue behind them. A skipped touch's
// request is touched again half a turnover later, as a sent one's.
const maxPrefixRequests = sched.TouchCandidates

// prefixTimeout bounds how long a prefix request (a touch, a copy) waits
// for its answer.
const prefixTimeout = 30 * time.Second

// maxPrefixAnswer bounds what is read of a prefix request's answer.
const maxPrefixAnswer = 1 << 20

// prefixRequestBody is the body of a touch or a copy: the completions
// API's fields vLLM needs to find the prefix (the model, and so its LoRA
// adapter; the cache salt its block hashes mix in) and to compute no more
// than one token.
type prefixRequestBody struct {
	Model       string   `json:"model"`
	Prompt      []uint32 `json:"prompt"`
	MaxTokens   int      `json:"max_tokens"`
	Temperature float64  `json:"temperature"`
	CacheSalt   string   `json:"cache_salt,omitempty"`
	// Priority: vLLM's (hold.touch_priority; 0 is not sent).
	Priority int `json:"priority,omitempty"`
}

// Touch implements sched.Toucher: it sends the first tokens tokens of h's
// prompt to endpoint i of the snapshot SnapshotFor last took for h. Only
// prompts whose token ids are the engine's own are touched (with the
// estimating tokenizer they would find nothing cached); a touch over the
// fleet's bound in flight is skipped.
func (f *releaseFleet) Touch(h *sched.Held, i, tokens int) {
	w := h.Value.(*waiter)
	fv, prompt := f.view, w.rt.engineIDs
	if fv == nil || i < 0 || i >= len(fv.members) || tokens <= 0 {
		return
	}
	if prompt == nil {
		f.g.met.touches.WithLabelValues(touchNotEngineIDs).Inc()
		return
	}
	if !f.mf.claimPrefixRequest() {
		f.g.met.touches.WithLabelValues(prefixSkipped).Inc()
		return
	}
	ids := prompt[:min(tokens, len(prompt))]
	body := prefixBody(w.rt, ids, f.g.cfg.Hold.TouchPriority)
	m, n := fv.members[i], len(ids)
	var compute float64 // its one token's prefill
	if sp := fv.snap.Endpoints[i].PrefillSpeed; sp > 0 {
		compute = 1 / sp
	}
	fl := f.mf.load.Route(fv.eps[i], f.g.clock(), load.Work{Uncached: 1, Cached: len(ids) - 1, PrefillSeconds: compute, Touch: true})
	go func() { _ = f.g.sendPrefix(f.g.touchKind(), f.mf, m, fl, body, n) }() // counted; nothing to undo
}

// claimPrefixRequest takes one of mf's slots for prefix requests in
// flight (false: all taken); sendPrefix gives it back.
func (mf *modelFleet) claimPrefixRequest() bool {
	if mf.prefixRequests.Add(1) > maxPrefixRequests {
		mf.prefixRequests.Add(-1)
		return false
	}
	return true
}

// prefixBody is the body of a request on ids, a prefix of rt's prompt:
// rt's model and cache salt, one output token, vLLM's priority (0: none).
func prefixBody(rt *routed, ids []uint32, priority int) []byte {
	// A struct of a string, numbers and a slice of numbers always
	// marshals.
	body, _ := json.Marshal(prefixRequestBody{Model: rt.req.Model, Prompt: ids, MaxTokens: 1, CacheSalt: rt.req.CacheSalt, Priority: priority})
	return body
}

// Outcomes of prefix requests (kvgate_hold_touches_total,
// kvgate_prefix_copies_total; not_engine_ids: touches only).
const (
	prefixDone        = "done"
	prefixFailed      = "failed"
	prefixSkipped     = "skipped"
	touchNotEngineIDs = "not_engine_ids"
)

// prefixKind is what a prefix request is (a touch, a copy): its name in
// the logs and the metrics its outcome and its prompt tokens count in.
type prefixKind struct {
	name             string
	outcomes, tokens *prometheus.CounterVec
}

func (g *Gateway) touchKind() prefixKind {
	return prefixKind{name: "touch", outcomes: g.met.touches, tokens: g.met.touchTokens}
}

func (g *Gateway) copyKind() prefixKind {
	return prefixKind{name: "prefix copy", outcomes: g.met.copies, tokens: g.met.copyTokens}
}

// sendPrefix sends the body of a request of kind k on a prompt's prefix
// (n prompt tokens, one output token) to m, ends its flight fl when the
// answer comes (its first and only token) or the request fails, gives
// back its slot among the model fleet's prefix requests in flight, and
// counts its outcome. An answer that reports its cached tokens (vLLM
// with --enable-prompt-tokens-details, kvgate's engine) tells how much
// it found cached and how much it computed: a prefix evicted before a
// touch came is computed again.
func (g *Gateway) sendPrefix(k prefixKind, mf *modelFleet, m *member, fl *load.Flight, body []byte, n int) error {
	defer mf.prefixRequests.Add(-1)
	ctx, cancel := context.WithTimeout(context.Background(), prefixTimeout)
	defer cancel()
	answer, err := g.postPrefix(ctx, m, body)
	now := g.clock()
	if err != nil {
		mf.load.Finish(fl, now)
		k.outcomes.WithLabelValues(prefixFailed).Inc()
		g.log.Debug("kvgate: "+k.name+" failed", "endpoint", m.ep.Name, "err", err)
		return err
	}
	mf.load.FirstToken(fl, now)
	mf.load.Finish(fl, now)
	k.outcomes.WithLabelValues(prefixDone).Inc()
	if cached, ok := openai.ResponseCachedTokens(answer); ok {
		cached = min(cached, n)
		k.tokens.WithLabelValues("cached").Add(float64(cached))
		k.tokens.WithLabelValues("computed").Add(float64(n - cached))
	}
	return nil
}

// postPrefix posts body to m's completions API and returns the answer.
func (g *Gateway) postPrefix(ctx context.Context, m *member, body []byte) ([]byte, error) {
	if m.ep.URL == "" {
		return nil, fmt.Errorf("endpoint %s has no url", m.ep.Name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.ep.URL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if m.ep.Ranked() {
		req.Header.Set(hdrDPRank, fmt.Sprint(m.ep.DPRank))
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	msg, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefixAnswer))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg[:min(len(msg), 512)]))
	}
	return msg, nil
}
