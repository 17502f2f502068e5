package sched

import (
	"fmt"
	"sync"

	"github.com/kvgate/kvgate/internal/fleet"
)

// Scheduler turns a policy's pick into a decision: it gives the policy only
// the endpoints that can compute the prompt, chooses the decode endpoint
// when the fleet is disaggregated, and applies admission (early rejection)
// when enabled.
//
// Decide never writes to the request or the snapshot it is given, and a
// Scheduler may be used by many goroutines at once (the policies are safe
// for concurrent use), so a gateway can decide several requests on one
// shared snapshot.
type Scheduler struct {
	Policy Policy
	// EarlyReject rejects a request whose predicted TTFT on the chosen
	// prefill endpoint exceeds its TTFT SLO, or whose chosen decode endpoint
	// has no KV room or would exceed its TPOT SLO, before any compute is
	// spent.
	EarlyReject bool
	// DefaultSLO fills the SLO fields a request leaves at 0. It is the one
	// place a default SLO is applied: policies and admission read the
	// request's SLO, and Decision.SLO carries the SLO the request was
	// judged by, which is the one its outcome must be measured against.
	DefaultSLO SLO
	// Explain asks for Decision.Costs (per-endpoint costs, for policies
	// that report them).
	Explain bool
	// Hold, without EarlyReject, holds at the router a request whose
	// predicted TTFT misses its SLO on every endpoint (Decision.Hold)
	// instead of queueing it on an engine: the caller pushes it into a
	// HoldQueue and ReleaseHeld dispatches it on slack or at its deadline
	// (hold.go). The deadline is arrival + HoldBacklog × the fleet's
	// backlog (default DefaultHoldBacklog), at least HoldMin SLOs
	// (default DefaultHoldMin) and at most HoldMax seconds (default
	// DefaultHoldMax). HoldSlack (SLOs, default DefaultHoldSlack): a
	// held request is released early onto an idle endpoint or one where
	// its predicted TTFT from now is within HoldSlack SLOs.
	//
	// With EarlyReject, Hold holds only a request that misses its SLO even
	// on an idle endpoint (rejecting it would turn it away on any fleet
	// state: it would starve): it is released onto an idle endpoint while
	// at least half the prefilling endpoints are idle, once no request has
	// been rejected for the load for HoldQuiet SLOs (default
	// DefaultHoldQuiet; earlier, and never, as such late answers come
	// back or not: Returns, lends), and rejected at its deadline,
	// arrival + HoldMin SLOs, if no endpoint had that slack.
	Hold                                                bool
	HoldMin, HoldBacklog, HoldMax, HoldSlack, HoldQuiet float64
	// HoldTouch turns on TouchHeld: held requests' cached prefixes are
	// kept warm (touch.go; experimental, off by default).
	HoldTouch bool
	// Displace, with EarlyReject, lets a request rejected for the load
	// take the place of a queued request that has not started and would
	// compute more (DisplaceFor; the caller runs it).
	Displace bool

	scratch sync.Pool // *view
}

// view is one decision's working copy of the candidates.
type view struct {
	snap  Snapshot
	index []int // snap.Endpoints[k] is the caller's endpoint index[k]
	costs []float64
}

// WithDefaults returns the request's SLO with the scheduler's defaults
// filled in.
func (sc *Scheduler) WithDefaults(s SLO) SLO {
	if s.TTFT <= 0 {
		s.TTFT = sc.DefaultSLO.TTFT
	}
	if s.TPOT <= 0 {
		s.TPOT = sc.DefaultSLO.TPOT
	}
	return s
}

// Decide routes one request. Decisions with Admit false carry a reason; the
// indices may still be set to show where the request would have gone.
// With a Snapshot.Forecast, the decode side is judged on its forecast for
// the end of the prefill.
func (sc *Scheduler) Decide(in *Request, s *Snapshot) Decision {
	d := sc.decide(in, s)
	if !d.Admit {
		d.CopyTo, d.CopyTokens = 0, 0 // a copy goes with the request only
	}
	return d
}

