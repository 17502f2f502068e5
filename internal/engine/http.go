package engine

import (
	"net/http"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/openai"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func (e *Engine) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", e.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", e.handleChatCompletions)
	mux.HandleFunc("POST /generate", e.handleGenerate)
	mux.HandleFunc("POST /v1/responses", e.handleResponses)
	mux.HandleFunc("GET /v1/responses/{id}", e.handleGetResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", e.handleCancelResponse)
	mux.HandleFunc("POST /v1/messages", e.handleMessages)
	mux.HandleFunc("POST /v1/messages/count_tokens", e.handleCountTokens)
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		openai.WriteJSON(w, http.StatusOK, map[string]string{"version": "0.11.0+kvgate.emulated"})
	})
	mux.HandleFunc("POST /tokenize", e.handleTokenize)
	mux.HandleFunc("POST /reset_prefix_cache", e.handleResetPrefixCache)
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /admin/role", e.handleGetRole)
	mux.HandleFunc("POST /admin/role", e.handleSetRole)
	mux.HandleFunc("POST /internal/kv/release", e.handleRelease)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openai.WriteError(w, openai.NotFound("no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// authenticated is h requiring the API key on /v1 paths when one is set
// (vLLM's AuthenticationMiddleware).
func (e *Engine) authenticated(h http.Handler) http.Handler {
	if e.cfg.APIKey == "" {
		return h
	}
	want := "Bearer " + e.cfg.APIKey
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1") && r.Header.Get("Authorization") != want {
			openai.WriteJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// handleModels lists the base model and, as vLLM does, each LoRA adapter
// with the base model as its parent.
func (e *Engine) handleModels(w http.ResponseWriter, _ *http.Request) {
	now := time.Now().Unix()
	data := []openai.Model{{
		ID: e.cfg.Model, Object: "model", Created: now, OwnedBy: "vllm",
		Root: e.cfg.Model, MaxModelLen: e.cfg.MaxModelLen,
	}}
	for _, name := range e.cfg.LoRAModules {
		data = append(data, openai.Model{ID: name, Object: "model", Created: now, OwnedBy: "vllm",
			Root: name, Parent: &e.cfg.Model, MaxModelLen: e.cfg.MaxModelLen})
	}
	openai.WriteJSON(w, http.StatusOK, openai.ModelList{Object: "list", Data: data})
}

func (e *Engine) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	err := e.sched.do(r.Context(), func() {
		n := e.sched.pool.reset()
		e.sched.publish(time.Now())
		e.log.Info("prefix cache reset", "blocks", n)
	})
	if err != nil {
		openai.WriteError(w, openai.Unavailable(time.Second, "engine is not running"))
		return
	}
	w.WriteHeader(http.StatusOK)
}
