package gateway

import (
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/predict"
	"github.com/kvgate/kvgate/internal/sched"
)

// passthroughPaths are vLLM's other APIs, forwarded whole to an endpoint
// of the body's model (passthrough.go): JSON bodies, and the audio APIs'
// multipart forms.
var passthroughPaths = []string{"/v1/embeddings", "/tokenize", "/detokenize", "/pooling", "/classify",
	"/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/v1/audio/transcriptions", "/v1/audio/translations"}

// Handler is the client-facing API: /v1/completions, /v1/chat/completions,
// the Responses API, the Messages API and SGLang's native /generate
// (routed; a stored response's GET and cancel go to the engine that made
// it), vLLM's other JSON APIs (passthroughPaths and the Messages API's
// count_tokens, forwarded), /v1/models, /health and /ready.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) { g.handle(w, r, apiCompletions) })
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { g.handle(w, r, apiChat) })
	mux.HandleFunc("/generate", func(w http.ResponseWriter, r *http.Request) { g.handle(w, r, apiGenerate) })
	for _, p := range passthroughPaths {
		mux.HandleFunc("POST "+p, g.handlePassthrough)
		mux.HandleFunc(p, postOnly) // another method: 405 (it was the catch-all's 404)
	}
	mux.HandleFunc("/v1/responses", func(w http.ResponseWriter, r *http.Request) { g.handle(w, r, apiResponses) })
	mux.HandleFunc("GET /v1/responses/{id}", g.handleResponseByID)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", g.handleResponseByID)
	mux.HandleFunc("/v1/messages", func(w http.ResponseWriter, r *http.Request) { g.handle(openai.MessagesErrors(w), r, apiMessages) })
	mux.HandleFunc("POST /v1/messages/count_tokens", func(w http.ResponseWriter, r *http.Request) { g.handlePassthrough(openai.MessagesErrors(w), r) })
	mux.HandleFunc("GET /v1/models", g.handleModels)
	mux.HandleFunc("GET /v1/models/{id...}", g.handleModel)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /ready", g.handleReady)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openai.WriteError(w, openai.NotFound("kvgate routes /v1/completions, /v1/chat/completions, /v1/responses, /v1/messages and SGLang's /generate, forwards POST %s and /v1/messages/count_tokens, and serves /v1/models, /v1/models/{id}, /health and /ready; not %s %s",
			strings.Join(passthroughPaths, ", "), r.Method, r.URL.Path))
	})
	return mux
}

// AdminHandler is the operator API (listen on loopback): /admin/endpoints,
// /admin/config (the configuration running), /admin/kv/... (the index's
// admin API) and /metrics.
func (g *Gateway) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/endpoints", func(w http.ResponseWriter, _ *http.Request) {
		openai.WriteJSON(w, http.StatusOK, map[string]any{"endpoints": g.endpointStates()})
	})
	kv := &kvindex.Admin{Index: g.idx, Tokens: g.toks}
	{
		kv.Events = func() []kvindex.EndpointEvents {
			var out []kvindex.EndpointEvents
			for _, s := range g.sub.Stats() {
				out = append(out, kvindex.EndpointEvents{Endpoint: s.Endpoint, Model: s.Model, Stats: s})
			}
			return out
		}
	}
	mux.Handle("/admin/kv/", kv.Handler())
	mux.Handle("GET /metrics", g.met.handler())
	mux.HandleFunc("GET /admin/config", g.serveConfig)
	return mux
}

// modelCard is a model as /v1/models lists it, vLLM's card.
type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root is a base model's name, an adapter's root as its engines
	// list it (vLLM's: its path; absent until one did).
	Root   string  `json:"root,omitempty"`
	Parent *string `json:"parent"` // a LoRA adapter's base model; null for a base model, as vLLM lists them
	// MaxModelLen is the least its engines listed (absent until one
	// did).
	MaxModelLen int `json:"max_model_len,omitempty"`
}

// modelCards are the cards of the models the fleet serves.
func (g *Gateway) modelCards() []modelCard {
	out := []modelCard{}
	for _, m := range g.Models() {
		card := modelCard{ID: m.ID, Object: "model", Created: g.start.Unix(), OwnedBy: "kvgate", MaxModelLen: m.MaxModelLen}
		if m.Parent != "" {
			card.Parent, card.Root = &m.Parent, m.Root
		} else {
			card.Root = m.ID
		}
		out = append(out, card)
	}
	return out
}

// handleModels lists the models the fleet serves, as vLLM's /v1/models
// does.
func (g *Gateway) handleModels(w http.ResponseWriter, _ *http.Request) {
	openai.WriteJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{Object: "list", Data: g.modelCards()})
}

// postOnly answers a method other than POST on a forwarded path.
func postOnly(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Allow", http.MethodPost)
	openai.WriteError(w, openai.Errorf(http.StatusMethodNotAllowed, "use POST"))
}

