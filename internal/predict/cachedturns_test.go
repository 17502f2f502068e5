package predict

import (
	"math/rand/v2"
	"testing"
)

// TestCachedTurnsKeepTheSpeed: traffic whose prompts are all but cached
// (one block of 16 tokens to compute after thousands cached, a benchmark
// repeating its prompts) costs a step's fixed time each, ~10 ms; that is
// the fixed term's, not a slow linear one.
func TestCachedTurnsKeepTheSpeed(t *testing.T) {
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 7))
		l, err := NewLearned(LiveOptions())
		if err != nil {
			t.Fatal(err)
		}
		names := []string{"a", "b"}
		for i := 0; i < 600; i++ {
			m := l.Model(names[rng.IntN(2)], 20000)
			u0 := 4 * (1 + rng.IntN(3))
			if i < 150 {
				u0 = 300
			}
			x := Features{Uncached: u0, Cached: 2048 + rng.IntN(600)}
			var also []Features
			if rng.Float64() < 0.3 {
				also = append(also, Features{Uncached: u0, Cached: 2048 + rng.IntN(600)})
			}
			u := x.Uncached
			for _, a := range also {
				u += a.Uncached
			}
			y := (0.005 + float64(u)/20000) * (1 + 0.2*rng.NormFloat64())
			if i >= 150 {
				y = 0.020 * (1 + 0.2*rng.NormFloat64())
			}
			pred := m.Prefill(x).Seconds
			for _, a := range also {
				pred += m.Prefill(a).Seconds
			}
			m.Observe(Observation{X: x, Also: also, Compute: max(y, 1e-3), Predicted: pred})
			if i%50 == 49 {
				t.Logf("seed %d after %d: speed %.0f, 8 after 2048: %.4f s", seed, i+1, m.Stats().Speed, m.Prefill(Features{Uncached: 8, Cached: 2048}).Seconds)
			}
		}
		for _, n := range names {
			m := l.Model(n, 20000)
			s := m.Prefill(Features{Uncached: 7000}).Seconds
			t.Logf("seed %d %s: speed %.0f, fresh 7000: %.3f s, 16 after 5000: %.4f s", seed, n, m.Stats().Speed, s, m.Prefill(Features{Uncached: 16, Cached: 5000}).Seconds)
			if s < 0.2 || s > 0.7 {
				t.Errorf("seed %d, endpoint %s: a fresh 7 000-token prompt predicted at %.2f s, want 0.2–0.7 (it takes 0.36 s)", seed, n, s)
			}
			// Nor do they stretch its pessimistic TTFT (the margin rose
			// to 2.2–2.8, and an idle fleet turned such a prompt away).
			if mg := m.Stats().Margin; mg > 1.6 {
				t.Errorf("seed %d, endpoint %s: margin %.2f after cached turns", seed, n, mg)
			}
			if p := m.Prefill(Features{Uncached: 8, Cached: 2048}).Seconds; p < 0.012 {
				t.Errorf("seed %d, endpoint %s: 8 tokens after 2 048 cached predicted at %.1f ms, want the step's ~20", seed, n, 1000*p)
			}
		}
	}
}
