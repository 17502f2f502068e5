package sched

import "fmt"

// Scheduler turns a policy's pick into a decision: it chooses the decode
// endpoint when the fleet is disaggregated and applies admission (early
// rejection) when enabled.
type Scheduler struct {
	Policy Policy
	// EarlyReject rejects a request whose predicted TTFT on the chosen
	// prefill endpoint exceeds its TTFT SLO, or whose chosen decode endpoint
	// has no KV room or would exceed its TPOT SLO, before any compute is
	// spent.
	EarlyReject bool
}

// Decide routes one request. Decisions with Admit false carry a reason; the
// indices may still be set to show where the request would have gone. With
// a Snapshot.Forecast, Decide overwrites the decode endpoints' KVFreeTokens
// and DecodeTPOT with their forecasts for the end of the prefill.
func (sc *Scheduler) Decide(req *Request, s *Snapshot) Decision {
	p := sc.Policy.Pick(req, s)
	if p < 0 || p >= len(s.Endpoints) || !s.Endpoints[p].Role.CanPrefill() {
		return Decision{Prefill: -1, Decode: -1, Reason: "no endpoint can serve the prompt"}
	}
	pe := &s.Endpoints[p]
	d := Decision{
		Admit:         true,
		Prefill:       p,
		Decode:        -1,
		PredictedTTFT: PredictTTFT(req, pe),
		CachedTokens:  pe.CachedTokens,
	}
	if pe.Role == RolePrefill {
		if s.Forecast != nil {
			// Mooncake's Conductor judges decode when the prefill ends:
			// refresh the decode endpoints' room and TPOT for that time.
			at := s.Now + d.PredictedTTFT
			for i := range s.Endpoints {
				if e := &s.Endpoints[i]; e.Role == RoleDecode {
					e.KVFreeTokens, e.DecodeTPOT = s.Forecast.ForecastDecode(i, at, req)
				}
			}
		}
		d.Decode = PickDecode(req, s)
		if d.Decode < 0 {
			d.Admit, d.Reason = false, "no decode endpoint"
			return d
		}
		d.PredictedTPOT = s.Endpoints[d.Decode].DecodeTPOT
	}
	if !sc.EarlyReject {
		return d
	}
	if req.SLO.TTFT > 0 && d.PredictedTTFT > req.SLO.TTFT {
		d.Admit = false
		d.Reason = fmt.Sprintf("predicted TTFT %.3fs exceeds SLO %.3fs", d.PredictedTTFT, req.SLO.TTFT)
		return d
	}
	if d.Decode >= 0 {
		de := &s.Endpoints[d.Decode]
		if de.KVFreeTokens < req.PromptTokens+req.OutputTokens {
			d.Admit, d.Reason = false, "no KV room on any decode endpoint"
			return d
		}
		if req.SLO.TPOT > 0 && de.DecodeTPOT > req.SLO.TPOT {
			d.Admit = false
			d.Reason = fmt.Sprintf("predicted TPOT %.4fs exceeds SLO %.4fs", de.DecodeTPOT, req.SLO.TPOT)
			return d
		}
	}
	return d
}

// PickDecode chooses the decode endpoint as Mooncake's Conductor does: among
// decode endpoints with KV room for the whole sequence, the lowest predicted
// TPOT, ties by fewer streams; if none has room, the one with the most free
// KV (admission may still reject it). -1 if there is no decode endpoint.
func PickDecode(req *Request, s *Snapshot) int {
	need := req.PromptTokens + req.OutputTokens
	best, roomy := -1, false
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if e.Role != RoleDecode {
			continue
		}
		fits := e.KVFreeTokens >= need
		if best < 0 {
			best, roomy = i, fits
			continue
		}
		b := &s.Endpoints[best]
		switch {
		case fits && !roomy:
			best, roomy = i, true
		case fits == roomy && fits:
			if e.DecodeTPOT < b.DecodeTPOT || (e.DecodeTPOT == b.DecodeTPOT && e.DecodeStreams < b.DecodeStreams) {
				best = i
			}
		case fits == roomy:
			if e.KVFreeTokens > b.KVFreeTokens {
				best = i
			}
		}
	}
	return best
}
