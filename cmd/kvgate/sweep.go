package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/workload"
)

// sweepMaxRequests caps each shape's workload: its duration is
// min(120 s, cap / rate) and a longer trace is cut at the cap.
const sweepMaxRequests = 15000

// sweepKinds are the workloads a shape is drawn from.
func sweepKinds() []string { return []string{"chat", "long-prompts", "long-documents", "agents"} }

// sweepShape is one fleet and workload of the randomized sweep
// (docs/sim.md, "The randomized shape sweep").
type sweepShape struct {
	Index       int     `json:"index"`
	Seed        uint64  `json:"seed"`
	Workload    string  `json:"workload"`
	Instances   int     `json:"instances"`
	CacheBlocks int     `json:"cache_blocks"`
	SLOTTFT     float64 `json:"slo_ttft"`
	Load        float64 `json:"load"`
	// Capacity is the fleet's measured prefill capacity on the workload
	// (requests/s, sim.FindCapacity); Rate = Load × Capacity.
	Capacity float64 `json:"capacity"`
	Rate     float64 `json:"rate"`
	// Duration is the generator's: min(120 s, cap / rate); Requests the
	// trace's, cut at the cap.
	Duration float64 `json:"duration"`
	Requests int     `json:"requests"`
	// The workload's parameters (those of its kind).
	Systems      int     `json:"systems,omitempty"`
	Sessions     int     `json:"sessions,omitempty"`
	SystemTokens int     `json:"system_tokens,omitempty"`
	TurnTokens   int     `json:"turn_tokens,omitempty"`
	PromptMedian int     `json:"prompt_median,omitempty"`
	PromptSigma  float64 `json:"prompt_sigma,omitempty"`
	ISL          int     `json:"isl,omitempty"`
	Hit          float64 `json:"hit,omitempty"`
	OutputTokens int     `json:"output_tokens"`
}

// drawShape draws shape seed's fleet and workload parameters (not yet its
// rate, which needs the capacity).
func drawShape(seed uint64) sweepShape {
	rng := rand.New(rand.NewPCG(seed, 0x5eed5a9e))
	logU := func(lo, hi float64) float64 { return lo * math.Exp(rng.Float64()*math.Log(hi/lo)) }
	logInt := func(lo, hi int) int { return int(math.Round(logU(float64(lo), float64(hi)))) }
	s := sweepShape{Seed: seed,
		Workload:    sweepKinds()[rng.IntN(len(sweepKinds()))],
		Instances:   logInt(4, 32),
		CacheBlocks: logInt(500, 15000),
		SLOTTFT:     round(1+4*rng.Float64(), 2),
		Load:        round(logU(0.3, 3), 3),
	}
	switch s.Workload {
	case "chat":
		s.Systems, s.Sessions = logInt(2, 100), logInt(50, 2000)
		s.SystemTokens, s.TurnTokens, s.OutputTokens = logInt(256, 8192), logInt(100, 1000), logInt(100, 1000)
	case "long-prompts":
		s.Sessions, s.PromptMedian, s.PromptSigma = logInt(32, 512), logInt(4000, 16000), round(0.8+0.5*rng.Float64(), 2)
		s.TurnTokens, s.OutputTokens = logInt(300, 3000), logInt(100, 1000)
	case "long-documents":
		s.ISL, s.OutputTokens, s.Hit = logInt(4000, 32000), logInt(100, 1000), round(0.1+0.4*rng.Float64(), 2)
	case "agents":
		s.Sessions, s.ISL, s.OutputTokens, s.Hit = logInt(50, 1000), logInt(2000, 12000), logInt(500, 3000), round(0.6+0.3*rng.Float64(), 2)
	}
	return s
}