// decide is Decide, before the copy of a request it does not admit is
// dropped.
func (sc *Scheduler) decide(in *Request, s *Snapshot) Decision {
	req := *in
	req.SLO = sc.WithDefaults(req.SLO)
	v, _ := sc.scratch.Get().(*view)
	if v == nil {
		v = &view{}
	}
	defer sc.scratch.Put(v)
	cand := prefillCandidates(s, v)
	d := Decision{Prefill: -1, Decode: -1, SLO: req.SLO}
	p, copyTo, copyTokens := -1, 0, 0
	if sc.Hold && req.SLO.TTFT > 0 && len(cand.Endpoints) > 0 && !sc.fitsSomewhere(&req, cand) {
		if p = sc.keepWarm(&req, cand); p < 0 {
			sc.hold(&req, cand, &d)
			return d
		}
	}
	if p < 0 {
		p, copyTo, copyTokens = pickCopying(sc.Policy, &req, cand)
	}
	if p >= 0 && cand.Endpoints[p].Role == fleet.RolePrefill && !decodes(s) {
		// A prefill-only endpoint with nothing to decode what it prefills
		// (a fleet whose roles are changing): the endpoints that serve a
		// request alone are the candidates.
		cand = candidates(s, v, func(e *Endpoint) bool { return e.Role == fleet.RoleBoth })
		p = pickIn(sc.Policy, &req, cand)
		copyTokens = 0
	}
	if p < 0 {
		d.Reason = "no endpoint can serve the prompt"
		return d
	}
	if sc.Explain {
		d.Costs = sc.costs(&req, s, cand, v)
	}
	if v.index != nil {
		p = v.index[p]
		if copyTokens > 0 {
			copyTo = v.index[copyTo]
		}
	}
	pe := &s.Endpoints[p]
	d.Admit, d.Prefill = true, p
	if copyTokens > 0 {
		d.CopyTo, d.CopyTokens = copyTo, copyTokens
	}
	d.PredictedTTFT = PredictTTFT(&req, pe)
	d.CachedTokens = pe.CachedTokens
	if pe.Role == fleet.RolePrefill {
		var de DecodeView
		d.Decode, de = PickDecode(&req, s, s.Now+d.PredictedTTFT)
		if d.Decode < 0 {
			d.Admit, d.Reason = false, "no decode endpoint"
			return d
		}
		d.PredictedTPOT = de.TPOT
		if !sc.EarlyReject {
			return d
		}
		if sc.rejectTTFT(&req, pe, &d) {
			return d
		}
		if missesTPOT(&req, de) {
			// Before rejecting for a TPOT the fleet has measured, try
			// an endpoint it has not (ExploreDecode).
			if i, e := ExploreDecode(&req, s, s.Now+d.PredictedTTFT); i >= 0 {
				d.Decode, de, d.PredictedTPOT = i, e, e.TPOT
			}
		}
		sc.admitDecode(&req, de, &d)
		return d
	}
	if sc.EarlyReject && sc.rejectTTFT(&req, pe, &d) {
		sc.surerEndpoint(&req, cand, v, &d)
		if d.Prefill != p {
			d.CopyTo, d.CopyTokens = 0, 0 // not kept on the holder
		}
	}
	return d
}

// surerEndpoint admits on another endpoint a request rejected only for
// the pessimism of the chosen one's prediction (its predicted TTFT fits,
// its pessimistic one does not): the endpoint of lowest pessimistic TTFT,
// if that fits. Without it an endpoint whose predictor grew unsure (a
// drift) would have its requests rejected instead of observed, and would
// never be learned again.
func (sc *Scheduler) surerEndpoint(req *Request, cand *Snapshot, v *view, d *Decision) {
	if d.PredictedTTFT > req.SLO.TTFT {
		return
	}
	best, bt := -1, req.SLO.TTFT
	for k := range cand.Endpoints {
		if t := PessimisticTTFT(req, &cand.Endpoints[k]); t <= bt {
			best, bt = k, t
		}
	}
	if best < 0 {
		return
	}
	e := &cand.Endpoints[best]
	if v.index != nil {
		best = v.index[best]
	}
	d.Admit, d.Reason, d.Prefill = true, "", best
	d.PredictedTTFT, d.CachedTokens = PredictTTFT(req, e), e.CachedTokens
}

// rejectTTFT rejects a request whose pessimistic TTFT on e (the
// prediction itself unless the predictor is unsure) exceeds its SLO.
func (sc *Scheduler) rejectTTFT(req *Request, e *Endpoint, d *Decision) bool {
	if t := PessimisticTTFT(req, e); req.SLO.TTFT > 0 && t > req.SLO.TTFT {
		d.Admit = false
		d.Reason = fmt.Sprintf("predicted TTFT %.3fs (pessimistic %.3fs) exceeds SLO %.3fs", d.PredictedTTFT, t, req.SLO.TTFT)
		return true
	}
	return false
}

