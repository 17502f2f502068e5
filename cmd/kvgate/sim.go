package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/workload"
)

type simFlags struct {
	scenario, workloadName, policies, rates, earlyReject, format, trace     string
	predictors, hold, loads, observe, eviction, writeTrace, eventsAt        string
	promptSigma, turns                                                      float64
	promptMedian, contextTokens                                             int
	spread, noise, driftFactor                                              float64
	instances, decodeInstances, systems, sessions, systemTokens, turnTokens int
	outputTokens, blockSize, cacheBlocks, decodeKVTokens, seeds             int
	engineSteps                                                             int
	duration, sloTTFT, sloTPOT, prefillSpeed, timeScale                     float64
	eventLag, approxTTL                                                     float64
	holdMin, holdBacklog, holdMax, holdSlack, holdQuiet                     float64
	seed                                                                    uint64
	holdTouch                                                               bool
	displace                                                                string
}

// simLimits are the ranges of kvgate sim's own numeric flags; the workload
// and timing-model flags take theirs from workload.ParamLimits and
// perfmodel.ModelLimits.
type simLimits struct {
	instances, decodeInstances, decodeKVTokens, cacheBlocks, seeds flagrange.Range[int]
	engineSteps                                                    flagrange.Range[int]
	sloTTFT, sloTPOT                                               flagrange.Range[float64]
	eventLag, approxTTL                                            flagrange.Range[float64]
	spread, noise, driftFactor                                     flagrange.Range[float64]
	holdMin, holdBacklog, holdMax, holdSlack, holdQuiet            flagrange.Range[float64]
	load                                                           flagrange.Range[float64]
}

func simRanges() simLimits {
	return simLimits{
		instances:       flagrange.Range[int]{Min: 1, Max: 4096},
		decodeInstances: flagrange.Range[int]{Min: 0, Max: 4096},
		decodeKVTokens:  flagrange.Range[int]{Min: 1, Max: 1 << 34, Unit: "tokens"},
		cacheBlocks:     flagrange.Range[int]{Min: 1, Max: maxCacheBlocks, Unit: "blocks"},
		seeds:           flagrange.Range[int]{Min: 1, Max: 1000},
		engineSteps:     flagrange.Range[int]{Min: 1, Max: sim.MaxStepTokens, Unit: "tokens", Zero: "each prompt prefilled whole, one after another"},
		sloTTFT:         flagrange.Range[float64]{Min: 0.001, Max: 86400, Unit: "seconds", Zero: "none"},
		sloTPOT:         flagrange.Range[float64]{Min: 0.0001, Max: 3600, Unit: "seconds", Zero: "none"},
		eventLag:        flagrange.Range[float64]{Min: 0.000001, Max: 3600, Unit: "seconds", Zero: "the router knows every cache exactly"},
		approxTTL:       flagrange.Range[float64]{Min: 0.001, Max: 86400, Unit: "seconds", Zero: "none"},
		spread:          flagrange.Range[float64]{Min: 1, Max: 100},
		noise:           flagrange.Range[float64]{Min: 0.001, Max: 2, Zero: "none"},
		driftFactor:     flagrange.Range[float64]{Min: 0.01, Max: 100},
		holdMin:         flagrange.Range[float64]{Min: 0.01, Max: 1000, Unit: "SLOs"},
		holdBacklog:     flagrange.Range[float64]{Min: 0.01, Max: 1000},
		holdMax:         flagrange.Range[float64]{Min: 0.001, Max: 86400, Unit: "seconds"},
		holdSlack:       flagrange.Range[float64]{Min: 0.001, Max: 1, Unit: "SLOs"},
		holdQuiet:       flagrange.Range[float64]{Min: 0.001, Max: 100000, Unit: "SLOs"},
		load:            flagrange.Range[float64]{Min: 0.01, Max: 100, Unit: "× capacity"},
	}
}

const (
	// maxCacheBlocks bounds the prefix-cache blocks of the whole simulated
	// fleet (instances × blocks per instance): the simulator allocates
	// every instance's cache up front, about 60 bytes a block.
	maxCacheBlocks = 1 << 23
	// maxRates bounds the --rates list.
	maxRates = 64
)

