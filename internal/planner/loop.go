package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
)

// Source observes the traffic of the window [now − window, now). When
// recent > 0 and it can, it also returns the requests of [now − recent,
// now) as Observation.Recent, for the what-if simulation.
type Source interface {
	Observe(ctx context.Context, now, window, recent float64) (Observation, error)
}

// LoopConfig wires a planner to a fleet.
type LoopConfig struct {
	Planner  *Planner
	Source   Source
	Actuator Actuator
	// Name names the actuator in Status ("sim", "engine", "kubernetes",
	// "dry-run").
	Name string
	// Window is the observation window in seconds (default the planner's
	// interval).
	Window float64
	// Clock is the time in seconds (default: seconds since the loop was
	// made, on the wall clock).
	Clock func() float64
}

// Loop runs a planner: every interval it reads the fleet from the actuator
// and the window from the source, decides, and carries a switch out. Its
// Status is safe to read from any goroutine (an admin endpoint, metrics).
type Loop struct {
	cfg LoopConfig
	log *slog.Logger

	mu     sync.Mutex
	status Status
}

// Status is the planner's state as /admin/planner shows it.
type Status struct {
	Actuator string `json:"actuator"`
	// Instances as last reported, and their counts.
	Instances []Instance `json:"instances"`
	Prefill   int        `json:"prefill"`
	Decode    int        `json:"decode"`
	Switching int        `json:"switching"`
	// TargetPrefill and TargetDecode are the split the planner wants.
	TargetPrefill int `json:"target_prefill"`
	TargetDecode  int `json:"target_decode"`
	// Changes counts switch decisions, Switched the instances they moved
	// (a dry run over a real fleet moves none), Failed the switches the
	// actuator refused or found undone (an engine back in its old role).
	Changes  int `json:"changes"`
	Switched int `json:"switched"`
	Failed   int `json:"failed"`
	// Actions counts decisions by action.
	Actions map[string]int `json:"actions"`
	// Last is the latest decision; Switches the decisions that moved
	// instances (the newest History of them), each with its reason.
	Last     *Decision  `json:"last,omitempty"`
	Switches []Decision `json:"switches"`
	// StepErrors counts steps that made no decision (the fleet or the
	// window could not be read); Error is the last step's failure, if it
	// failed.
	StepErrors int    `json:"step_errors"`
	Error      string `json:"error,omitempty"`
}

// NewLoop checks the wiring.
func NewLoop(cfg LoopConfig) (*Loop, error) {
	if cfg.Planner == nil || cfg.Source == nil || cfg.Actuator == nil {
		return nil, errors.New("planner loop: needs a planner, a source and an actuator")
	}
	if cfg.Window == 0 {
		cfg.Window = cfg.Planner.cfg.Interval
	}
	if !(cfg.Window > 0 && cfg.Window <= 86400) {
		return nil, fmt.Errorf("planner loop: window must be in (0, 86400] s, got %v", cfg.Window)
	}
	if cfg.Clock == nil {
		start := time.Now()
		cfg.Clock = func() float64 { return time.Since(start).Seconds() }
	}
	l := &Loop{cfg: cfg, log: cfg.Planner.log}
	l.status = Status{Actuator: cfg.Name, Actions: map[string]int{}, Switches: []Decision{}}
	return l, nil
}

