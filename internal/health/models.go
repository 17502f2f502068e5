package health

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/kvgate/kvgate/internal/fleet"
)

// modelsEvery: a probe lists the engine's models (GET /v1/models) every
// this many probes, the first included: an adapter loaded at run time
// (vLLM's /v1/load_lora_adapter) is known within modelsEvery intervals.
const modelsEvery = 5

// maxModelsBody bounds a /v1/models answer.
const maxModelsBody = 1 << 20

// modelList is what an engine's /v1/models says of its model: its LoRA
// adapters (the entries whose parent is the model, as vLLM lists an
// adapter; at most fleet.MaxLoRA, names of 1 to fleet.MaxLoRANameLen
// bytes) and the model's max_model_len (0: not said).
type modelList struct {
	adapters []string
	// roots are the adapters' roots as listed (vLLM's: the adapter's
	// path), for those that list one.
	roots       map[string]string
	maxModelLen int
	// metricsModel is the name the engine's metrics carry for the
	// endpoint's model when that is not the model itself: vLLM labels
	// every series with the first of its served names
	// (--served-model-name a b), and lists each name as a base model of
	// one root, in that order ("": the model's own).
	metricsModel string
	// missing says that a listing does not name the endpoint's model
	// ("": it does, or lists nothing).
	missing string
}

// maxRootLen bounds an adapter's root taken from an engine (a path).
const maxRootLen = 4096

// maxModelLen bounds a max_model_len taken from an engine.
const maxModelLen = 1 << 30

// listAdapters GETs base/v1/models and reads what it says of model.
func (p *Prober) listAdapters(ctx context.Context, base, model string) (modelList, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return modelList{}, err
	}
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return modelList{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		err := fmt.Errorf("GET /v1/models: status %s", resp.Status)
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			err = &unauthorizedError{err}
		}
		return modelList{}, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxModelsBody+1))
	if err != nil {
		return modelList{}, fmt.Errorf("GET /v1/models: %w", err)
	}
	if len(body) > maxModelsBody {
		return modelList{}, fmt.Errorf("GET /v1/models: answer over %d bytes", maxModelsBody)
	}
	return parseModels(body, model)
}

// modelCard is one model of an OpenAI model list.
type modelCard struct {
	ID          string  `json:"id"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen float64 `json:"max_model_len"`
}

// maxMetricsModelLen bounds the metrics' model name taken from a listing.
const maxMetricsModelLen = 1024

// firstName is the first base model listed with model's root, when that
// is another name than model (""): the name vLLM's metrics carry.
func firstName(cards []modelCard, model string) string {
	root := ""
	for _, c := range cards {
		if c.ID == model && c.Parent == nil {
			root = c.Root
		}
	}
	if root == "" {
		return ""
	}
	for _, c := range cards {
		if c.Parent == nil && c.Root == root {
			if c.ID == model || len(c.ID) > maxMetricsModelLen {
				return ""
			}
			return c.ID
		}
	}
	return ""
}

// parseModels reads an OpenAI model list: the ids whose parent is model,
// each once, and model's own max_model_len (one out of range is not
// taken).
func parseModels(body []byte, model string) (modelList, error) {
	var list struct {
		Data []modelCard `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return modelList{}, fmt.Errorf("GET /v1/models: %w", err)
	}
	var out modelList
	seen := map[string]bool{}
	listed := len(list.Data) == 0 // an empty list says nothing
	for _, m := range list.Data {
		listed = listed || m.ID == model
		if m.ID == model && m.Parent == nil && m.MaxModelLen >= 1 && m.MaxModelLen <= maxModelLen && m.MaxModelLen == float64(int(m.MaxModelLen)) {
			out.maxModelLen = int(m.MaxModelLen)
		}
		if m.Parent == nil || *m.Parent != model || m.ID == model || m.ID == "" || len(m.ID) > fleet.MaxLoRANameLen || seen[m.ID] {
			continue
		}
		if len(out.adapters) == fleet.MaxLoRA {
			continue
		}
		seen[m.ID] = true
		out.adapters = append(out.adapters, m.ID)
		if m.Root != "" && len(m.Root) <= maxRootLen {
			if out.roots == nil {
				out.roots = map[string]string{}
			}
			out.roots[m.ID] = m.Root
		}
	}
	out.metricsModel = firstName(list.Data, model)
	if !listed {
		ids := make([]string, 0, min(len(list.Data), 4))
		for _, m := range list.Data[:min(len(list.Data), 4)] {
			ids = append(ids, fmt.Sprintf("%.64q", m.ID))
		}
		out.missing = fmt.Sprintf("GET /v1/models: the engine serves %s, not model %q: its requests get the engine's 404 (is the endpoint's model its --served-model-name?)",
			strings.Join(ids, ", "), model)
	}
	return out, nil
}

