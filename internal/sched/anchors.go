package sched

import "math"

// sglangCacheAware is SGLang router's cache-aware policy (sgl-router's
// cache_aware). Load is the number of in-flight requests. When the pool is
// imbalanced (max-min > abs and max > rel*min) it routes to the least
// loaded endpoint; otherwise to the endpoint with the longest prefix match
// if the match rate exceeds the threshold, else to the endpoint with the
// smallest radix tree (the fewest cached tokens in all, HeldTokens: "the
// most available cache capacity"), ties to the least loaded, then the
// first. Among endpoints with equal longest matches (the tenants of the
// deepest matched radix-tree node) the least loaded one wins, then the
// first.
//
// With leastLoad set it is the variant sglang-least-load, whose low-match
// branch goes to the least loaded endpoint instead of the smallest tree.
type sglangCacheAware struct {
	o         Options
	leastLoad bool
}

func (p *sglangCacheAware) Name() string {
	if p.leastLoad {
		return "sglang-least-load"
	}
	return "sglang-cache-aware"
}

func (p *sglangCacheAware) Pick(req *Request, s *Snapshot) int {
	minL, maxL := math.MaxInt, -1
	least, bestMatch := -1, -1
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		l := e.InflightRequests
		if l < minL {
			minL, least = l, i
		}
		if l > maxL {
			maxL = l
		}
		if bestMatch < 0 || e.CachedTokens > s.Endpoints[bestMatch].CachedTokens ||
			(e.CachedTokens == s.Endpoints[bestMatch].CachedTokens && l < s.Endpoints[bestMatch].InflightRequests) {
			bestMatch = i
		}
	}
	if least < 0 {
		return -1
	}
	if float64(maxL-minL) > p.o.SGLangBalanceAbs && float64(maxL) > p.o.SGLangBalanceRel*float64(minL) {
		return least
	}
	if req.PromptTokens > 0 && float64(s.Endpoints[bestMatch].CachedTokens)/float64(req.PromptTokens) > p.o.SGLangCacheThreshold {
		return bestMatch
	}
	if p.leastLoad {
		return least
	}
	return smallestTree(s)
}

// smallestTree returns the endpoint holding the fewest cached tokens, ties
// to the least loaded, then the first.
func smallestTree(s *Snapshot) int {
	best := -1
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if best < 0 {
			best = i
			continue
		}
		b := &s.Endpoints[best]
		if e.HeldTokens < b.HeldTokens || (e.HeldTokens == b.HeldTokens && e.InflightRequests < b.InflightRequests) {
			best = i
		}
	}
	return best
}

// llmdTokenAware is llm-d's matched configuration: the prefix-cache affinity
// filter keeps endpoints holding at least LLMDAffinity of the prompt's blocks
// unless the best sticky endpoint's estimated TTFT (in-flight uncached tokens
// / prefill speed) exceeds the best non-sticky one's by more than the
// penalty; the token-load scorer (or the active-request scorer in the
// decode-bound variant) then picks the highest score, ties at random.
type llmdTokenAware struct {
	o   Options
	rng *lockedRand
}

func (*llmdTokenAware) Name() string { return "llmd-token-aware" }

func estTTFT(e *Endpoint) float64 {
	if e.PrefillSpeed <= 0 {
		return 0
	}
	return float64(e.InflightUncached) / e.PrefillSpeed
}

// filter reports whether the affinity filter applies, and which endpoints
// it keeps.
func (p *llmdTokenAware) filter(req *Request, s *Snapshot) (bool, func(*Endpoint) bool) {
	bestSticky, bestOther := math.Inf(1), math.Inf(1)
	nSticky := 0
	sticky := func(e *Endpoint) bool {
		if req.PromptBlocks <= 0 || s.BlockSize <= 0 {
			return false
		}
		return float64(e.CachedTokens/s.BlockSize) >= p.o.LLMDAffinity*float64(req.PromptBlocks)
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		t := estTTFT(e)
		if sticky(e) {
			nSticky++
			bestSticky = min(bestSticky, t)
		} else {
			bestOther = min(bestOther, t)
		}
	}
	return nSticky > 0 && !(bestSticky-bestOther > p.o.LLMDTTFTPenalty), sticky
}

// score is the token-load scorer (or, decode-bound, the active-request
// scorer): higher is better.
func (p *llmdTokenAware) score(req *Request, e *Endpoint) float64 {
	if p.o.LLMDDecodeBound {
		return -float64(e.InflightRequests)
	}
	capTokens := p.o.LLMDTokenLoadCap
	if capTokens <= 0 {
		capTokens = 2 * e.PrefillSpeed
	}
	return 1 - math.Min(1, float64(e.InflightUncached+Uncached(req, e))/capTokens)
}

