package sim

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/workload"
)

// TestMeasureCapacity: capacity = instances × speed / mean uncached tokens
// under cache-only routing, on traces whose reuse is known exactly.
func TestMeasureCapacity(t *testing.T) {
	tests := []struct {
		name     string
		shared   bool // every request sends the same 1 024-token prompt
		uncached float64
	}{
		// Distinct prompts: every token is computed.
		{"distinct", false, 1024},
		// One prompt ten times: only the first computes it whole, the
		// others its last block (an engine computes every prompt's last
		// token: load.CachedPrefix).
		{"shared", true, (1024 + 9*64) / 10.0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := &workload.Trace{Name: "t", BlockSize: 64, Duration: 10}
			for i := range 10 {
				keys := make([]uint64, 16)
				for b := range keys {
					keys[b] = uint64(b + 1)
					if !tt.shared {
						keys[b] += uint64(100 * (i + 1))
					}
				}
				tr.Requests = append(tr.Requests, workload.Request{Arrival: float64(i), PromptTokens: 1024, Keys: keys, Session: -1})
			}
			m := perfmodel.Default()
			m.PrefillTokensPerSec = 5000
			cfg := Config{Prefill: 4, Model: m, CacheTokens: 64 * 1000, Decode: 2} // decode is ignored
			c, err := MeasureCapacity(context.Background(), cfg, tr)
			if err != nil {
				t.Fatal(err)
			}
			if !near(c.MeanPrompt, 1024) || !near(c.MeanUncached, tt.uncached) || !near(c.RequestsPerSec, 4*5000/tt.uncached) {
				t.Errorf("got %+v, want mean uncached %v and %v req/s", c, tt.uncached, 4*5000/tt.uncached)
			}
		})
	}
	if _, err := MeasureCapacity(context.Background(), Config{Prefill: 1, Model: perfmodel.Default(), CacheTokens: 64}, &workload.Trace{Name: "empty", BlockSize: 64}); err == nil {
		t.Error("an empty workload has no capacity")
	}
}

// TestFindCapacity: the capacity of the long-prompt workload is measured at
// a rate equal to itself, whatever the first guess.
func TestFindCapacity(t *testing.T) {
	gen := func(rate float64) (*workload.Trace, error) {
		c := workload.LongPrompts(rate)
		c.Duration = 60
		return workload.LongPrompt(c)
	}
	cfg := baselineConfig()
	var got []float64
	for _, guess := range []float64{2, 200} {
		c, err := FindCapacity(context.Background(), cfg, guess, gen)
		if err != nil {
			t.Fatal(err)
		}
		if c.MeanUncached >= c.MeanPrompt || c.RequestsPerSec < 8*20000/c.MeanPrompt {
			t.Errorf("guess %v: %+v: the cache must save tokens", guess, c)
		}
		got = append(got, c.RequestsPerSec)
	}
	if r := got[0] / got[1]; r < 0.9 || r > 1.1 {
		t.Errorf("capacities %v from guesses 2 and 200 differ by more than 10 %%", got)
	}
}
