package sched

import "math"

// kvgatePolicy is kvgate's own policy (see docs/policies.md).
//
// Cost: each candidate endpoint i is scored by
//
//	cost_i = q_i + u_i / s_i + λ · u_i / s̄
//
// where q_i is its predicted queue wait, u_i the uncached tokens it would
// compute, s_i its prefill speed and s̄ the fleet's mean: the predicted
// TTFT plus λ times the compute the choice consumes (fleetPrice). λ is
// the shadow price of compute, derived from how full the fleet's queues
// are measured against the SLO: idle fleet λ ≈ 0 (minimise TTFT), fleet
// queues near the SLO λ large (save compute: keep affinity), a fleet
// rejecting requests for the load λ = 1000 (compute first). Only
// endpoints whose predicted TTFT fits the SLO compete when any does; a
// request that fits nowhere goes down the longest queue. An endpoint
// where the request would make the request queued last there late
// (Endpoint.TailRoom: chunked-prefill engines) ranks after every other
// that fits.
type kvgatePolicy struct {
	o Options
}

// lostComputeWeight orders lost requests' endpoints of equal queue by
// compute without letting compute outweigh a queue difference.
const lostComputeWeight = 1e-6

func newKVGate(o Options) *kvgatePolicy { return &kvgatePolicy{o: o} }

func (*kvgatePolicy) Name() string { return "kvgate" }

// HoldsLost: kvgate holds at the router what fits nowhere (hold.go).
func (*kvgatePolicy) HoldsLost() bool { return true }

// tailPenalty ranks an endpoint where a request would make a queued one
// late after every endpoint where it would not (costs are seconds, and
// λ·compute stays far below it).
const tailPenalty = 1e9

// pressurePrice is λ while the fleet is compute-bound: a second of
// compute outweighs any latency within the SLO, so among the endpoints
// that fit the one that computes least wins (ties by TTFT).
const pressurePrice = 1000

// price is λ: the fleet's mean queue wait as a fraction of the SLO, scaled
// (0 for a request without a TTFT SLO: it minimises its TTFT); while the
// fleet is compute-bound (it rejected a request for the load, with no
// prefilling endpoint idle, within KVGatePressure SLOs, which only early
// rejection does), pressurePrice. Admitted requests all fit their SLO
// then, so the latency a choice saves earns nothing; the compute it
// spends is what the next request lacks.
//
// A rejection for the load while an endpoint stood idle says the
// opposite: the fleet had the compute, but the request's prefix was
// cached only on endpoints whose queues were full. Keeping requests on
// their prefix's holders made it so; for the same window λ is 0, so that
// requests go where their TTFT is lowest, busy holders are passed over
// for idle endpoints, and the prefixes requests share are copied there.
//
// perToken is λ's price of one uncached token: λ over the fleet's mean
// prefill speed (0 when no endpoint has a speed), at which λ values
// compute (fleetPrice); an endpoint of unknown speed counts as 0 in the
// mean, as it computes nothing in kvgate's cost.
func (p *kvgatePolicy) price(req *Request, s *Snapshot) (lambda, perToken float64) {
	var queue, speeds float64
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		queue += e.QueueWait
		speeds += e.PrefillSpeed
	}
	if len(s.Endpoints) == 0 || req.SLO.TTFT <= 0 {
		return 0, 0
	}
	window := p.o.KVGatePressure * req.SLO.TTFT
	switch a, b := s.SinceLoadRejection, s.SinceIdleRejection; {
	case a > 0 && a < window:
		lambda = pressurePrice
	case b > 0 && b < window:
		lambda = 0
	default:
		lambda = p.o.KVGateGain * queue / float64(len(s.Endpoints)) / req.SLO.TTFT
	}
	if speeds > 0 {
		perToken = lambda * float64(len(s.Endpoints)) / speeds
	}
	return lambda, perToken
}

// pricing is one decision's prices: λ, and, while the fleet is
// compute-bound, how much compute a placement may spend beyond the least
// the request takes anywhere.
type pricing struct {
	lambda float64
	// perToken is λ over the fleet's mean prefill speed: λ's price of
	// one uncached token (fleetPrice).
	perToken float64
	// least is the request's least compute on any endpoint (seconds);
	// spare is how much more a placement may compute (seconds; +Inf: any).
	least, spare float64
}

// pricing is λ and, under pressure, the spare compute: the fleet's mean
// prefill (Snapshot.MeanPrefill). An endpoint that would compute more than
// that beyond the request's least recomputes a prefix another endpoint
// holds, and spends on it more than serving another request takes, which
// a fleet that is rejecting requests for lack of compute cannot afford:
// there the request counts as not fitting, and if nothing else fits it is
// rejected, as its cheapest endpoint cannot take it in time. Its own
// compute is never held against it (a long prompt competes as any other).
func (p *kvgatePolicy) pricing(req *Request, s *Snapshot) pricing {
	return p.prices(req, s).withLeast(req, s)
}

