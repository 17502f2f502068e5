package gateway

import (
	"slices"
	"sync"
)

// A request's output length plans the decode side: the KV room its
// sequence needs on a decode endpoint (sched.PickDecode, and early
// rejection's "no KV room") and the planner's traffic. max_tokens is only
// a bound, and agents send large ones (Claude Code and opencode 32 000,
// where their answers are a few hundred tokens): planned at max_tokens, a
// P/D fleet reserves a whole context per stream and rejects for KV room
// it has. So once a model's answers have been seen, a request's output is
// planned at their 95th percentile, within its own max_tokens.

const (
	// outputWindow is how many of a model's latest answers are kept.
	outputWindow = 512
	// outputMinSamples is how many answers the percentile needs first;
	// before, max_tokens (or defaultOutputTokens without it) plans.
	outputMinSamples = 64
	// outputRefresh is how many answers pass between recomputations of
	// the percentile (a sort of the window).
	outputRefresh = 32
)

// outputLengths keeps the output lengths (tokens per sequence) of a
// model's latest answers and their 95th percentile. Safe for concurrent
// use.
type outputLengths struct {
	mu      sync.Mutex
	ring    [outputWindow]int32
	n, next int // samples kept; the slot the next one goes to
	since   int // samples since p95 was computed
	p95     int // 0: not enough samples yet
}

// observe records an answer of tokens output tokens per sequence.
func (o *outputLengths) observe(tokens int) {
	if tokens <= 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ring[o.next] = int32(min(tokens, maxOutputTokens))
	o.next = (o.next + 1) % outputWindow
	o.n = min(o.n+1, outputWindow)
	o.since++
	if o.n >= outputMinSamples && (o.p95 == 0 || o.since >= outputRefresh) {
		s := slices.Clone(o.ring[:o.n])
		slices.Sort(s)
		o.p95, o.since = int(s[(o.n*95+99)/100-1]), 0
	}
}

// planned is the output length to plan a request at: limit (its
// max_tokens, or defaultOutputTokens when it set none: limited false),
// or the answers' 95th percentile once known, within a limit set.
func (o *outputLengths) planned(limit int, limited bool) int {
	o.mu.Lock()
	p := o.p95
	o.mu.Unlock()
	switch {
	case p == 0:
		return limit
	case limited:
		return min(limit, p)
	}
	return p
}
