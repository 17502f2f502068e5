package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/planner"
)

// plannerConfig turns on the xPyD planner in kvgate serve (docs/planner.md).
type plannerConfig struct {
	// Actuator: "dry-run" (default: decide, log and export, change
	// nothing) or "engine" (switch engines through their POST /admin/role
	// and tell the gateway their new roles).
	Actuator string `yaml:"actuator"`
	// Interval is the seconds between decisions (default 30).
	Interval float64 `yaml:"interval"`
	// Total is the instance budget (0: every endpoint).
	Total int `yaml:"total"`
	// MinPrefill and MinDecode: the fewest of each role (default 1).
	MinPrefill int `yaml:"min_prefill"`
	MinDecode  int `yaml:"min_decode"`
	// PrefillCapacity and DecodeCapacity are an instance's tokens/s
	// (default: the fleet's configured prefill speeds' mean, and the
	// planner's 3 000); Learn corrects them from the SLO misses seen.
	PrefillCapacity float64 `yaml:"prefill_capacity"`
	DecodeCapacity  float64 `yaml:"decode_capacity"`
	Learn           bool    `yaml:"learn"`
	// Cooldown and Warmup are the planner's seconds between changes and
	// of an instance's drain and warm-up (0: its defaults, 60 and 30).
	Cooldown float64 `yaml:"cooldown"`
	Warmup   float64 `yaml:"warmup"`
	// Grace is the seconds the engine actuator waits, an engine out of
	// routing, before asking it to switch, so that the requests already
	// sent to it arrive before it stops admitting (default 2; at most
	// 600).
	Grace *float64 `yaml:"grace"`
}

// defaultPlannerGrace is the engine actuator's default grace: the
// requests in flight to an engine leaving routing reach it within it
// (a P/D decode leg waits for its prefill leg, about a TTFT SLO).
const defaultPlannerGrace = 2 * time.Second

// check refuses settings out of range, naming them.
func (pc *plannerConfig) check() error {
	lim, sz := planner.Limits(), planner.SizingLimits()
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if pc.PrefillCapacity != 0 {
		add(sz.PrefillCapacity.Check("planner.prefill_capacity", pc.PrefillCapacity))
	}
	if pc.DecodeCapacity != 0 {
		add(sz.DecodeCapacity.Check("planner.decode_capacity", pc.DecodeCapacity))
	}
	add(lim.Cooldown.Check("planner.cooldown", pc.Cooldown))
	add(lim.Warmup.Check("planner.warmup", pc.Warmup))
	if g := pc.Grace; g != nil && (*g < 0 || *g > 600 || *g != *g) {
		add(fmt.Errorf("planner.grace must be in [0, 600] seconds, got %v", *g))
	}
	return errors.Join(errs...)
}

// fits refuses a budget the fleet eps cannot be planned with: the
// planner in serve switches roles, it neither adds nor removes engines.
// (A discovered fleet's size changes: there the planner warns when it
// cannot plan.)
func (pc *plannerConfig) fits(eps []fleet.Endpoint) error {
	n := 0
	for _, e := range eps {
		if e.Role == fleet.RolePrefill || e.Role == fleet.RoleDecode {
			n++
		}
	}
	switch {
	case n == 0:
		return fmt.Errorf("planner: the fleet has no prefill or decode endpoints; the planner sizes a disaggregated fleet's split")
	case pc.Total > 0 && pc.Total != n:
		return fmt.Errorf("planner.total is %d but the fleet has %d prefill and decode endpoints; the planner switches roles and neither adds nor removes engines: leave total at 0", pc.Total, n)
	case max(pc.MinPrefill, 1)+max(pc.MinDecode, 1) > n:
		return fmt.Errorf("planner.min_prefill %d and min_decode %d do not fit the fleet's %d prefill and decode endpoints", max(pc.MinPrefill, 1), max(pc.MinDecode, 1), n)
	}
	return nil
}

// fleetCapacity is the planner's per-instance capacity in serve: the
// configured, else the prefill speed the fleet's endpoints are
// configured with now (their mean; the gateway's --prefill-speed for
// those without), discovered ones included; and the planner's default
// decode capacity.
type fleetCapacity struct {
	pc           *plannerConfig
	u            *fleetUnion
	prefillSpeed float64
}

// Estimate implements planner.CapacityEstimator.
func (f fleetCapacity) Estimate(planner.Shape) planner.Capacity {
	c := planner.SeedCapacity()
	c.Prefill = f.prefillSpeed
	if f.pc.PrefillCapacity > 0 {
		c.Prefill = f.pc.PrefillCapacity
	} else if eps := f.u.endpoints(); len(eps) > 0 {
		var sum float64
		for _, e := range eps {
			sum += cmp.Or(e.PrefillSpeed, f.prefillSpeed)
		}
		c.Prefill = sum / float64(len(eps))
	}
	if f.pc.DecodeCapacity > 0 {
		c.Decode = f.pc.DecodeCapacity
	}
	return c
}