// prices is pricing without the least compute, which takes a pass over
// the endpoints of its own.
func (p *kvgatePolicy) prices(req *Request, s *Snapshot) pricing {
	pr := pricing{spare: math.Inf(1)}
	pr.lambda, pr.perToken = p.price(req, s)
	if pr.lambda >= pressurePrice && s.MeanPrefill > 0 && !math.IsInf(s.MeanPrefill, 1) {
		pr.spare = s.MeanPrefill
	}
	return pr
}

// bounded: a placement may not spend more than the spare compute beyond
// the least.
func (pr pricing) bounded() bool { return !math.IsInf(pr.spare, 1) }

// withLeast is pr with, when bounded, req's least compute on any
// endpoint of s (seconds).
func (pr pricing) withLeast(req *Request, s *Snapshot) pricing {
	if !pr.bounded() {
		return pr
	}
	pr.least = math.Inf(1)
	for i := range s.Endpoints {
		pr.least = min(pr.least, computeSeconds(req, &s.Endpoints[i]))
	}
	return pr
}

// wasteful: on e, req would recompute more than the spare compute beyond
// its least.
func (pr pricing) wasteful(compute float64) bool {
	return compute-pr.least > pr.spare
}

// cost is endpoint e's cost for req at prices pr, and whether its
// predicted TTFT fits the SLO (and, under pressure, its compute the spare).
func (p *kvgatePolicy) cost(req *Request, e *Endpoint, pr pricing) (cost float64, fits bool) {
	cost, fits, _ = p.costOf(req, e, pr)
	return cost, fits
}

// costOf is cost and e's compute for req (seconds, computeSeconds).
func (p *kvgatePolicy) costOf(req *Request, e *Endpoint, pr pricing) (cost float64, fits bool, compute float64) {
	u := Uncached(req, e)
	if e.PrefillSpeed > 0 {
		compute = float64(u) / e.PrefillSpeed
	}
	ttft := e.QueueWait + compute
	fits = req.SLO.TTFT <= 0 || ttft <= p.o.KVGateFit*req.SLO.TTFT
	if fits && pr.wasteful(compute) {
		// Under pressure, not worth its recompute: never chosen while an
		// endpoint that fits or one that is lost remains (one that
		// computes least always does: the scheduler then rejects).
		return math.Inf(1), false, compute
	}
	if !fits {
		// The request misses its SLO wherever it goes: it is lost.
		// Send it down the longest queue (least compute among equals),
		// an endpoint already written off, instead of into a short queue
		// where it would push requests that can still make their SLO
		// past it.
		return -e.QueueWait + lostComputeWeight*compute, false, compute
	}
	cost = ttft + pr.fleetPrice(u)
	if HarmsTail(req, e) {
		// Its first chunk would share the step that ends e's queue and
		// push a first token due in that step past its SLO: a request
		// already admitted would be lost for this one. Chosen only if no
		// other endpoint fits, when it is one request for the other.
		cost += tailPenalty
	}
	return cost, true, compute
}

// fleetPrice is λ times the compute of u uncached tokens valued at the
// fleet's mean speed (u times pr.perToken). λ prices the fleet's
// compute, which a request's tokens consume wherever they are computed;
// valued at each endpoint's own predicted speed instead, a learned
// speed's noise of a percent, times λ = 1000 under pressure, outweighs
// any queue, and every new conversation goes to whichever endpoint is
// believed fastest, however long its queue (docs/policies.md). An
// endpoint's own speed still counts in its TTFT.
func (pr pricing) fleetPrice(u int) float64 {
	return float64(u) * pr.perToken
}

// Costs implements CostReporter: endpoints whose TTFT fits the SLO cost
// their kvgate cost; the others, when any fits, +Inf.
func (p *kvgatePolicy) Costs(req *Request, s *Snapshot, dst []float64) []float64 {
	pr := p.pricing(req, s)
	limit := p.conversationLimit(req, s, pr)
	anyFits := false
	for i := range s.Endpoints {
		c, fits := p.cost(req, &s.Endpoints[i], pr)
		if fits && !passedOver(&s.Endpoints[i], limit) {
			anyFits = true
		}
		dst = append(dst, c)
	}
	if anyFits {
		for i := range s.Endpoints {
			if _, fits := p.cost(req, &s.Endpoints[i], pr); !fits || passedOver(&s.Endpoints[i], limit) {
				dst[i] = math.Inf(1)
			}
		}
	}
	return dst
}

