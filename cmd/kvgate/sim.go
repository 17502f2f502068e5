package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/workload"
)

type simFlags struct {
	scenario, workloadName, policies, rates, earlyReject, format, trace     string
	instances, decodeInstances, systems, sessions, systemTokens, turnTokens int
	outputTokens, blockSize, cacheBlocks, decodeKVTokens, seeds             int
	duration, sloTTFT, sloTPOT, prefillSpeed, timeScale                     float64
	seed                                                                    uint64
}

func newSimFlagSet(f *simFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvgate sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.scenario, "scenario", "", "preset: seed-routing (the seed chapter's routing experiment: 8 instances, 40 and 70 req/s, every policy with and without early rejection)")
	fs.StringVar(&f.workloadName, "workload", "chat", "workload: chat, long-documents, agents (ignored with --trace)")
	fs.StringVar(&f.trace, "trace", "", "replay a Mooncake-format JSON-lines trace (512-token hash blocks) instead of a generated workload")
	fs.Float64Var(&f.timeScale, "time-scale", 1, "multiply trace arrival times by this (0.5 = twice the rate)")
	fs.StringVar(&f.policies, "policies", "all", "comma-separated policies, or all: "+strings.Join(sched.Names(), ", "))
	fs.StringVar(&f.earlyReject, "early-reject", "both", "early rejection: on, off or both")
	fs.StringVar(&f.rates, "rates", "", "comma-separated arrival rates in req/s (default: 40,70 for chat, the phase's rate for long-documents and agents)")
	fs.IntVar(&f.instances, "instances", 8, "prefill instances")
	fs.IntVar(&f.decodeInstances, "decode-instances", 0, "decode instances (0: prefill only, TTFT measured at the end of prefill, as the seed)")
	fs.IntVar(&f.decodeKVTokens, "decode-kv-tokens", 1_000_000, "KV capacity of each decode instance in tokens")
	fs.IntVar(&f.systems, "systems", 20, "chat: system prompts")
	fs.IntVar(&f.sessions, "sessions", 400, "chat: conversations")
	fs.IntVar(&f.systemTokens, "system-tokens", 2048, "chat: tokens per system prompt")
	fs.IntVar(&f.turnTokens, "turn-tokens", 300, "chat: tokens appended per turn")
	fs.IntVar(&f.outputTokens, "output-tokens", 500, "chat: output tokens per request")
	fs.Float64Var(&f.duration, "duration", 120, "seconds of arrivals")
	fs.Uint64Var(&f.seed, "seed", 0, "random seed (workload and policies)")
	fs.IntVar(&f.seeds, "seeds", 1, "run generated workloads with seeds seed … seed+N-1 and report each (a trace is replayed once)")
	fs.Float64Var(&f.sloTTFT, "slo-ttft", 2, "TTFT SLO in seconds")
	fs.Float64Var(&f.sloTPOT, "slo-tpot", 0, "TPOT SLO in seconds (0: none; needs --decode-instances)")
	fs.Float64Var(&f.prefillSpeed, "prefill-speed", 20000, "prompt tokens per second per prefill instance")
	fs.IntVar(&f.blockSize, "block-size", 64, "block size in tokens (traces use their own 512-token blocks)")
	fs.IntVar(&f.cacheBlocks, "cache-blocks", 3000, "prefix-cache capacity per instance, in blocks of --block-size")
	fs.StringVar(&f.format, "format", "table", "output: table or json")
	return fs
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || !(v > 0) {
			return nil, fmt.Errorf("bad rate %q: want a positive number", p)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no rates given")
	}
	return out, nil
}

func parsePolicies(s string) ([]string, error) {
	if s == "all" || s == "" {
		return sched.Names(), nil
	}
	known := map[string]bool{}
	for _, n := range sched.Names() {
		known[n] = true
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if !known[p] {
			return nil, fmt.Errorf("unknown policy %q (known: %s)", p, strings.Join(sched.Names(), ", "))
		}
		out = append(out, p)
	}
	return out, nil
}

type simJob struct {
	trace  *workload.Trace
	rate   float64
	seed   uint64
	policy string
	reject bool
}

type simOutput struct {
	Runs []sim.Result `json:"runs"`
}

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f simFlags
	fs := newSimFlagSet(&f, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch f.scenario {
	case "", "seed-routing":
	default:
		return fmt.Errorf("unknown scenario %q (known: seed-routing)", f.scenario)
	}
	if f.format != "table" && f.format != "json" {
		return fmt.Errorf("unknown format %q (table or json)", f.format)
	}
	policies, err := parsePolicies(f.policies)
	if err != nil {
		return err
	}
	var rejects []bool
	switch f.earlyReject {
	case "both":
		rejects = []bool{false, true}
	case "on":
		rejects = []bool{true}
	case "off":
		rejects = []bool{false}
	default:
		return fmt.Errorf("--early-reject must be on, off or both, got %q", f.earlyReject)
	}
	if f.seeds < 1 {
		return fmt.Errorf("--seeds must be >= 1")
	}
	if f.blockSize <= 0 || f.cacheBlocks < 0 {
		return fmt.Errorf("--block-size must be > 0 and --cache-blocks >= 0")
	}
	model := perfmodel.Default()
	model.PrefillTokensPerSec = f.prefillSpeed
	cfg := sim.Config{Prefill: f.instances, Decode: f.decodeInstances, Model: model,
		CacheTokens: f.cacheBlocks * f.blockSize, DecodeKVTokens: f.decodeKVTokens,
		SLO: sched.SLO{TTFT: f.sloTTFT, TPOT: f.sloTPOT}}

	traces, err := buildTraces(&f)
	if err != nil {
		return err
	}
	var jobs []simJob
	for _, tr := range traces {
		for _, p := range policies {
			for _, rj := range rejects {
				jobs = append(jobs, simJob{trace: tr.trace, rate: tr.rate, seed: tr.seed, policy: p, reject: rj})
			}
		}
	}
	results, err := runJobs(ctx, cfg, jobs)
	if err != nil {
		return err
	}
	if f.format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(simOutput{Runs: results})
	}
	return printTable(stdout, results, f.seeds > 1, jobs)
}

