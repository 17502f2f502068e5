package sched

// kvgatePolicy is kvgate's own policy (see docs/policy.md).
type kvgatePolicy struct {
	o Options
}

func newKVGate(o Options) *kvgatePolicy { return &kvgatePolicy{o: o} }

func (*kvgatePolicy) Name() string { return "kvgate" }

// Pick keeps affinity while it is cheap measured against the SLO: among
// endpoints whose predicted TTFT is within half the SLO it takes the longest
// cached prefix (ties by predicted TTFT); otherwise the lowest predicted TTFT.
func (p *kvgatePolicy) Pick(req *Request, s *Snapshot) int {
	slo := req.SLO.TTFT
	if slo <= 0 {
		slo = p.o.TTFTSLO
	}
	budget := 0.5 * slo
	best, bestT := -1, 0.0
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if !e.Role.CanPrefill() {
			continue
		}
		t := PredictTTFT(req, e)
		if t > budget {
			continue
		}
		if best < 0 || e.CachedTokens > s.Endpoints[best].CachedTokens ||
			(e.CachedTokens == s.Endpoints[best].CachedTokens && t < bestT) {
			best, bestT = i, t
		}
	}
	if best >= 0 {
		return best
	}
	return argBest(s, func(e *Endpoint) float64 { return PredictTTFT(req, e) }, tieBetter)
}