func (p *kvgatePolicy) Pick(req *Request, s *Snapshot) int {
	pr := p.prices(req, s)
	if pr.bounded() && !req.OpensConversation {
		// Under pressure the spare bound needs the least compute, a pass
		// of its own; it can only turn away the endpoint that wins
		// without it, so one pass finds that winner and the least
		// together, and the bound is checked on the winner alone.
		best, least := p.pickFitting(req, s, pr)
		pr.least = least
		// The winner's compute again, one division: carried through the
		// loop instead it cost 35 ns more a decision (BenchmarkDecision64).
		if best >= 0 && !pr.wasteful(computeSeconds(req, &s.Endpoints[best])) {
			return best
		}
		return p.pick(req, s, pr)
	}
	return p.pick(req, s, pr.withLeast(req, s))
}

// pickFitting is the endpoint of least cost among those that fit the SLO,
// the spare bound aside (-1: none fits), and req's least compute.
func (p *kvgatePolicy) pickFitting(req *Request, s *Snapshot, pr pricing) (best int, least float64) {
	pr.spare = math.Inf(1)
	best, bestCost, least := -1, math.Inf(1), math.Inf(1)
	for i := range s.Endpoints {
		cost, fits, compute := p.costOf(req, &s.Endpoints[i], pr)
		least = min(least, compute)
		if fits && (best < 0 || cost < bestCost || (cost == bestCost && kvgateTie(s, i, best))) {
			best, bestCost = i, cost
		}
	}
	return best, least
}

// PickCopy implements CopyPicker: the conversation balance's move made
// ahead of time. When the balance passes over the endpoints holding the
// prompt's shared prefix for one that holds less of it (conversationLimit),
// the conversation computes the prefix once more there, a cold start on
// its first request's critical path: at light load such starts are the
// TTFT tail (docs/policies.md). So on an idle fleet (the endpoint it
// would move to, and the holder that would win without the limit, both
// with nothing queued) the request stays on the holder, and the holder's
// cached prefix is copied to the endpoint it would have moved to: the next
// conversation that opens with the prefix finds it there (the holder is
// still at the limit, the copy's endpoint is not) and moves without a
// cold start. The copy costs the compute the move would have, at a time
// its endpoint has nothing else to do; under load the move is made as
// before.
func (p *kvgatePolicy) PickCopy(req *Request, s *Snapshot) (pick, copyTo, tokens int) {
	if !req.OpensConversation {
		return p.Pick(req, s), 0, 0
	}
	pr := p.prices(req, s)
	if pr.bounded() {
		return p.Pick(req, s), 0, 0
	}
	pr = pr.withLeast(req, s)
	limit := p.conversationLimit(req, s, pr)
	if math.IsInf(limit, 1) || !twoIdle(s) {
		// No move, or no two idle endpoints to keep the request and
		// take the copy: the choice needs no second pass.
		return p.pickUnder(req, s, pr, limit), 0, 0
	}
	moved, held := p.pickBoth(req, s, pr, limit)
	if moved.i < 0 || held.i == moved.i || !copyAhead(s, held, moved) {
		return moved.i, 0, 0
	}
	return held.i, moved.i, s.Endpoints[held.i].CachedTokens
}

// twoIdle: at least two of s's endpoints have nothing queued.
func twoIdle(s *Snapshot) bool {
	n := 0
	for i := range s.Endpoints {
		if s.Endpoints[i].QueueWait <= 0 {
			if n++; n == 2 {
				return true
			}
		}
	}
	return false
}

// copyAhead: a request that the balance moves from endpoint held (its
// choice without the limit) to endpoint moved may stay on held and have
// held's cached prefix copied to moved instead: held holds more of the
// prompt and both are idle. (held fits the SLO: moved does, a finite
// limit says so, and a pick prefers what fits.)
func copyAhead(s *Snapshot, held, moved choice) bool {
	h, m := &s.Endpoints[held.i], &s.Endpoints[moved.i]
	return h.CachedTokens > m.CachedTokens && h.QueueWait <= 0 && m.QueueWait <= 0
}

// pick is Pick at prices pr (their least compute set when bounded).
func (p *kvgatePolicy) pick(req *Request, s *Snapshot, pr pricing) int {
	return p.pickUnder(req, s, pr, p.conversationLimit(req, s, pr))
}

// pickUnder is pick with the conversation limit given.
func (p *kvgatePolicy) pickUnder(req *Request, s *Snapshot, pr pricing, limit float64) int {
	best := choice{i: -1}
	for i := range s.Endpoints {
		if passedOver(&s.Endpoints[i], limit) {
			continue
		}
		cost, fits := p.cost(req, &s.Endpoints[i], pr)
		best.offer(s, i, cost, fits)
	}
	return best.i
}

