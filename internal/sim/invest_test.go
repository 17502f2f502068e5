package sim

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// TestInvestmentYields: two instances of 20 000 tokens/s, a 2 s SLO,
// early rejection. A 60 000-token prompt (3 s alone) is served late on an
// idle instance, an investment; a 30 000-token one takes the other
// instance; at 0.2 s a 20 000-token one fits nowhere (1.4 + 1 s on one,
// 2.8 + 1 s on the other) but alone on the investment's instance, which it
// gets: the investment is stopped (rejected), what it computed in 0.2 s
// (4 000 tokens: 62 blocks of 64) stays cached, and a later request
// sharing its first 70 blocks finds those 62 there and no more.
func TestInvestmentYields(t *testing.T) {
	blocks := func(from, n int) []uint64 {
		k := make([]uint64, n)
		for i := range k {
			k[i] = uint64(from + i)
		}
		return k
	}
	long := blocks(1, 937)
	tr := &workload.Trace{Name: "t", BlockSize: 64, Duration: 10, Requests: []workload.Request{
		{Arrival: 0, PromptTokens: 937 * 64, Keys: long, Session: -1},
		{Arrival: 0.1, PromptTokens: 468 * 64, Keys: blocks(10000, 468), Session: -1},
		{Arrival: 0.2, PromptTokens: 312 * 64, Keys: blocks(20000, 312), Session: -1},
		{Arrival: 9, PromptTokens: 72 * 64, Keys: append(append([]uint64(nil), long[:70]...), 30000, 30001), Session: -1},
	}}
	var ds []sched.Decision
	cfg := Config{Prefill: 2, Model: perfmodel.Default(), CacheTokens: 64 * 5000, SLO: sched.SLO{TTFT: 2},
		OnDecision: func(_ int, d sched.Decision) { ds = append(ds, d) }}
	res := runPolicy(t, cfg, tr, "kvgate", true)
	if len(ds) != 4 || !ds[0].Hold || !ds[1].Admit || !ds[2].Admit {
		t.Fatalf("decisions %+v", ds)
	}
	if ds[2].Prefill == ds[1].Prefill || ds[2].PredictedTTFT > 1.0001 {
		t.Errorf("the yielded-to request went to %d (the 30 000-token one to %d), predicted TTFT %v: want the investment's instance, 1 s",
			ds[2].Prefill, ds[1].Prefill, ds[2].PredictedTTFT)
	}
	if ds[3].Prefill != ds[2].Prefill || ds[3].CachedTokens != 62*64 {
		t.Errorf("the continuation went to %d with %d cached, want %d with %d", ds[3].Prefill, ds[3].CachedTokens, ds[2].Prefill, 62*64)
	}
	if math.Abs(res.Yielded-0.25) > 1e-9 || math.Abs(res.Rejected-0.25) > 1e-9 {
		t.Errorf("yielded %v, rejected %v: want the investment, 1 of 4", res.Yielded, res.Rejected)
	}
}