func newSimFlagSet(f *simFlags, stderr io.Writer) (*flag.FlagSet, *flagrange.Flags) {
	fs := flag.NewFlagSet("kvgate sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvgate sim [flags]\n\nSimulates a fleet of prefill (and decode) instances under a workload and\nruns routing policies on it, with and without early rejection: the same\nscheduling code as kvgate serve, in simulated time (docs/sim.md).\n\nFlags:")
		fs.PrintDefaults()
	}
	fl := flagrange.New(fs)
	wl, pm, sl := workload.ParamLimits(), perfmodel.ModelLimits(), simRanges()
	*f = simFlags{workloadName: "chat", timeScale: 1, policies: "all", earlyReject: "both", instances: 8,
		decodeKVTokens: 1_000_000, systems: 20, sessions: 400, systemTokens: 2048, turnTokens: 300, outputTokens: 500,
		duration: 120, seeds: 1, sloTTFT: 2, prefillSpeed: 20000, blockSize: 64, cacheBlocks: 3000, format: "table",
		predictors: "all", spread: 2.5, noise: 0.05, driftFactor: 0.5,
		holdMin: sched.DefaultHoldMin, holdBacklog: sched.DefaultHoldBacklog, holdMax: sched.DefaultHoldMax,
		holdSlack: sched.DefaultHoldSlack, holdQuiet: sched.DefaultHoldQuiet}
	fs.StringVar(&f.scenario, "scenario", "", "preset: seed-routing (the baseline chapter's routing experiment: 8 instances, 40 and 70 req/s, every policy with and without early rejection); heterogeneous (instances of hidden, unequal, non-linear speeds, one slowing mid-run; the kvgate policy with each predictor, see docs/predictor.md); sweep (--seeds random shapes: fleet, cache, workload, SLO and load drawn by seed, every policy, then a ranking; see docs/sim.md)")
	fs.StringVar(&f.predictors, "predictors", f.predictors, "heterogeneous or --engine-steps: comma-separated predictors, or all: "+strings.Join(sim.Predictors, ", "))
	fs.StringVar(&f.observe, "observe", "first-token", "heterogeneous or --engine-steps (default there: windows): what the learned predictor learns from: first-token (each first token, exact on the simulator's FIFO engines) or windows (busy windows, as the gateway does in front of batching engines; docs/predictor.md)")
	flagrange.Var(fl, &f.spread, "spread", sl.spread, "heterogeneous: how many times faster the fast half of the instances is than the slow half")
	flagrange.Var(fl, &f.noise, "noise", sl.noise, "heterogeneous: lognormal sigma of each prefill's time")
	flagrange.Var(fl, &f.driftFactor, "drift-factor", sl.driftFactor, "heterogeneous: instance p0 runs at this times its speed from mid-run on (1: no drift)")
	fs.StringVar(&f.workloadName, "workload", f.workloadName, "workload: chat, long-documents, agents, long-prompts, agent-sessions (not with --trace)")
	fs.StringVar(&f.trace, "trace", "", "replay a Mooncake-format JSON-lines trace (512-token hash blocks) instead of a generated workload")
	fs.StringVar(&f.writeTrace, "write-trace", "", "also write the first workload simulated (the first seed at the first rate; with --scenario sweep, the first shape at its rate) to this file as a Mooncake-format trace, for kvgate bench --workload trace to replay against live engines (--block-size must divide 512)")
	flagrange.Var(fl, &f.timeScale, "time-scale", wl.TimeScale, "multiply trace arrival times by this (0.5 = twice the rate)")
	fs.StringVar(&f.policies, "policies", f.policies, "comma-separated policies, or all: "+strings.Join(sched.Names(), ", "))
	fs.StringVar(&f.earlyReject, "early-reject", f.earlyReject, "early rejection: on, off or both")
	fs.StringVar(&f.hold, "hold", "policy", "hold at the router requests that fit nowhere (docs/policies.md; with early rejection, those that miss their SLO even on an idle instance): policy (the policies meant to: kvgate), on (every policy; all reads the same) or off")
	flagrange.Var(fl, &f.holdMin, "hold-min", sl.holdMin, "a held request's deadline is at least this many TTFT SLOs after its arrival")
	flagrange.Var(fl, &f.holdBacklog, "hold-backlog", sl.holdBacklog, "a held request's deadline: this times the fleet's backlog at its arrival (mean queue wait + held compute per instance)")
	flagrange.Var(fl, &f.holdMax, "hold-max", sl.holdMax, "a held request's deadline is at most this long after its arrival")
	flagrange.Var(fl, &f.holdSlack, "hold-slack", sl.holdSlack, "a held request is released early onto an idle instance or one where its predicted TTFT is within this many SLOs")
	fs.StringVar(&f.displace, "displace", "policy", "with early rejection, a request rejected for the load takes the place of a queued request that has not started its prefill and would compute more, whose client gets the 429 instead (docs/policies.md, \"Displacement\"): policy (the policies meant to: kvgate), on (every policy) or off; only on the default engines (not with --engine-steps, --scenario heterogeneous, --event-lag, --events-at prefill or --decode-instances, where no run displaces)")
	fs.BoolVar(&f.holdTouch, "hold-touch", false, "without early rejection, keep the cached prefixes of requests held longer than the fleet's cache turnover warm with one-token requests, within half of each instance's cache (experimental: the simulator gains, a live replay lost; docs/policies.md)")
	flagrange.Var(fl, &f.holdQuiet, "hold-quiet", sl.holdQuiet, "with early rejection, a held request is served on an idle instance (of a fleet at least half idle) once no request has been rejected for the load for this many SLOs (earlier, by the share of them that has passed, while most such late answers were followed by their conversation's next turn; never while fewer than a quarter were); it gives the instance up to an arrival that would otherwise be rejected for the load")
	fs.StringVar(&f.rates, "rates", "", fmt.Sprintf("comma-separated arrival rates, each %s, at most %d (default: 40,70 for chat, the phase's rate for long-documents and agents, %d for long-prompts, %d for agent-sessions)", wl.Rate, maxRates, longPromptRate, agentSessionRate))
	fs.StringVar(&f.loads, "loads", "", fmt.Sprintf("instead of --rates: comma-separated loads, each %s, at most %d: multiples of the fleet's prefill capacity on the workload (instances × prefill speed / mean uncached tokens per request under cache-only routing, measured on each seed's workload first)", sl.load, maxRates))
	flagrange.Var(fl, &f.instances, "instances", sl.instances, "prefill instances")
	flagrange.Var(fl, &f.decodeInstances, "decode-instances", sl.decodeInstances, "decode instances (0: prefill only, TTFT measured at the end of prefill, as the baseline chapter)")
	flagrange.Var(fl, &f.decodeKVTokens, "decode-kv-tokens", sl.decodeKVTokens, "KV capacity of each decode instance in tokens")
	flagrange.Var(fl, &f.engineSteps, "engine-steps", sl.engineSteps, "prefill instances run chunked prefill in steps of this many tokens (vLLM's --max-num-batched-tokens; kvgate engine's default is 8192): a prompt's last chunk shares its step with the next queued prompt's first chunk, whose compute delays its first token; the router is told the budget and, outside --scenario heterogeneous (whose --predictors and --observe stay), predicts as kvgate serve does (the learned predictor with the gateway's fit, from busy windows) unless --predictors or --observe say; not with --decode-instances")
	lp, as := workload.LongPrompts(longPromptRate), workload.AgentSessions(agentSessionRate)
	flagrange.Var(fl, &f.systems, "systems", wl.Systems, fmt.Sprintf("chat: system prompts; agent-sessions: shared system prompts (default %d)", as.Systems))
	flagrange.Var(fl, &f.sessions, "sessions", wl.Sessions, fmt.Sprintf("chat: conversations; long-prompts: conversation slots (default %d); agent-sessions: session slots (default %d)", lp.Sessions, as.Sessions))
	flagrange.Var(fl, &f.systemTokens, "system-tokens", wl.SystemTokens, fmt.Sprintf("chat: tokens per system prompt; agent-sessions: the same (default %d)", as.SystemTokens))
	flagrange.Var(fl, &f.turnTokens, "turn-tokens", wl.TurnTokens, fmt.Sprintf("chat: tokens appended per turn; long-prompts: their mean (default %d); agent-sessions: the mean of a step's (default %d)", lp.TurnTokens, as.TurnTokens))
	flagrange.Var(fl, &f.outputTokens, "output-tokens", wl.OutputTokens, fmt.Sprintf("chat: output tokens per request; long-prompts and agent-sessions: their mean (default %d, %d)", lp.OutputTokens, as.OutputTokens))
	f.promptMedian, f.promptSigma, f.contextTokens, f.turns = lp.PromptMedian, lp.PromptSigma, lp.ContextTokens, lp.Turns
	flagrange.Var(fl, &f.promptMedian, "prompt-median", wl.PromptMedian, "long-prompts: median first prompt of a conversation")
	flagrange.Var(fl, &f.promptSigma, "prompt-sigma", wl.PromptSigma, "long-prompts: lognormal sigma of the first prompt")
	flagrange.Var(fl, &f.contextTokens, "context-tokens", wl.ContextTokens, fmt.Sprintf("long-prompts: context window; first prompts are drawn below it, a conversation that would outgrow it ends; agent-sessions: the same for a session (default %d)", as.ContextTokens))
	flagrange.Var(fl, &f.turns, "turns", wl.Turns, "long-prompts: mean turns per conversation")
	flagrange.Var(fl, &f.duration, "duration", wl.Duration, "seconds of arrivals")
	fs.Uint64Var(&f.seed, "seed", 0, "random seed (workload and policies; any uint64)")
	flagrange.Var(fl, &f.seeds, "seeds", sl.seeds, "run generated workloads with seeds seed … seed+N-1 and report each (a trace is replayed once)")
	flagrange.Var(fl, &f.sloTTFT, "slo-ttft", sl.sloTTFT, "TTFT SLO in seconds")
	flagrange.Var(fl, &f.sloTPOT, "slo-tpot", sl.sloTPOT, "TPOT SLO in seconds (needs --decode-instances)")
	flagrange.Var(fl, &f.eventLag, "event-lag", sl.eventLag, "the router hears of cached blocks this late (KV-event lag)")
	flagrange.Var(fl, &f.approxTTL, "approx-ttl", sl.approxTTL, "with --event-lag or --events-at prefill: the router's own routing decisions count as cached blocks for this long (kvindex's approximate entries)")
	fs.StringVar(&f.eventsAt, "events-at", "dispatch", "when the router hears of a request's blocks and the evictions they cause (then --event-lag later): dispatch (the baseline chapter's model: it sees what an instance's queue will evict before it happens) or prefill (when the request's prefill starts, as vLLM allocates blocks at scheduling: it routes on prefixes the queue ahead is about to evict, as a gateway does)")
	flagrange.Var(fl, &f.prefillSpeed, "prefill-speed", pm.PrefillTokensPerSec, "prompt tokens per second per prefill instance")
	flagrange.Var(fl, &f.blockSize, "block-size", wl.BlockSize, "block size in tokens (traces use their own 512-token blocks)")
	flagrange.Var(fl, &f.cacheBlocks, "cache-blocks", sl.cacheBlocks, fmt.Sprintf("prefix-cache capacity per instance, in blocks of --block-size; instances × cache blocks at most %d", maxCacheBlocks))
	fs.StringVar(&f.eviction, "eviction", "tail-first", "the order in which an instance's prefix cache gives up a request's blocks: tail-first (as vLLM, SGLang and kvgate engine do: a conversation that loses blocks keeps its prefix) or head-first (the baseline chapter's model: its first block goes first, and the whole prefix with it; the docs/ figures that do not say tail-first)")
	fs.StringVar(&f.format, "format", f.format, "output: table or json")
	return fs, fl
}

