package sched

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestDisplaceFor: a request of 0.5 s (10 000 tokens at 20 000 tokens/s)
// with a 2 s SLO, rejected behind a queue of 1.8 s, takes the place of a
// queued request only if that one has not started, is of no higher
// priority, would compute more than it, and leaves it fitting its SLO
// (pessimistic compute included); of several, the one that frees the
// most compute.
func TestDisplaceFor(t *testing.T) {
	ep := func(wait, cached, slack float64, role fleet.Role) Endpoint {
		return Endpoint{Role: role, PrefillSpeed: 20000, QueueWait: wait, CachedTokens: int(cached), PrefillSlack: slack}
	}
	both := ep(1.8, 0, 1, fleet.RoleBoth)
	const now = 10.0
	tests := []struct {
		name   string
		eps    []Endpoint
		queued []Queued
		want   int
	}{
		{"none", []Endpoint{both}, nil, -1},
		{"larger, not started", []Endpoint{both}, []Queued{{Endpoint: 0, Compute: 1, Start: now + 0.5}}, 0},
		{"started", []Endpoint{both}, []Queued{{Endpoint: 0, Compute: 1, Start: now}}, -1},
		{"smaller", []Endpoint{both}, []Queued{{Endpoint: 0, Compute: 0.4, Start: now + 0.5}}, -1},
		{"as large", []Endpoint{both}, []Queued{{Endpoint: 0, Compute: 0.5, Start: now + 0.5}}, -1},
		{"too little freed", []Endpoint{ep(2.5, 0, 1, fleet.RoleBoth)}, []Queued{{Endpoint: 0, Compute: 0.8, Start: now + 0.5}}, -1},
		{"higher priority", []Endpoint{both}, []Queued{{Endpoint: 0, Compute: 1, Start: now + 0.5, Priority: 1}}, -1},
		{"lower priority", []Endpoint{both}, []Queued{{Endpoint: 0, Compute: 1, Start: now + 0.5, Priority: -1}}, 0},
		{"the most freed", []Endpoint{both, ep(1.8, 5000, 1, fleet.RoleBoth)},
			[]Queued{{Endpoint: 0, Compute: 1, Start: now + 0.5}, {Endpoint: 1, Compute: 1, Start: now + 0.5}, {Endpoint: 0, Compute: 0.9, Start: now + 0.1}}, 1},
		{"pessimism misses", []Endpoint{ep(1.8, 0, 3, fleet.RoleBoth)}, []Queued{{Endpoint: 0, Compute: 1, Start: now + 0.5}}, -1},
		{"decode only", []Endpoint{ep(1.8, 0, 1, fleet.RoleDecode)}, []Queued{{Endpoint: 0, Compute: 1, Start: now + 0.5}}, -1},
		{"out of range", []Endpoint{both}, []Queued{{Endpoint: 1, Compute: 1, Start: now + 1}, {Endpoint: -1, Compute: 1, Start: now + 1}}, -1},
		{"no sane numbers", []Endpoint{both}, []Queued{{Endpoint: 0, Compute: math.NaN(), Start: now + 1}, {Endpoint: 0, Compute: 1, Start: math.NaN()}}, -1},
	}
	sc := &Scheduler{EarlyReject: true, Displace: true}
	req := &Request{PromptTokens: 10000, SLO: SLO{TTFT: 2}}
	for _, tt := range tests {
		s := &Snapshot{Now: now, Endpoints: tt.eps}
		if got := sc.DisplaceFor(req, s, tt.queued); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
	// Without a TTFT SLO nothing is rejected for its queue.
	if got := sc.DisplaceFor(&Request{PromptTokens: 10000}, &Snapshot{Now: now, Endpoints: []Endpoint{both}}, []Queued{{Endpoint: 0, Compute: 1, Start: now + 1}}); got != -1 {
		t.Errorf("no SLO: %d", got)
	}
}

// TestDisplaceSettings: displacement is kvgate's, with early rejection
// only, unless the settings say every policy or none.
func TestDisplaceSettings(t *testing.T) {
	kv, _ := New("kvgate", Options{})
	co, _ := New("cache-only", Options{})
	for _, c := range []struct {
		mode   HoldMode
		pol    Policy
		reject bool
		want   bool
	}{
		{HoldByPolicy, kv, true, true},
		{HoldByPolicy, kv, false, false},
		{HoldByPolicy, co, true, false},
		{HoldAlways, co, true, true},
		{HoldNever, kv, true, false},
	} {
		if got := (HoldSettings{Displace: c.mode}).Scheduler(c.pol, c.reject).Displace; got != c.want {
			t.Errorf("%v %s reject %v: %v, want %v", c.mode, c.pol.Name(), c.reject, got, c.want)
		}
	}
}

// BenchmarkDisplaceFor64: what a request rejected for the load costs more
// with displacement: the choice among 256 queued requests (4 an
// endpoint) on a 64-endpoint fleet (the caller then decides again),
// against one decision of kvgate's and of llm-d's token-aware policy in
// the same run.
func BenchmarkDisplaceFor64(b *testing.B) {
	r, s := benchFleet(64)
	sc := Scheduler{Policy: mustNew(&testing.T{}, "kvgate", Options{}), EarlyReject: true, Displace: true}
	q := make([]Queued, 256)
	for k := range q {
		q[k] = Queued{Endpoint: k % 64, Compute: 0.05 * float64(1+k%7), Start: s.Now + 0.1*float64(1+k%5)}
	}
	b.Run("decision", func(b *testing.B) {
		for b.Loop() {
			sc.Decide(r, s)
		}
	})
	b.Run("llmd-token-aware", func(b *testing.B) {
		lsc := Scheduler{Policy: mustNew(&testing.T{}, "llmd-token-aware", Options{}), EarlyReject: true}
		for b.Loop() {
			lsc.Decide(r, s)
		}
	})
	b.Run("displace-for", func(b *testing.B) {
		for b.Loop() {
			sc.DisplaceFor(r, s, q)
		}
	})
}
