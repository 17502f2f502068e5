package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/kvgate/kvgate/internal/discovery"
	"github.com/kvgate/kvgate/internal/discovery/k8s"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/gateway"
)

// serveConfig is kvgate serve's YAML file: the gateway's config and where
// endpoints come from besides the static list.
type serveConfig struct {
	gateway.Config `yaml:",inline"`
	Discovery      discoveryConfig `yaml:"discovery"`
	// Planner, when set, runs the xPyD planner in the background.
	Planner *plannerConfig `yaml:"planner"`
}

// discoveryConfig names the dynamic endpoint sources (docs/discovery.md).
type discoveryConfig struct {
	// File is a YAML file of endpoints (endpoints: [...]) watched for
	// changes.
	File string `yaml:"file"`
	// Kubernetes selects pods by label.
	Kubernetes *k8sConfig `yaml:"kubernetes"`
}

type k8sConfig struct {
	Kubeconfig       string `yaml:"kubeconfig"` // "": in-cluster
	Namespace        string `yaml:"namespace"`
	Selector         string `yaml:"selector"`
	RoleLabel        string `yaml:"role_label"`
	ModelLabel       string `yaml:"model_label"`
	Model            string `yaml:"model"`
	Port             int    `yaml:"port"`
	PortName         string `yaml:"port_name"`
	Scheme           string `yaml:"scheme"`
	EventsAnnotation string `yaml:"events_annotation"`
	EventsPort       int    `yaml:"events_port"`
	EventsPortName   string `yaml:"events_port_name"`
	NameFromPod      bool   `yaml:"name_from_pod"`
}

func (d discoveryConfig) any() bool { return d.File != "" || d.Kubernetes != nil }

// sources builds the configured discovery sources.
func (d discoveryConfig) sources(log *slog.Logger) ([]discovery.Source, error) {
	var out []discovery.Source
	if d.File != "" {
		f, err := discovery.NewFile(discovery.FileConfig{Path: d.File, Logger: log})
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	if k := d.Kubernetes; k != nil {
		client, err := k8s.NewClient(k.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("discovery.kubernetes: %w", err)
		}
		src, err := k8s.New(client, k8s.Config{Namespace: k.Namespace, Selector: k.Selector, RoleLabel: k.RoleLabel,
			ModelLabel: k.ModelLabel, Model: k.Model, Port: k.Port, PortName: k.PortName, Scheme: k.Scheme,
			EventsAnnotation: k.EventsAnnotation, EventsPort: k.EventsPort, EventsPortName: k.EventsPortName,
			NameFromPod: k.NameFromPod, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("discovery.kubernetes: %w", err)
		}
		out = append(out, src)
	}
	return out, nil
}

// fleetUnion merges the static endpoints with each source's latest list
// into the gateway's endpoint list, and applies the planner's switches
// over it: an engine the planner moved keeps its new role whatever the
// config or discovery list later (a reload or a discovery update no
// longer puts it back in its old role), and one switching is out of
// routing until it serves again.
type fleetUnion struct {
	mu     sync.Mutex
	static []fleet.Endpoint
	latest map[int][]fleet.Endpoint
	g      *gateway.Gateway
	log    *slog.Logger
	// roles are the planner's actuator's roles of the engines it
	// manages, and out those of them switching (nil: no actuator has
	// routed yet); managed is the engines the actuator last saw (Fleet).
	roles   map[string]fleet.Role
	out     map[string]bool
	managed []string
	// refused are the refusals logged, while they last (routed).
	refused map[string]bool
}

func (u *fleetUnion) update(src int, eps []fleet.Endpoint) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.latest[src] = eps
	all := u.routed()
	if err := u.g.SetEndpoints(all); err != nil {
		u.log.Error("discovery: endpoint update refused; the running fleet is kept", "err", err)
		return
	}
	u.log.Info("discovery: fleet updated", "endpoints", len(all))
}

// Fleet is every endpoint of the fleet, the planner's roles applied,
// those switching included (planner.EngineOptions.Fleet): the engines the
// planner manages from now.
func (u *fleetUnion) Fleet() []fleet.Endpoint {
	u.mu.Lock()
	defer u.mu.Unlock()
	all := u.withRoles(u.union())
	u.managed = u.managed[:0]
	for _, e := range all {
		u.managed = append(u.managed, e.Name)
	}
	return all
}

// endpoints is every endpoint of the fleet, the planner's roles applied,
// those switching included (as Fleet, which also records them as the
// planner's actuator's).
func (u *fleetUnion) endpoints() []fleet.Endpoint {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.withRoles(u.union())
}

// SetEndpoints implements planner.Router: eps are the engines of the
// planner's that serve, in their roles; the others it manages are
// switching. The gateway gets the whole fleet so (discovered engines the
// planner does not manage kept as listed).
func (u *fleetUnion) SetEndpoints(eps []fleet.Endpoint) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.roles, u.out = map[string]fleet.Role{}, map[string]bool{}
	for _, e := range eps {
		u.roles[e.Name] = e.Role
	}
	for _, name := range u.managed {
		if _, ok := u.roles[name]; !ok {
			u.out[name] = true
		}
	}
	return u.g.SetEndpoints(u.routed())
}

