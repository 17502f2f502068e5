package gateway

import (
	"maps"
	"slices"
	"sync"

	"github.com/kvgate/kvgate/internal/enginemetrics"
	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/sched"
)

// serves reports whether a request for model may go to m: its model, or
// an adapter it declares or its engine lists.
func (m *member) serves(model string) bool {
	if m.ep.Serves(model) {
		return true
	}
	f := m.found.Load()
	return f != nil && slices.Contains(*f, model)
}

// adapters are the LoRA adapters m serves: declared, then found.
func (m *member) adapters() []string {
	f := m.found.Load()
	if f == nil {
		return m.ep.LoRA
	}
	return append(slices.Clip(m.ep.LoRA), *f...)
}

// adaptersOf maps each LoRA adapter the members serve to its base model:
// the ones endpoints declare (fleet.Validate made them unambiguous), then
// the ones engines list (health.Prober.Adapters), each kept in its
// member's found unless its name is a served model's or another base
// model's adapter. Called with g.mu held.
func (g *Gateway) adaptersOf() map[string]string {
	out := map[string]string{}
	models := map[string]bool{}
	for _, m := range g.members {
		models[m.ep.Model] = true
		for _, a := range m.ep.LoRA {
			out[a] = m.ep.Model
		}
	}
	if g.health == nil {
		return out
	}
	names := slices.Sorted(maps.Keys(g.members)) // the same choice at every refresh
	for _, name := range names {
		m := g.members[name]
		listed, _ := g.health.Adapters(name)
		var found []string
		var declared map[string]bool // m's own, when it lists some
		if len(listed) > 0 && len(m.ep.LoRA) > 0 {
			declared = make(map[string]bool, len(m.ep.LoRA))
			for _, a := range m.ep.LoRA {
				declared[a] = true
			}
		}
		for _, a := range listed {
			if base, ok := out[a]; ok && base != m.ep.Model && !g.clashWarned[a+"\x00"+name] {
				// An adapter of another base model too: not reachable
				// here (a request names it, not its base). Said once.
				if g.clashWarned == nil {
					g.clashWarned = map[string]bool{}
				}
				g.clashWarned[a+"\x00"+name] = true
				g.log.Warn("lora: an engine lists an adapter another base model already serves; requests for it go to that model's endpoints, not this one",
					"endpoint", name, "model", m.ep.Model, "adapter", a, "served_as_adapter_of", base)
			}
			if base, ok := out[a]; models[a] || ok && base != m.ep.Model || declared[a] {
				continue
			}
			out[a] = m.ep.Model
			found = append(found, a)
		}
		if old := m.found.Load(); old == nil && found != nil || old != nil && !slices.Equal(*old, found) {
			m.found.Store(&found)
		}
	}
	return out
}

// adapterFlights counts one member's requests in flight per LoRA adapter:
// the gateway's own, exact at every decision, where the engine's scraped
// vllm:lora_requests_info is seconds old.
type adapterFlights struct {
	mu sync.Mutex
	n  map[string]int
}

// start counts a request for adapter in flight until done is first
// called.
func (a *adapterFlights) start(adapter string) (done func()) {
	a.mu.Lock()
	if a.n == nil {
		a.n = map[string]int{}
	}
	a.n[adapter]++
	a.mu.Unlock()
	return sync.OnceFunc(func() {
		a.mu.Lock()
		if a.n[adapter]--; a.n[adapter] <= 0 {
			delete(a.n, adapter)
		}
		a.mu.Unlock()
	})
}

// loraStart counts a request for adapter in flight on m until done is
// first called, and tells the other replicas (replica sync).
func (g *Gateway) loraStart(m *member, adapter string) (done func()) {
	mine := m.lora.start(adapter)
	if g.sync == nil {
		return mine
	}
	theirs := g.sync.Place(m.ep.Model, m.ep.Name, adapter)
	return sync.OnceFunc(func() { mine(); theirs() })
}

// counts is a copy of the counts (nil when none is in flight).
func (a *adapterFlights) counts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.n) == 0 {
		return nil
	}
	return maps.Clone(a.n)
}

// slot reports whether a request for adapter finds a place in a batch of
// at most maxLoRA adapters: the adapter is in flight here already, or
// fewer than maxLoRA others are. Requests waiting in the engine count, as
// they will take their slot when they run.
func (a *adapterFlights) slot(adapter string, maxLoRA int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[adapter] > 0 || len(a.n) < maxLoRA
}

// adapterGone hears that m's engine answered 404 to a request for
// adapter: an adapter its engine listed (not one m declares) was unloaded
// since the listing, so it is forgotten at once, not at the next listing
// (up to five probe intervals of 404s).
func (g *Gateway) adapterGone(m *member, adapter string) {
	if m.ep.Serves(adapter) || g.health == nil || !g.health.ForgetAdapter(m.ep.Name, adapter) {
		return
	}
	g.log.Info("lora: adapter gone from its engine", "endpoint", m.ep.Name, "adapter", adapter)
	g.refresh()
}

// servedElsewhere reports whether an endpoint other than m serves
// adapter (declared, or listed by its engine).
func (g *Gateway) servedElsewhere(m *member, adapter string) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, o := range g.members {
		if o != m && o.ep.Model == m.ep.Model && o.serves(adapter) {
			return true
		}
	}
	return false
}

// defaultMaxLoRAs is vLLM's --max-loras default, assumed for an engine
// that has not (yet) reported its own.
const defaultMaxLoRAs = 1

// keepLoRASlots keeps, of the endpoints serving adapter, those whose
// batch has a place for it, where another endpoint that can do their part
// (prefill, decode) has one: vLLM passes a request for another adapter
// over while --max-loras others run, a wait no prediction here includes.
// Which adapters an endpoint runs is what the gateway has in flight
// there; how many it may run is the max_lora of the engine's
// vllm:lora_requests_info, or vLLM's default of 1 before (or without)
// one: requests sent before the first scrape would otherwise mix
// adapters on every engine and wait.
func (g *Gateway) keepLoRASlots(adapter string, members []*member, eps []*load.Endpoint, s *sched.Snapshot) ([]*member, []*load.Endpoint) {
	slots := make([]bool, len(members))
	prefill, decode, all := false, false, true
	for i, m := range members {
		n := defaultMaxLoRAs
		if g.health != nil {
			if mt, ok := g.health.Metrics(m.ep.Name); ok && mt.Has(enginemetrics.FieldLoRA) {
				n = mt.MaxLoRA
			}
		}
		ok := m.lora.slot(adapter, n)
		slots[i] = ok
		all = all && ok
		prefill = prefill || ok && m.ep.Role.CanPrefill()
		decode = decode || ok && m.ep.Role.CanDecode()
	}
	if all {
		return members, eps
	}
	return keepEndpoints(members, eps, s, func(i int, m *member) bool {
		return slots[i] || m.ep.Role.CanPrefill() && !prefill || m.ep.Role.CanDecode() && !decode
	})
}
