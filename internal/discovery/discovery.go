// Package discovery tells the gateway which engines exist. A Source calls
// its update function with the full current list of endpoints once at
// start and again whenever the list changes, until its context ends.
//
// Sources here: Static (a fixed list) and File (a YAML file of endpoints,
// watched for changes). The Kubernetes source lives in the k8s subpackage
// so that only a binary that uses it links client-go.
package discovery

import (
	"context"
	"log/slog"
	"slices"

	"github.com/kvgate/kvgate/internal/fleet"
)

// Source discovers endpoints. Run calls update with the full, validated
// list (fleet.Validate) once at start and then on every change, from one
// goroutine (never concurrently); the slice belongs to the callee. Run
// returns nil when ctx ends, or an error when the source cannot run at
// all (for example its file is missing or invalid at start).
type Source interface {
	Run(ctx context.Context, update func([]fleet.Endpoint)) error
}

// Static is a fixed list of endpoints.
type Static struct {
	eps []fleet.Endpoint
}

// NewStatic validates eps (names unique, fields as fleet.Validate wants).
func NewStatic(eps []fleet.Endpoint) (*Static, error) {
	v, err := fleet.Validate(eps)
	if err != nil {
		return nil, err
	}
	return &Static{eps: v}, nil
}

// Run reports the list once and waits for ctx.
func (s *Static) Run(ctx context.Context, update func([]fleet.Endpoint)) error {
	update(slices.Clone(s.eps))
	<-ctx.Done()
	return nil
}

// Notifier passes lists on to an update function: the first always, later
// ones only when they differ from the last one passed, logging what
// changed. Sources use it to keep Source's contract; it is not safe for
// concurrent use.
type Notifier struct {
	source string
	log    *slog.Logger
	update func([]fleet.Endpoint)
	last   []fleet.Endpoint
	sent   bool
}

// NewNotifier returns a Notifier that logs as source.
func NewNotifier(source string, log *slog.Logger, update func([]fleet.Endpoint)) *Notifier {
	return &Notifier{source: source, log: log, update: update}
}

// Publish passes eps on unless it equals the last list passed; it reports
// whether it did. eps must not be modified afterwards.
func (n *Notifier) Publish(eps []fleet.Endpoint) bool {
	if n.sent && slices.EqualFunc(n.last, eps, fleet.Endpoint.Equal) {
		return false
	}
	added, removed, changed := Diff(n.last, eps)
	n.log.Info("discovery: endpoints", "source", n.source, "count", len(eps),
		"added", added, "removed", removed, "changed", changed)
	n.last, n.sent = eps, true
	n.update(slices.Clone(eps))
	return true
}

// Diff names the endpoints added, removed and changed (same name, other
// fields) from old to cur.
func Diff(old, cur []fleet.Endpoint) (added, removed, changed []string) {
	before := make(map[string]fleet.Endpoint, len(old))
	for _, e := range old {
		before[e.Name] = e
	}
	for _, e := range cur {
		o, ok := before[e.Name]
		switch {
		case !ok:
			added = append(added, e.Name)
		case !o.Equal(e):
			changed = append(changed, e.Name)
		}
		delete(before, e.Name)
	}
	for _, e := range old {
		if _, gone := before[e.Name]; gone {
			removed = append(removed, e.Name)
		}
	}
	return added, removed, changed
}
