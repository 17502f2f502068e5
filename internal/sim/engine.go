package sim

import (
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/internal/perfmodel"
)

// EngineConfig is one aggregated engine (prefill and decode on the same
// instance) under vLLM-style continuous batching with chunked prefill.
type EngineConfig struct {
	Model perfmodel.Model
	// MaxBatchedTokens is the token budget of one step (prefill chunk tokens
	// plus one per decoding sequence).
	MaxBatchedTokens int
	// MaxSeqs bounds the running batch; 0 means no bound.
	MaxSeqs int
}

// EngineRequest is one request offered to the engine.
type EngineRequest struct {
	Arrival float64
	// Uncached is the number of prompt tokens to compute; Context is the
	// whole prompt (cached part included), which decode attention reads.
	Uncached int
	Context  int
	Output   int
}

// EngineLatency is what a streaming client would measure.
type EngineLatency struct {
	TTFT float64
	// TPOT is the mean time between output tokens after the first (0 for
	// one-token outputs).
	TPOT float64
}

// SimulateEngine predicts each request's TTFT and TPOT on one engine. Each
// step first serves the running sequences in admission order (a prefill
// chunk for one still prefilling, one token for one decoding), then admits
// waiting requests first come first served, within the token budget; a
// step lasts perfmodel.StepTime. KV capacity is taken as ample. The engine
// emulator (internal/engine) schedules the same way, so its measured
// latencies should match these predictions.
func SimulateEngine(cfg EngineConfig, reqs []EngineRequest) ([]EngineLatency, error) {
	if err := cfg.Model.Validate(); err != nil {
		return nil, fmt.Errorf("engine sim: %w", err)
	}
	if cfg.MaxBatchedTokens <= 0 {
		return nil, fmt.Errorf("engine sim: max batched tokens must be > 0")
	}
	type state struct {
		left, out     int
		first, last   float64
		arrival       float64
		context, want int
	}
	st := make([]state, len(reqs))
	order := make([]int, len(reqs))
	for i, r := range reqs {
		if r.Uncached < 1 || r.Output < 1 || r.Context < r.Uncached {
			return nil, fmt.Errorf("engine sim: request %d needs uncached >= 1, output >= 1 and context >= uncached", i)
		}
		st[i] = state{left: r.Uncached, arrival: r.Arrival, context: r.Context, want: r.Output}
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case reqs[a].Arrival < reqs[b].Arrival:
			return -1
		case reqs[a].Arrival > reqs[b].Arrival:
			return 1
		}
		return 0
	})
	type item struct{ r, n int }
	var waiting, running []int
	var items []item
	t, next, done := 0.0, 0, 0
	for done < len(reqs) {
		for next < len(order) && st[order[next]].arrival <= t {
			waiting = append(waiting, order[next])
			next++
		}
		if len(running) == 0 && len(waiting) == 0 {
			t = st[order[next]].arrival
			continue
		}
		budget := cfg.MaxBatchedTokens
		prefill, decodes, ctx := 0, 0, 0
		items = items[:0]
		for _, r := range running {
			if budget == 0 {
				break
			}
			s := &st[r]
			if s.left > 0 {
				n := min(s.left, budget)
				items = append(items, item{r, n})
				prefill += n
				budget -= n
				continue
			}
			items = append(items, item{r, 1})
			decodes++
			ctx += s.context + s.out
			budget--
		}
		for len(waiting) > 0 && budget > 0 && (cfg.MaxSeqs <= 0 || len(running) < cfg.MaxSeqs) {
			r := waiting[0]
			waiting = waiting[1:]
			running = append(running, r)
			n := min(st[r].left, budget)
			items = append(items, item{r, n})
			prefill += n
			budget -= n
		}
		t += cfg.Model.StepTime(prefill, decodes, ctx)
		for _, it := range items {
			s := &st[it.r]
			if s.left > 0 {
				s.left -= it.n
				if s.left == 0 { // the last prefill chunk emits the first token
					s.out, s.first, s.last = 1, t, t
				}
			} else {
				s.out++
				s.last = t
			}
			if s.left == 0 && s.out == s.want {
				done++
			}
		}
		running = slices.DeleteFunc(running, func(r int) bool { return st[r].left == 0 && st[r].out == st[r].want })
	}
	out := make([]EngineLatency, len(reqs))
	for i, s := range st {
		out[i].TTFT = s.first - s.arrival
		if s.want > 1 {
			out[i].TPOT = (s.last - s.first) / float64(s.want-1)
		}
	}
	return out, nil
}