type namedTrace struct {
	trace *workload.Trace
	rate  float64
	seed  uint64
}

func buildTraces(f *simFlags) ([]namedTrace, error) {
	var out []namedTrace
	for s := 0; s < f.seeds; s++ {
		seed := f.seed + uint64(s)
		if f.trace != "" {
			fh, err := os.Open(f.trace)
			if err != nil {
				return nil, err
			}
			tr, err := workload.ReadMooncake(fh, f.timeScale)
			fh.Close()
			if err != nil {
				return nil, err
			}
			return []namedTrace{{trace: tr, rate: round(float64(len(tr.Requests))/tr.Duration, 2), seed: seed}}, nil
		}
		var rates []float64
		if f.rates != "" {
			r, err := parseRates(f.rates)
			if err != nil {
				return nil, err
			}
			rates = r
		}
		switch f.workloadName {
		case "chat":
			if rates == nil {
				rates = []float64{40, 70}
			}
			for _, rate := range rates {
				tr, err := workload.Chat(workload.ChatConfig{Systems: f.systems, Sessions: f.sessions, SystemTokens: f.systemTokens,
					TurnTokens: f.turnTokens, OutputTokens: f.outputTokens, Rate: rate, Duration: f.duration, BlockSize: f.blockSize, Seed: seed})
				if err != nil {
					return nil, err
				}
				out = append(out, namedTrace{tr, rate, seed})
			}
		case "long-documents", "agents":
			c := workload.LongDocs()
			gen := workload.Docs
			if f.workloadName == "agents" {
				c, gen = workload.Agents(), workload.AgentSteps
			}
			c.Duration, c.BlockSize, c.Seed = f.duration, f.blockSize, seed
			if rates == nil {
				rates = []float64{c.Rate}
			}
			for _, rate := range rates {
				c.Rate = rate
				tr, err := gen(c)
				if err != nil {
					return nil, err
				}
				out = append(out, namedTrace{tr, rate, seed})
			}
		default:
			return nil, fmt.Errorf("unknown workload %q (chat, long-documents, agents)", f.workloadName)
		}
	}
	return out, nil
}

func round(v float64, digits int) float64 {
	p, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'f', digits, 64), 64)
	return p
}

// runJobs runs every job, in parallel over the machine's cores, and returns
// results in job order.
func runJobs(ctx context.Context, cfg sim.Config, jobs []simJob) ([]sim.Result, error) {
	results := make([]sim.Result, len(jobs))
	errs := make([]error, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				// Cache capacity is in tokens, so it stays the same
				// whatever the trace's block size.
				c := cfg
				pol, err := sched.New(j.policy, sched.Options{Seed: j.seed + 1})
				if err != nil {
					errs[i] = err
					continue
				}
				res, err := sim.Run(ctx, c, j.trace, &sched.Scheduler{Policy: pol, EarlyReject: j.reject})
				if err != nil {
					errs[i] = fmt.Errorf("%s: %w", j.policy, err)
					continue
				}
				res.Rate = j.rate
				results[i] = roundResult(res)
			}
		}()
	}
	for i := range jobs {
		if ctx.Err() != nil {
			close(next)
			wg.Wait()
			return nil, ctx.Err()
		}
		select {
		case next <- i:
		case <-ctx.Done():
			close(next)
			wg.Wait()
			return nil, ctx.Err()
		}
	}
	close(next)
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return nil, e
		}
	}
	return results, nil
}

func roundResult(r sim.Result) sim.Result {
	r.HitRate = round(r.HitRate, 4)
	r.TTFTP50 = round(r.TTFTP50, 4)
	r.TTFTP99 = round(r.TTFTP99, 4)
	r.Attainment = round(r.Attainment, 4)
	r.Rejected = round(r.Rejected, 4)
	r.Goodput = round(r.Goodput, 2)
	r.TPOTP50 = round(r.TPOTP50, 5)
	r.TPOTP99 = round(r.TPOTP99, 5)
	return r
}

func printTable(w io.Writer, rs []sim.Result, withSeed bool, jobs []simJob) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	head := "rate\tpolicy\treject\trequests\thit\tTTFT p50\tTTFT p99\tattain\trejected\tgoodput\t"
	if withSeed {
		head = "seed\t" + head
	}
	fmt.Fprintln(tw, head)
	for i, r := range rs {
		rej := "-"
		if r.EarlyReject {
			rej = "yes"
		}
		line := fmt.Sprintf("%g\t%s\t%s\t%d\t%.1f%%\t%.2fs\t%.2fs\t%.1f%%\t%.1f%%\t%.1f/s\t",
			r.Rate, r.Policy, rej, r.Requests, 100*r.HitRate, r.TTFTP50, r.TTFTP99, 100*r.Attainment, 100*r.Rejected, r.Goodput)
		if withSeed {
			line = fmt.Sprintf("%d\t", jobs[i].seed) + line
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}