// parseList parses a comma-separated list of numbers for the flag name
// (--rates, --loads); each must be in r, and at most maxRates are given.
func parseList(s, name string, r flagrange.Range[float64]) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" && strings.TrimSpace(s) != "" {
			return nil, fmt.Errorf("%s: an empty entry in %q (as kvgate bench --rates refuses it)", name, s)
		}
		if p == "" {
			continue
		}
		v, err := strconv.ParseFloat(p, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: bad number %q: want each %s", name, p, r)
		}
		if err := r.Check(name, v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no values given", name)
	}
	if len(out) > maxRates {
		return nil, fmt.Errorf("%s: %d values, at most %d", name, len(out), maxRates)
	}
	return out, nil
}

// simCacheBlocks is each instance's cache capacity in the blocks the
// simulator counts: blocks of --block-size, or of the trace's 512 tokens.
// Capacity is set in tokens, so it stays the same whatever the block size;
// a capacity of less than one block is an error rather than a cache that
// holds nothing (see docs/sim.md, "Flag ranges").
func simCacheBlocks(f *simFlags) (int, error) {
	if f.trace == "" {
		return f.cacheBlocks, nil
	}
	n := f.cacheBlocks * f.blockSize / workload.MooncakeBlockTokens
	if n < 1 {
		return 0, fmt.Errorf("--cache-blocks × --block-size = %d tokens holds no %d-token trace block: give at least %d tokens",
			f.cacheBlocks*f.blockSize, workload.MooncakeBlockTokens, workload.MooncakeBlockTokens)
	}
	return n, nil
}