// routed is the fleet as the gateway routes it: the planner's roles
// applied, its engines switching left out, and what would make the list
// invalid left out too (logged once while it lasts): a discovered entry
// that clashes with a static one or another source's (a name, a socket,
// an adapter named like a model). One such entry used to make the
// gateway refuse every later list whole, so that deleted pods stayed
// routed and new ones were never added.
func (u *fleetUnion) routed() []fleet.Endpoint {
	all := u.withRoles(u.union())
	out := all[:0]
	for _, e := range all {
		if !u.out[e.Name] {
			out = append(out, e)
		}
	}
	kept, refused := fleet.ValidateEach(out)
	seen := make(map[string]bool, len(refused))
	for _, r := range refused {
		msg := r.Error()
		if !u.refused[msg] {
			u.log.Error("discovery: endpoint left out of the fleet", "err", msg)
		}
		seen[msg] = true
	}
	u.refused = seen
	return kept
}

// withRoles applies the planner's roles to eps (in place).
func (u *fleetUnion) withRoles(eps []fleet.Endpoint) []fleet.Endpoint {
	for i := range eps {
		if r, ok := u.roles[eps[i].Name]; ok {
			eps[i].Role = r
		}
	}
	return eps
}

// runDiscovery runs every source until ctx ends; it returns the first
// source's start-up error.
func runDiscovery(ctx context.Context, srcs []discovery.Source, u *fleetUnion) error {
	errc := make(chan error, len(srcs))
	for i, s := range srcs {
		go func() {
			errc <- s.Run(ctx, func(eps []fleet.Endpoint) { u.update(i, eps) })
		}()
	}
	var errs []error
	for range srcs {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (u *fleetUnion) union() []fleet.Endpoint {
	all := append([]fleet.Endpoint(nil), u.static...)
	srcs := make([]int, 0, len(u.latest))
	for i := range u.latest {
		srcs = append(srcs, i)
	}
	sort.Ints(srcs)
	for _, i := range srcs {
		all = append(all, u.latest[i]...)
	}
	return all
}

// reload gives apply the fleet to route with static as the configured
// endpoints (a config reload), and keeps static only when apply succeeds:
// a refused reload leaves the union as it was (it kept the refused
// file's endpoints, routed at the next discovery update until
// 2026-12-04).
func (u *fleetUnion) reload(static []fleet.Endpoint, apply func([]fleet.Endpoint) error) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	old := u.static
	u.static = static
	if err := apply(u.routed()); err != nil {
		u.static = old
		return err
	}
	return nil
}
