package engine

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func (e *Engine) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", e.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", e.handleChatCompletions)
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "0.11.0+kvgate.emulated"})
	})
	mux.HandleFunc("POST /tokenize", e.handleTokenize)
	mux.HandleFunc("POST /reset_prefix_cache", e.handleResetPrefixCache)
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /admin/role", e.handleGetRole)
	mux.HandleFunc("POST /admin/role", e.handleSetRole)
	mux.HandleFunc("POST /internal/kv/release", e.handleRelease)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErrorType(w, http.StatusNotFound, "NotFoundError", "no route for "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// apiError is OpenAI's error body.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	default:
		return "InternalServerError"
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeErrorType(w, status, errorType(status), msg)
}

func writeErrorType(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: status}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func (e *Engine) handleModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []model{{
			ID: e.cfg.Model, Object: "model", Created: time.Now().Unix(), OwnedBy: "vllm",
			Root: e.cfg.Model, MaxModelLen: e.cfg.MaxModelLen,
		}},
	})
}

func (e *Engine) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	err := e.sched.do(r.Context(), func() {
		n := e.sched.pool.reset()
		e.sched.publish(time.Now())
		e.log.Info("prefix cache reset", "blocks", n)
	})
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "engine is not running")
		return
	}
	w.WriteHeader(http.StatusOK)
}