func parsePolicies(s string) ([]string, error) {
	if s == "all" {
		return sched.Names(), nil
	}
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("--policies: no policy given (all, or a comma-separated list)")
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
		if slices.Contains(out, p) {
			// Run twice, it would count twice in the sweep's ranking.
			return nil, fmt.Errorf("--policies: %s given twice", p)
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
	// predictor is the heterogeneous scenario's router predictor ("":
	// none).
	predictor string
	hold      sched.HoldSettings
	// load and capacity: the spec's (--loads).
	load, capacity float64
	cfg            *sim.Config // the spec's fleet, if its own
}

// holdSettings are --hold and the deadline's --hold-* parameters (--hold
// is checked by runSim).
func (f *simFlags) holdSettings() sched.HoldSettings {
	mode, _ := sched.ParseHoldMode(f.hold)
	displace, _ := sched.ParseHoldMode(f.displace)
	return sched.HoldSettings{Mode: mode, Min: f.holdMin, Backlog: f.holdBacklog, Max: f.holdMax, Slack: f.holdSlack, Quiet: f.holdQuiet,
		Touch: f.holdTouch, Displace: displace}
}

type simOutput struct {
	Runs []sim.Result `json:"runs"`
}

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f simFlags
	fs, fl := newSimFlagSet(&f, stderr)
	if err := parseFlags(fs, fl, args); err != nil {
		return err
	}
	workloadDefaults(fs, &f)
	predictors, err := simScenario(fs, &f)
	if err != nil {
		return err
	}
	c, err := parseSimChoices(&f)
	if err != nil {
		return err
	}
	if f.scenario == "sweep" {
		return runSweep(ctx, &f, c.eviction, c.policies, c.rejects, stdout, sweepMaxRequests)
	}
	cfg, stepPredictors, err := simConfig(fs, &f, c.eviction)
	if err != nil {
		return err
	}
	if stepPredictors != nil {
		predictors = stepPredictors
	}
	specs, err := traceSpecs(ctx, &f, cfg)
	if err != nil {
		return err
	}
	if err := writeFirstTrace(f.writeTrace, specs); err != nil {
		return err
	}
	results, _, err := runJobs(ctx, cfg, specs, c.policies, c.rejects, predictors, f.holdSettings())
	if err != nil {
		return err
	}
	if f.format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(simOutput{Runs: results})
	}
	return printTable(stdout, results)
}

// simScenario checks the scenario and the flags it takes or refuses, and
// returns the predictors to compare (one, the configured, but for the
// heterogeneous scenario).
func simScenario(fs *flag.FlagSet, f *simFlags) ([]string, error) {
	predictors := []string{""}
	var err error
	switch f.scenario {
	case "", "seed-routing":
	case "heterogeneous":
		if predictors, err = heteroScenario(fs, f); err != nil {
			return nil, err
		}
	case "sweep":
		if err := sweepFlags(fs, f); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown scenario %q (known: seed-routing, heterogeneous, sweep)", f.scenario)
	}
	if f.scenario != "heterogeneous" {
		if err := heteroOnly(fs, f.engineSteps > 0); err != nil {
			return nil, err
		}
	}
	return predictors, unusedFlags(fs, f)
}

// simChoices are the parsed choices of a run: what to compare and how the
// engines evict.
type simChoices struct {
	policies []string
	rejects  []bool
	eviction sim.Eviction
}

// parseSimChoices parses and checks the flags that name choices.
func parseSimChoices(f *simFlags) (simChoices, error) {
	var c simChoices
	if f.observe != "first-token" && f.observe != "windows" {
		return c, fmt.Errorf("--observe must be first-token or windows, got %q", f.observe)
	}
	if f.format != "table" && f.format != "json" {
		return c, fmt.Errorf("unknown format %q (table or json)", f.format)
	}
	if f.eventsAt != "dispatch" && f.eventsAt != "prefill" {
		return c, fmt.Errorf("--events-at must be dispatch or prefill, got %q", f.eventsAt)
	}
	if _, err := sched.ParseHoldMode(f.hold); err != nil {
		return c, fmt.Errorf("--hold %w", err)
	}
	if _, err := sched.ParseHoldMode(f.displace); err != nil {
		return c, fmt.Errorf("--displace %w", err)
	}
	var err error
	if c.policies, err = parsePolicies(f.policies); err != nil {
		return c, err
	}
	if c.rejects, err = parseEarlyReject(f.earlyReject); err != nil {
		return c, err
	}
	if c.eviction, err = sim.ParseEviction(f.eviction); err != nil {
		return c, fmt.Errorf("--eviction: %w", err)
	}
	return c, nil
}

// simConfig builds the simulated fleet of a seed-routing or heterogeneous
// run, and with --engine-steps the predictors to compare (nil otherwise).
func simConfig(fs *flag.FlagSet, f *simFlags, eviction sim.Eviction) (sim.Config, []string, error) {
	cacheBlocks, err := simCacheBlocks(f)
	if err != nil {
		return sim.Config{}, nil, err
	}
	if f.instances*cacheBlocks > maxCacheBlocks {
		return sim.Config{}, nil, fmt.Errorf("--instances × --cache-blocks = %d cache blocks in the fleet, more than %d (the simulator allocates them up front)",
			f.instances*cacheBlocks, maxCacheBlocks)
	}
	if f.engineSteps > 0 && f.decodeInstances > 0 {
		return sim.Config{}, nil, fmt.Errorf("--engine-steps models aggregated instances: not with --decode-instances")
	}
	model := perfmodel.Default()
	model.PrefillTokensPerSec = f.prefillSpeed
	cfg := sim.Config{Prefill: f.instances, Decode: f.decodeInstances, Model: model,
		CacheTokens: f.cacheBlocks * f.blockSize, DecodeKVTokens: f.decodeKVTokens,
		SLO: sched.SLO{TTFT: f.sloTTFT, TPOT: f.sloTPOT}, EventLag: f.eventLag, ApproxTTL: f.approxTTL, Eviction: eviction,
		EventsAtPrefill: f.eventsAt == "prefill"}
	var predictors []string
	switch {
	case f.scenario == "heterogeneous":
		cfg.Truth = sim.Heterogeneous(f.instances, f.prefillSpeed, f.spread, f.noise, f.duration/2, f.driftFactor, f.seed)
		cfg.Truth.StepTokens = f.engineSteps
		cfg.BatchingEngines = f.observe == "windows"
		if f.decodeInstances > 0 {
			cfg.Truth.DecodeFactors = sim.HeterogeneousDecode(f.decodeInstances, f.spread)
		}
	case f.engineSteps > 0:
		cfg.Truth = sim.Chunked(f.instances, f.prefillSpeed, f.engineSteps)
		if predictors, cfg.BatchingEngines, err = stepsPredictors(fs, f); err != nil {
			return sim.Config{}, nil, err
		}
	}
	return cfg, predictors, nil
}

