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
// and hands the union to the gateway; a union the gateway refuses (say, a
// name used twice) is logged and the running fleet kept.
type fleetUnion struct {
	mu     sync.Mutex
	static []fleet.Endpoint
	latest map[int][]fleet.Endpoint
	g      *gateway.Gateway
	log    *slog.Logger
}

func (u *fleetUnion) update(src int, eps []fleet.Endpoint) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.latest[src] = eps
	all := u.union()
	if err := u.g.SetEndpoints(all); err != nil {
		u.log.Error("discovery: endpoint update refused; the running fleet is kept", "err", err)
		return
	}
	u.log.Info("discovery: fleet updated", "endpoints", len(all))
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

// withStatic replaces the static endpoints (a config reload) and returns
// the new union.
func (u *fleetUnion) withStatic(static []fleet.Endpoint) []fleet.Endpoint {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.static = static
	return u.union()
}
