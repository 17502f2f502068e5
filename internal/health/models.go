package health

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/kvgate/kvgate/internal/fleet"
)

// modelsEvery: a probe lists the engine's models (GET /v1/models) every
// this many probes, the first included: an adapter loaded at run time
// (vLLM's /v1/load_lora_adapter) is known within modelsEvery intervals.
const modelsEvery = 5

// maxModelsBody bounds a /v1/models answer.
const maxModelsBody = 1 << 20

// listAdapters GETs base/v1/models and returns the LoRA adapters of model
// it lists: the entries whose parent is model, as vLLM lists an adapter
// (at most fleet.MaxLoRA; names of 1 to fleet.MaxLoRANameLen bytes).
func (p *Prober) listAdapters(ctx context.Context, base, model string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("GET /v1/models: status %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxModelsBody+1))
	if err != nil {
		return nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	if len(body) > maxModelsBody {
		return nil, fmt.Errorf("GET /v1/models: answer over %d bytes", maxModelsBody)
	}
	return parseAdapters(body, model)
}

// parseAdapters reads an OpenAI model list and returns the ids whose
// parent is model, each once.
func parseAdapters(body []byte, model string) ([]string, error) {
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	var out []string
	seen := map[string]bool{}
	for _, m := range list.Data {
		if m.Parent == nil || *m.Parent != model || m.ID == model || m.ID == "" || len(m.ID) > fleet.MaxLoRANameLen || seen[m.ID] {
			continue
		}
		if len(out) == fleet.MaxLoRA {
			break
		}
		seen[m.ID] = true
		out = append(out, m.ID)
	}
	return out, nil
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
	ads, err := p.listAdapters(ctx, ep.URL, ep.Model)
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.modelsErr = err.Error()
		return
	}
	t.adapters, t.hasAdapters, t.modelsErr = ads, true, ""
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