// sweepFlags refuses the flags a sweep draws itself or cannot use: its
// shapes set the fleet, the workload, the SLO and the rate.
func sweepFlags(fs *flag.FlagSet, f *simFlags) error {
	allowed := map[string]bool{"scenario": true, "seed": true, "seeds": true, "policies": true, "early-reject": true,
		"format": true, "prefill-speed": true, "block-size": true, "write-trace": true, "hold-touch": true, "displace": true}
	var bad []string
	fs.Visit(func(fl *flag.Flag) {
		if !allowed[fl.Name] {
			bad = append(bad, "--"+fl.Name)
		}
	})
	if len(bad) > 0 {
		return fmt.Errorf("--scenario sweep draws its shapes itself: %s not allowed (use --seed, --seeds, --policies, --early-reject, --hold-touch, --displace, --format, --prefill-speed, --block-size, --write-trace)", strings.Join(bad, ", "))
	}
	return nil
}

// workloadDefaults gives the long-prompt and agent-session workloads their own defaults for
// the flags it shares with chat, unless they were set.
func workloadDefaults(fs *flag.FlagSet, f *simFlags) {
	type intDefault struct {
		dst *int
		v   int
	}
	var defaults map[string]intDefault
	switch f.workloadName {
	case "long-prompts":
		lp := workload.LongPrompts(longPromptRate)
		defaults = map[string]intDefault{"sessions": {&f.sessions, lp.Sessions}, "turn-tokens": {&f.turnTokens, lp.TurnTokens},
			"output-tokens": {&f.outputTokens, lp.OutputTokens}}
	case "agent-sessions":
		as := workload.AgentSessions(agentSessionRate)
		defaults = map[string]intDefault{"sessions": {&f.sessions, as.Sessions}, "systems": {&f.systems, as.Systems},
			"system-tokens": {&f.systemTokens, as.SystemTokens}, "turn-tokens": {&f.turnTokens, as.TurnTokens},
			"context-tokens": {&f.contextTokens, as.ContextTokens}, "output-tokens": {&f.outputTokens, as.OutputTokens}}
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	for name, p := range defaults {
		if !set[name] {
			*p.dst = p.v
		}
	}
}

// parseEarlyReject reads --early-reject: the early-rejection settings to
// run each policy with.
func parseEarlyReject(s string) ([]bool, error) {
	switch s {
	case "both":
		return []bool{false, true}, nil
	case "on":
		return []bool{true}, nil
	case "off":
		return []bool{false}, nil
	}
	return nil, fmt.Errorf("--early-reject must be on, off or both, got %q", s)
}

// traceSpec is one workload to simulate, built only when its turn comes so
// that at most a few are in memory at once.
// writeFirstTrace writes the workload of specs[0] to path as a
// Mooncake-format trace (nothing when path is empty).
func writeFirstTrace(path string, specs []traceSpec) error {
	if path == "" || len(specs) == 0 {
		return nil
	}
	tr, err := specs[0].build()
	if err != nil {
		return err
	}
	// Written beside path and renamed over it once whole: a refusal (a
	// block size that does not divide 512) or a failure midway left an
	// existing file empty or cut.
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("--write-trace: %w", err)
	}
	err = workload.WriteMooncake(f, tr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("--write-trace %s: %w", path, err)
	}
	return nil
}

