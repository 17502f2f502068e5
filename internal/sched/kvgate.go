package sched

import "math"

// kvgatePolicy is kvgate's own policy (see docs/policies.md).
//
// Cost: each candidate endpoint i is scored by
//
//	cost_i = q_i + (1 + λ) · u_i / s_i
//
// where q_i is its predicted queue wait, u_i the uncached tokens it would
// compute and s_i its prefill speed: the predicted TTFT plus λ times the
// compute the choice consumes. λ is the shadow price of compute, derived
// from how full the fleet's queues are measured against the SLO: idle fleet
// λ ≈ 0 (minimise TTFT), fleet queues near the SLO λ large (save compute:
// keep affinity). Only endpoints whose predicted TTFT fits the SLO compete
// when any does; a request that fits nowhere goes down the longest queue.
type kvgatePolicy struct {
	o Options
}

// lostComputeWeight orders lost requests' endpoints of equal queue by
// compute without letting compute outweigh a queue difference.
const lostComputeWeight = 1e-6

func newKVGate(o Options) *kvgatePolicy { return &kvgatePolicy{o: o} }

func (*kvgatePolicy) Name() string { return "kvgate" }

func (p *kvgatePolicy) slo(req *Request) float64 {
	if req.SLO.TTFT > 0 {
		return req.SLO.TTFT
	}
	return p.o.TTFTSLO
}

// price is λ: the fleet's mean queue wait as a fraction of the SLO, scaled.
func (p *kvgatePolicy) price(req *Request, s *Snapshot) float64 {
	var sum float64
	n := 0
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if e.Role.CanPrefill() {
			sum += e.QueueWait
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return p.o.KVGateGain * sum / float64(n) / p.slo(req)
}

func (p *kvgatePolicy) Pick(req *Request, s *Snapshot) int {
	slo := p.slo(req)
	lambda := p.price(req, s)
	best, bestCost, bestFits := -1, math.Inf(1), false
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !e.Role.CanPrefill() {
			continue
		}
		compute := 0.0
		if e.PrefillSpeed > 0 {
			compute = float64(Uncached(req, e)) / e.PrefillSpeed
		}
		ttft := e.QueueWait + compute
		fits := ttft <= p.o.KVGateFit*slo
		cost := ttft + lambda*compute
		if !fits {
			// The request misses its SLO wherever it goes: it is lost.
			// Send it down the longest queue (least compute among
			// equals), an endpoint already written off, instead of
			// into a short queue where it would push requests that can
			// still make their SLO past it.
			cost = -e.QueueWait + lostComputeWeight*compute
		}
		switch {
		case best < 0, fits && !bestFits, fits == bestFits && (cost < bestCost || (cost == bestCost && tieBetter(s, i, best))):
			best, bestCost, bestFits = i, cost, fits
		}
	}
	return best
}
