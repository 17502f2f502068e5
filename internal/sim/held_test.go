package sim

import (
	"testing"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// TestSGLangSmallestTree: requests matching nothing on an idle fleet go,
// under SGLang's rule, to the instance whose cache holds the least (so
// they take turns), and under sglang-least-load to the least loaded (all
// equal: the first). With event lag longer than the run the router has
// heard of no stored block, every tree looks empty, and SGLang's rule
// falls back to the least loaded too.
func TestSGLangSmallestTree(t *testing.T) {
	tr := &workload.Trace{Name: "t", BlockSize: 64, Duration: 80}
	for i := range 8 {
		keys := []uint64{uint64(2*i + 1), uint64(2*i + 2)}
		tr.Requests = append(tr.Requests, workload.Request{Arrival: float64(10 * i), PromptTokens: 128, Keys: keys, Session: -1})
	}
	tests := []struct {
		policy string
		lag    float64
		want   []int
	}{
		{"sglang-cache-aware", 0, []int{0, 1, 2, 3, 0, 1, 2, 3}},
		{"sglang-least-load", 0, []int{0, 0, 0, 0, 0, 0, 0, 0}},
		{"sglang-cache-aware", 1000, []int{0, 0, 0, 0, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		var got []int
		cfg := Config{Prefill: 4, Model: perfmodel.Default(), CacheTokens: 64 * 100, SLO: sched.SLO{TTFT: 2}, EventLag: tt.lag,
			OnDecision: func(_ int, d sched.Decision) { got = append(got, d.Prefill) }}
		runPolicy(t, cfg, tr, tt.policy, false)
		if len(got) != len(tt.want) {
			t.Fatalf("%s: %d decisions", tt.policy, len(got))
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s, lag %v: chose %v, want %v", tt.policy, tt.lag, got, tt.want)
				break
			}
		}
	}
}