// MaxModelLen is the max_model_len name's engine listed for its model
// last (0, false before any listing said one).
func (p *Prober) MaxModelLen(name string) (int, bool) {
	t := p.target(name)
	if t == nil {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maxModelLen, t.maxModelLen > 0
}

// Adapters returns the LoRA adapters name's engine listed last (nil,
// false before any listing succeeded).
func (p *Prober) Adapters(name string) ([]string, bool) {
	t := p.target(name)
	if t == nil {
		return nil, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.adapters, t.hasAdapters
}

// probeModels lists t's adapters when due; a failed listing keeps the
// last one and records its error.
func (p *Prober) probeModels(ctx context.Context, t *target, ep fleet.Endpoint) {
	t.mu.Lock()
	due := t.probes%modelsEvery == 1
	t.mu.Unlock()
	if !due || p.cfg.NoModels {
		return
	}
	list, err := p.listAdapters(ctx, ep.URL, ep.Model)
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		var ue *unauthorizedError
		if errors.As(err, &ue) && !t.warnedAuth {
			// Told once: the clients' requests get the engine's 401 too,
			// while the endpoint looks healthy (/health is open).
			t.warnedAuth = true
			p.cfg.Logger.Warn("health: the engine refuses kvgate's requests without an API key (its --api-key): set engine_api_key or KVGATE_ENGINE_API_KEY to the engines' key",
				"endpoint", ep.Name, "err", err)
		}
		t.modelsErr = err.Error()
		return
	}
	t.warnedAuth = false
	if list.missing != "" && list.missing != t.modelsErr {
		p.cfg.Logger.Warn("health: the engine does not list the endpoint's model", "endpoint", ep.Name, "listing", list.missing)
	}
	problem := list.missing
	// A declared adapter its engine does not serve: every request for it
	// there gets the engine's 404 (a walkthrough: 6 of 6, and nothing
	// said why).
	var unlisted []string
	for _, a := range ep.LoRA {
		if !slices.Contains(list.adapters, a) {
			unlisted = append(unlisted, a)
		}
	}
	if len(unlisted) > 0 {
		msg := fmt.Sprintf("declared LoRA adapters the engine does not list: %s", strings.Join(unlisted, ", "))
		if problem == "" && msg != t.modelsErr {
			p.cfg.Logger.Warn("health: the engine does not list adapters the endpoint declares (lora=); their requests there get its 404, retried on another endpoint that serves them",
				"endpoint", ep.Name, "adapters", unlisted)
		}
		problem = cmp.Or(problem, msg)
	}
	t.adapters, t.roots, t.hasAdapters, t.modelsErr = list.adapters, list.roots, true, problem
	t.metricsModel = list.metricsModel
	if list.maxModelLen > 0 {
		t.maxModelLen = list.maxModelLen
	}
}

// AdapterRoot is the root name's engine listed last for adapter (vLLM's:
// the adapter's path); false when it listed none.
func (p *Prober) AdapterRoot(name, adapter string) (string, bool) {
	t := p.target(name)
	if t == nil {
		return "", false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.roots[adapter]
	return r, ok
}

// ForgetAdapter drops adapter from name's listing until the next one
// (its engine said it no longer serves it); false if it was not listed.
func (p *Prober) ForgetAdapter(name, adapter string) bool {
	t := p.target(name)
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	i := slices.Index(t.adapters, adapter)
	if i < 0 {
		return false
	}
	t.adapters = slices.Delete(slices.Clone(t.adapters), i, i+1)
	return true
}

// unauthorizedError is an engine's 401 or 403 to kvgate's own request.
type unauthorizedError struct{ error }

func (e *unauthorizedError) Unwrap() error { return e.error }
