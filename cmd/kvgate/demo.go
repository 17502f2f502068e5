package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/demo"
	"github.com/kvgate/kvgate/internal/flagrange"
)

type demoFlags struct {
	format, report, runs      string
	timeScale, rate, duration float64
	outputTokens, turnTokens  int
	replicas                  int
	unsynced                  bool
	seed                      uint64
}

// runDemo is kvgate demo: the main job on a built-in default.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f demoFlags
	fs := flag.NewFlagSet("kvgate demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fl := flagrange.New(fs)
	fs.StringVar(&f.format, "format", "table", "table or json")
	fs.StringVar(&f.report, "report", "kvgate-demo.html", "write the HTML report here (\"\": none)")
	fs.Uint64Var(&f.seed, "seed", 0, "random seed of the workload")
	fs.StringVar(&f.runs, "runs", "", "comma-separated run numbers to make (1-6; default all)")
	// The baseline chapter's chat workload runs 120 s at 40 and 70 req/s; a
	// demo has a few minutes, so it runs 40 s at 130 req/s. With 300-token
	// turns that is about a third of the fleet's prefill capacity (every
	// policy that reads the learned speeds serves it in time); with
	// --turn-tokens 600 the fleet saturates and the policies part (README).
	// At 2× real time a 2-core machine keeps up (engine lag under 4 %); at
	// 4× it did not (docs/bench.md).
	f.timeScale, f.rate, f.duration, f.outputTokens, f.turnTokens = 2, 130, 40, 16, 300
	flagrange.Var(fl, &f.timeScale, "time-scale", flagrange.Range[float64]{Min: 1, Max: 20}, "the emulated engines run this many times faster than real time")
	flagrange.Var(fl, &f.rate, "rate", flagrange.Range[float64]{Min: 1, Max: 200, Unit: "req/s"}, "arrival rate (engine time)")
	flagrange.Var(fl, &f.duration, "duration", flagrange.Range[float64]{Min: 5, Max: 600, Unit: "seconds"}, "seconds of arrivals (engine time)")
	flagrange.Var(fl, &f.outputTokens, "output-tokens", flagrange.Range[int]{Min: 2, Max: 4096, Unit: "tokens"}, "max_tokens per request")
	f.replicas = 1
	flagrange.Var(fl, &f.replicas, "replicas", flagrange.Range[int]{Min: 1, Max: 8}, "gateway replicas in front of the fleet, requests spread over them in turn, each sharing its requests in flight with the others (docs/serve.md, \"Several gateway replicas\")")
	fs.BoolVar(&f.unsynced, "unsynced", false, "with --replicas: the replicas do not share their requests in flight (each counts only its own)")
	flagrange.Var(fl, &f.turnTokens, "turn-tokens", flagrange.Range[int]{Min: 1, Max: 2048, Unit: "words"}, "words each turn adds to its conversation: the prefill load (600 saturates the fleet)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvgate demo [flags]\n\nStarts an emulated fleet and kvgate's gateway on loopback, sends the baseline\nchapter's chat workload through real HTTP for several policies and a P/D fleet,\nprints the comparison and writes an HTML report. Needs nothing but the binary.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, fl, args); err != nil {
		return err
	}
	if f.format != "table" && f.format != "json" {
		return fmt.Errorf("--format %q: table or json", f.format)
	}
	if err := outputWritable("--report", f.report); err != nil {
		return err
	}
	cfg := demo.Config{
		TimeScale: f.timeScale,
		Chat: bench.ChatConfig{Systems: 20, Sessions: 400, SystemTokens: 2048, TurnTokens: f.turnTokens, OutputTokens: f.outputTokens,
			Rate: f.rate, Duration: f.duration, Seed: f.seed},
		SLO: bench.SLO{TTFT: 2},
		Runs: []demo.RunSpec{
			{Policy: "round-robin", Prefill: 8},
			{Policy: "llmd-token-aware", Prefill: 8},
			{Policy: "predicted-ttft", Prefill: 8},
			{Policy: "kvgate", Prefill: 8},
			{Policy: "kvgate", EarlyReject: true, Prefill: 8},
			{Policy: "kvgate", EarlyReject: true, Prefill: 8, Decode: 2},
		},
	}
	for i := range cfg.Runs {
		cfg.Runs[i].Replicas, cfg.Runs[i].Unsynced = f.replicas, f.unsynced
	}
	if f.runs != "" {
		var keep []demo.RunSpec
		for _, s := range strings.Split(f.runs, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || n > len(cfg.Runs) {
				return fmt.Errorf("--runs: %q is not a run number in [1, %d]", s, len(cfg.Runs))
			}
			keep = append(keep, cfg.Runs[n-1])
		}
		cfg.Runs = keep
	}
	if f.format == "table" {
		fmt.Fprintf(stdout, "kvgate demo: 8 emulated engines (20 000 prefill tokens/s each: the simulator's timing model) running %g× faster\n"+
			"than real time; the baseline chapter's chat workload (20 system prompts of 2 048 tokens, 400 sessions, +%d words a turn)\n"+
			"at %g req/s for %g s, max_tokens %d, sent through kvgate's gateway over real HTTP; TTFT SLO 2 s. Every time below is in\n"+
			"the engines' (modelled) seconds; hit is the engines' own cached-token count.\n\n",
			f.timeScale, f.turnTokens, f.rate, f.duration, f.outputTokens)
	}
	started := time.Now()
	bar := newProgressBar(stderr, "")
	results, err := demo.Run(ctx, cfg, func(run, done, total int) {
		bar.setName(fmt.Sprintf("run %d/%d", run+1, len(cfg.Runs)))
		bar.update(done, total)
	})
	bar.finish()
	if err != nil {
		return err
	}
	return demoOutput(&f, results, time.Since(started), stdout)
}

