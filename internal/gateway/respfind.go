package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
)

// An answer no routing here told of (made before this gateway started, or
// by a replica it does not sync with: every replica of a rolling restart)
// is found by asking the engines: GET /v1/responses/{id} answers 200 on
// the engine that keeps it (vLLM's response store is its own memory). A
// request continuing it, and its GET or cancel, then go there as if this
// gateway had routed it; until 2026-12-05 they were a 404, or a
// continuation went where routing sent it, most likely an engine that did
// not keep the answer.

const (
	// maxResponseProbes bounds the engines asked for one id.
	maxResponseProbes = 64
	// responseProbeTimeout bounds the asking.
	responseProbeTimeout = 2 * time.Second
	// responseMissMemory is how long an id no engine kept is not asked
	// for again: a client resending an unknown id makes no fan-out of
	// engine requests each time.
	responseMissMemory = 30 * time.Second
	// maxResponseMisses bounds the ids remembered as kept nowhere.
	maxResponseMisses = 4096
	// responseLookupRate and responseLookupBurst bound the ids asked for
	// (each asks every engine): a client sending a new unknown id with
	// every request fans out at most this much; beyond it an unknown id
	// is routed as unknown, as before the asking.
	responseLookupRate  = 50.0 // ids a second
	responseLookupBurst = 100.0
)

// lookupBudget is a token bucket of response lookups.
type lookupBudget struct {
	mu     sync.Mutex
	tokens float64
	at     time.Time
}

// take reports whether a lookup may be made at now, taking its token.
func (b *lookupBudget) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at.IsZero() {
		b.tokens = responseLookupBurst
	} else if d := now.Sub(b.at).Seconds(); d > 0 {
		b.tokens = min(responseLookupBurst, b.tokens+d*responseLookupRate)
	}
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// responseMisses remembers the ids no engine kept, for a while.
type responseMisses struct {
	mu sync.Mutex
	at map[string]time.Time
}

// ask reports whether id may be asked for at now (no recent miss), and
// forgets the misses that have aged.
func (m *responseMisses) ask(id string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.at[id]
	if ok && now.Sub(t) < responseMissMemory {
		return false
	}
	delete(m.at, id)
	return true
}

// miss records that no engine kept id at now.
func (m *responseMisses) miss(id string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.at == nil {
		m.at = map[string]time.Time{}
	}
	if len(m.at) >= maxResponseMisses { // the aged go first, else any
		for k, t := range m.at {
			if now.Sub(t) >= responseMissMemory {
				delete(m.at, k)
			}
		}
		for k := range m.at {
			if len(m.at) < maxResponseMisses {
				break
			}
			delete(m.at, k)
		}
	}
	m.at[id] = now
}

// holderOf is the endpoint that keeps response id: the one this gateway
// (or a synced peer) saw make it, else the one that answers for it when
// asked ("": none, or not asked again yet).
func (g *Gateway) holderOf(ctx context.Context, id string) string {
	if name := g.respHolders.holder(id); name != "" {
		return name
	}
	if id == "" || len(id) > maxResponseID || !g.respMisses.ask(id, g.now()) || !g.respLookups.take(g.now()) {
		return ""
	}
	ms := g.responseKeepers()
	ctx, cancel := context.WithTimeout(ctx, responseProbeTimeout)
	defer cancel()
	found := make(chan string, len(ms))
	for _, m := range ms {
		go func() { found <- g.keeps(ctx, m, id) }()
	}
	for range ms {
		if name := <-found; name != "" {
			g.respHolders.learn(id, name)
			return name
		}
	}
	if ctx.Err() == nil || len(ms) == 0 {
		g.respMisses.miss(id, g.now())
	}
	return ""
}

// responseKeepers are the endpoints that may keep a Responses API answer
// (aggregated ones: the API runs there), one per engine URL, at most
// maxResponseProbes.
func (g *Gateway) responseKeepers() []*member {
	g.mu.RLock()
	defer g.mu.RUnlock()
	seen := map[string]bool{}
	var ms []*member
	for _, mf := range g.models {
		for _, m := range mf.members {
			if m.ep.Role != fleet.RoleBoth || seen[m.ep.URL] || len(ms) == maxResponseProbes {
				continue
			}
			seen[m.ep.URL] = true
			ms = append(ms, m)
		}
	}
	return ms
}

// maxResponseProbeAnswer bounds what is read of an engine's answer.
const maxResponseProbeAnswer = 1 << 20

// keeps asks m's engine for response id: its name if it answers 200 with
// the response object of that id (an engine without the API may answer
// anything with 200).
func (g *Gateway) keeps(ctx context.Context, m *member, id string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.ep.URL+"/v1/responses/"+url.PathEscape(id), nil)
	if err != nil {
		return ""
	}
	c := *g.client // its transport (and the engines' API key), not following redirects:
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req) // an engine redirecting an id of ".." is not asked twice
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var o struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, maxResponseProbeAnswer)).Decode(&o) != nil || o.ID != id {
		return ""
	}
	return m.ep.Name
}
