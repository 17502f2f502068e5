package gateway

import (
	"slices"

	"github.com/kvgate/kvgate/internal/load"
)

// Copies ahead of the conversation balance (sched.CopyPicker,
// docs/policies.md): on an idle fleet, a request that opens a
// conversation stays on the endpoint holding its shared prefix (a system
// prompt) even when kvgate's balance would move it, and the gateway
// copies that prefix to the endpoint the balance would have moved it to,
// with a request on the prompt's first tokens (the engine's own ids) and
// one output token, sent as touches are (touch.go). The next conversation
// that opens with the prefix moves there and finds it cached.

// prefixCopy is a prefix to copy (sched.Decision.CopyTokens): the first
// tokens tokens of the prompt, to endpoint to (ep in the load
// accounting), which holds cached of them and prefills at speed.
type prefixCopy struct {
	to     *member
	ep     *load.Endpoint
	tokens int
	cached int
	speed  float64
}

// copyPrefix sends the copy p asks for, if any, once rt is admitted. The
// copy is accounted in the load as the prefill it is, of what its
// endpoint lacks: the predictor times it and learns from its answer
// (unlike a touch's one token, which it does not model, a copy's compute
// inside a busy window would otherwise be taken for the window's
// requests'). Its blocks are recorded approximately in the index at
// once, as a routed request's are, so that the next conversation sees
// them before the engine's KV events; a copy that fails takes them back.
// A copy over the fleet's bound on prefix requests in flight is skipped.
func (g *Gateway) copyPrefix(rt *routed, p *plan) {
	c := p.copy
	if c == nil || rt.engineIDs == nil {
		return
	}
	if !p.mf.claimPrefixRequest() {
		g.met.copies.WithLabelValues(prefixSkipped).Inc()
		return
	}
	ids := rt.engineIDs[:min(c.tokens+1, len(rt.engineIDs))] // its prefix and one token more
	body, n := prefixBody(rt, ids, 0), len(ids)
	uncached := max(n-c.cached, 1)
	var compute float64
	if c.speed > 0 {
		compute = float64(uncached) / c.speed
	}
	keys := slices.Clone(rt.prep.Keys[:min(c.tokens/g.cfg.BlockSize, len(rt.prep.Keys))])
	fl := p.mf.load.Route(c.ep, g.clock(), load.Work{Uncached: uncached, Cached: n - uncached,
		UncachedBlocks: max(len(keys)-c.cached/g.cfg.BlockSize, 0), Keys: keys, PrefillSeconds: compute})
	g.routed(c.to, keys)
	go g.sendCopy(p.mf, c.to, fl, body, n, keys)
}

// sendCopy sends a copy's body (of n prompt tokens, the blocks keys) to
// m (sendPrefix); a copy that fails takes back its index entries.
func (g *Gateway) sendCopy(mf *modelFleet, m *member, fl *load.Flight, body []byte, n int, keys []uint64) {
	if err := g.sendPrefix(g.copyKind(), mf, m, fl, body, n); err != nil {
		g.unrouted(m, keys)
	}
}
