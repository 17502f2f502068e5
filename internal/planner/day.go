package planner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/workload"
)

// DayConfig is a simulated day: phases in sequence, each blending into the
// next over a transition, the arrival rate drifting with noise, on a fleet
// of Instances whose split is fixed, planned, or set by an oracle.
type DayConfig struct {
	Phases []Phase
	// PhaseMinutes is the length of a phase without its own Minutes.
	PhaseMinutes float64
	// TransitionMinutes is how long one phase takes to give way to the
	// next (the mix shifts linearly, centred on the boundary).
	TransitionMinutes float64
	// Noise is the amplitude of the rate's slow drift: the rate is
	// multiplied by a factor in [1 − Noise, 1 + Noise] that moves between
	// random values every NoiseMinutes.
	Noise        float64
	NoiseMinutes float64
	// LeadInMinutes of the first phase run before the measured day, so
	// that every run is measured in steady operation (a planner has been
	// running; an oracle has set its split), from the same initial split.
	LeadInMinutes float64
	Seed          uint64
	Instances     int
	// Warmup is the seconds a switched instance warms up after draining.
	Warmup float64
	// Interval is the seconds between planner (and oracle) decisions.
	Interval float64
	// Policy is the routing policy (the gateway's); early rejection is on.
	Policy string
	// Prefixes is the number of shared prompt prefixes of each phase.
	Prefixes int
	// Model, SLO, CacheTokens and DecodeKVTokens describe the engines.
	Model          perfmodel.Model
	SLO            sched.SLO
	CacheTokens    int
	DecodeKVTokens int
	// PlannerCapacity, when set, is the capacity the planner is configured
	// with instead of the one derived from the timing model (to see how it
	// copes with a wrong one).
	PlannerCapacity *Capacity
	// Learn lets the planner correct its capacity from measured misses.
	Learn bool
	// Logger receives the planner's decisions (nil: discarded).
	Logger *slog.Logger
}

// DefaultDay is the seed's three phases, 12 minutes each with 4-minute
// transitions and ±10 % drift, on 24 instances of an engine whose decode
// carries about 3 000 output tokens/s within a 50 ms TPOT (2 600 to 3 200
// depending on context) and whose prefill computes 20 000 tokens/s.
func DefaultDay() DayConfig {
	m := perfmodel.Default()
	m.DecodeStepBase, m.DecodeStepPerSeq, m.DecodeStepPerKContext = 0.010, 0.00024, 0.000004
	return DayConfig{
		Phases: SeedPhases(), PhaseMinutes: 12, TransitionMinutes: 4, Noise: 0.1, NoiseMinutes: 2, LeadInMinutes: 3,
		Instances: 24, Warmup: 30, Interval: 30, Policy: "kvgate", Prefixes: 8,
		Model: m, SLO: sched.SLO{TTFT: 2, TPOT: 0.05}, CacheTokens: 1 << 20, DecodeKVTokens: 5 << 19,
	}
}

// DayRanges are the ranges of a DayConfig's numbers; kvgate plan's flags
// use them.
type DayRanges struct {
	PhaseMinutes, TransitionMinutes, Noise, NoiseMinutes, LeadInMinutes flagrange.Range[float64]
	Warmup, Interval                                                    flagrange.Range[float64]
	Instances, Prefixes                                                 flagrange.Range[int]
}

// DayLimits returns the ranges.
func DayLimits() DayRanges {
	return DayRanges{
		PhaseMinutes:      flagrange.Range[float64]{Min: 1, Max: 240, Unit: "minutes"},
		TransitionMinutes: flagrange.Range[float64]{Min: 0, Max: 60, Unit: "minutes"},
		Noise:             flagrange.Range[float64]{Min: 0, Max: 0.5},
		NoiseMinutes:      flagrange.Range[float64]{Min: 0.1, Max: 60, Unit: "minutes"},
		LeadInMinutes:     flagrange.Range[float64]{Min: 0, Max: 60, Unit: "minutes"},
		Warmup:            flagrange.Range[float64]{Min: 0, Max: 600, Unit: "seconds"},
		Interval:          flagrange.Range[float64]{Min: 1, Max: 600, Unit: "seconds"},
		Instances:         flagrange.Range[int]{Min: 2, Max: 256, Unit: "instances"},
		Prefixes:          flagrange.Range[int]{Min: 1, Max: 4096},
	}
}