// buildWithin builds sp's workload, or returns ctx's error as soon as ctx
// ends: a generator does not stop midway (a day of chat is millions of
// requests, seconds to build), and kvgate sim stops within a second of
// SIGINT or SIGTERM (the abandoned build ends with the process).
func buildWithin(ctx context.Context, sp traceSpec) (*workload.Trace, error) {
	type built struct {
		tr  *workload.Trace
		err error
	}
	done := make(chan built, 1)
	go func() {
		tr, err := sp.build()
		done <- built{tr, err}
	}()
	select {
	case b := <-done:
		return b.tr, b.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type traceSpec struct {
	seed  uint64
	build func() (*workload.Trace, error)
	// rate is the generator's rate; 0 for a trace, whose rate is measured.
	rate float64
	// load, with --loads, is rate as a multiple of capacity, the fleet's
	// measured prefill capacity in requests per second.
	load, capacity float64
	// cfg, when set, is this workload's fleet (the sweep's shapes); nil:
	// the runs' common one.
	cfg *sim.Config
}

// generator is a generated workload at any rate: validate checks the
// parameters and the expected size at a rate before anything runs, gen
// builds the trace.
type generator struct {
	validate func(rate float64) error
	gen      func(rate float64) (*workload.Trace, error)
}

// flagGenerator is the --workload the flags describe, with the given seed,
// and its default rates.
func flagGenerator(f *simFlags, seed uint64) (generator, []float64, error) {
	switch f.workloadName {
	case "chat":
		c := workload.ChatConfig{Systems: f.systems, Sessions: f.sessions, SystemTokens: f.systemTokens,
			TurnTokens: f.turnTokens, OutputTokens: f.outputTokens, Duration: f.duration, BlockSize: f.blockSize, Seed: seed}
		at := func(rate float64) workload.ChatConfig { c := c; c.Rate = rate; return c }
		return generator{validate: func(r float64) error { return at(r).Validate() },
			gen: func(r float64) (*workload.Trace, error) { return workload.Chat(at(r)) }}, []float64{40, 70}, nil
	case "long-documents", "agents":
		c := workload.LongDocs()
		gen := workload.Docs
		if f.workloadName == "agents" {
			c, gen = workload.Agents(), workload.AgentSteps
		}
		c.Duration, c.BlockSize, c.Seed = f.duration, f.blockSize, seed
		at := func(rate float64) workload.ShapeConfig { c := c; c.Rate = rate; return c }
		name := f.workloadName
		return generator{validate: func(r float64) error { return at(r).Validate(name) },
			gen: func(r float64) (*workload.Trace, error) { return gen(at(r)) }}, []float64{c.Rate}, nil
	case "long-prompts":
		c := workload.LongPromptConfig{Duration: f.duration, Sessions: f.sessions, PromptMedian: f.promptMedian,
			PromptSigma: f.promptSigma, ContextTokens: f.contextTokens, Turns: f.turns, TurnTokens: f.turnTokens,
			OutputTokens: f.outputTokens, BlockSize: f.blockSize, Seed: seed}
		at := func(rate float64) workload.LongPromptConfig { c := c; c.Rate = rate; return c }
		return generator{validate: func(r float64) error { return at(r).Validate() },
			gen: func(r float64) (*workload.Trace, error) { return workload.LongPrompt(at(r)) }}, []float64{longPromptRate}, nil
	case "agent-sessions":
		c := workload.AgentSessionConfig{Duration: f.duration, Sessions: f.sessions, Systems: f.systems, SystemTokens: f.systemTokens,
			TurnTokens: f.turnTokens, ContextTokens: f.contextTokens, OutputTokens: f.outputTokens, BlockSize: f.blockSize, Seed: seed}
		at := func(rate float64) workload.AgentSessionConfig { c := c; c.Rate = rate; return c }
		return generator{validate: func(r float64) error { return at(r).Validate() },
			gen: func(r float64) (*workload.Trace, error) { return workload.AgentSession(at(r)) }}, []float64{agentSessionRate}, nil
	}
	return generator{}, nil, fmt.Errorf("unknown workload %q (chat, long-documents, agents, long-prompts, agent-sessions)", f.workloadName)
}

// longPromptRate is the long-prompt workload's default rate: about its
// prefill capacity on the default fleet (docs/sim.md).
const longPromptRate = 17

// agentSessionRate is the agent-session workload's default rate: about its
// prefill capacity on the default fleet (8.7–10.4 req/s on seeds 0–2,
// docs/sim.md).
const agentSessionRate = 10

// traceSpecs lists the workloads the flags ask for and checks each
// generator's parameters and expected size before anything runs. With
// --loads the rates are multiples of the fleet's prefill capacity on each
// seed's workload, measured first (sim.FindCapacity).
func traceSpecs(ctx context.Context, f *simFlags, cfg sim.Config) ([]traceSpec, error) {
	if f.trace != "" {
		if f.loads != "" {
			return nil, fmt.Errorf("--loads needs a generated workload, not --trace (use --time-scale)")
		}
		path, scale := f.trace, f.timeScale
		return []traceSpec{{seed: f.seed, build: func() (*workload.Trace, error) {
			fh, err := os.Open(path)
			if err != nil {
				return nil, err
			}
			defer fh.Close()
			return workload.ReadMooncake(fh, scale)
		}}}, nil
	}
	if f.rates != "" && f.loads != "" {
		return nil, fmt.Errorf("give --rates or --loads, not both")
	}
	var rates, loads []float64
	var err error
	if f.rates != "" {
		if rates, err = parseList(f.rates, "--rates", workload.ParamLimits().Rate); err != nil {
			return nil, err
		}
	}
	if f.loads != "" {
		if loads, err = parseList(f.loads, "--loads", simRanges().load); err != nil {
			return nil, err
		}
	}
	var out []traceSpec
	for s := 0; s < f.seeds; s++ {
		seed := f.seed + uint64(s)
		g, def, err := flagGenerator(f, seed)
		if err != nil {
			return nil, err
		}
		rs := rates
		if rs == nil {
			rs = def
		}
		var capacity float64
		if loads != nil {
			if err := g.validate(def[0]); err != nil {
				return nil, fmt.Errorf("--duration %g: %w", f.duration, err)
			}
			c, err := sim.FindCapacity(ctx, cfg, def[0], g.gen)
			if err != nil {
				return nil, fmt.Errorf("--loads: measuring the fleet's capacity: %w", err)
			}
			capacity, rs = c.RequestsPerSec, nil
			for _, l := range loads {
				rs = append(rs, round(l*capacity, 2))
			}
		}
		for i, rate := range rs {
			if err := g.validate(rate); err != nil {
				return nil, fmt.Errorf("rate %g, --duration %g: %w", rate, f.duration, err)
			}
			sp := traceSpec{seed: seed, rate: rate, build: func() (*workload.Trace, error) { return g.gen(rate) }}
			if loads != nil {
				sp.load, sp.capacity = loads[i], capacity
			}
			out = append(out, sp)
		}
	}
	return out, nil
}

func round(v float64, digits int) float64 {
	p, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'f', digits, 64), 64)
	return p
}

// runJobs builds each workload in turn and runs every (policy, early
// rejection) pair on it, in parallel over the machine's cores; a workload is
// released once its runs are done. Results come back in job order, with the
// jobs.
func runJobs(ctx context.Context, cfg sim.Config, specs []traceSpec, policies []string, rejects []bool, predictors []string, hold sched.HoldSettings) ([]sim.Result, []simJob, error) {
	perTrace := len(policies) * len(rejects) * len(predictors)
	results := make([]sim.Result, len(specs)*perTrace)
	errs := make([]error, len(results))
	jobs := make([]simJob, 0, len(results))
	type indexed struct {
		i int
		j simJob
	}
	next := make(chan indexed)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for x := range next {
				results[x.i], errs[x.i] = runJob(ctx, cfg, x.j)
			}
		}()
	}
	stop := func(err error) ([]sim.Result, []simJob, error) {
		close(next)
		wg.Wait()
		return nil, nil, err
	}
	for _, sp := range specs {
		if ctx.Err() != nil {
			return stop(ctx.Err())
		}
		tr, err := buildWithin(ctx, sp)
		if err != nil {
			return stop(err)
		}
		rate := sp.rate
		if rate == 0 {
			rate = round(float64(len(tr.Requests))/tr.Duration, 2)
		}
		for _, p := range policies {
			for _, rj := range rejects {
				for _, pr := range predictors {
					j := simJob{trace: tr, rate: rate, seed: sp.seed, policy: p, reject: rj, predictor: pr, hold: hold, load: sp.load, capacity: sp.capacity, cfg: sp.cfg}
					select {
					case next <- indexed{len(jobs), j}:
						jobs = append(jobs, j)
					case <-ctx.Done():
						return stop(ctx.Err())
					}
				}
			}
		}
	}
	close(next)
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return nil, nil, e
		}
	}
	for i := range jobs {
		jobs[i].trace, jobs[i].cfg = nil, nil // let the last workload go with the results kept
	}
	return results, jobs, nil
}