func (p *llmdTokenAware) Pick(req *Request, s *Snapshot) int {
	useFilter, sticky := p.filter(req, s)
	best, bestScore := -1, math.Inf(-1)
	var tieBuf [64]int
	ties := tieBuf[:0]
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if useFilter && !sticky(e) {
			continue
		}
		score := p.score(req, e)
		switch {
		case best < 0 || score > bestScore:
			best, bestScore = i, score
			ties = append(ties[:0], i)
		case score == bestScore:
			ties = append(ties, i)
		}
	}
	if len(ties) > 1 {
		return ties[p.rng.IntN(len(ties))]
	}
	return best
}

// llmdBlend is llm-d's previous default: a weighted sum of the prefix match
// ratio, a queue score (in-flight requests, min-max normalised), KV free
// fraction and an LRU score (time since last picked, normalised).
type llmdBlend struct {
	o   Options
	rng *lockedRand
}

func (*llmdBlend) Name() string { return "llmd-weighted-blend" }
func (p *llmdBlend) Pick(req *Request, s *Snapshot) int {
	minQ, maxQ := math.MaxInt, math.MinInt
	oldest, newest := math.Inf(1), math.Inf(-1)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		minQ, maxQ = min(minQ, e.InflightRequests), max(maxQ, e.InflightRequests)
		oldest, newest = min(oldest, e.LastPicked), max(newest, e.LastPicked)
	}
	best, bestScore, nTies := -1, math.Inf(-1), 0
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		prefix := 0.0
		if req.PromptTokens > 0 {
			prefix = float64(e.CachedTokens) / float64(req.PromptTokens)
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-e.InflightRequests) / float64(maxQ-minQ)
		}
		lru := 1.0
		if newest > oldest {
			lru = (newest - e.LastPicked) / (newest - oldest)
		}
		score := p.o.BlendPrefix*prefix + p.o.BlendQueue*queue + p.o.BlendKV*(1-e.KVUsage) + p.o.BlendLRU*lru
		switch {
		case best < 0 || score > bestScore:
			best, bestScore, nTies = i, score, 1
		case score == bestScore:
			nTies++
			if p.rng.IntN(nTies) == 0 { // reservoir choice among ties
				best = i
			}
		}
	}
	return best
}

// dynamoKV is Dynamo's KV router cost: prefill_scale × max(active prefill
// blocks + prompt blocks − overlap blocks, 0) + active decode blocks + prompt
// blocks; the lowest cost wins (ties at random), or with a temperature > 0 a
// softmax sample over the normalised negative costs.
type dynamoKV struct {
	o   Options
	rng *lockedRand
}

func (*dynamoKV) Name() string { return "dynamo-kv" }

// Signals: Dynamo's cost reads the active block counts.
func (*dynamoKV) Signals() Signals { return SignalActiveBlocks }
func (p *dynamoKV) Pick(req *Request, s *Snapshot) int {
	var costBuf [64]float64
	costs := costBuf[:0]
	best, bestCost, nTies := -1, math.Inf(1), 0
	minC, maxC := math.Inf(1), math.Inf(-1)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		c := p.cost(req, s, e)
		costs = append(costs, c)
		minC, maxC = min(minC, c), max(maxC, c)
		switch {
		case best < 0 || c < bestCost:
			best, bestCost, nTies = i, c, 1
		case c == bestCost:
			nTies++
			if p.rng.IntN(nTies) == 0 {
				best = i
			}
		}
	}
	if best < 0 || p.o.DynamoTemperature <= 0 || maxC == minC {
		return best
	}
	// Softmax over normalised logits -cost, as Dynamo samples when its
	// temperature is positive.
	var sum float64
	w := make([]float64, len(costs))
	for i, c := range costs {
		w[i] = math.Exp(-((c - minC) / (maxC - minC)) / p.o.DynamoTemperature)
		sum += w[i]
	}
	r := p.rng.Float64() * sum
	for i, x := range w {
		if r < x {
			return i
		}
		r -= x
	}
	return best
}

// Costs implements CostReporter: Dynamo's cost.
func (p *dynamoKV) Costs(req *Request, s *Snapshot, dst []float64) []float64 {
	for i := range s.Endpoints {
		dst = append(dst, p.cost(req, s, &s.Endpoints[i]))
	}
	return dst
}

func (p *dynamoKV) cost(req *Request, s *Snapshot, e *Endpoint) float64 {
	overlap := e.CachedTokens / max(s.BlockSize, 1)
	prefill := math.Max(float64(e.ActivePrefillBlocks+req.PromptBlocks-overlap), 0)
	return p.o.DynamoPrefillScale*prefill + float64(e.ActiveDecodeBlocks+req.PromptBlocks)
}

// Costs implements CostReporter: 1 − the token-load score, +Inf for
// endpoints the affinity filter drops.
func (p *llmdTokenAware) Costs(req *Request, s *Snapshot, dst []float64) []float64 {
	useFilter, sticky := p.filter(req, s)
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if useFilter && !sticky(e) {
			dst = append(dst, math.Inf(1))
			continue
		}
		dst = append(dst, -p.score(req, e))
	}
	return dst
}
