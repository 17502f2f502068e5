package sched

import "testing"

// TestSGLangLowMatch: below the match threshold on a balanced pool,
// sglang-cache-aware (SGLang's rule) goes to the endpoint whose tree is
// smallest, sglang-least-load to the least loaded; above it both take the
// longest match, and an imbalanced pool goes to the least loaded in both.
func TestSGLangLowMatch(t *testing.T) {
	tests := []struct {
		name             string
		snap             *Snapshot
		smallest, lowest int // sglang-cache-aware's and sglang-least-load's choices
	}{
		{"low match: smallest tree vs least loaded",
			snapOf(Endpoint{InflightRequests: 3, HeldTokens: 90000}, Endpoint{CachedTokens: 640, InflightRequests: 10, HeldTokens: 100000},
				Endpoint{InflightRequests: 5, HeldTokens: 20000}), 2, 0},
		{"equal trees: the least loaded, then the first",
			snapOf(Endpoint{InflightRequests: 4, HeldTokens: 500}, Endpoint{InflightRequests: 2, HeldTokens: 500},
				Endpoint{InflightRequests: 2, HeldTokens: 500}), 1, 1},
		{"unknown trees (0): the least loaded",
			snapOf(Endpoint{InflightRequests: 4}, Endpoint{InflightRequests: 1}), 1, 1},
		{"match over the threshold: the longest match",
			snapOf(Endpoint{InflightRequests: 3}, Endpoint{CachedTokens: 3200, InflightRequests: 10, HeldTokens: 1 << 20}), 1, 1},
		{"imbalanced: the least loaded, not the smallest tree",
			snapOf(Endpoint{InflightRequests: 10, HeldTokens: 1 << 20}, Endpoint{InflightRequests: 100}), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for name, want := range map[string]int{"sglang-cache-aware": tt.smallest, "sglang-least-load": tt.lowest} {
				p := mustNew(t, name, Options{})
				if p.Name() != name {
					t.Errorf("policy %s names itself %s", name, p.Name())
				}
				if got := pick(p, req(6400), tt.snap); got != want {
					t.Errorf("%s picked %d, want %d", name, got, want)
				}
			}
		})
	}
}
