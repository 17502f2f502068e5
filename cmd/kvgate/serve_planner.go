package main

import (
	"fmt"
	"log/slog"
	"net/http"

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

// newPlannerLoop builds the planner loop over the gateway, and mounts its
// status on the admin API and its metrics on /metrics.
func newPlannerLoop(pc *plannerConfig, rec *planner.Recorder, g *gateway.Gateway, eps []fleet.Endpoint, log *slog.Logger) (*planner.Loop, error) {
	p, err := planner.New(planner.Config{Total: pc.Total, MinPrefill: pc.MinPrefill, MinDecode: pc.MinDecode,
		Interval: pc.Interval, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("planner: %w", err)
	}
	var act planner.Actuator
	name := pc.Actuator
	switch name {
	case "", "dry-run":
		name = "dry-run"
		virtual := make([]planner.Instance, len(eps))
		for i, e := range eps {
			virtual[i] = planner.Instance{Name: e.Name, Role: e.Role}
		}
		act = planner.NewDryRun(nil, virtual, log)
	case "engine":
		if act, err = planner.NewEngineActuator(eps, planner.EngineOptions{Router: g, Logger: log}); err != nil {
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
