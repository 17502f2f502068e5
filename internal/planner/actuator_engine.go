package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
)

// Router routes requests to the fleet: the gateway, whose SetEndpoints
// replaces its endpoint list (requests in flight on a removed endpoint
// finish where they are).
type Router interface {
	SetEndpoints(eps []fleet.Endpoint) error
}

// EngineOptions configure an EngineActuator.
type EngineOptions struct {
	// Router, when set, is told the fleet's endpoints: an engine leaves it
	// before its switch starts and comes back in its new role once it
	// serves.
	Router Router
	// Grace is how long after taking an engine out of the router the
	// actuator waits before asking it to switch, so that requests already
	// routed to it (a decode leg whose prefill is running) reach it
	// before it stops admitting; in [0, 10m].
	Grace time.Duration
	// Client defaults to one with a 10 s timeout.
	Client *http.Client
	Logger *slog.Logger
	// Fleet, when set, is the fleet's endpoints now (a gateway's, its
	// discovered engines included), read at each Instances: an engine
	// it adds is managed from then on, in the role it lists; one it
	// drops is no longer; an engine the actuator switched keeps the role
	// it switched it to. Nil: the endpoints given to NewEngineActuator.
	Fleet func() []fleet.Endpoint
}

// EngineActuator switches engines' roles through their POST /admin/role
// (the kvgate engine emulator's drain-then-warm-up switch) and keeps a
// router's endpoint list in step.
type EngineActuator struct {
	o   EngineOptions
	log *slog.Logger
	rc  roleClient

	mu  sync.Mutex
	eps []fleet.Endpoint // roles as last serving
	// moving: engines switching, by name, to their target role.
	moving map[string]fleet.Role
	// unreachable: engines whose role status could not be read, by the
	// reads in a row that failed.
	unreachable map[string]int
	// foreign: engines switching on someone else's word, by target.
	foreign map[string]fleet.Role
	// failed: switches found undone since TakeFailures last ran.
	failed int
}

// maxRoleBody caps an engine's /admin/role answer.
const maxRoleBody = 64 << 10

