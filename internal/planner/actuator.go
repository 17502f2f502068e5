package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/sim"
)

// Actuator carries out the planner's decisions on a fleet: the simulator
// (SimActuator), the engine emulator's role-switch endpoint
// (EngineActuator), Kubernetes (KubeActuator) or nobody (DryRun).
type Actuator interface {
	// Instances reports every instance of the fleet, with its role and
	// any role change in progress.
	Instances(ctx context.Context) ([]Instance, error)
	// Switch starts moving the named instance to role to and returns once
	// the change has started; Instances shows it switching until it
	// serves in its new role.
	Switch(ctx context.Context, name string, to fleet.Role) error
}

// SimActuator drives a phased simulation's fleet (sim.Live).
type SimActuator struct{ Live *sim.Live }

// Instances implements Actuator.
func (a SimActuator) Instances(context.Context) ([]Instance, error) {
	st := a.Live.Instances()
	out := make([]Instance, len(st))
	for i, s := range st {
		out[i] = Instance{Name: s.Name, Role: s.Role, Load: s.Load}
		if s.State != sim.StateServing {
			out[i].Switching, out[i].Target = true, s.Target
		}
	}
	return out, nil
}

// Switch implements Actuator.
func (a SimActuator) Switch(_ context.Context, name string, to fleet.Role) error {
	for _, s := range a.Live.Instances() {
		if s.Name == name {
			return a.Live.Switch(s.ID, to)
		}
	}
	return fmt.Errorf("sim: no instance %q", name)
}

// DryRun only logs the switches it is asked for; its decisions are exported
// like any other (Loop's Status and metrics). With a Source it reports that
// fleet's instances (the planner keeps proposing what it would do); without,
// it keeps a virtual fleet that takes each switch at once.
type DryRun struct {
	Source Actuator
	Logger *slog.Logger

	mu      sync.Mutex
	virtual []Instance
	// Switches counts the switches it was asked for.
	switches int
}

// NewDryRun returns a dry run over a virtual fleet of the given instances
// (ignored when source is set).
func NewDryRun(source Actuator, virtual []Instance, log *slog.Logger) *DryRun {
	if log == nil {
		log = slog.Default()
	}
	return &DryRun{Source: source, Logger: log, virtual: append([]Instance(nil), virtual...)}
}

// Instances implements Actuator.
func (a *DryRun) Instances(ctx context.Context) ([]Instance, error) {
	if a.Source != nil {
		return a.Source.Instances(ctx)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Instance(nil), a.virtual...), nil
}

// Switch implements Actuator: it logs, and moves the virtual instance.
func (a *DryRun) Switch(_ context.Context, name string, to fleet.Role) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.switches++
	a.Logger.Info("planner dry run: would switch", "instance", name, "to", to)
	if a.Source != nil {
		return errNotMoved
	}
	for i := range a.virtual {
		if a.virtual[i].Name == name {
			a.virtual[i].Role = to
			return nil
		}
	}
	return fmt.Errorf("dry run: no instance %q", name)
}

// errNotMoved is a dry run's answer over a real fleet: the switch was
// logged, nothing moved (Loop counts it neither moved nor failed).
var errNotMoved = errors.New("dry run: not switched")

// Switches is how many switches the dry run was asked for.
func (a *DryRun) Switches() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.switches
}
