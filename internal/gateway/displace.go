package gateway

import (
	"context"
	"errors"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/sched"
)

// Displacement (sched.Scheduler.DisplaceFor, docs/policies.md): with early
// rejection, a request rejected for the load takes the place of a request
// queued on an engine that has not started its prefill and would compute
// more. That one's upstream request is aborted (vLLM and SGLang drop a
// waiting request whose client disconnected) and its client gets the 429
// early rejection would have given it, with no compute spent; its answer's
// headers are held back until its first byte (relay), so that the 429 can
// still be sent. Aggregated requests only: a disaggregated one's prefill
// leg is answered whole, and its decode leg holds KV by then.

// errDisplaced: a queued request gave its place up.
var errDisplaced = errors.New("kvgate: displaced from the engine's queue before its prefill by a request of less compute")

// queue enters rt's attempt on p (aggregated) in its fleet's displaceable
// requests, when the scheduler displaces and the attempt was admitted
// against a TTFT target: one without (a class with none, a retry or a
// continuation of an admitted request) cannot be late, and Moore and
// Hodgson's rule never drops it (a batch request was displaced and told
// not to retry: walkthrough, 2026-12-05). It returns the attempt's
// context and the relay's start hook (nil: not entered), and the function
// that takes it out, to be deferred.
func (g *Gateway) queue(ctx context.Context, rt *routed, p *plan, fl *load.Flight) (context.Context, func() bool, func()) {
	if p.decode != nil || p.invests || !g.sched.Load().Displace || !(p.dec.SLO.TTFT > 0) {
		return ctx, nil, func() {}
	}
	qctx, cancel := context.WithCancelCause(ctx)
	q := &stoppable{m: p.prefill, flight: fl, cancel: cancel, keys: rt.prep.Keys, priority: rt.class.Priority, tenant: rt.tenant}
	p.mf.queued.add(q)
	return qctx, func() bool { return p.mf.queued.remove(q) }, func() {
		p.mf.queued.remove(q)
		cancel(nil)
	}
}

// displaceFor displaces, for req which the scheduler rejected for the load
// on fs's snapshot, the queued request sched.Scheduler.DisplaceFor picks:
// it aborts its upstream request and ends its flight now, so that the
// next snapshot shows its engine's queue without it. It reports whether
// it displaced one.
//
// Between tenants (Config.FairnessHeader; unless NoFairness) it takes the
// place of another tenant's request only while that tenant holds at least
// as many prompt tokens in flight as rt's would with rt
// (fairShare.mayDisplace).
func (g *Gateway) displaceFor(fs *fleetView, rt *routed, req *sched.Request) bool {
	sc := g.sched.Load()
	if !sc.Displace {
		return false
	}
	var qs []sched.Queued
	return g.stopPicked(fs, &fs.mf.queued, errDisplaced, g.met.displaced, func(c *stoppable, i int) bool {
		if !g.cfg.NoFairness && !g.fair.mayDisplace(rt.model, c.tenant, rt.tenant, max(rt.promptN-fs.snap.Endpoints[i].CachedTokens, 0)) {
			return false
		}
		start, compute, ok := fs.mf.load.Queued(c.flight)
		if ok {
			qs = append(qs, sched.Queued{Endpoint: i, Compute: compute, Start: start, Priority: c.priority})
		}
		return ok
	}, func() int { return sc.DisplaceFor(req, &fs.snap, qs) })
}