// generator returns the shape's workload at any rate, each trace at most
// maxRequests long.
func (s *sweepShape) generator(blockSize, maxRequests int) generator {
	dur := func(rate float64) float64 { return min(120, float64(maxRequests)/rate) }
	var v func(rate float64) error
	var g func(rate float64) (*workload.Trace, error)
	switch s.Workload {
	case "chat":
		at := func(rate float64) workload.ChatConfig {
			return workload.ChatConfig{Systems: s.Systems, Sessions: s.Sessions, SystemTokens: s.SystemTokens, TurnTokens: s.TurnTokens,
				OutputTokens: s.OutputTokens, Rate: rate, Duration: dur(rate), BlockSize: blockSize, Seed: s.Seed}
		}
		v, g = func(r float64) error { return at(r).Validate() }, func(r float64) (*workload.Trace, error) { return workload.Chat(at(r)) }
	case "long-prompts":
		at := func(rate float64) workload.LongPromptConfig {
			c := workload.LongPrompts(rate)
			c.Duration, c.Sessions, c.PromptMedian, c.PromptSigma = dur(rate), s.Sessions, s.PromptMedian, s.PromptSigma
			c.TurnTokens, c.OutputTokens, c.BlockSize, c.Seed = s.TurnTokens, s.OutputTokens, blockSize, s.Seed
			return c
		}
		v, g = func(r float64) error { return at(r).Validate() }, func(r float64) (*workload.Trace, error) { return workload.LongPrompt(at(r)) }
	default:
		c, gen := workload.LongDocs(), workload.Docs
		if s.Workload == "agents" {
			c, gen = workload.Agents(), workload.AgentSteps
			c.Sessions = s.Sessions
		}
		c.ISL, c.OSL, c.Hit, c.BlockSize, c.Seed = s.ISL, s.OutputTokens, s.Hit, blockSize, s.Seed
		at := func(rate float64) workload.ShapeConfig { c := c; c.Rate, c.Duration = rate, dur(rate); return c }
		name := s.Workload
		v, g = func(r float64) error { return at(r).Validate(name) }, func(r float64) (*workload.Trace, error) { return gen(at(r)) }
	}
	return generator{validate: v, gen: func(rate float64) (*workload.Trace, error) {
		tr, err := g(rate)
		if err != nil || len(tr.Requests) <= maxRequests {
			return tr, err
		}
		tr.Requests = tr.Requests[:maxRequests]
		tr.Duration = max(tr.Requests[maxRequests-1].Arrival, 1e-3)
		return tr, nil
	}}
}

// describe is the shape in one line.
func (s *sweepShape) describe() string {
	var w string
	switch s.Workload {
	case "chat":
		w = fmt.Sprintf("%d systems × %d tokens, %d sessions, %d-token turns", s.Systems, s.SystemTokens, s.Sessions, s.TurnTokens)
	case "long-prompts":
		w = fmt.Sprintf("%d sessions, first prompts median %d sigma %g, %d-token turns", s.Sessions, s.PromptMedian, s.PromptSigma, s.TurnTokens)
	case "long-documents":
		w = fmt.Sprintf("ISL %d, shared prefix %g", s.ISL, s.Hit)
	case "agents":
		w = fmt.Sprintf("%d sessions, ISL %d, reuse %g", s.Sessions, s.ISL, s.Hit)
	}
	return fmt.Sprintf("shape %d (seed %d): %s (%s, output %d), %d instances × %d cache blocks, TTFT SLO %gs, load %g × %g req/s = %g req/s, %d requests (%.4gs of arrivals)",
		s.Index, s.Seed, s.Workload, w, s.OutputTokens, s.Instances, s.CacheBlocks, s.SLOTTFT, s.Load, s.Capacity, s.Rate, s.Requests, s.Duration)
}

// sweepShapeOut is a shape with its runs, as the JSON output carries it.
type sweepShapeOut struct {
	sweepShape
	Runs []sim.Result `json:"runs"`
}

type sweepOutput struct {
	Shapes  []sweepShapeOut `json:"shapes"`
	Ranking []rankRow       `json:"ranking"`
}

// runSweep is kvgate sim --scenario sweep: --seeds shapes from --seed on,
// every policy with each early-rejection setting, then the ranking.
func runSweep(ctx context.Context, f *simFlags, eviction sim.Eviction, policies []string, rejects []bool, stdout io.Writer, maxRequests int) error {
	model := perfmodel.Default()
	model.PrefillTokensPerSec = f.prefillSpeed
	shapes := make([]sweepShape, f.seeds)
	specs := make([]traceSpec, f.seeds)
	for i := range shapes {
		s := drawShape(f.seed + uint64(i))
		s.Index = i
		cfg := sim.Config{Prefill: s.Instances, Model: model, CacheTokens: s.CacheBlocks * f.blockSize, SLO: sched.SLO{TTFT: s.SLOTTFT}, Eviction: eviction}
		g := s.generator(f.blockSize, maxRequests)
		guess := 10 * float64(s.Instances)
		if err := g.validate(guess); err != nil {
			return fmt.Errorf("sweep shape %d: %w", i, err)
		}
		c, err := sim.FindCapacity(ctx, cfg, guess, g.gen)
		if err != nil {
			return fmt.Errorf("sweep shape %d: measuring the capacity: %w", i, err)
		}
		s.Capacity = round(c.RequestsPerSec, 2)
		s.Rate = round(s.Load*c.RequestsPerSec, 2)
		if err := g.validate(s.Rate); err != nil {
			return fmt.Errorf("sweep shape %d at %g req/s: %w", i, s.Rate, err)
		}
		rate, scfg := s.Rate, cfg
		specs[i] = traceSpec{seed: s.Seed, rate: rate, load: s.Load, capacity: s.Capacity, cfg: &scfg,
			build: func() (*workload.Trace, error) { return g.gen(rate) }}
		shapes[i] = s
	}
	if err := writeFirstTrace(f.writeTrace, specs); err != nil {
		return err
	}
	results, _, err := runJobs(ctx, sim.Config{}, specs, policies, rejects, []string{""}, f.holdSettings())
	if err != nil {
		return err
	}
	per := len(policies) * len(rejects)
	out := sweepOutput{}
	byShape := make([][]sim.Result, len(shapes))
	for i, s := range shapes {
		byShape[i] = results[i*per : (i+1)*per]
		s.Requests = byShape[i][0].Requests
		s.Duration = round(min(120, float64(maxRequests)/s.Rate), 3)
		shapes[i] = s
		out.Shapes = append(out.Shapes, sweepShapeOut{sweepShape: s, Runs: byShape[i]})
	}
	out.Ranking = rankPolicies(byShape)
	if f.format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	for i := range shapes {
		fmt.Fprintln(stdout, shapes[i].describe())
		if err := printTable(stdout, byShape[i]); err != nil {
			return err
		}
		fmt.Fprintln(stdout)
	}
	return printRanking(stdout, out.Ranking, len(shapes))
}

