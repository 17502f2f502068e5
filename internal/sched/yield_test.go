package sched

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestYieldFor: a request of 1 s alone (20 000 tokens at 20 000 tokens/s)
// and a 2 s SLO takes an investment's endpoint only where nothing is
// queued behind the investment and it fits there alone (pessimistic
// compute included), the one where it would be soonest.
func TestYieldFor(t *testing.T) {
	ep := func(wait, cached float64, slack float64, role fleet.Role) Endpoint {
		return Endpoint{Role: role, PrefillSpeed: 20000, QueueWait: wait, CachedTokens: int(cached), PrefillSlack: slack}
	}
	req := &Request{PromptTokens: 20000, SLO: SLO{TTFT: 2}}
	tests := []struct {
		name string
		eps  []Endpoint
		in   []Investing
		want int
	}{
		{"none", []Endpoint{ep(3, 0, 1, fleet.RoleBoth)}, nil, -1},
		{"alone", []Endpoint{ep(3, 0, 1, fleet.RoleBoth)}, []Investing{{0, 3}}, 0},
		{"queued behind", []Endpoint{ep(3, 0, 1, fleet.RoleBoth)}, []Investing{{0, 2.5}}, -1},
		{"the one with its prefix", []Endpoint{ep(3, 0, 1, fleet.RoleBoth), ep(3, 10000, 1, fleet.RoleBoth)}, []Investing{{0, 3}, {1, 3}}, 1},
		{"pessimism misses", []Endpoint{ep(3, 0, 2.5, fleet.RoleBoth)}, []Investing{{0, 3}}, -1},
		{"decode only", []Endpoint{ep(3, 0, 1, fleet.RoleDecode)}, []Investing{{0, 3}}, -1},
		{"out of range", []Endpoint{ep(3, 0, 1, fleet.RoleBoth)}, []Investing{{1, 3}, {-1, 3}}, -1},
		{"no sane remainder", []Endpoint{ep(3, 0, 1, fleet.RoleBoth)}, []Investing{{0, math.NaN()}}, -1},
	}
	sc := &Scheduler{EarlyReject: true}
	for _, tt := range tests {
		s := &Snapshot{Endpoints: tt.eps}
		if got := sc.YieldFor(req, s, tt.in); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// BenchmarkYieldFor64: what a request rejected for the load costs more
// while investments run: the choice among 8 investments on a 64-endpoint
// fleet (the caller then decides again), against one decision in the same
// run.
func BenchmarkYieldFor64(b *testing.B) {
	r, s := benchFleet(64)
	sc := Scheduler{Policy: mustNew(&testing.T{}, "kvgate", Options{}), Hold: true, EarlyReject: true}
	in := make([]Investing, 8)
	for k := range in {
		in[k] = Investing{Endpoint: 8 * k, Remaining: s.Endpoints[8*k].QueueWait}
	}
	b.Run("decision", func(b *testing.B) {
		for b.Loop() {
			sc.Decide(r, s)
		}
	})
	b.Run("yield-for", func(b *testing.B) {
		for b.Loop() {
			sc.YieldFor(r, s, in)
		}
	})
}
