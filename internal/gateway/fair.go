package gateway

import "sync"

// Fairness between tenants (Config.FairnessHeader: llm-d's
// x-gateway-inference-fairness-id by default). With early rejection a
// tenant that floods the fleet fills its queues to the SLO, and every
// other tenant's requests are then rejected as often as the flood's. So
// fairShare keeps room for the tenants turned away: when a tenant's
// request is rejected for the load, missing its SLO by m seconds, every
// tenant with more prompt tokens in flight on that model (and a priority
// no higher) is admitted for the next shedWindow only if its own
// predicted TTFT leaves m seconds of its SLO unused, so that the queues
// it joins stay short enough for the other's next request. Nobody is
// held back while nobody else is turned away, and then only by the room
// the other lacked, so a tenant alone may use the whole fleet.
type fairShare struct {
	mu sync.Mutex
	// tenants are the tenants with requests in flight or turned away
	// lately; denied those of them turned away within shedWindow.
	tenants map[tenantKey]*tenantState
	denied  map[tenantKey]struct{}
}

type tenantKey struct{ model, tenant string }

type tenantState struct {
	// inflight is the uncached prompt tokens of its admitted requests
	// not yet ended.
	inflight int64
	// until is the clock time its last rejection for the load stops
	// holding others back; prio that request's priority, miss how many
	// seconds it missed its SLO by.
	until, miss float64
	prio        int
}

// maxTenants bounds the tenants tracked (per gateway): tenants beyond it
// share one overflow entry. maxTenantName bounds a tenant's name; a longer
// one is cut.
const (
	maxTenants    = 4096
	maxTenantName = 256
	overflow      = "\x00overflow"
)

// DefaultFairnessHeader is llm-d's fairness id header.
const DefaultFairnessHeader = "X-Gateway-Inference-Fairness-Id"

// resolve is the key k is tracked under (under mu): k, or the overflow
// entry's once maxTenants others are tracked. Names are at most
// maxTenantName bytes (the caller cuts them: tenantOf).
func (f *fairShare) resolve(k tenantKey) tenantKey {
	if f.tenants == nil {
		f.tenants, f.denied = map[tenantKey]*tenantState{}, map[tenantKey]struct{}{}
	}
	if _, ok := f.tenants[k]; !ok && len(f.tenants) >= maxTenants {
		k.tenant = overflow
	}
	return k
}

// state is k's entry, made if absent (under mu; k resolved).
func (f *fairShare) state(k tenantKey) *tenantState {
	s := f.tenants[k]
	if s == nil {
		s = &tenantState{}
		f.tenants[k] = s
	}
	return s
}

// admitted counts tokens as model's tenant's in flight until release is
// called (once).
func (f *fairShare) admitted(model, tenant string, tokens int) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.resolve(tenantKey{model, tenant})
	s := f.state(k)
	n := int64(max(tokens, 0))
	s.inflight += n
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			s.inflight -= n
			f.forget(k, s)
		})
	}
}

// forget drops k's entry once it holds nothing in flight and sheds no one.
func (f *fairShare) forget(k tenantKey, s *tenantState) {
	if _, shedding := f.denied[k]; s.inflight <= 0 && !shedding && f.tenants[k] == s {
		delete(f.tenants, k)
	}
}

// mayDisplace reports whether a request of model's tenant taker, tokens
// uncached, may take the place of a queued request of tenant victim
// (displace.go): the same tenant, or one holding at least as many
// prompt tokens in flight as taker would with this request. A tenant
// whose prompts are long is then not displaced by another's short ones
// once it holds less than that one: displacement serves more requests,
// never by starving a tenant.
func (f *fairShare) mayDisplace(model, victim, taker string, tokens int) bool {
	if victim == taker {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, t := f.resolve(tenantKey{model, victim}), f.resolve(tenantKey{model, taker})
	if v == t {
		return true
	}
	var hv, ht int64
	if s := f.tenants[v]; s != nil {
		hv = s.inflight
	}
	if s := f.tenants[t]; s != nil {
		ht = s.inflight
	}
	return hv >= ht+int64(max(tokens, 0))
}

// deny records that a request of model's tenant, of priority prio, was
// rejected for the load at clock time now, missing its SLO by miss
// seconds.
func (f *fairShare) deny(model, tenant string, prio int, now, miss float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.resolve(tenantKey{model, tenant})
	s := f.state(k)
	if s.until <= now {
		s.miss = 0
	}
	s.until, s.prio, s.miss = now+shedWindow, prio, max(s.miss, miss)
	f.denied[k] = struct{}{}
}

// room is how many seconds of its SLO a request of model's tenant, of
// priority prio, must leave unused at clock time now (0: none): the most
// that another tenant of the model with fewer tokens in flight missed by,
// turned away for the load within shedWindow by a request of priority at
// least prio.
func (f *fairShare) room(model, tenant string, prio int, now float64) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.denied) == 0 {
		return 0
	}
	me := f.resolve(tenantKey{model, tenant})
	var mine int64
	if s := f.tenants[me]; s != nil {
		mine = s.inflight
	}
	var room float64
	for k := range f.denied {
		s := f.tenants[k]
		if s == nil || s.until <= now {
			delete(f.denied, k)
			if s != nil {
				f.forget(k, s)
			}
			continue
		}
		if k.model == model && k != me && s.prio >= prio && s.inflight < mine {
			room = max(room, s.miss)
		}
	}
	return room
}

// tenantOf is r's tenant: its fairness header, cut to maxTenantName
// bytes ("" without one: the tenant of every request without it).
func tenantOf(h string) string {
	if len(h) > maxTenantName {
		return h[:maxTenantName]
	}
	return h
}