// admitDecode rejects a request whose sequence fits no decode endpoint's
// KV, or whose predicted TPOT on the chosen one exceeds its target
// (missesTPOT).
func (sc *Scheduler) admitDecode(req *Request, de DecodeView, d *Decision) {
	if need, ok := req.KVTokens(); !ok || de.KVFreeTokens < need {
		d.Admit, d.Reason = false, "no KV room on any decode endpoint"
		return
	}
	if missesTPOT(req, de) {
		d.Admit = false
		d.Reason = fmt.Sprintf("predicted TPOT %.4fs exceeds SLO %.4fs", de.TPOT, req.SLO.TPOT)
	}
}

// costs maps a CostReporter's per-candidate costs back onto the caller's
// endpoint indices (NaN for endpoints that were not candidates).
func (sc *Scheduler) costs(req *Request, s, cand *Snapshot, v *view) []float64 {
	cr, ok := sc.Policy.(CostReporter)
	if !ok {
		return nil
	}
	v.costs = cr.Costs(req, cand, v.costs[:0])
	out := make([]float64, len(s.Endpoints))
	if v.index == nil {
		copy(out, v.costs)
		return out
	}
	for i := range out {
		out[i] = nan
	}
	for k, i := range v.index {
		if k < len(v.costs) {
			out[i] = v.costs[k]
		}
	}
	return out
}

// pickIn is pol's choice among cand's endpoints (-1: none, or an answer
// out of range).
func pickIn(pol Policy, req *Request, cand *Snapshot) int {
	if len(cand.Endpoints) == 0 {
		return -1
	}
	if p := pol.Pick(req, cand); p >= 0 && p < len(cand.Endpoints) {
		return p
	}
	return -1
}

// Copies reports whether the policy may ask for prefix copies
// (CopyPicker), for requests that can have them (Request.CanCopy).
func (sc *Scheduler) Copies() bool {
	_, ok := sc.Policy.(CopyPicker)
	return ok
}

// pickCopying is pickIn, with the copy a CopyPicker asks for when req's
// prefix can be copied (tokens 0: none, or an answer out of range).
func pickCopying(pol Policy, req *Request, cand *Snapshot) (p, to, tokens int) {
	cp, ok := pol.(CopyPicker)
	if !ok || !req.CanCopy || len(cand.Endpoints) == 0 {
		return pickIn(pol, req, cand), 0, 0
	}
	n := len(cand.Endpoints)
	p, to, tokens = cp.PickCopy(req, cand)
	switch {
	case p < 0 || p >= n:
		return -1, 0, 0
	case tokens <= 0 || to < 0 || to >= n || to == p:
		return p, 0, 0
	}
	return p, to, min(tokens, req.PromptTokens)
}

// decodes: some endpoint of s is decode-only.
func decodes(s *Snapshot) bool {
	for i := range s.Endpoints {
		if s.Endpoints[i].Role == fleet.RoleDecode {
			return true
		}
	}
	return false
}

// prefillCandidates is candidates for the endpoints that can prefill.
// The usual fleet is all of them (s itself), which it tells with a direct
// loop, not candidates' call per endpoint: a tenth of a decision over 64
// endpoints.
func prefillCandidates(s *Snapshot, v *view) *Snapshot {
	for i := range s.Endpoints {
		if !s.Endpoints[i].Role.CanPrefill() {
			return candidates(s, v, func(e *Endpoint) bool { return e.Role.CanPrefill() })
		}
	}
	v.index = nil
	return s
}

// candidates returns s itself when every endpoint passes keep (no copy),
// else a view holding copies of the endpoints that do, with v.index
// mapping back.
func candidates(s *Snapshot, v *view, keep func(*Endpoint) bool) *Snapshot {
	all := true
	for i := range s.Endpoints {
		if !keep(&s.Endpoints[i]) {
			all = false
			break
		}
	}
	v.index = v.index[:0]
	if all {
		v.index = nil
		return s
	}
	// Every fleet-wide field of s, the view's own endpoints.
	buf := v.snap.Endpoints[:0]
	v.snap = *s
	v.snap.Endpoints = buf
	for i := range s.Endpoints {
		if keep(&s.Endpoints[i]) {
			v.snap.Endpoints = append(v.snap.Endpoints, s.Endpoints[i])
			v.index = append(v.index, i)
		}
	}
	if v.index == nil {
		v.index = []int{}
	}
	return &v.snap
}

// addInts adds two non-negative counts, reporting overflow.
func addInts(a, b int) (int, bool) {
	if a < 0 || b < 0 || a > int(^uint(0)>>1)-b {
		return 0, false
	}
	return a + b, true
}