// Step makes one decision and carries it out.
func (l *Loop) Step(ctx context.Context) (Decision, error) {
	now := l.cfg.Clock()
	inst, err := l.cfg.Actuator.Instances(ctx)
	if err != nil {
		l.fail(err)
		return Decision{}, fmt.Errorf("planner: fleet: %w", err)
	}
	if f, ok := l.cfg.Actuator.(failureTaker); ok {
		l.undone(f.TakeFailures())
	}
	recent := 0.0
	if w := l.cfg.Planner.cfg.WhatIf; w != nil {
		recent = w.Warmup + l.cfg.Window
	}
	obs, err := l.cfg.Source.Observe(ctx, now, l.cfg.Window, recent)
	if err != nil {
		l.fail(err)
		return Decision{}, fmt.Errorf("planner: observe: %w", err)
	}
	d := l.cfg.Planner.Decide(ctx, &obs, inst)
	var errs []error
	moved := 0
	if d.Action == ActionSwitch {
		for _, mv := range []struct {
			names []string
			to    fleet.Role
		}{{d.ToPrefill, fleet.RolePrefill}, {d.ToDecode, fleet.RoleDecode}} {
			for _, n := range mv.names {
				if err := l.cfg.Actuator.Switch(ctx, n, mv.to); errors.Is(err, errNotMoved) {
					continue
				} else if err != nil {
					errs = append(errs, err)
					continue
				}
				moved++
			}
		}
	}
	err = errors.Join(errs...)
	l.record(d, inst, moved, len(errs), err)
	if err != nil {
		return d, fmt.Errorf("planner: switch: %w", err)
	}
	return d, nil
}

// failureTaker is an actuator that finds switches undone after they
// started (EngineActuator: an engine restarted in its old role).
type failureTaker interface{ TakeFailures() int }

// undone counts n switches found undone as failed, and not as moved.
func (l *Loop) undone(n int) {
	if n == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.status.Failed += n
	l.status.Switched = max(l.status.Switched-n, 0)
}

// fail records a step that made no decision: the fleet it showed is not
// known any more (it kept showing the last one read).
func (l *Loop) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.status.StepErrors++
	l.status.Error = err.Error()
	l.status.Instances = []Instance{}
	l.status.Prefill, l.status.Decode, l.status.Switching = 0, 0, 0
}

func (l *Loop) record(d Decision, inst []Instance, moved, failed int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &l.status
	s.Instances = inst
	s.Prefill, s.Decode, s.Switching = d.Prefill, d.Decode, d.Switching
	s.TargetPrefill, s.TargetDecode = d.TargetPrefill, d.TargetDecode
	s.Actions[d.Action]++
	s.Last = &d
	s.Error = ""
	if err != nil {
		s.Error = err.Error()
	}
	if d.Action == ActionSwitch {
		s.Changes++
		s.Switched += moved
		s.Failed += failed
		s.Switches = append(s.Switches, d)
		if h := l.cfg.Planner.cfg.History; len(s.Switches) > h {
			s.Switches = append([]Decision(nil), s.Switches[len(s.Switches)-h:]...)
		}
	}
}

// Status returns a copy of the planner's state.
func (l *Loop) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.status
	s.Instances = append([]Instance{}, s.Instances...) // [] before the first step, not null
	s.Switches = append([]Decision{}, s.Switches...)
	s.Actions = make(map[string]int, len(l.status.Actions))
	for k, v := range l.status.Actions {
		s.Actions[k] = v
	}
	if s.Last != nil {
		last := *s.Last
		s.Last = &last
	}
	return s
}

// Run steps every planner interval until ctx ends. It reads the fleet at
// once (the engine actuator then routes engines in the roles they serve:
// a restarted gateway routed them in the configured ones for its first
// interval), and decides from the first interval on. A failed step is
// logged when its error is not the last step's (not every step: an
// unreadable fleet warned every interval for ever), and the loop goes on.
func (l *Loop) Run(ctx context.Context) error {
	if inst, err := l.cfg.Actuator.Instances(ctx); err == nil {
		l.mu.Lock()
		l.status.Instances = inst
		l.status.Prefill, l.status.Decode, l.status.Switching = counts(inst)
		l.mu.Unlock()
	}
	iv := time.Duration(l.cfg.Planner.cfg.Interval * float64(time.Second))
	t := time.NewTicker(iv)
	defer t.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		_, err := l.Step(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil && err.Error() != last:
			l.log.Warn("planner step failed (logged again when its error changes)", "err", err)
			last = err.Error()
		case err == nil && last != "":
			l.log.Info("planner steps again")
			last = ""
		}
	}
}

// Handler serves the Status as JSON (for /admin/planner).
func (l *Loop) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			openai.WriteError(w, openai.Errorf(http.StatusMethodNotAllowed, "use GET"))
			return
		}
		openai.WriteJSON(w, http.StatusOK, l.Status())
	})
}
