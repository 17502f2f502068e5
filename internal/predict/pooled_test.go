package predict

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// predictors builds each predictor with o, for tests that hold for both.
func predictors(t *testing.T, o Options) map[string]DecodePredictor {
	t.Helper()
	l, err := NewLearned(o)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAnalytic(o)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]DecodePredictor{"learned": l, "analytic": a}
}

// observeExact feeds m one prefill of 4 000 tokens that took slowness ×
// their analytic time at 20 000 tokens/s.
func observeExact(m Model, slowness float64) {
	x := Features{Uncached: 4000}
	e, took := m.Prefill(x), 0.2*slowness
	m.Observe(Observation{X: x, Compute: took, Predicted: e.Seconds, TTFT: took, PredictedTTFT: e.Seconds})
}

func margin(m Model) float64 {
	e := m.Prefill(Features{Uncached: 4000})
	return e.Pessimistic / e.Seconds
}

// TestMarginLearnsFromTheFleet: eight endpoints of one configured speed,
// started together and each observed at exactly its prediction, walk
// their margin down together (alone, ten samples move the tracker by 0.05
// in log units: 1.43, thirty to 1.29); an endpoint that has seen nothing yet starts from the fleet's
// margin (and its own tracker from the fleet's), one of another speed
// from the prior.
func TestMarginLearnsFromTheFleet(t *testing.T) {
	for name, p := range predictors(t, Options{}) {
		t.Run(name, func(t *testing.T) {
			eps := make([]Model, 8)
			for i := range eps {
				eps[i] = p.Model(fmt.Sprint("e", i), 20000)
			}
			// Checked at 10 rounds (the pool's margin) and at 30 (each
			// endpoint's own, which must not restart from the prior the
			// pool had at the endpoints' first samples).
			for round := 1; round <= 30; round++ {
				for _, m := range eps {
					observeExact(m, 1)
				}
				if round != 10 && round != 30 {
					continue
				}
				for i, m := range eps {
					if g := margin(m); g > 1.05 {
						t.Errorf("endpoint %d after %d rounds of exact samples in its pool: margin %.3f, want ≤ 1.05", i, round, g)
					}
				}
			}
			fresh := p.Model("new", 20000)
			if g := margin(fresh); g > 1.05 {
				t.Errorf("new endpoint of the pool: margin %.3f, want the pool's (≤ 1.05)", g)
			}
			// Its own tracker, which takes over after MinSamples, starts
			// where the pool's stands, not at the prior.
			for range 20 {
				observeExact(fresh, 1)
			}
			if g := margin(fresh); g > 1.05 {
				t.Errorf("new endpoint after 20 samples of its own: margin %.3f, want ≤ 1.05", g)
			}
			if g := margin(p.Model("other", 40000)); math.Abs(g-1.5) > 1e-9 {
				t.Errorf("endpoint of another speed: margin %.3f, want the prior 1.5", g)
			}
		})
	}
}

// TestMarginOwnAfterMinSamples: an endpoint slower than its pool-mates by
// a fifth uses the pool's margin until it has MinSamples ratios of its
// own, then its own: the analytic model, which cannot learn the slowness,
// covers it with a margin of about 1.2; the learned one learns the speed
// and needs none. Its pool-mate's own margin stays low.
func TestMarginOwnAfterMinSamples(t *testing.T) {
	wantSlow := map[string][2]float64{"analytic": {1.15, 1.3}, "learned": {1, 1.1}}
	for name, p := range predictors(t, Options{MinSamples: 16}) {
		t.Run(name, func(t *testing.T) {
			fast := p.Model("fast", 20000)
			for range 200 {
				observeExact(fast, 1)
			}
			slow := p.Model("slow", 20000)
			for range 15 {
				observeExact(slow, 1.2)
			}
			if g, pool := margin(slow), margin(p.Model("unseen", 20000)); g != pool {
				t.Errorf("slow endpoint with 15 samples: margin %.3f, want the pool's (%.3f)", g, pool)
			}
			for range 400 {
				observeExact(slow, 1.2)
			}
			if g, w := margin(slow), wantSlow[name]; g < w[0] || g > w[1] {
				t.Errorf("slow endpoint with 415 samples: margin %.3f, want its own in %v", g, w)
			}
			if g := margin(fast); g > 1.05 {
				t.Errorf("fast endpoint: margin %.3f, want its own (≤ 1.05)", g)
			}
		})
	}
}