// trafficRecorder feeds the gateway's traffic to the planner's recorder.
type trafficRecorder struct{ r *planner.Recorder }

func (t trafficRecorder) Routed(at float64, prompt, cached, output int, rejP, rejD bool) {
	t.r.Arrived(planner.Arrival{At: at, PromptTokens: prompt, CachedTokens: cached, OutputTokens: output,
		RejectedPrefill: rejP, RejectedDecode: rejD})
}

func (t trafficRecorder) Answered(at, ttft, tpot float64, output int, ttftMiss, tpotMiss bool) {
	t.r.Completed(planner.Completion{At: at, TTFT: ttft, TPOT: tpot, OutputTokens: output, TTFTMiss: ttftMiss, TPOTMiss: tpotMiss})
}

func (t trafficRecorder) AnsweredOutput(at float64, output int) {
	t.r.Completed(planner.Completion{At: at, OutputTokens: output, Untimed: true})
}

// newPlannerRecorder is the recorder the gateway feeds when a planner is
// configured (nil otherwise).
func newPlannerRecorder(pc *plannerConfig) (*planner.Recorder, error) {
	if pc == nil {
		return nil, nil
	}
	return planner.NewRecorder(3600, 1<<20)
}

// newPlannerLoop builds the planner loop over the gateway's fleet (u:
// its configured and discovered endpoints), and mounts its status on the
// admin API and its metrics on /metrics.
func newPlannerLoop(pc *plannerConfig, rec *planner.Recorder, g *gateway.Gateway, u *fleetUnion, prefillSpeed float64, discovered bool, log *slog.Logger) (*planner.Loop, error) {
	if err := pc.check(); err != nil {
		return nil, err
	}
	eps := u.endpoints()
	if !discovered { // the fleet is what it is: a plan it cannot hold is an error now
		if err := pc.fits(eps); err != nil {
			return nil, err
		}
	}
	p, err := planner.New(planner.Config{Total: pc.Total, MinPrefill: pc.MinPrefill, MinDecode: pc.MinDecode,
		Interval: pc.Interval, Capacity: fleetCapacity{pc: pc, u: u, prefillSpeed: prefillSpeed}, Learn: pc.Learn,
		Cooldown: pc.Cooldown, Warmup: pc.Warmup, Logger: log})
	if err != nil {
		return nil, err // it says "planner: " (it said it twice)
	}
	var act planner.Actuator
	name := pc.Actuator
	switch name {
	case "", "dry-run":
		name = "dry-run"
		act = planner.NewDryRun(liveFleet{u: u, g: g}, nil, log)
	case "engine":
		grace := defaultPlannerGrace
		if pc.Grace != nil {
			grace = time.Duration(*pc.Grace * float64(time.Second))
		}
		if act, err = planner.NewEngineActuator(eps, planner.EngineOptions{Router: u, Fleet: u.Fleet, Grace: grace, Logger: log}); err != nil {
			return nil, fmt.Errorf("planner: %w", err)
		}
	default:
		return nil, fmt.Errorf("planner.actuator %q: dry-run or engine", pc.Actuator)
	}
	loop, err := planner.NewLoop(planner.LoopConfig{Planner: p, Source: rec, Actuator: act, Name: name, Clock: g.Clock})
	if err != nil {
		return nil, err
	}
	if err := g.AddCollector(planner.NewCollector(loop)); err != nil {
		return nil, fmt.Errorf("planner metrics: %w", err)
	}
	return loop, nil
}

// liveFleet is a dry run's fleet: the gateway's endpoints as they serve
// now (the ones the health checks have in), so that the planner judges
// the real fleet, not one it imagines its proposals made.
type liveFleet struct {
	u *fleetUnion
	g *gateway.Gateway
}

// Instances implements planner.Actuator.
func (l liveFleet) Instances(context.Context) ([]planner.Instance, error) {
	in := l.g.Eligible()
	var out []planner.Instance
	for _, e := range l.u.endpoints() {
		if in[e.Name] {
			out = append(out, planner.Instance{Name: e.Name, Role: e.Role})
		}
	}
	return out, nil
}

// Switch implements planner.Actuator; a dry run never calls it.
func (liveFleet) Switch(_ context.Context, name string, _ fleet.Role) error {
	return fmt.Errorf("dry run: %s not switched", name)
}

// withPlanner adds GET /admin/planner to the admin API.
func withPlanner(admin http.Handler, loop *planner.Loop) http.Handler {
	if loop == nil {
		return admin
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/planner", loop.Handler())
	mux.Handle("/", admin)
	return mux
}
