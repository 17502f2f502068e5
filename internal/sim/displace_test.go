package sim

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// TestDisplacement: one instance of 20 000 tokens/s, a 2 s SLO, early
// rejection. A (0.6 s) starts at once; B (1.2 s) queues behind it; C
// (0.5 s) at 0.2 s would wait 1.6 s, misses, and takes B's place (B, not
// started, is rejected; its blocks leave the cache); D (0.8 s) at 0.3 s
// then fits behind C. Three served against two, and a later request on
// B's prompt finds nothing of it cached. Without displacement (and for
// cache-only, by policy) B keeps its place and C and D are rejected.
func TestDisplacement(t *testing.T) {
	keys := func(from, n int) []uint64 {
		k := make([]uint64, n)
		for i := range k {
			k[i] = uint64(from + i)
		}
		return k
	}
	req := func(at float64, from, blocks int) workload.Request {
		return workload.Request{Arrival: at, PromptTokens: blocks * 1000, Keys: keys(from, blocks), Session: -1, OutputTokens: 1}
	}
	tr := &workload.Trace{Name: "t", BlockSize: 1000, Duration: 10, Requests: []workload.Request{
		req(0, 100, 12), req(0.1, 200, 24), req(0.2, 300, 10), req(0.3, 400, 16), req(9, 200, 24),
	}}
	var ds []sched.Decision
	cfg := Config{Prefill: 1, Model: perfmodel.Default(), CacheTokens: 1000 * 1000, SLO: sched.SLO{TTFT: 2},
		OnDecision: func(_ int, d sched.Decision) { ds = append(ds, d) }}
	for _, c := range []struct {
		policy   string
		mode     sched.HoldMode
		attained float64
		displ    float64
	}{
		{"kvgate", sched.HoldByPolicy, 0.8, 0.2},
		{"kvgate", sched.HoldNever, 0.6, 0},
		{"cache-only", sched.HoldByPolicy, 0.6, 0},
		{"cache-only", sched.HoldAlways, 0.8, 0.2},
	} {
		ds = ds[:0]
		p, err := sched.New(c.policy, sched.Options{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		res := runScheduler(t, cfg, tr, sched.HoldSettings{Mode: sched.HoldNever, Displace: c.mode}.Scheduler(p, true))
		if math.Abs(res.Attainment-c.attained) > 1e-9 || math.Abs(res.Displaced-c.displ) > 1e-9 || math.Abs(res.Rejected-(1-c.attained)) > 1e-9 {
			t.Errorf("%s %v: attainment %v displaced %v rejected %v, want %v, %v, %v", c.policy, c.mode, res.Attainment, res.Displaced, res.Rejected, c.attained, c.displ, 1-c.attained)
		}
		if c.displ > 0 && (len(ds) != 5 || ds[4].CachedTokens != 0) {
			t.Errorf("%s: B's prompt again found %d tokens cached, want none", c.policy, ds[4].CachedTokens)
		}
		if c.displ == 0 && (len(ds) != 5 || ds[4].CachedTokens != 23000) {
			t.Errorf("%s %v: B's prompt again found %d tokens cached, want 23 000 (its last token is computed)", c.policy, c.mode, ds[4].CachedTokens)
		}
	}
}
