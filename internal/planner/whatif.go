package planner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/workload"
)

// WhatIf asks the simulator — the same scheduling policy the fleet runs —
// what each candidate split would give on the recent traffic: the first of
// the two recent windows warms the caches and queues, the second is
// measured. The planner then picks by simulated SLO attainment instead of
// by the capacity formula alone.
type WhatIf struct {
	// Fleet is the simulated fleet: timing model, cache and KV sizes,
	// SLO, warm-up. Instances and Prefill are set per candidate.
	Fleet sim.PhasedConfig
	// Policy and Options build the scheduler (as the gateway does).
	Policy      string
	Options     sched.Options
	EarlyReject bool
	// Spread: candidates are the formula's split ± Spread and the current
	// split (default 2).
	Spread int
	// Every is the fewest seconds between two simulations (0: whenever the
	// split may change).
	Every float64
	// Warmup is the seconds of traffic replayed before the measured window
	// (default 120): long enough for decode batches to fill, about the
	// longest output's decode time.
	Warmup float64
	// Steady is how far (a fraction of the level) the load may be
	// forecast to move over the planner's horizon of one interval and a
	// warm-up for the simulation to be used (default 0.1): replaying the
	// recent past judges a steady load well and a ramp late, so in a ramp
	// the formula, which forecasts, decides.
	Steady float64
	// Parallel bounds concurrent simulations (default GOMAXPROCS).
	Parallel int
}

// Candidate is one simulated split.
type Candidate struct {
	Prefill    int     `json:"prefill"`
	Decode     int     `json:"decode"`
	Attainment float64 `json:"attainment"`
}

const maxSpread = 64

func (w *WhatIf) validate() error {
	if _, err := sched.New(w.Policy, w.Options); err != nil {
		return fmt.Errorf("what-if: %w", err)
	}
	if w.Spread < 0 || w.Spread > maxSpread {
		return fmt.Errorf("what-if: spread must be in [0, %d], got %d", maxSpread, w.Spread)
	}
	if !(w.Every >= 0 && w.Every <= 86400) {
		return fmt.Errorf("what-if: every must be in [0, 86400] s, got %v", w.Every)
	}
	if !(w.Warmup >= 0 && w.Warmup <= 3600) {
		return fmt.Errorf("what-if: warm-up must be in [0, 3600] s, got %v", w.Warmup)
	}
	if !(w.Steady >= 0 && w.Steady <= 10) {
		return fmt.Errorf("what-if: steady must be in [0, 10], got %v", w.Steady)
	}
	if w.Parallel < 0 || w.Parallel > 1024 {
		return fmt.Errorf("what-if: parallel must be in [0, 1024], got %d", w.Parallel)
	}
	return nil
}

// candidateSplits lists the prefill counts to simulate: cur and best ±
// spread, within [lo, hi], ascending.
func candidateSplits(best, cur, lo, hi, spread int) []int {
	if spread == 0 {
		spread = 2
	}
	var out []int
	for q := lo; q <= hi; q++ {
		if q == cur || abs(q-best) <= spread {
			out = append(out, q)
		}
	}
	return out
}

// evaluate simulates each split on tr, measuring the last window seconds.
func (w *WhatIf) evaluate(ctx context.Context, tr *workload.Trace, window float64, splits []int, total int) ([]Candidate, error) {
	if len(tr.Requests) == 0 {
		return nil, errors.New("no recent requests to replay")
	}
	par := w.Parallel
	if par == 0 {
		par = runtime.GOMAXPROCS(0)
	}
	out := make([]Candidate, len(splits))
	errs := make([]error, len(splits))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i, q := range splits {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = w.simulate(ctx, tr, window, q, total)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func (w *WhatIf) simulate(ctx context.Context, tr *workload.Trace, window float64, q, total int) (Candidate, error) {
	pol, err := sched.New(w.Policy, w.Options)
	if err != nil {
		return Candidate{}, err
	}
	cfg := w.Fleet
	cfg.Instances, cfg.Prefill, cfg.Interval = total, q, 0
	cfg.Segments = []sim.Segment{{Name: "measured", From: max(tr.Duration-window, 0), To: tr.Duration + 1}}
	res, err := sim.RunPhased(ctx, cfg, tr, sched.HoldSettings{Mode: sched.HoldNever}.Scheduler(pol, w.EarlyReject), nil)
	if err != nil {
		return Candidate{}, fmt.Errorf("what-if %dP%dD: %w", q, total-q, err)
	}
	return Candidate{Prefill: q, Decode: total - q, Attainment: res.Segments[0].Attainment}, nil
}

// simTie is how close two simulated attainments must be to count as
// equal.
const simTie = 0.002

// pickSimulated returns the candidate with the best simulated attainment
// (ties within simTie: closest to the formula's split, then to cur) and
// the gain of each simulated split over cur (unsimulated splits gain
// -Inf: never chosen).
func pickSimulated(cands []Candidate, cur, formula int) (int, func(int) float64) {
	att := map[int]float64{}
	top := math.Inf(-1)
	for _, c := range cands {
		att[c.Prefill] = c.Attainment
		top = max(top, c.Attainment)
	}
	best := -1
	for _, c := range cands {
		if c.Attainment < top-simTie {
			continue
		}
		if best < 0 || abs(c.Prefill-formula) < abs(best-formula) ||
			(abs(c.Prefill-formula) == abs(best-formula) && abs(c.Prefill-cur) < abs(best-cur)) {
			best = c.Prefill
		}
	}
	base := att[cur]
	return best, func(q int) float64 {
		a, ok := att[q]
		if !ok {
			return math.Inf(-1)
		}
		return a - base
	}
}