// rankRow is one policy's standing over the sweep's shapes in one mode.
type rankRow struct {
	EarlyReject    bool    `json:"early_reject"`
	Policy         string  `json:"policy"`
	MeanAttainment float64 `json:"mean_attainment"`
	// MeanRank: its rank by attainment on each shape (1 = best; tied
	// policies share the mean of their ranks), averaged.
	MeanRank float64 `json:"mean_rank"`
	// Won: shapes where no policy attains more (ties all win).
	Won int `json:"won"`
	// MeanP99Ratio: its TTFT p99 over the lowest p99 of the shape's
	// policies, averaged over the shapes where that lowest p99 is > 0.
	MeanP99Ratio float64 `json:"mean_p99_ratio"`
}

// rankPolicies ranks the policies in each early-rejection mode; byShape
// holds each shape's runs (every policy in every mode). Rows come by mode
// (without rejection first), then by mean rank, then by name.
func rankPolicies(byShape [][]sim.Result) []rankRow {
	type key struct {
		reject bool
		policy string
	}
	type acc struct {
		attain, rank, ratio float64
		n, won, nRatio      int
	}
	sums := map[key]*acc{}
	for _, runs := range byShape {
		for _, reject := range []bool{false, true} {
			var mode []sim.Result
			for _, r := range runs {
				if r.EarlyReject == reject {
					mode = append(mode, r)
				}
			}
			if len(mode) == 0 {
				continue
			}
			best, lowP99 := math.Inf(-1), math.Inf(1)
			for _, r := range mode {
				best, lowP99 = max(best, r.Attainment), min(lowP99, r.TTFTP99)
			}
			for _, r := range mode {
				above, tied := 0, 0
				for _, o := range mode {
					switch {
					case o.Attainment > r.Attainment:
						above++
					case o.Attainment == r.Attainment:
						tied++ // r itself included
					}
				}
				a := sums[key{reject, r.Policy}]
				if a == nil {
					a = &acc{}
					sums[key{reject, r.Policy}] = a
				}
				a.n++
				a.attain += r.Attainment
				a.rank += float64(above) + float64(tied+1)/2
				if r.Attainment == best {
					a.won++
				}
				if lowP99 > 0 {
					a.ratio += r.TTFTP99 / lowP99
					a.nRatio++
				}
			}
		}
	}
	var rows []rankRow
	for k, a := range sums {
		row := rankRow{EarlyReject: k.reject, Policy: k.policy, MeanAttainment: round(a.attain/float64(a.n), 4),
			MeanRank: round(a.rank/float64(a.n), 3), Won: a.won}
		if a.nRatio > 0 {
			row.MeanP99Ratio = round(a.ratio/float64(a.nRatio), 3)
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(x, y rankRow) int {
		switch {
		case x.EarlyReject != y.EarlyReject:
			if y.EarlyReject {
				return -1
			}
			return 1
		case x.MeanRank != y.MeanRank:
			if x.MeanRank < y.MeanRank {
				return -1
			}
			return 1
		}
		return strings.Compare(x.Policy, y.Policy)
	})
	return rows
}

func printRanking(w io.Writer, rows []rankRow, shapes int) error {
	fmt.Fprintf(w, "ranking over %d shapes (rank by attainment, 1 = best; p99 ratio: TTFT p99 / the shape's lowest)\n", shapes)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "reject\tpolicy\tmean attain\tmean rank\twon\tmean p99 ratio\t")
	for _, r := range rows {
		rej := "-"
		if r.EarlyReject {
			rej = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f%%\t%.2f\t%d\t%.2f\t\n", rej, r.Policy, 100*r.MeanAttainment, r.MeanRank, r.Won, r.MeanP99Ratio)
	}
	return tw.Flush()
}