// Validate checks the day.
func (c *DayConfig) Validate() error {
	l := DayLimits()
	errs := []error{
		l.PhaseMinutes.Check("phase-minutes", c.PhaseMinutes),
		l.TransitionMinutes.Check("transition-minutes", c.TransitionMinutes),
		l.Noise.Check("noise", c.Noise),
		l.NoiseMinutes.Check("noise-minutes", c.NoiseMinutes),
		l.LeadInMinutes.Check("lead-in-minutes", c.LeadInMinutes),
		l.Warmup.Check("warmup", c.Warmup),
		l.Interval.Check("interval", c.Interval),
		l.Instances.Check("instances", c.Instances),
		l.Prefixes.Check("prefixes", c.Prefixes),
	}
	if err := SizingLimits().Phases.Check("number of phases", len(c.Phases)); err != nil {
		errs = append(errs, err)
	}
	for _, ph := range c.Phases {
		errs = append(errs, ph.Validate())
	}
	if err := c.Model.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, err := sched.New(c.Policy, sched.Options{}); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("simulated day: %w", err)
	}
	// The whole day's expected size, within what one workload may hold.
	var reqs, keys float64
	for _, ph := range c.Phases {
		m := ph.Minutes
		if m == 0 {
			m = c.PhaseMinutes
		}
		n := ph.Rate * (1 + c.Noise) * 60 * (m + c.TransitionMinutes + c.LeadInMinutes)
		reqs += n
		keys += n * (1.5*ph.ISL/64 + 1)
	}
	if reqs > workload.MaxRequests || keys > workload.MaxKeys {
		return fmt.Errorf("simulated day: about %.3g requests and %.3g prompt blocks, more than a workload holds (%d, %d): shorten the phases or lower the rates",
			reqs, keys, workload.MaxRequests, workload.MaxKeys)
	}
	for i, s := range c.measured() {
		if s.to-s.from < 60*c.TransitionMinutes {
			return fmt.Errorf("simulated day: phase %s (%.1f min) is shorter than a transition (%.1f min)", c.Phases[i].Name, (s.to-s.from)/60, c.TransitionMinutes)
		}
	}
	return nil
}

type span struct{ from, to float64 }

// spans are the phases' nominal spans in seconds (boundaries are the
// middles of the transitions); the first includes the lead-in.
func (c *DayConfig) spans() []span {
	out := c.measured()
	out[0].from = 0
	return out
}

// measured are the spans the day is measured over: after the lead-in.
func (c *DayConfig) measured() []span {
	out := make([]span, len(c.Phases))
	t := 60 * c.LeadInMinutes
	for i, ph := range c.Phases {
		m := ph.Minutes
		if m == 0 {
			m = c.PhaseMinutes
		}
		out[i] = span{t, t + 60*m}
		t += 60 * m
	}
	return out
}

// weight is phase i's share of its rate at time t: 1 inside its span,
// ramping linearly across the transitions into and out of it.
func (c *DayConfig) weight(sp []span, i int, t float64) float64 {
	half := 30 * c.TransitionMinutes
	w := 1.0
	if i > 0 && half > 0 {
		w = min(w, (t-(sp[i].from-half))/(2*half))
	}
	if i < len(sp)-1 && half > 0 {
		w = min(w, ((sp[i].to+half)-t)/(2*half))
	}
	if half == 0 && (t < sp[i].from || t >= sp[i].to) {
		return 0
	}
	return min(max(w, 0), 1)
}

// drift is the rate's slow noise: linear between random knots.
type drift struct {
	every float64
	knots []float64
}

func newDrift(rng *rand.Rand, total, every, amp float64) drift {
	n := int(total/every) + 2
	d := drift{every: every, knots: make([]float64, n)}
	for i := range d.knots {
		d.knots[i] = 1 + amp*(2*rng.Float64()-1)
	}
	return d
}

func (d drift) at(t float64) float64 {
	x := t / d.every
	i := min(int(x), len(d.knots)-2)
	f := x - float64(i)
	return d.knots[i]*(1-f) + d.knots[i+1]*f
}

