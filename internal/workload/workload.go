// Package workload generates the request streams kvgate is evaluated on (the
// seed chapter's multi-turn chat, long documents, coding agents) and reads
// recorded traces (Mooncake's JSON-lines format).
//
// A request carries its prompt as chained block keys (internal/tokens), so a
// simulator can compute prefix-cache hits without holding token ids.
package workload

import "fmt"

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

// Trace is a workload materialised as requests in arrival order.
type Trace struct {
	Name      string
	BlockSize int
	// Duration is the span the arrivals cover (seconds), for rates.
	Duration float64
	Requests []Request
}

// Validate checks ordering and sizes.
func (t *Trace) Validate() error {
	if t.BlockSize <= 0 {
		return fmt.Errorf("workload %s: block size must be > 0", t.Name)
	}
	prev := 0.0
	for i := range t.Requests {
		r := &t.Requests[i]
		if r.Arrival < prev {
			return fmt.Errorf("workload %s: request %d arrives at %v before %v", t.Name, i, r.Arrival, prev)
		}
		prev = r.Arrival
		if r.PromptTokens <= 0 || len(r.Keys)*t.BlockSize > r.PromptTokens {
			return fmt.Errorf("workload %s: request %d has %d tokens and %d blocks of %d", t.Name, i, r.PromptTokens, len(r.Keys), t.BlockSize)
		}
	}
	return nil
}