// runJob simulates one (workload, policy, early rejection) job.
func runJob(ctx context.Context, cfg sim.Config, j simJob) (sim.Result, error) {
	pol, err := sched.New(j.policy, sched.Options{Seed: j.seed + 1})
	if err != nil {
		return sim.Result{}, err
	}
	if j.cfg != nil {
		cfg = *j.cfg
	}
	cfg.Predictor = j.predictor
	if cfg.Truth != nil {
		t := *cfg.Truth
		t.Seed = j.seed
		cfg.Truth = &t
	}
	res, err := sim.Run(ctx, cfg, j.trace, j.hold.Scheduler(pol, j.reject))
	if err != nil {
		return sim.Result{}, fmt.Errorf("%s: %w", j.policy, err)
	}
	res.Rate = j.rate
	res.Seed = j.seed
	res.Load, res.Capacity = j.load, round(j.capacity, 2)
	return roundResult(res), nil
}

func roundResult(r sim.Result) sim.Result {
	r.HitRate = round(r.HitRate, 4)
	r.TTFTP50 = round(r.TTFTP50, 4)
	r.TTFTP99 = round(r.TTFTP99, 4)
	r.TTFTMax = round(r.TTFTMax, 4)
	r.LateTTFTP50 = round(r.LateTTFTP50, 4)
	r.Attainment = round(r.Attainment, 4)
	r.Rejected = round(r.Rejected, 4)
	r.Unserved = round(r.Unserved, 4)
	r.Held = round(r.Held, 4)
	r.Yielded = round(r.Yielded, 4)
	r.Displaced = round(r.Displaced, 4)
	r.Touches, r.TouchTokens = round(r.Touches, 4), round(r.TouchTokens, 2)
	r.Copies, r.CopyTokens = round(r.Copies, 4), round(r.CopyTokens, 2)
	r.Goodput = round(r.Goodput, 2)
	r.TPOTP50 = round(r.TPOTP50, 5)
	r.TPOTP99 = round(r.TPOTP99, 5)
	r.TTFTMdAPE = round(r.TTFTMdAPE, 4)
	r.TTFTAPEP90 = round(r.TTFTAPEP90, 4)
	r.TPOTMdAPE = round(r.TPOTMdAPE, 4)
	r.TPOTAPEP90 = round(r.TPOTAPEP90, 4)
	for _, p := range []**float64{&r.DriftRecovery, &r.StaleRouting} {
		if *p != nil {
			v := round(**p, 1)
			*p = &v
		}
	}
	return r
}

