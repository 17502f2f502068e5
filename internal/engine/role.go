package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
)

// errSwitching rejects new work while the engine changes role.
var errSwitching = errors.New("engine is switching role; not admitting new requests")

// admit returns the role that serves a new request, or errSwitching.
func (e *Engine) admit() (fleet.Role, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.roleState != stateServing {
		return 0, errSwitching
	}
	return e.role, nil
}

// RoleStatus is the answer of GET /admin/role.
type RoleStatus struct {
	Role  fleet.Role `json:"role"`
	State string     `json:"state"`
	// TargetRole is the role being switched to; nil (no target_role in
	// the JSON) while serving.
	TargetRole *fleet.Role `json:"target_role,omitempty"`
	InFlight   int         `json:"in_flight"`
}

// RoleStatus reports the role and any switch in progress.
func (e *Engine) RoleStatus() RoleStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := RoleStatus{Role: e.role, State: e.roleState, InFlight: int(e.sched.inflight.Load())}
	if e.roleState != stateServing {
		to := e.targetRole
		st.TargetRole = &to
	}
	return st
}

// SwitchRole starts a role change: stop admitting, drain the requests in
// flight, wait the warm-up delay, then serve as to. It returns at once; the
// switch runs in the background (see RoleStatus).
func (e *Engine) SwitchRole(to fleet.Role) error {
	if err := checkRole(to); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.started {
		return errors.New("engine not started")
	}
	if e.roleState != stateServing {
		return fmt.Errorf("a switch to %s is already in progress", e.targetRole)
	}
	if e.role == to {
		return nil
	}
	e.roleState, e.targetRole = stateDraining, to
	e.log.Info("role switch: draining", "from", e.role, "to", to)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.runSwitch(e.ctx, to)
	}()
	return nil
}

func (e *Engine) runSwitch(ctx context.Context, to fleet.Role) {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for e.sched.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	e.mu.Lock()
	e.roleState = stateWarming
	e.mu.Unlock()
	warm := time.NewTimer(e.cfg.real(e.cfg.RoleSwitchWarmup.Seconds()))
	defer warm.Stop()
	select {
	case <-ctx.Done():
		return
	case <-warm.C:
	}
	e.mu.Lock()
	e.role, e.roleState = to, stateServing
	e.mu.Unlock()
	e.log.Info("role switch: serving", "role", to)
}

// checkRole rejects a fleet.Role value outside the three roles.
func checkRole(r fleet.Role) error {
	if r > fleet.RoleDecode {
		return fmt.Errorf("role must be both, prefill or decode, got %d", r)
	}
	return nil
}

// parseRequiredRole parses a role an operator names; unlike
// fleet.ParseRole it does not read "" as both.
func parseRequiredRole(s string) (fleet.Role, error) {
	r, err := fleet.ParseRole(s)
	if s == "" || err != nil {
		return 0, fmt.Errorf("role must be both, prefill or decode, got %q", s)
	}
	return r, nil
}

func (e *Engine) handleGetRole(w http.ResponseWriter, _ *http.Request) {
	openai.WriteJSON(w, http.StatusOK, e.RoleStatus())
}

func (e *Engine) handleSetRole(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Role string `json:"role"`
	}
	if err := e.decodeObject(w, r, &body); err != nil {
		openai.WriteError(w, err)
		return
	}
	to, err := parseRequiredRole(body.Role)
	if err != nil {
		openai.WriteError(w, openai.BadRequest("%v", err).WithParam("role"))
		return
	}
	if err := e.SwitchRole(to); err != nil {
		openai.WriteError(w, openai.Errorf(http.StatusConflict, "%v", err))
		return
	}
	st := e.RoleStatus()
	code := http.StatusAccepted
	if st.State == stateServing {
		code = http.StatusOK
	}
	openai.WriteJSON(w, code, st)
}