// pickBoth is pickUnder at limit (moved) and without a limit (held), in
// one pass: the best of the endpoints the limit passes over, offered to
// the best of the others, is the best of all.
func (p *kvgatePolicy) pickBoth(req *Request, s *Snapshot, pr pricing, limit float64) (moved, held choice) {
	m, over := choice{i: -1}, choice{i: -1}
	for i := range s.Endpoints {
		cost, fits := p.cost(req, &s.Endpoints[i], pr)
		if passedOver(&s.Endpoints[i], limit) {
			over.offer(s, i, cost, fits)
		} else {
			m.offer(s, i, cost, fits)
		}
	}
	held = m
	if over.i >= 0 {
		held.offer(s, over.i, over.cost, over.fits)
	}
	return m, held
}

// choice is a pick's best endpoint so far: one that fits the SLO before
// one that does not, then the lower cost, then kvgateTie.
type choice struct {
	i    int // -1: none yet
	cost float64
	fits bool
}

func (c *choice) offer(s *Snapshot, i int, cost float64, fits bool) {
	switch {
	case c.i < 0, fits && !c.fits, fits == c.fits && (cost < c.cost || (cost == c.cost && kvgateTie(s, i, c.i))):
		c.i, c.cost, c.fits = i, cost, fits
	}
}

// conversationLimit bounds the conversations an endpoint may hold and
// still take req, when req opens one (consistent hashing with bounded
// loads, Mirrokni, Thorup and Zadimoghaddam 2018): a conversation lives
// where it starts, its later turns claiming that endpoint's cache and
// compute, so an endpoint that holds part of the prompt (a shared system
// prompt pulls every conversation that starts with it to its holders)
// takes req only while it would then hold at most ⌈(1 + ε) × the fleet's
// mean⌉ (passedOver). The conversation then computes the shared prefix
// once more on an endpoint with room, and the next ones that share it
// have two homes.
//
// ε is KVGateBalance × (1 + λ): passing over a holder spends compute,
// which kvgate prices at 1 + λ per second in its cost, so the imbalance
// it tolerates grows at the same rate. An idle fleet bounds at ε₀; a
// fleet whose queues near the SLO tolerates several times the mean; a
// compute-bound one (λ = pressurePrice) never passes a holder over.
//
// +Inf: no limit (req continues a conversation, balancing is off, or no
// endpoint the limit leaves fits the SLO).
func (p *kvgatePolicy) conversationLimit(req *Request, s *Snapshot, pr pricing) float64 {
	if !req.OpensConversation || p.o.KVGateBalance < 0 || len(s.Endpoints) < 2 {
		return math.Inf(1)
	}
	var sum float64
	for i := range s.Endpoints {
		sum += s.Endpoints[i].Conversations
	}
	eps := p.o.KVGateBalance * (1 + pr.lambda)
	// Holding fewer than limit, an endpoint holds at most ⌈(1 + ε)·mean⌉
	// with req (1e-9 absorbs the decayed counts' rounding).
	limit := math.Ceil((1+eps)*(sum+1)/float64(len(s.Endpoints))) - 1 + 1e-9
	for i := range s.Endpoints {
		if e := &s.Endpoints[i]; !passedOver(e, limit) {
			if _, fits := p.cost(req, e, pr); fits {
				return limit
			}
		}
	}
	// No endpoint the limit leaves fits the SLO: none is passed over.
	return math.Inf(1)
}

// passedOver: e is at the conversation limit and holds part of the
// request's prompt. An endpoint that holds none of it does not pull the
// conversation by its cache; it competes by its queue as always.
func passedOver(e *Endpoint, limit float64) bool {
	return e.Conversations >= limit && e.CachedTokens > 0
}

// kvgateTie orders endpoints of equal cost: the smaller prefix cache first
// (a new conversation lands where it evicts least, as SGLang's router
// places them), then the endpoint idle longest.
func kvgateTie(s *Snapshot, i, b int) bool {
	if hi, hb := s.Endpoints[i].HeldTokens, s.Endpoints[b].HeldTokens; hi != hb {
		return hi < hb
	}
	return tieBetter(s, i, b)
}

// PickOverdue implements OverduePicker: an overdue held request has
// missed its SLO; it goes where its TTFT plus the compute it takes, at the
// fleet's price, is lowest (q + u/s + λ·u/s̄ over every endpoint), so that
// under load it keeps to its cache.
func (p *kvgatePolicy) PickOverdue(req *Request, s *Snapshot) int {
	var pr pricing
	pr.lambda, pr.perToken = p.price(req, s)
	best, bc := -1, math.Inf(1)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		c := e.QueueWait + computeSeconds(req, e) + pr.fleetPrice(Uncached(req, e))
		if best < 0 || c < bc || (c == bc && kvgateTie(s, i, best)) {
			best, bc = i, c
		}
	}
	return best
}