// handleModel is one model's card (GET /v1/models/{id}, OpenAI's and
// SGLang's retrieve; a name with slashes, as Hugging Face names are,
// included), or OpenAI's 404.
func (g *Gateway) handleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, card := range g.modelCards() {
		if card.ID == id {
			openai.WriteJSON(w, http.StatusOK, card)
			return
		}
	}
	openai.WriteError(w, openai.NotFound("The model `%s` does not exist.", id).WithParam("model"))
}

// handleReady is 200 when every model has at least one endpoint that can
// take traffic.
func (g *Gateway) handleReady(w http.ResponseWriter, _ *http.Request) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if len(g.members) == 0 {
		openai.WriteError(w, openai.Unavailable(time.Second, "no endpoints"))
		return
	}
	listed := map[string]bool{} // the models the fleet serves now, healthy or not
	for _, m := range g.members {
		listed[m.ep.Model] = true
	}
	for name, mf := range g.models {
		if !listed[name] {
			// Every endpoint of it left the fleet (a model renamed, a
			// canary deleted): not a model this gateway serves now, so
			// not a reason to take it out of its Service (until
			// 2026-12-04 it stayed unready until restarted).
			continue
		}
		if len(mf.members) == 0 {
			openai.WriteError(w, openai.Unavailable(time.Second, "no healthy endpoint for model %q", name))
			return
		}
		if _, why := g.servable(name, mf.members); why != "" {
			openai.WriteError(w, openai.Unavailable(time.Second, "model %q cannot be served: %s", name, why))
			return
		}
	}
	openai.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// EndpointState is one endpoint's live state in /admin/endpoints.
type EndpointState struct {
	Name  string     `json:"name"`
	URL   string     `json:"url"`
	Model string     `json:"model"`
	Role  fleet.Role `json:"role"`
	// LoRA is the adapters it serves (declared, then listed by its
	// engine), and LoRAInFlight the gateway's
	// requests in flight there per adapter (the batch places' count).
	LoRA         []string       `json:"lora,omitempty"`
	LoRAInFlight map[string]int `json:"lora_in_flight,omitempty"`
	Eligible     bool           `json:"eligible"` // in the snapshot: discovered and healthy
	Load         endpointLoad   `json:"load"`
	KVBlocks     int64          `json:"kv_index_gpu_blocks"`
	TPOT         float64        `json:"observed_tpot_seconds"`
	// Predictor is the endpoint's prefill model: learned speed and recent
	// TTFT prediction error.
	Predictor *predict.Stats `json:"predictor,omitempty"`
	// DecodePredictor is the endpoint's TPOT model (learned predictor,
	// endpoints that decode): the TPOT of one more stream now and the
	// recent TPOT prediction error.
	DecodePredictor *predict.DecodeStats `json:"decode_predictor,omitempty"`
	// Health is the prober's view (checks, ejection, scraped metrics).
	Health *health.State `json:"health,omitempty"`
}

func (g *Gateway) endpointStates() []EndpointState {
	blocks := map[kvindex.EndpointID]int64{}
	for _, s := range g.idx.Stats() {
		blocks[s.ID] = s.GPUBlocks
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	now := g.clock()
	out := []EndpointState{} // [] with none, not null
	seen := map[string]bool{}
	for _, mf := range g.models {
		var snap sched.Snapshot
		mf.load.Snapshot(now, 0, nil, nil, nil, &snap)
		for i, m := range mf.members {
			seen[m.ep.Name] = true
			out = append(out, EndpointState{Name: m.ep.Name, URL: m.ep.URL, Model: m.ep.Model, Role: m.ep.Role,
				LoRA: m.adapters(), LoRAInFlight: m.lora.counts(),
				Eligible: true, Load: loadOf(&snap.Endpoints[i]), KVBlocks: blocks[m.kvID], TPOT: m.obs.tpot()})
			if st, ok := mf.load.PredictorStats(m.ep.Name); ok && m.ep.Role != fleet.RoleDecode {
				out[len(out)-1].Predictor = &st
			}
			if st, ok := mf.load.DecodeStats(m.ep.Name, 0); ok && st.Analytic > 0 {
				out[len(out)-1].DecodePredictor = &st
			}
		}
	}
	for _, m := range g.members {
		if !seen[m.ep.Name] {
			out = append(out, EndpointState{Name: m.ep.Name, URL: m.ep.URL, Model: m.ep.Model, Role: m.ep.Role,
				LoRA: m.adapters(), LoRAInFlight: m.lora.counts(), KVBlocks: blocks[m.kvID], TPOT: m.obs.tpot()})
		}
	}
	if g.health != nil {
		for i := range out {
			if st, ok := g.health.State(out[i].Name); ok {
				out[i].Health = &st
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