// printTable prints one line per run: its seed, the TTFT tail (p99, max,
// and the median of the late requests, "-" when none was late) next to
// attainment, and the unserved column only when some run left requests
// unserved.
func printTable(w io.Writer, rs []sim.Result) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	unserved := slices.ContainsFunc(rs, func(r sim.Result) bool { return r.Unserved > 0 })
	head := "seed\trate\tpolicy\treject\trequests\thit\tTTFT p50\tp99\tmax\tlate p50\tattain\trejected\t"
	if unserved {
		head += "unserved\t"
	}
	held := slices.ContainsFunc(rs, func(r sim.Result) bool { return r.Held > 0 })
	if held {
		head += "held\t"
	}
	head += "goodput\t"
	if len(rs) > 0 && rs[0].Predictor != "" {
		head += "TTFT err p50\tp90\tdrift recovery\tstale routing\t"
	}
	// With decode instances the TPOT is a target: its percentiles show,
	// and the predictor's TPOT error with a predictor.
	withTPOT := slices.ContainsFunc(rs, func(r sim.Result) bool { return r.TPOTP50 > 0 })
	tpotErr := withTPOT && rs[0].Predictor != ""
	if withTPOT {
		head += "TPOT p50\tTPOT p99\t"
	}
	if tpotErr {
		head += "TPOT err p50\tp90\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rs {
		rej := "-"
		if r.EarlyReject {
			rej = "yes"
		}
		pol := r.Policy
		if r.Predictor != "" {
			pol += " (" + r.Predictor + ")"
		}
		late := "-"
		if r.LateTTFTP50 > 0 {
			late = fmt.Sprintf("%.2fs", r.LateTTFTP50)
		}
		ttft := [3]string{"-", "-", "-"} // of no request served: unknown, not 0
		if r.Served > 0 {
			ttft = [3]string{fmt.Sprintf("%.2fs", r.TTFTP50), fmt.Sprintf("%.2fs", r.TTFTP99), fmt.Sprintf("%.2fs", r.TTFTMax)}
		}
		line := fmt.Sprintf("%d\t%g\t%s\t%s\t%d\t%.1f%%\t%s\t%s\t%s\t%s\t%.1f%%\t%.1f%%\t",
			r.Seed, r.Rate, pol, rej, r.Requests, 100*r.HitRate, ttft[0], ttft[1], ttft[2], late, 100*r.Attainment, 100*r.Rejected)
		if unserved {
			line += fmt.Sprintf("%.1f%%\t", 100*r.Unserved)
		}
		if held {
			line += fmt.Sprintf("%.1f%%\t", 100*r.Held)
		}
		line += fmt.Sprintf("%.1f/s\t", r.Goodput)
		if r.Predictor != "" {
			line += fmt.Sprintf("%.1f%%\t%.1f%%\t%s\t%s\t", 100*r.TTFTMdAPE, 100*r.TTFTAPEP90, seconds(r.DriftRecovery), seconds(r.StaleRouting))
		}
		if withTPOT && r.Served == 0 {
			line += "-\t-\t"
		} else if withTPOT {
			line += fmt.Sprintf("%.1fms\t%.1fms\t", 1000*r.TPOTP50, 1000*r.TPOTP99)
		}
		if tpotErr {
			line += fmt.Sprintf("%.1f%%\t%.1f%%\t", 100*r.TPOTMdAPE, 100*r.TPOTAPEP90)
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// unusedFlags refuses flags given where nothing reads them (a run that
// silently ignores a flag looks like a run that used it).
func unusedFlags(fs *flag.FlagSet, f *simFlags) error {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	switch {
	case f.trace != "" && set["rates"]:
		return fmt.Errorf("--rates: a trace is replayed at its own rate (--time-scale compresses it)")
	case f.trace == "" && set["time-scale"]:
		return fmt.Errorf("--time-scale scales a --trace's timestamps; a generated workload's rate is --rates or --loads")
	case f.decodeInstances == 0 && f.sloTPOT > 0 && f.scenario != "heterogeneous":
		return fmt.Errorf("--slo-tpot needs --decode-instances (without decode instances no TPOT is simulated)")
	case set["approx-ttl"] && f.approxTTL > 0 && f.eventLag == 0 && f.eventsAt != "prefill":
		return fmt.Errorf("--approx-ttl: the router's own entries count only with --event-lag or --events-at prefill (the router hears every block at once otherwise)")
	case set["decode-kv-tokens"] && f.decodeInstances == 0:
		return fmt.Errorf("--decode-kv-tokens needs --decode-instances (it is the decode instances' KV capacity)")
	case f.trace != "" && set["seeds"] && f.seeds > 1:
		return fmt.Errorf("--seeds: a trace is replayed once, as recorded (seeds draw generated workloads)")
	case set["rates"] && strings.TrimSpace(f.rates) == "", set["loads"] && strings.TrimSpace(f.loads) == "":
		return fmt.Errorf("--rates or --loads given empty: give values, or leave the flag out for the workload's default")
	}
	if err := unusedHoldFlags(set, f); err != nil {
		return err
	}
	if f.scenario == "sweep" {
		return nil // sweepFlags checked its own
	}
	for _, name := range []string{"workload", "duration", "systems", "system-tokens", "sessions", "turn-tokens", "output-tokens",
		"prompt-median", "prompt-sigma", "context-tokens", "turns"} {
		readers := workloadFlagReaders[name]
		switch {
		case !set[name]:
		case f.trace != "":
			return fmt.Errorf("--%s: not read with --trace (a trace is replayed as recorded)", name)
		case readers != nil && !slices.Contains(readers, f.workloadName):
			return fmt.Errorf("--%s: not read by --workload %s (only by %s)", name, f.workloadName, strings.Join(readers, ", "))
		}
	}
	return nil
}

// unusedHoldFlags refuses the hold's settings where no run reads them:
// with --hold off, --hold-quiet without a run with early rejection, and
// --hold-touch without one without it.
func unusedHoldFlags(set map[string]bool, f *simFlags) error {
	for _, name := range []string{"hold-min", "hold-backlog", "hold-max", "hold-slack", "hold-quiet", "hold-touch"} {
		if set[name] && f.hold == "off" {
			return fmt.Errorf("--%s: not read with --hold off", name)
		}
	}
	switch {
	case set["hold-quiet"] && f.earlyReject == "off":
		return fmt.Errorf("--hold-quiet: read only with early rejection, and --early-reject is off")
	case set["hold-touch"] && f.holdTouch && f.earlyReject == "on":
		return fmt.Errorf("--hold-touch: read only without early rejection, and --early-reject is on")
	case set["displace"] && f.displace != "off" && f.earlyReject == "off":
		return fmt.Errorf("--displace: read only with early rejection, and --early-reject is off")
	}
	return nil
}

// workloadFlagReaders are the generated workloads that read each workload
// flag (nil: every one).
var workloadFlagReaders = map[string][]string{
	"systems": {"chat", "agent-sessions"}, "system-tokens": {"chat", "agent-sessions"},
	"sessions": {"chat", "long-prompts", "agent-sessions"}, "turn-tokens": {"chat", "long-prompts", "agent-sessions"},
	"output-tokens": {"chat", "long-prompts", "agent-sessions"}, "context-tokens": {"long-prompts", "agent-sessions"},
	"prompt-median": {"long-prompts"}, "prompt-sigma": {"long-prompts"}, "turns": {"long-prompts"},
}

// heteroOnly rejects the heterogeneous scenario's flags given without it
// (they would be ignored); with a truth of chunked steps (--engine-steps)
// --predictors and --observe apply too.
func heteroOnly(fs *flag.FlagSet, steps bool) error {
	var set []string
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "predictors", "observe":
			if !steps {
				set = append(set, "--"+fl.Name)
			}
		case "spread", "noise", "drift-factor":
			set = append(set, "--"+fl.Name)
		}
	})
	if len(set) > 0 {
		hint := ""
		if !steps {
			hint = " (--predictors and --observe also with --engine-steps)"
		}
		return fmt.Errorf("%s: only with --scenario heterogeneous%s", strings.Join(set, ", "), hint)
	}
	return nil
}

// heteroScenario applies the heterogeneous scenario's defaults (the kvgate
// policy unless --policies is given) and returns the predictors to run.
func heteroScenario(fs *flag.FlagSet, f *simFlags) ([]string, error) {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if !set["policies"] {
		f.policies = "kvgate"
	}
	if f.trace != "" {
		return nil, fmt.Errorf("--scenario heterogeneous runs generated workloads (no --trace)")
	}
	return parsePredictors(f.predictors)
}

// stepsPredictors is the predictors and the learning of a run with
// --engine-steps outside the heterogeneous scenario: as kvgate serve
// (learned, from busy windows) unless --predictors or --observe say.
func stepsPredictors(fs *flag.FlagSet, f *simFlags) ([]string, bool, error) {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	preds, windows := []string{"learned"}, true
	if set["predictors"] {
		var err error
		if preds, err = parsePredictors(f.predictors); err != nil {
			return nil, false, err
		}
	}
	if set["observe"] {
		windows = f.observe == "windows"
	}
	return preds, windows, nil
}

// parsePredictors reads --predictors: all, or a comma-separated list.
func parsePredictors(list string) ([]string, error) {
	if list == "all" {
		return sim.Predictors, nil
	}
	var out []string
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(sim.Predictors, p) {
			return nil, fmt.Errorf("unknown predictor %q (known: %s)", p, strings.Join(sim.Predictors, ", "))
		}
		out = append(out, p)
	}
	return out, nil
}

// seconds prints an optional measure in seconds ("-": not measured; a
// negative recovery: never).
func seconds(v *float64) string {
	switch {
	case v == nil:
		return "-"
	case *v < 0:
		return "never"
	}
	return fmt.Sprintf("%gs", *v)
}