func demoOutput(f *demoFlags, results []demo.Result, took time.Duration, stdout io.Writer) error {
	runs := make([]bench.RunResult, len(results))
	for i, r := range results {
		runs[i] = bench.RunResult{Summary: r.Summary, Records: r.Records}
	}
	// The results first, the report after: a report that cannot be
	// written costs it alone, not the minutes of the run's table.
	report := func() error {
		if f.report == "" {
			return nil
		}
		return writeReport(f.report, "kvgate demo", runs)
	}
	if f.format == "json" {
		type row struct {
			Policy      string  `json:"policy"`
			EarlyReject bool    `json:"early_reject"`
			Fleet       string  `json:"fleet"`
			Requests    int     `json:"requests"`
			Goodput     float64 `json:"goodput"`
			Attainment  float64 `json:"attainment"`
			TTFTP50     float64 `json:"ttft_p50"`
			TTFTP99     float64 `json:"ttft_p99"`
			TPOTP50     float64 `json:"tpot_p50"`
			HitRate     float64 `json:"hit_rate"`
			Rejected    float64 `json:"rejected"`
			EngineLag   float64 `json:"engine_lag"`
			Replicas    int     `json:"replicas"`
			ReplicaSync bool    `json:"replica_sync"`
		}
		out := struct {
			Runs []row `json:"runs"`
		}{}
		for _, r := range results {
			fleet := "aggregated"
			if r.Spec.Decode > 0 {
				fleet = "pd"
			}
			s := r.Summary
			out.Runs = append(out.Runs, row{Policy: r.Spec.Policy, EarlyReject: r.Spec.EarlyReject, Fleet: fleet, Requests: s.Requests,
				Goodput: s.Goodput, Attainment: s.Attainment, TTFTP50: s.TTFT.P50, TTFTP99: s.TTFT.P99, TPOTP50: s.TPOT.P50,
				HitRate: s.HitRate, Rejected: s.Rejected, EngineLag: r.EngineLag,
				Replicas: max(r.Spec.Replicas, 1), ReplicaSync: r.Spec.Replicas > 1 && !r.Spec.Unsynced})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
		return report()
	}
	ss := make([]bench.Summary, len(results))
	for i, r := range results {
		ss[i] = r.Summary
	}
	if err := bench.WriteTable(stdout, ss); err != nil {
		return err
	}
	lagWarning(stdout, f.timeScale, results)
	fmt.Fprintf(stdout, "\nTook %.0f s of wall time.\n", took.Seconds())
	if err := report(); err != nil {
		return err
	}
	if f.report != "" {
		fmt.Fprintf(stdout, "Report with plots: %s\n", f.report)
	}
	return nil
}

// lagTolerance is the engine lag (a share of a run's wall time) beyond
// which the demo warns that the machine could not keep up.
const lagTolerance = 0.05

// lagWarning tells, after the table, which runs' engines fell behind their
// timing model (engine.Engine.Lag): their latencies are the machine's, not
// the model's.
func lagWarning(w io.Writer, timeScale float64, results []demo.Result) {
	worst, at := 0.0, -1
	for i, r := range results {
		if r.EngineLag > worst {
			worst, at = r.EngineLag, i
		}
	}
	if worst <= lagTolerance {
		return
	}
	fmt.Fprintf(w, "\nwarning: the machine did not keep up: an engine of run %d (%s) fell behind its timing model for %.0f %% of the run's\n"+
		"time (CPU short of the fleet's goroutines at %g× real time), so its latencies are longer than the model's; try\n"+
		"--time-scale %g.\n", at+1, results[at].Summary.Label, 100*worst, timeScale, max(1, timeScale/2))
}