// NewEngineActuator manages the engines of eps (each needs its URL).
func NewEngineActuator(eps []fleet.Endpoint, o EngineOptions) (*EngineActuator, error) {
	eps, err := fleet.Validate(eps)
	if err != nil {
		return nil, fmt.Errorf("engine actuator: %w", err)
	}
	for _, e := range eps {
		if e.URL == "" {
			return nil, fmt.Errorf("engine actuator: endpoint %s has no url", e.Name)
		}
		if e.Ranked() {
			// The role is the engine's, not a rank's: moving one rank
			// would move them all.
			return nil, fmt.Errorf("engine actuator: endpoint %s is a data-parallel rank; the planner switches whole engines' roles and cannot switch one rank", e.Name)
		}
	}
	if o.Grace < 0 || o.Grace > 10*time.Minute {
		return nil, fmt.Errorf("engine actuator: grace must be in [0, 10m], got %v", o.Grace)
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &EngineActuator{o: o, log: o.Logger, rc: roleClient{o.Client}, eps: eps, moving: map[string]fleet.Role{},
		unreachable: map[string]int{}, foreign: map[string]fleet.Role{}}, nil
}

// roleStatus is an engine's GET /admin/role answer.
type roleStatus struct {
	Role       string `json:"role"`
	State      string `json:"state"`
	TargetRole string `json:"target_role"`
	InFlight   int    `json:"in_flight"`
}

// roleClient speaks the engine's role-switch API.
type roleClient struct{ c *http.Client }

// status is GET base/admin/role of the engine called name.
func (rc roleClient) status(ctx context.Context, name, base string) (roleStatus, error) {
	var st roleStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/admin/role", nil)
	if err != nil {
		return st, err
	}
	resp, err := rc.c.Do(req)
	if err != nil {
		return st, fmt.Errorf("engine %s: %w", name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxRoleBody))
	if err != nil {
		return st, fmt.Errorf("engine %s: %w", name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("engine %s: GET /admin/role: status %d: %s", name, resp.StatusCode, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("engine %s: GET /admin/role: %w", name, err)
	}
	return st, nil
}

// set is POST base/admin/role {"role": to}: the engine drains, warms up
// and serves as to.
func (rc roleClient) set(ctx context.Context, name, base string, to fleet.Role) error {
	body, _ := json.Marshal(map[string]string{"role": to.String()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/admin/role", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := rc.c.Do(req)
	if err != nil {
		return fmt.Errorf("engine %s: POST /admin/role: %w", name, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxRoleBody))
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("engine %s: POST /admin/role: status %d: %s", name, resp.StatusCode, bytes.TrimSpace(msg))
	}
	return nil
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Instances implements Actuator: it asks every engine for its role, and an
// engine that finished its switch goes back into the router in its new
// role. An engine whose role cannot be read (no answer, an error, an
// answer it cannot understand) stays in the plan in the role it last
// served for unreadableGrace reads (a blip of its admin port made the
// planner move another engine to stand in for it), then is left out (the
// planner plans the engines it can reach; one dead engine froze every
// decision). An engine serving a role other than the router's is given
// that role (switched by someone else, or its switch undone by a
// restart), and one switching on someone else's word is out of the
// router until it serves, as the planner's own switches are.
func (a *EngineActuator) Instances(ctx context.Context) ([]Instance, error) {
	a.mu.Lock()
	if a.o.Fleet != nil {
		a.eps = a.follow(a.o.Fleet())
	}
	eps := append([]fleet.Endpoint(nil), a.eps...)
	a.mu.Unlock()
	out := make([]Instance, 0, len(eps))
	var ch roleChanges
	var errs []error
	for _, e := range eps {
		st, role, err := a.roleOf(ctx, e)
		if a.noteReach(e.Name, err) {
			errs = append(errs, err)
			continue
		}
		if err != nil { // within its grace: as it last served
			out = append(out, a.lastKnown(e))
			continue
		}
		out = append(out, a.instance(e, st, role, &ch))
	}
	if len(out) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := a.apply(&ch); err != nil {
		return nil, err
	}
	return out, nil
}

// roleOf reads engine e's role status: an error when it cannot be read or
// says neither a role it serves nor, while it is not serving, the role it
// is switching to (an engine "ready" without a target was taken for a
// switch in flight for ever, and froze every decision).
func (a *EngineActuator) roleOf(ctx context.Context, e fleet.Endpoint) (roleStatus, fleet.Role, error) {
	st, err := a.rc.status(ctx, e.Name, e.URL)
	if err != nil {
		return st, 0, err
	}
	role, err := fleet.ParseRole(st.Role)
	if err != nil {
		return st, 0, fmt.Errorf("engine %s: GET /admin/role: %w", e.Name, err)
	}
	if st.State != "serving" {
		if _, err := fleet.ParseRole(st.TargetRole); err != nil || st.TargetRole == "" { // "" parses as both
			return st, 0, fmt.Errorf("engine %s: GET /admin/role: state %q without a target_role (%q)", e.Name, st.State, st.TargetRole)
		}
	}
	return st, role, nil
}

// lastKnown is engine e as the actuator last knew it: serving its role,
// or switching to its target.
func (a *EngineActuator) lastKnown(e fleet.Endpoint) Instance {
	in := Instance{Name: e.Name, Role: e.Role}
	a.mu.Lock()
	defer a.mu.Unlock()
	if t, ok := a.moving[e.Name]; ok {
		in.Switching, in.Target = true, t
	} else if t, ok := a.foreign[e.Name]; ok {
		in.Switching, in.Target = true, t
	}
	return in
}

// unreadableGrace is how many reads in a row an engine's role may fail
// before it is left out of the plan.
const unreadableGrace = 3

// roleChanges are what one Instances found to change in the router.
type roleChanges struct {
	// done: the planner's switches finished in their target role;
	// undone: its switches whose engine serves another role (killed and
	// restarted in its old one, or refused after the planner's request
	// was taken); adopted: engines serving a role the router does not
	// have them in (someone else's switch, finished); started: engines
	// switching on someone else's word, by their target.
	done, undone, adopted, started map[string]fleet.Role
}

func (c *roleChanges) note(m *map[string]fleet.Role, name string, r fleet.Role) {
	if *m == nil {
		*m = map[string]fleet.Role{}
	}
	(*m)[name] = r
}

// instance is engine e's Instance from its role status st (serving role),
// noting in ch what the router must be told.
func (a *EngineActuator) instance(e fleet.Endpoint, st roleStatus, role fleet.Role, ch *roleChanges) Instance {
	in := Instance{Name: e.Name, Role: e.Role, Load: float64(st.InFlight)}
	a.mu.Lock()
	target, moving := a.moving[e.Name]
	a.mu.Unlock()
	serving := st.State == "serving"
	switch {
	case moving && serving && role == target:
		ch.note(&ch.done, e.Name, target)
		in.Role = target
	case moving && serving:
		ch.note(&ch.undone, e.Name, role)
		in.Role = role
	case moving:
		in.Switching, in.Target = true, target
	case !serving:
		t, _ := fleet.ParseRole(st.TargetRole) // roleOf checked it
		in.Switching, in.Target = true, t
		ch.note(&ch.started, e.Name, t)
	case role != e.Role || a.isForeign(e.Name):
		ch.note(&ch.adopted, e.Name, role)
		in.Role = role
	}
	return in
}

// isForeign reports whether name was switching on someone else's word.
func (a *EngineActuator) isForeign(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.foreign[name]
	return ok
}

// apply records ch in the actuator's roles and tells the router. A change
// already made (a switch's end found by its watch and by Instances both)
// is neither made nor logged again.
func (a *EngineActuator) apply(ch *roleChanges) error {
	if len(ch.done)+len(ch.undone)+len(ch.adopted)+len(ch.started) == 0 {
		return nil
	}
	var eff roleChanges // the changes that change something
	a.mu.Lock()
	for i := range a.eps {
		name := a.eps[i].Name
		_, moving := a.moving[name]
		fr, foreign := a.foreign[name]
		for _, c := range []struct {
			from map[string]fleet.Role
			to   *map[string]fleet.Role
		}{{ch.done, &eff.done}, {ch.undone, &eff.undone}, {ch.adopted, &eff.adopted}} {
			if r, ok := c.from[name]; ok && (moving || foreign || a.eps[i].Role != r) {
				eff.note(c.to, name, r)
				a.eps[i].Role = r
				delete(a.moving, name)
				delete(a.foreign, name)
			}
		}
		if r, ok := ch.started[name]; ok && (!foreign || fr != r) {
			eff.note(&eff.started, name, r)
			a.foreign[name] = r
		}
	}
	a.failed += len(eff.undone)
	var err error
	if len(eff.done)+len(eff.undone)+len(eff.adopted)+len(eff.started) > 0 {
		err = a.publishLocked()
	}
	a.mu.Unlock()
	for name, r := range eff.done {
		a.log.Info("planner: engine serves in its new role", "engine", name, "role", r)
	}
	for name, r := range eff.undone {
		a.log.Warn("planner: engine serves its old role, not the one it was switching to (restarted?); back in routing as it serves", "engine", name, "role", r)
	}
	for name, r := range eff.adopted {
		a.log.Warn("planner: engine serves a role the router did not have it in (switched by someone else); routing it as it serves", "engine", name, "role", r)
	}
	for name, r := range eff.started {
		a.log.Warn("planner: engine is switching on someone else's word; out of routing until it serves", "engine", name, "to", r)
	}
	return err
}

// noteReach counts an engine's failed role reads in a row and reports
// whether it is to be left out of the plan (past unreadableGrace); its
// becoming unreadable and readable again are logged once each.
func (a *EngineActuator) noteReach(name string, err error) (leaveOut bool) {
	a.mu.Lock()
	n, was := a.unreachable[name]
	if err != nil {
		n++
		a.unreachable[name] = n
	} else {
		delete(a.unreachable, name)
	}
	a.mu.Unlock()
	switch {
	case err != nil && !was:
		a.log.Warn("planner: engine's role cannot be read; planned as it last served until it has failed "+strconv.Itoa(unreadableGrace)+" reads in a row, then without it", "engine", name, "err", err)
	case err != nil && n == unreadableGrace+1:
		a.log.Warn("planner: engine's role still cannot be read; planning without it", "engine", name, "err", err)
	case err == nil && was:
		a.log.Info("planner: engine's role can be read again", "engine", name)
	}
	return err != nil && n > unreadableGrace
}

// TakeFailures returns how many switches Instances found undone since the
// last call (Loop counts them with the switches refused).
func (a *EngineActuator) TakeFailures() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.failed
	a.failed = 0
	return n
}

// follow is the engines to manage when the fleet lists now: the ones
// known keep the role the actuator has them in, new ones come in the role
// listed, those that cannot be switched (no URL, a data-parallel rank)
// are left to the router.
func (a *EngineActuator) follow(now []fleet.Endpoint) []fleet.Endpoint {
	known := make(map[string]fleet.Role, len(a.eps))
	for _, e := range a.eps {
		known[e.Name] = e.Role
	}
	out := make([]fleet.Endpoint, 0, len(now))
	for _, e := range now {
		if e.URL == "" || e.Ranked() {
			continue
		}
		if r, ok := known[e.Name]; ok {
			e.Role = r
		}
		out = append(out, e)
		delete(known, e.Name)
	}
	for name := range known { // gone from the fleet: no longer switching
		delete(a.moving, name)
		delete(a.unreachable, name)
		delete(a.foreign, name)
	}
	return out
}

// publishLocked gives the router the engines that are not switching, on
// the planner's word or someone else's.
func (a *EngineActuator) publishLocked() error {
	if a.o.Router == nil {
		return nil
	}
	eps := make([]fleet.Endpoint, 0, len(a.eps))
	for _, e := range a.eps {
		_, moving := a.moving[e.Name]
		if _, foreign := a.foreign[e.Name]; !moving && !foreign {
			eps = append(eps, e)
		}
	}
	if err := a.o.Router.SetEndpoints(eps); err != nil {
		return fmt.Errorf("engine actuator: router: %w", err)
	}
	return nil
}

// Switch implements Actuator: out of the router, wait Grace, then POST
// /admin/role; on failure the engine goes back into the router as it was.
func (a *EngineActuator) Switch(ctx context.Context, name string, to fleet.Role) error {
	if to != fleet.RolePrefill && to != fleet.RoleDecode {
		return fmt.Errorf("engine %s: the planner switches to prefill or decode, not %s", name, to)
	}
	a.mu.Lock()
	var ep *fleet.Endpoint
	for i := range a.eps {
		if a.eps[i].Name == name {
			ep = &a.eps[i]
		}
	}
	_, moving := a.moving[name]
	switch {
	case ep == nil:
		a.mu.Unlock()
		return fmt.Errorf("no engine %q", name)
	case moving || ep.Role == to:
		a.mu.Unlock()
		return fmt.Errorf("engine %s is already %s or switching", name, to)
	}
	e := *ep
	a.moving[name] = to
	err := a.publishLocked()
	a.mu.Unlock()
	if err == nil {
		err = sleepCtx(ctx, a.o.Grace)
	}
	if err == nil {
		err = a.rc.set(ctx, e.Name, e.URL, to)
	}
	if err != nil {
		a.mu.Lock()
		delete(a.moving, name)
		if perr := a.publishLocked(); perr != nil {
			err = fmt.Errorf("%w (and restoring it: %v)", err, perr)
		}
		a.mu.Unlock()
		return err
	}
	a.log.Info("planner: engine switching", "engine", name, "from", e.Role, "to", to)
	go a.watch(ctx, e, to)
	return nil
}

// watchEvery and watchFor bound how often and how long a switch is
// watched for its end (Instances, each planner step, decides otherwise).
const (
	watchEvery = 250 * time.Millisecond
	watchFor   = 10 * time.Minute
)

// watch asks engine e for its role until it serves to, and then puts it
// back into the router at once: it sat idle until the next planner step
// (an interval, 30 s by default: a walkthrough's clients got 503s while
// the only decode engine waited so). It stops when the switch is no
// longer in flight (Instances settled it), when ctx ends, or after
// watchFor.
func (a *EngineActuator) watch(ctx context.Context, e fleet.Endpoint, to fleet.Role) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	deadline := time.Now().Add(watchFor)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		target, moving := a.moving[e.Name]
		a.mu.Unlock()
		if !moving || target != to {
			return
		}
		st, role, err := a.roleOf(ctx, e)
		if err == nil && st.State == "serving" && role == to {
			ch := roleChanges{done: map[string]fleet.Role{e.Name: to}}
			if err := a.apply(&ch); err != nil {
				a.log.Warn("planner: engine serves in its new role, but the router refused it", "engine", e.Name, "err", err)
			}
			return
		}
	}
}