// BuildDay generates the day's requests: each phase's stream (a shared
// prefix of hit × ISL tokens, the rest unique; lengths ±50 %) generated at
// its peak rate over its span and transitions, then thinned to its weight
// times the drift.
func BuildDay(c *DayConfig) (*workload.Trace, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	sp := c.spans()
	total := sp[len(sp)-1].to
	rng := rand.New(rand.NewPCG(c.Seed, 0xda7))
	dr := newDrift(rng, total, 60*c.NoiseMinutes, c.Noise)
	half := 30 * c.TransitionMinutes
	peak := 1 + c.Noise
	tr := &workload.Trace{Name: "day", BlockSize: 64, Duration: total}
	for i, ph := range c.Phases {
		if ph.Rate == 0 {
			continue
		}
		from, to := max(sp[i].from-half, 0), min(sp[i].to+half, total)
		if i == 0 {
			from = 0
		}
		if i == len(sp)-1 {
			to = total
		}
		sc := workload.ShapeConfig{Rate: ph.Rate * peak, Duration: to - from, ISL: int(ph.ISL), OSL: int(ph.OSL), Hit: ph.Hit,
			BlockSize: tr.BlockSize, Seed: c.Seed + uint64(i)*7919, Prefixes: c.Prefixes}
		part, err := workload.Docs(sc)
		if err != nil {
			return nil, fmt.Errorf("simulated day: phase %s: %w", ph.Name, err)
		}
		for _, q := range part.Requests {
			t := q.Arrival + from
			if rng.Float64()*peak < c.weight(sp, i, t)*dr.at(t) {
				q.Arrival = t
				q.Session = i
				tr.Requests = append(tr.Requests, q)
			}
		}
	}
	slices.SortStableFunc(tr.Requests, func(a, b workload.Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	if len(tr.Requests) > workload.MaxRequests {
		return nil, fmt.Errorf("simulated day: %d requests, more than %d", len(tr.Requests), workload.MaxRequests)
	}
	return tr, nil
}

// fleet is the day's simulated fleet with prefill instances to start.
func (c *DayConfig) fleet(prefill int) sim.PhasedConfig {
	segs := make([]sim.Segment, len(c.Phases))
	for i, s := range c.measured() {
		segs[i] = sim.Segment{Name: c.Phases[i].Name, From: s.from, To: s.to}
	}
	return sim.PhasedConfig{Instances: c.Instances, Prefill: prefill, Model: c.Model, CacheTokens: c.CacheTokens,
		DecodeKVTokens: c.DecodeKVTokens, SLO: c.SLO, Warmup: c.Warmup, Interval: c.Interval, Segments: segs}
}

// Capacity is the day's engine capacity as the planner estimates it from
// the timing model.
func (c *DayConfig) Capacity() ModelCapacity {
	return ModelCapacity{Model: c.Model, TPOT: c.SLO.TPOT, KVTokens: c.DecodeKVTokens}
}

func (c *DayConfig) scheduler() (*sched.Scheduler, error) {
	pol, err := sched.New(c.Policy, sched.Options{Seed: c.Seed + 1})
	if err != nil {
		return nil, err
	}
	// The phased simulator has no hold queue (docs/planner.md).
	return sched.HoldSettings{Mode: sched.HoldNever}.Scheduler(pol, true), nil
}

// DayRun is one way of running the day.
type DayRun struct {
	Name string `json:"name"`
	// Split is the fixed split, or how the split was set.
	Split          string  `json:"split"`
	Attainment     float64 `json:"attainment"`
	TTFTAttainment float64 `json:"ttft_attainment"`
	TPOTAttainment float64 `json:"tpot_attainment"`
	Rejected       float64 `json:"rejected"`
	// Switches counts instance role switches, Changes the decisions that
	// started them.
	Switches int `json:"switches"`
	Changes  int `json:"changes"`
	// Phases is attainment per phase (requests by arrival in its span).
	Phases []sim.SegmentResult `json:"phases"`
	// Log holds every switch decision with its reason (planner runs).
	Log []Decision `json:"log,omitempty"`
	// Timeline lists the instance switches.
	Timeline []sim.SwitchRecord `json:"timeline,omitempty"`
}

// DayReport compares the ways of running the day.
type DayReport struct {
	Requests  int      `json:"requests"`
	Minutes   float64  `json:"minutes"`
	Instances int      `json:"instances"`
	Runs      []DayRun `json:"runs"`
	// Sweep is every fixed split's attainment (best fixed in hindsight).
	Sweep []Candidate `json:"sweep"`
	// OracleSplits is the split the oracle uses in each phase: the fixed
	// split with the best attainment in that phase.
	OracleSplits []Candidate `json:"oracle_splits"`
}

// DayOptions choose what RunDay compares.
type DayOptions struct {
	// Fixed is the fixed split to report (the seed's 12P12D).
	FixedPrefill int
	// WhatIf adds a planner that simulates candidate splits.
	WhatIf bool
	// Parallel bounds concurrent simulations (default GOMAXPROCS).
	Parallel int
}

// RunDay simulates the day under a fixed split, every fixed split (the best
// in hindsight), the planner (and the planner with what-if simulation) and
// an oracle that knows each phase's best split and when it starts.
func RunDay(ctx context.Context, c DayConfig, o DayOptions) (*DayReport, error) {
	tr, err := BuildDay(&c)
	if err != nil {
		return nil, err
	}
	if o.FixedPrefill < 1 || o.FixedPrefill >= c.Instances {
		return nil, fmt.Errorf("simulated day: fixed split needs 1 to %d prefill instances of %d, got %d", c.Instances-1, c.Instances, o.FixedPrefill)
	}
	par := o.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	ms := c.measured()
	rep := &DayReport{Minutes: (ms[len(ms)-1].to - ms[0].from) / 60, Instances: c.Instances}
	for _, q := range tr.Requests {
		if q.Arrival >= ms[0].from {
			rep.Requests++
		}
	}
	fixed, err := runEveryFixed(ctx, &c, tr, par)
	if err != nil {
		return nil, err
	}
	best := 0
	for i, r := range fixed {
		a := dayRun("", r).Attainment
		rep.Sweep = append(rep.Sweep, Candidate{Prefill: i + 1, Decode: c.Instances - i - 1, Attainment: a})
		if a > rep.Sweep[best].Attainment {
			best = i
		}
	}
	rep.Runs = append(rep.Runs,
		fixedRun(fmt.Sprintf("fixed %dP%dD", o.FixedPrefill, c.Instances-o.FixedPrefill), fixed[o.FixedPrefill-1], o.FixedPrefill, c.Instances),
		fixedRun("best fixed (hindsight)", fixed[best], best+1, c.Instances))
	oracle := oracleSplits(fixed, len(c.Phases), c.Instances, rep)
	planned, err := runPlanned(ctx, &c, tr, o.FixedPrefill, false)
	if err != nil {
		return nil, err
	}
	rep.Runs = append(rep.Runs, planned)
	if o.WhatIf {
		wi, err := runPlanned(ctx, &c, tr, o.FixedPrefill, true)
		if err != nil {
			return nil, err
		}
		rep.Runs = append(rep.Runs, wi)
	}
	or, err := runOracle(ctx, &c, tr, o.FixedPrefill, oracle)
	if err != nil {
		return nil, err
	}
	rep.Runs = append(rep.Runs, or)
	fo, err := runForesight(ctx, &c, tr, o.FixedPrefill)
	if err != nil {
		return nil, err
	}
	rep.Runs = append(rep.Runs, fo)
	return rep, nil
}

// runEveryFixed simulates the day under every fixed split (1 to
// Instances−1 prefill instances, in that order), par at a time.
func runEveryFixed(ctx context.Context, c *DayConfig, tr *workload.Trace, par int) ([]sim.PhasedResult, error) {
	n := c.Instances - 1
	fixed := make([]sim.PhasedResult, n)
	errs := make([]error, n)
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for q := 1; q <= n; q++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fixed[q-1], errs[q-1] = runFixed(ctx, c, tr, q)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return fixed, nil
}

// oracleSplits is the oracle's prefill instances per phase: the best
// fixed split in that phase (fixed[i] has i+1), each also reported in
// rep.OracleSplits.
func oracleSplits(fixed []sim.PhasedResult, phases, instances int, rep *DayReport) []int {
	oracle := make([]int, phases)
	for ph := range phases {
		b := 0
		for i, r := range fixed {
			if r.Segments[ph].Attainment > fixed[b].Segments[ph].Attainment {
				b = i
			}
		}
		oracle[ph] = b + 1
		rep.OracleSplits = append(rep.OracleSplits, Candidate{Prefill: b + 1, Decode: instances - b - 1,
			Attainment: fixed[b].Segments[ph].Attainment})
	}
	return oracle
}

func runFixed(ctx context.Context, c *DayConfig, tr *workload.Trace, prefill int) (sim.PhasedResult, error) {
	sc, err := c.scheduler()
	if err != nil {
		return sim.PhasedResult{}, err
	}
	cfg := c.fleet(prefill)
	cfg.Interval = 0
	res, err := sim.RunPhased(ctx, cfg, tr, sc, nil)
	if err != nil {
		return res, fmt.Errorf("fixed %dP%dD: %w", prefill, c.Instances-prefill, err)
	}
	return res, nil
}

func fixedRun(name string, r sim.PhasedResult, prefill, total int) DayRun {
	run := dayRun(name, r)
	run.Split = fmt.Sprintf("%dP%dD", prefill, total-prefill)
	return run
}

// dayRun summarises a run over the measured day: its phases' requests.
func dayRun(name string, r sim.PhasedResult) DayRun {
	run := DayRun{Name: name, Switches: len(r.Switches), Phases: r.Segments, Timeline: r.Switches}
	n := 0
	for _, s := range r.Segments {
		w := float64(s.Requests)
		n += s.Requests
		run.Attainment += w * s.Attainment
		run.TTFTAttainment += w * s.TTFTAttainment
		run.TPOTAttainment += w * s.TPOTAttainment
		run.Rejected += w * s.Rejected
	}
	if n > 0 {
		w := float64(n)
		run.Attainment /= w
		run.TTFTAttainment /= w
		run.TPOTAttainment /= w
		run.Rejected /= w
	}
	return run
}

// simSource observes a phased run as a gateway would.
type simSource struct{ live *sim.Live }

func (s *simSource) Observe(_ context.Context, now, window, recent float64) (Observation, error) {
	w := s.live.Window(now-window, now)
	o := Observation{Now: now, Window: now - max(now-window, 0), Requests: w.Arrivals, PromptTokens: w.PromptTokens,
		CachedTokens: w.CachedTokens, OutputTokens: w.OutputTokens, RejectedPrefill: w.RejectedTTFT,
		RejectedDecode: w.RejectedDecode, Finished: w.Finished, TTFTMiss: w.TTFTMiss, TPOTMiss: w.TPOTMiss}
	if recent > 0 {
		o.Recent = s.live.Trace(max(now-recent, 0), now)
	}
	if w.Finished > 0 {
		o.MeanTTFT, o.MeanTPOT = w.TTFTSum/float64(w.Finished), w.TPOTSum/float64(w.Finished)
	}
	return o, nil
}

// SimDriver runs a Loop as a phased simulation's controller: the loop's
// source is the run's window, its actuator the run's fleet.
type SimDriver struct {
	Loop *Loop
	src  *simSource
	act  *SimActuator
}

// NewSimDriver wires planner p to a phased run; window is the observation
// window in seconds.
func NewSimDriver(p *Planner, window float64) (*SimDriver, error) {
	d := &SimDriver{src: &simSource{}, act: &SimActuator{}}
	l, err := NewLoop(LoopConfig{Planner: p, Source: d.src, Actuator: d.act, Name: "sim", Window: window,
		Clock: func() float64 { return d.src.live.Now() }})
	if err != nil {
		return nil, err
	}
	d.Loop = l
	return d, nil
}

// Tick implements sim.Controller.
func (d *SimDriver) Tick(ctx context.Context, live *sim.Live) error {
	d.src.live, d.act.Live = live, live
	_, err := d.Loop.Step(ctx)
	return err
}

// dayPlanner is the planner the day runs: the formula on the model's
// capacity, or with what-if simulation on the same fleet and policy.
func dayPlanner(c *DayConfig, whatIf bool) (*Planner, error) {
	log := c.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	run := "planner"
	if whatIf {
		run = "planner + what-if"
	}
	log = log.With("run", run) // the day runs both: say whose decision
	pc := Config{Total: c.Instances, Capacity: c.Capacity(), Warmup: c.Warmup, Interval: c.Interval, Learn: c.Learn, Logger: log}
	if c.PlannerCapacity != nil {
		pc.Capacity = StaticCapacity(*c.PlannerCapacity)
	}
	if whatIf {
		f := c.fleet(1)
		f.Segments = nil
		pc.WhatIf = &WhatIf{Fleet: f, Policy: c.Policy, Options: sched.Options{Seed: c.Seed + 1}, EarlyReject: true, Every: 60,
			Warmup: 1.5 * maxOSL(c.Phases) * c.SLO.TPOT}
	}
	return New(pc)
}

// maxOSL is the longest mean output of the phases.
func maxOSL(phases []Phase) float64 {
	m := 0.0
	for _, ph := range phases {
		m = max(m, ph.OSL)
	}
	return m
}

func runPlanned(ctx context.Context, c *DayConfig, tr *workload.Trace, start int, whatIf bool) (DayRun, error) {
	p, err := dayPlanner(c, whatIf)
	if err != nil {
		return DayRun{}, err
	}
	drv, err := NewSimDriver(p, c.Interval)
	if err != nil {
		return DayRun{}, err
	}
	sc, err := c.scheduler()
	if err != nil {
		return DayRun{}, err
	}
	res, err := sim.RunPhased(ctx, c.fleet(start), tr, sc, drv)
	name := "planner"
	if whatIf {
		name = "planner + what-if"
	}
	if err != nil {
		return DayRun{}, fmt.Errorf("%s: %w", name, err)
	}
	run := dayRun(name, res)
	st := drv.Loop.Status()
	run.Split = fmt.Sprintf("from %dP%dD, planned", start, c.Instances-start)
	run.Changes = st.Changes
	run.Log = st.Switches
	return run, nil
}

// oracle switches, ahead of each phase, to that phase's best fixed split,
// early enough that the switch (drain and warm-up) ends as the phase
// begins (the middle of the transition into it).
type oracle struct {
	spans  []span
	splits []int
	// lead[j] is how long before phase j starts the oracle switches.
	lead []float64
}

func newOracle(c *DayConfig, splits []int) *oracle {
	o := &oracle{spans: c.spans(), splits: splits, lead: make([]float64, len(splits))}
	for j := 1; j < len(splits); j++ {
		drain := c.SLO.TTFT // a prefill queue
		if splits[j] > splits[j-1] {
			// Decode instances finish their streams: the longest left,
			// about 1.5 × the mean output at the TPOT target.
			drain = 1.5 * c.Phases[j-1].OSL * c.SLO.TPOT
		}
		o.lead[j] = c.Warmup + drain
	}
	return o
}

func (o *oracle) Tick(_ context.Context, live *sim.Live) error {
	ph := 0
	for j := len(o.spans) - 1; j > 0; j-- {
		if live.Now() >= o.spans[j].from-o.lead[j] {
			ph = j
			break
		}
	}
	inst := live.Instances()
	np, idle := servingPrefill(inst)
	if !idle {
		return nil // one change at a time
	}
	return switchTo(live, inst, np, o.splits[ph])
}

// foresight is an oracle that knows the load ahead: before each interval
// it sizes the split, with the planner's own rules, for the exact load of
// the interval after its switch would land (read from the trace: output
// tokens, and prompt tokens less each phase's shared prefix), and moves
// there in one change, with no forecast, margin or confirmation.
type foresight struct {
	c      *DayConfig
	tr     *workload.Trace
	p      *Planner
	prefix []int // shared-prefix tokens of each phase
}

func newForesight(c *DayConfig, tr *workload.Trace) (*foresight, error) {
	// The oracle knows the engine: the timing model's capacity, whatever
	// the planner is configured with.
	oc := *c
	oc.PlannerCapacity, oc.Learn = nil, false
	p, err := dayPlanner(&oc, false)
	if err != nil {
		return nil, err
	}
	f := &foresight{c: c, tr: tr, p: p, prefix: make([]int, len(c.Phases))}
	for i, ph := range c.Phases {
		f.prefix[i] = int(ph.Hit*ph.ISL) / tr.BlockSize * tr.BlockSize
	}
	return f, nil
}

// loads are the exact prefill and decode loads of [from, to) and their
// shape.
func (f *foresight) loads(from, to float64) (lp, ld float64, s Shape) {
	reqs := f.tr.Requests
	i, _ := slices.BinarySearchFunc(reqs, from, func(q workload.Request, t float64) int { return cmp.Compare(q.Arrival, t) })
	var n, prompt, unc, out float64
	for ; i < len(reqs) && reqs[i].Arrival < to; i++ {
		q := &reqs[i]
		n++
		prompt += float64(q.PromptTokens)
		unc += float64(max(q.PromptTokens-f.prefix[q.Session], 0))
		out += float64(q.OutputTokens)
	}
	if n == 0 {
		return 0, 0, s
	}
	w := to - from
	s = Shape{Rate: n / w, ISL: prompt / n, OSL: out / n, Hit: 1 - unc/prompt}
	return unc / w, out / w, s
}

func (f *foresight) Tick(_ context.Context, live *sim.Live) error {
	inst := live.Instances()
	np, idle := servingPrefill(inst)
	if !idle {
		return nil // one change at a time
	}
	from := live.Now() + f.c.Warmup
	lp, ld, shape := f.loads(from, from+f.c.Interval)
	if shape.Rate == 0 {
		return nil
	}
	total := f.c.Instances
	want := f.p.formulaBest(lp, ld, 1, total-1, np, total, f.p.cfg.Capacity.Estimate(shape))
	return switchTo(live, inst, np, want)
}

// servingPrefill counts the prefill instances, and reports whether no
// instance is switching.
func servingPrefill(inst []sim.InstanceState) (np int, idle bool) {
	for _, s := range inst {
		if s.State != sim.StateServing {
			return 0, false
		}
		if s.Role == fleet.RolePrefill {
			np++
		}
	}
	return np, true
}

// switchTo moves the least loaded instances so that want serve prefill.
func switchTo(live *sim.Live, inst []sim.InstanceState, np, want int) error {
	from, to, k := fleet.RoleDecode, fleet.RolePrefill, want-np
	if k < 0 {
		from, to, k = fleet.RolePrefill, fleet.RoleDecode, -k
	}
	slices.SortStableFunc(inst, func(a, b sim.InstanceState) int { return cmp.Compare(a.Load, b.Load) })
	for _, s := range inst {
		if k == 0 {
			break
		}
		if s.Role == from {
			if err := live.Switch(s.ID, to); err != nil {
				return err
			}
			k--
		}
	}
	return nil
}

func runForesight(ctx context.Context, c *DayConfig, tr *workload.Trace, start int) (DayRun, error) {
	sc, err := c.scheduler()
	if err != nil {
		return DayRun{}, err
	}
	f, err := newForesight(c, tr)
	if err != nil {
		return DayRun{}, err
	}
	res, err := sim.RunPhased(ctx, c.fleet(start), tr, sc, f)
	if err != nil {
		return DayRun{}, fmt.Errorf("oracle (foresight): %w", err)
	}
	run := dayRun("oracle (foresight)", res)
	run.Split = "sized for the coming load"
	run.Changes = changesOf(res.Switches)
	return run, nil
}

// changesOf counts the distinct start times of switches.
func changesOf(sw []sim.SwitchRecord) int {
	n := 0
	for i, s := range sw {
		if i == 0 || s.Start != sw[i-1].Start {
			n++
		}
	}
	return n
}

func runOracle(ctx context.Context, c *DayConfig, tr *workload.Trace, start int, splits []int) (DayRun, error) {
	sc, err := c.scheduler()
	if err != nil {
		return DayRun{}, err
	}
	res, err := sim.RunPhased(ctx, c.fleet(start), tr, sc, newOracle(c, splits))
	if err != nil {
		return DayRun{}, fmt.Errorf("oracle: %w", err)
	}
	run := dayRun("oracle (phases)", res)
	parts := make([]string, len(splits))
	for i, q := range splits {
		parts[i] = fmt.Sprintf("%dP%dD", q, c.Instances-q)
	}
	run.Split = strings.Join(parts, " ")
	run.Changes = changesOf(res.Switches)
	return run, nil
}
