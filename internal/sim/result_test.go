package sim

import (
	"testing"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// TestTailMeasures runs requests of 500 uncached tokens arriving together
// on one instance of 1 000 tokens/s: their TTFTs are 0.5 s, 1 s, 1.5 s, …
// so the longest, the late ones' median and the seed are known exactly.
func TestTailMeasures(t *testing.T) {
	tests := []struct {
		name      string
		n         int
		slo       float64
		reject    bool
		max, late float64
		attain    float64
	}{
		{"none late", 2, 1, false, 1, 0, 1},
		{"one late", 3, 1, false, 1.5, 1.5, 2.0 / 3},
		// 1.5 s and 2 s late: the median is sorted[n/2], the later one.
		{"two late", 4, 1, false, 2, 2, 0.5},
		{"odd late", 5, 1, false, 2.5, 2, 0.4},
		{"no SLO: nobody is late", 4, 0, false, 2, 0, 1},
		// Rejected requests are misses without a latency: nobody served
		// is late, and the max is the last admitted one's.
		{"rejected are not late", 4, 1, true, 1, 0, 0.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := &workload.Trace{Name: "t", BlockSize: 64, Duration: 1, Seed: 42}
			for i := range tt.n {
				// Distinct single-block prompts: nothing is cached.
				tr.Requests = append(tr.Requests, workload.Request{PromptTokens: 500, Keys: []uint64{uint64(i + 1)}, Session: -1})
			}
			m := perfmodel.Default()
			m.PrefillTokensPerSec = 1000
			cfg := Config{Prefill: 1, Model: m, CacheTokens: 64 * 10, SLO: sched.SLO{TTFT: tt.slo}}
			r := runPolicy(t, cfg, tr, "least-queue", tt.reject)
			if !near(r.TTFTMax, tt.max) || !near(r.LateTTFTP50, tt.late) || !near(r.Attainment, tt.attain) {
				t.Errorf("max %v, late p50 %v, attainment %v; want %v, %v, %v", r.TTFTMax, r.LateTTFTP50, r.Attainment, tt.max, tt.late, tt.attain)
			}
			if r.Seed != 42 {
				t.Errorf("seed %d, want the trace's 42", r.Seed)
			}
			if r.TTFTMax < r.TTFTP99 {
				t.Errorf("max %v below p99 %v", r.TTFTMax, r.TTFTP99)
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