// TestDecodeMarginLearnsFromTheFleet: the TPOT margin is pooled too.
func TestDecodeMarginLearnsFromTheFleet(t *testing.T) {
	for name, p := range predictors(t, Options{}) {
		t.Run(name, func(t *testing.T) {
			x := DecodeFeatures{Streams: 4, Context: 8000, Prior: 0.02}
			for range 10 {
				for i := range 8 {
					m := p.DecodeModel(fmt.Sprint("d", i))
					e := m.TPOT(x)
					m.ObserveTPOT(DecodeObservation{X: x, TPOT: e.Seconds, Predicted: e.Seconds})
				}
			}
			e := p.DecodeModel("new").TPOT(x)
			if g := e.Pessimistic / e.Seconds; g > 1.05 {
				t.Errorf("new decode endpoint: margin %.3f, want the pool's (≤ 1.05)", g)
			}
		})
	}
}

// TestMarginOwnStartsAtMostThePrior: in a pool configured alike but half
// twice as slow, the pool's margin covers the slow half (about 2); a fast
// endpoint's own tracker, taking over after MinSamples, starts at most at
// the prior 1.5, since the tracker descends nine times slower than it
// climbs.
func TestMarginOwnStartsAtMostThePrior(t *testing.T) {
	a, _ := NewAnalytic(Options{MinSamples: 16})
	fast, slow := a.Model("fast", 20000), a.Model("slow", 20000)
	for range 16 {
		observeExact(slow, 2)
		observeExact(fast, 1)
	}
	if g := margin(a.Model("unseen", 20000)); g < 1.8 {
		t.Fatalf("pool margin %.3f, want the slow half's (≈ 2)", g)
	}
	if g := margin(fast); g > 1.5+1e-9 {
		t.Errorf("fast endpoint after %d samples: margin %.3f, want at most the prior 1.5", 16, g)
	}
}

// TestUnlikeEndpointsLeaveTheirPool: two endpoints of one configured
// speed whose engines do 3 000 and 2 000 tokens/s (a drift the config
// did not follow) are each predicted by their own fit once it predicts
// them better than the pool does; before, the own fit's noise, which
// counted its misses while it learned from the configured prior, kept
// both pooled (a walkthrough: both at 2 656 tokens/s after 101 and 36
// samples, the slower predicted 25 % fast). Alike endpoints stay pooled
// (TestShrinkPredictsAlikeEndpointsAlike).
func TestUnlikeEndpointsLeaveTheirPool(t *testing.T) {
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 11))
		l, err := NewLearned(LiveOptions())
		if err != nil {
			t.Fatal(err)
		}
		speed := map[string]float64{"fast": 3000, "slow": 2000}
		for i := range 140 {
			name := "fast"
			if i%4 == 3 {
				name = "slow"
			}
			x := Features{Uncached: 800 + rng.IntN(400)}
			y := (0.005 + float64(x.Uncached)/speed[name]) * (1 + 0.01*rng.NormFloat64())
			l.Model(name, 20000).Observe(Observation{X: x, Compute: y})
		}
		for name, sp := range speed {
			want := 0.005 + 1000/sp
			if got := l.Model(name, 20000).Prefill(Features{Uncached: 1000}).Seconds; math.Abs(got-want)/want > 0.1 {
				t.Errorf("seed %d: %s (%.0f tokens/s) predicted %.3f s for 1 000 tokens, want %.3f", seed, name, sp, got, want)
			}
		}
	}
}
