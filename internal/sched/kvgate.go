package sched

import (
	"fmt"
	"math"
)

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
// when any does.
type kvgatePolicy struct {
	o Options
}

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
			// A request that misses its SLO everywhere is already lost;
			// place it where it costs the fleet least compute.
			cost = compute
		}
		switch {
		case best < 0, fits && !bestFits, fits == bestFits && (cost < bestCost || (cost == bestCost && tieBetter(s, i, best))):
			best, bestCost, bestFits = i, cost, fits
		}
	}
	return best
}

// Admit rejects a request whose predicted TTFT exceeds the SLO and, under
// pressure, one whose priced cost q + (1+λ)·compute exceeds it: when the
// fleet is short of compute, an expensive request (long uncached part)
// is shed before the cheap ones it would push past their SLO.
func (p *kvgatePolicy) Admit(req *Request, s *Snapshot, i int) (bool, string) {
	slo := p.slo(req)
	e := &s.Endpoints[i]
	compute := 0.0
	if e.PrefillSpeed > 0 {
		compute = float64(Uncached(req, e)) / e.PrefillSpeed
	}
	ttft := e.QueueWait + compute
	if ttft > slo {
		return false, fmt.Sprintf("predicted TTFT %.3fs exceeds SLO %.3fs", ttft, slo)
	}
	if p.o.KVGateShed > 0 {
		lambda := p.price(req, s) * p.o.KVGateShed
		if c := e.QueueWait + (1+lambda)*compute; c > slo {
			return false, fmt.Sprintf("shed under load: priced cost %.3fs (compute %.3fs at price %.2f) exceeds SLO %.3fs", c, compute, lambda, slo)
		}
	}
	return true, ""
}
