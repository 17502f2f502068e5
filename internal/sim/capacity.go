package sim

import (
	"context"
	"fmt"

	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// Capacity is a fleet's prefill capacity on a workload: the request rate
// its prefill instances can compute when each request computes the mean
// uncached part a cache-affine router leaves it.
type Capacity struct {
	// RequestsPerSec = prefill instances × prefill speed / MeanUncached.
	RequestsPerSec float64 `json:"requests_per_s"`
	// MeanPrompt and MeanUncached are the mean prompt tokens and the mean
	// tokens computed per request under cache-only routing (longest cached
	// prefix first) without rejection.
	MeanPrompt   float64 `json:"mean_prompt_tokens"`
	MeanUncached float64 `json:"mean_uncached_tokens"`
}

// MeasureCapacity replays tr on the fleet under cache-only routing and
// returns the fleet's prefill capacity on it. Only the prefill fleet
// counts: decode instances, a fleet truth and the SLO are ignored, and
// every instance computes at cfg.Model's speed.
func MeasureCapacity(ctx context.Context, cfg Config, tr *workload.Trace) (Capacity, error) {
	cfg.Decode, cfg.Truth, cfg.Predictor, cfg.BatchingEngines, cfg.OnDecision, cfg.SLO = 0, nil, "", false, nil, sched.SLO{}
	if len(tr.Requests) == 0 {
		return Capacity{}, fmt.Errorf("sim: capacity of workload %s: no requests", tr.Name)
	}
	pol, err := sched.New("cache-only", sched.Options{})
	if err != nil {
		return Capacity{}, err
	}
	res, err := Run(ctx, cfg, tr, &sched.Scheduler{Policy: pol})
	if err != nil {
		return Capacity{}, fmt.Errorf("sim: capacity of workload %s: %w", tr.Name, err)
	}
	var tok float64
	for i := range tr.Requests {
		tok += float64(tr.Requests[i].PromptTokens)
	}
	c := Capacity{MeanPrompt: tok / float64(len(tr.Requests))}
	// At least one token: a workload the cache holds entirely would have
	// an unbounded capacity.
	c.MeanUncached = max(c.MeanPrompt*(1-res.HitRate), 1)
	c.RequestsPerSec = float64(cfg.Prefill) * cfg.Model.PrefillTokensPerSec / c.MeanUncached
	return c, nil
}

// FindCapacity measures the fleet's capacity on a generated workload whose
// rate gen sets. The cache's reuse varies a little with the number of
// requests (the warm-up's share), so the capacity is taken at a rate equal
// to itself: a trace at guess gives a first estimate, a trace at that
// estimate the answer.
func FindCapacity(ctx context.Context, cfg Config, guess float64, gen func(rate float64) (*workload.Trace, error)) (Capacity, error) {
	var c Capacity
	rate := guess
	for range 2 {
		tr, err := gen(rate)
		if err != nil {
			return Capacity{}, err
		}
		if c, err = MeasureCapacity(ctx, cfg, tr); err != nil {
			return Capacity{}, err
		}
		rate = c.RequestsPerSec
	}
	return c, nil
}
