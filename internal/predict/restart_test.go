package predict

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestRestartedEndpointWithinItsPool: three endpoints configured at
// 20 000 tokens/s, two doing that and one 5 000, under light chat
// traffic (follow-up turns of 200–400 tokens after a cached context, one
// fresh prompt in fifty, a fixed cost of 15 ms); then one fast endpoint
// restarts as an engine doing 2 500 and is forgotten (Learned.Forget, as
// the gateway does for an endpoint back from out). Its pool predicts it
// until it has samples of its own, but never faster than its fastest
// pool-mate: the pool's fit, trained on unlike engines, had wandered to
// 43 000–53 000 tokens/s on four seeds of eight (a walkthrough, live:
// 49 555 where the others stood at 3 249–14 195), and the restarted
// endpoint, predicting a fresh 2 048-token prompt at 38–47 ms, took
// every one. Its misses reach its error: the pool's fit, its linear term
// at its floor, took fresh 2 048-token prompts for fixed-cost samples,
// and the error stayed 0 while the predictions were 94–95 % off.
func TestRestartedEndpointWithinItsPool(t *testing.T) {
	const (
		configured = 20000
		fixed      = 0.015
	)
	speed := map[string]float64{"fast1": 20000, "fast2": 20000, "slow": 5000}
	names := []string{"fast1", "fast2", "slow"}
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 5))
		l, err := NewLearned(LiveOptions())
		if err != nil {
			t.Fatal(err)
		}
		observe := func(m Model, x Features, y float64) {
			e := m.Prefill(x)
			m.Observe(Observation{X: x, Compute: y, Predicted: e.Seconds, TTFT: y, PredictedTTFT: e.Seconds})
		}
		for range 300 {
			name := names[rng.IntN(len(names))]
			x := Features{Uncached: 200 + rng.IntN(200), Cached: 2000 + rng.IntN(3000)}
			if rng.Float64() < 0.02 {
				x = Features{Uncached: 500 + rng.IntN(3500)}
			}
			y := (fixed + float64(x.Uncached)/speed[name]) * (1 + 0.1*rng.NormFloat64())
			observe(l.Model(name, configured), x, y)
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, name := range []string{"fast1", "slow"} {
			s := l.Model(name, configured).Stats().Speed
			lo, hi = min(lo, s), max(hi, s)
		}
		l.Forget("fast2")
		m := l.Model("fast2", configured)
		key, _ := poolKey(configured)
		fresh := Features{Uncached: 2048}
		st := m.Stats()
		t.Logf("seed %d: pool-mates %.0f–%.0f tokens/s, pool fit %.0f, restarted endpoint %.0f (%d samples), fresh 2 048 tokens predicted %.3f s",
			seed, lo, hi, RefTokens/l.pools[key].fit.predict(fresh), st.Speed, st.Samples, m.Prefill(fresh).Seconds)
		if st.Speed > hi*1.01 {
			t.Errorf("seed %d: restarted endpoint predicted at %.0f tokens/s, faster than its pool-mates' %.0f–%.0f (configured %d)", seed, st.Speed, lo, hi, configured)
		}
		// It now does 2 500 tokens/s: 16 fresh prompts, each missed.
		var miss float64
		const n = 16
		for range n {
			y := fixed + float64(fresh.Uncached)/2500
			miss += math.Abs(m.Prefill(fresh).Seconds-y) / y / n
			observe(m, fresh, y)
		}
		if ape := m.Stats().APE; ape < miss/2 {
			t.Errorf("seed %d: restarted endpoint's recent TTFT error %.3f after %d predictions %.0f %% off on average", seed, ape, n, 100*miss)
		} else {
			t.Logf("seed %d: recent TTFT error %.3f, predictions %.0f %% off on average", seed, ape, 100*miss)
		}
	}
}