// DecodeView is a decode endpoint's state as the decision sees it: now, or
// forecast for the end of the prefill.
type DecodeView struct {
	KVFreeTokens int
	TPOT         float64
	Streams      int
	// Unproven is the endpoint's DecodeUnproven.
	Unproven int
}

func decodeView(s *Snapshot, i int, at float64, req *Request) DecodeView {
	e := &s.Endpoints[i]
	dv := DecodeView{KVFreeTokens: e.KVFreeTokens, TPOT: e.DecodeTPOT, Streams: e.DecodeStreams, Unproven: e.DecodeUnproven}
	if s.Forecast != nil {
		// Mooncake's Conductor judges decode when the prefill ends.
		dv.KVFreeTokens, dv.TPOT = s.Forecast.ForecastDecode(i, at, req)
	}
	return dv
}

// missesTPOT: req's predicted TPOT on the decode endpoint de exceeds its
// target, and the prediction is de's own. An unproven endpoint's TPOT is
// its predictor's pool's (other endpoints' streams); judged by it, a fast
// endpoint in a pool of slower ones would be sent nothing and never
// observed (Endpoint.DecodeUnproven).
func missesTPOT(req *Request, de DecodeView) bool {
	return req.SLO.TPOT > 0 && de.TPOT > req.SLO.TPOT && de.Unproven == 0
}

// ExploreDecode is the decode endpoint to try for req when the one
// PickDecode chose would miss its TPOT target by a TPOT it has measured:
// among unproven decode endpoints (Endpoint.DecodeUnproven) with KV room
// for the whole sequence at time at and fewer streams than they still
// need to prove themselves (exploring), the one with the fewest streams
// (ties by the lower TPOT); -1 if none. Without it an unproven endpoint,
// predicted by its pool, can rank behind a proven one that misses the
// target: every request is then rejected on the proven one, and the
// unproven one, sent nothing, never shows its speed.
func ExploreDecode(req *Request, s *Snapshot, at float64) (int, DecodeView) {
	need, ok := req.KVTokens()
	if !ok {
		return -1, DecodeView{}
	}
	best := -1
	var b DecodeView
	for i := range s.Endpoints {
		if s.Endpoints[i].Role != fleet.RoleDecode || s.Endpoints[i].DecodeUnproven == 0 {
			continue
		}
		e := decodeView(s, i, at, req)
		if e.KVFreeTokens < need || !e.exploring() {
			continue
		}
		if best < 0 || e.Streams < b.Streams || (e.Streams == b.Streams && e.TPOT < b.TPOT) {
			best, b = i, e
		}
	}
	return best, b
}

// exploring: the endpoint is unproven and has fewer streams than the
// samples it still needs; one with as many has enough in flight to prove
// itself, and more sent before they report would be sent on its pool's
// prediction alone.
func (dv DecodeView) exploring() bool { return dv.Unproven > 0 && dv.Streams < dv.Unproven }

// PickDecode chooses the decode endpoint as Mooncake's Conductor does: among
// decode endpoints with KV room for the whole sequence (at time at, when a
// Forecast is set), the lowest predicted TPOT, ties by fewer streams; if none
// has room, the one with the most free KV (admission may still reject it).
// An unproven endpoint (DecodeUnproven) that has as many streams as it
// still needs to prove itself comes after every other endpoint with room.
// It returns -1 if there is no decode endpoint.
func PickDecode(req *Request, s *Snapshot, at float64) (int, DecodeView) {
	need, ok := req.KVTokens()
	if !ok {
		need = int(^uint(0) >> 1)
	}
	best, bestTier := -1, -1
	var b DecodeView
	for i := range s.Endpoints {
		if s.Endpoints[i].Role != fleet.RoleDecode {
			continue
		}
		e := decodeView(s, i, at, req)
		tier := 0 // no room
		if e.KVFreeTokens >= need {
			tier = 2
			if e.Unproven > 0 && !e.exploring() {
				tier = 1 // room, but enough streams in flight to prove it
			}
		}
		better := false
		switch {
		case best < 0, tier > bestTier:
			better = true
		case tier < bestTier:
		case tier > 0:
			better = e.TPOT < b.TPOT || (e.TPOT == b.TPOT && e.Streams < b.Streams)
		default:
			better = e.KVFreeTokens > b.KVFreeTokens
		}
		if better {
			best, bestTier, b = i, tier, e
		}
	}
	return best, b
}
