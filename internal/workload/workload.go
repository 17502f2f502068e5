// Package workload generates the request streams kvgate is evaluated on (the
// baseline chapter's multi-turn chat, long documents, coding agents, long
// prompts in conversations that come back) and reads
// recorded traces (Mooncake's JSON-lines format).
//
// A request carries its prompt as chained block keys (internal/tokens), so a
// simulator can compute prefix-cache hits without holding token ids.
package workload

import (
	"fmt"
	"math"
)

// Request is one request of a workload.
type Request struct {
	// Arrival is seconds since the start of the workload.
	Arrival      float64
	PromptTokens int
	OutputTokens int
	// Keys are the chained keys of the prompt's full blocks. Requests of one
	// conversation may share the backing array; treat it as read-only.
	Keys    []uint64
	Session int
}

// Openings reports, per request, whether it opens its conversation: the
// first request of its Session (none for requests without a session, -1).
func (t *Trace) Openings() []bool {
	opens := make([]bool, len(t.Requests))
	seen := make(map[int]struct{})
	for i := range t.Requests {
		if s := t.Requests[i].Session; s >= 0 {
			if _, ok := seen[s]; !ok {
				seen[s] = struct{}{}
				opens[i] = true
			}
		}
	}
	return opens
}

// Trace is a workload materialised as requests in arrival order.
type Trace struct {
	Name      string
	BlockSize int
	// Duration is the span the arrivals cover (seconds), for rates.
	Duration float64
	// Seed is the seed a generator drew the workload with (0 for a
	// recorded trace); the simulator reports it with each run.
	Seed     uint64
	Requests []Request
}

// Validate checks ordering and sizes: arrivals finite and in order, a
// finite Duration, at most MaxRequests requests, prompts of 1 to
// MaxPromptTokens tokens with no more full blocks than they hold, and
// outputs of 0 to MaxOutputTokens tokens.
func (t *Trace) Validate() error {
	if t.BlockSize <= 0 {
		return fmt.Errorf("workload %s: block size must be > 0", t.Name)
	}
	if !(t.Duration >= 0 && t.Duration <= math.MaxFloat64) {
		return fmt.Errorf("workload %s: duration must be finite and >= 0, got %v", t.Name, t.Duration)
	}
	if len(t.Requests) > MaxRequests {
		return fmt.Errorf("workload %s: %d requests, more than %d", t.Name, len(t.Requests), MaxRequests)
	}
	prev := 0.0
	for i := range t.Requests {
		r := &t.Requests[i]
		if !(r.Arrival >= prev) || math.IsInf(r.Arrival, 1) {
			return fmt.Errorf("workload %s: request %d arrives at %v, before %v or not at a finite time", t.Name, i, r.Arrival, prev)
		}
		prev = r.Arrival
		if r.PromptTokens <= 0 || r.PromptTokens > MaxPromptTokens || len(r.Keys) > r.PromptTokens/t.BlockSize {
			return fmt.Errorf("workload %s: request %d has %d tokens (at most %d) and %d blocks of %d", t.Name, i, r.PromptTokens, MaxPromptTokens, len(r.Keys), t.BlockSize)
		}
		if r.OutputTokens < 0 || r.OutputTokens > MaxOutputTokens {
			return fmt.Errorf("workload %s: request %d has %d output tokens, want 0 to %d", t.Name, i, r.OutputTokens, MaxOutputTokens)
		}
	}
	return nil
}
