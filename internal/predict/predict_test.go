package predict

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// truth is a hidden engine: linear speed, quadratic attention, overhead.
type truth struct {
	speed, knee, overhead, noise float64
}

func (t truth) seconds(x Features, rng *rand.Rand) float64 {
	u, c := float64(x.Uncached), float64(x.Cached)
	s := u/t.speed*(1+(c+u/2)/t.knee) + t.overhead
	if t.noise > 0 {
		s *= math.Exp(t.noise * rng.NormFloat64())
	}
	return s
}

func sample(rng *rand.Rand) Features {
	return Features{Uncached: 64 + rng.IntN(8000), Cached: rng.IntN(12000)}
}

// train feeds n samples of tr to m and returns the median and p90
// absolute percentage error of the next 500 predictions (noise-free truth).
func train(m Model, tr truth, n int, rng *rand.Rand) (mdape, p90 float64) {
	for range n {
		x := sample(rng)
		pred := m.Prefill(x).Seconds
		m.Observe(Observation{X: x, Compute: tr.seconds(x, rng), Predicted: pred})
	}
	return evalErr(m, tr, rng)
}

func evalErr(m Model, tr truth, rng *rand.Rand) (mdape, p90 float64) {
	exact := tr
	exact.noise = 0
	return apeQuantiles(func() (pred, want float64) {
		x := sample(rng)
		return m.Prefill(x).Seconds, exact.seconds(x, rng)
	})
}

// apeQuantiles is the median and p90 absolute percentage error of 500
// predictions next makes against their truths.
func apeQuantiles(next func() (pred, want float64)) (mdape, p90 float64) {
	apes := make([]float64, 500)
	for i := range apes {
		pred, want := next()
		apes[i] = math.Abs(pred-want) / want
	}
	slices.Sort(apes)
	return apes[len(apes)/2], apes[len(apes)*9/10]
}

func TestLearnedFitsHiddenCost(t *testing.T) {
	cases := []struct {
		name string
		tr   truth
	}{
		{"slower than configured", truth{speed: 8000, knee: 1e12, overhead: 0, noise: 0.03}},
		{"faster, quadratic", truth{speed: 50000, knee: 16000, overhead: 0.004, noise: 0.03}},
		{"configured, quadratic, noisy", truth{speed: 20000, knee: 32000, overhead: 0.01, noise: 0.08}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			l, err := NewLearned(Options{})
			if err != nil {
				t.Fatal(err)
			}
			a, _ := NewAnalytic(Options{})
			amd, _ := evalErr(a.Model("e", 20000), c.tr, rng)
			md, p90 := train(l.Model("e", 20000), c.tr, 600, rng)
			t.Logf("learned mdape %.3f p90 %.3f; analytic mdape %.3f", md, p90, amd)
			if md > 0.05 || p90 > 0.12 {
				t.Errorf("learned mdape %.3f p90 %.3f, want < 0.05 and < 0.12", md, p90)
			}
		})
	}
}

func TestLearnedRecoversFromDrift(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	l, _ := NewLearned(Options{})
	m := l.Model("e", 20000)
	tr := truth{speed: 20000, knee: 32000, overhead: 0.005, noise: 0.05}
	train(m, tr, 300, rng)
	tr.speed /= 2
	tr.overhead *= 2
	if md, _ := evalErr(m, tr, rng); md < 0.3 {
		t.Fatalf("before any slowed sample the error is %.3f: the test does not drift", md)
	}
	if md, _ := train(m, tr, 150, rng); md > 0.06 {
		t.Errorf("150 samples after the drift mdape %.3f, want < 0.06", md)
	}
}

func TestPoolPredictsNewEndpoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	l, _ := NewLearned(Options{MinSamples: 16})
	tr := truth{speed: 9000, knee: 1e12, noise: 0.02}
	train(l.Model("a", 20000), tr, 200, rng)
	b := l.Model("b", 20000)
	if md, _ := evalErr(b, tr, rng); md > 0.08 {
		t.Errorf("new endpoint of the same class: mdape %.3f, want the pool's fit (< 0.08)", md)
	}
	other := l.Model("c", 40000)
	if md, _ := evalErr(other, tr, rng); md < 0.5 {
		t.Errorf("endpoint of another class: mdape %.3f, want its own analytic prior (far off)", md)
	}
	if st := b.Stats(); st.Samples != 0 || math.Abs(st.Speed-9000)/9000 > 0.08 {
		t.Errorf("stats of the pooled endpoint %+v, want 0 samples and speed near 9000", st)
	}
}

func TestPessimisticQuantile(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	l, _ := NewLearned(Options{Quantile: 0.9})
	m := l.Model("e", 20000)
	x := Features{Uncached: 1000}
	if e := m.Prefill(x); math.Abs(e.Pessimistic/e.Seconds-1.5) > 1e-9 {
		t.Fatalf("before data the margin is %g, want the initial 1.5", e.Pessimistic/e.Seconds)
	}
	tr := truth{speed: 20000, knee: 1e12, noise: 0.1}
	train(m, tr, 2000, rng)
	below := 0
	const n = 2000
	for range n {
		x := sample(rng)
		e := m.Prefill(x)
		y := tr.seconds(x, rng)
		if e.Pessimistic < e.Seconds {
			t.Fatalf("pessimistic %g below the mean %g", e.Pessimistic, e.Seconds)
		}
		if y <= e.Pessimistic {
			below++
		}
		m.Observe(Observation{X: x, Compute: y, Predicted: e.Seconds})
	}
	if cov := float64(below) / n; cov < 0.8 || cov > 0.97 {
		t.Errorf("coverage of the 0.9 quantile %.3f, want within [0.8, 0.97]", cov)
	}
}

func TestObserveIgnoresBadSamples(t *testing.T) {
	l, _ := NewLearned(Options{})
	m := l.Model("e", 20000)
	x := Features{Uncached: 2048}
	before := m.Prefill(x).Seconds
	for _, y := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		m.Observe(Observation{X: x, Compute: y, Predicted: before, TTFT: y, PredictedTTFT: before})
	}
	if after := m.Prefill(x).Seconds; after != before || math.IsNaN(m.Stats().APE) {
		t.Errorf("bad samples moved the model: %g -> %g, stats %+v", before, after, m.Stats())
	}
}

func TestOptionsRanges(t *testing.T) {
	bad := []Options{{Forget: 0.3}, {Forget: 1.1}, {MinSamples: -1}, {Quantile: 0.2}, {Quantile: 1},
		{QuantileStep: -1}, {InitialMargin: 0.5}, {ErrorWeight: 2}, {Forget: math.NaN()}}
	for _, o := range bad {
		if _, err := NewLearned(o); err == nil {
			t.Errorf("NewLearned(%+v): no error", o)
		}
		if _, err := NewAnalytic(o); err == nil {
			t.Errorf("NewAnalytic(%+v): no error", o)
		}
	}
	if _, err := NewLearned(Options{}); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestAnalytic(t *testing.T) {
	a, _ := NewAnalytic(Options{})
	m := a.Model("e", 10000)
	if s := m.Prefill(Features{Uncached: 5000}).Seconds; s != 0.5 {
		t.Errorf("5000 tokens at 10000/s: %g s", s)
	}
	m.Observe(Observation{TTFT: 1, PredictedTTFT: 0.5})
	if st := m.Stats(); st.APE != 0.5 || st.Speed != 10000 || st.Samples != 1 {
		t.Errorf("stats %+v", st)
	}
	if a.Model("e", 5000).Prefill(Features{Uncached: 5000}).Seconds != 1 {
		t.Error("a new configured speed is not used")
	}
}

func benchModels(b *testing.B) map[string]Model {
	l, _ := NewLearned(Options{})
	a, _ := NewAnalytic(Options{})
	return map[string]Model{"analytic": a.Model("e", 20000), "learned": l.Model("e", 20000)}
}

func BenchmarkPrefill(b *testing.B) {
	for _, name := range []string{"analytic", "learned"} {
		m := benchModels(b)[name]
		b.Run(name, func(b *testing.B) {
			x := Features{Uncached: 3000, Cached: 2000}
			var s float64
			for i := 0; b.Loop(); i++ {
				x.Uncached = 1000 + i&2047
				s += m.Prefill(x).Seconds
			}
			if s < 0 {
				b.Fatal(s)
			}
		})
	}
}

func BenchmarkObserve(b *testing.B) {
	for _, name := range []string{"analytic", "learned"} {
		m := benchModels(b)[name]
		b.Run(name, func(b *testing.B) {
			o := Observation{X: Features{Uncached: 3000, Cached: 2000}, Compute: 0.2, Predicted: 0.15, TTFT: 0.3, PredictedTTFT: 0.25}
			for i := 0; b.Loop(); i++ {
				o.X.Uncached = 1000 + i&2047
				o.Compute = float64(o.X.Uncached) / 12000
				m.Observe(o)
			}
		})
	}
}

// TestShrinkPredictsAlikeEndpointsAlike: two endpoints of one pool whose
// observations differ by less than their noise (0.25 lognormal) are
// predicted alike with Shrink, apart without; an endpoint four times
// slower than its pool-mates keeps its own fit either way.
func TestShrinkPredictsAlikeEndpointsAlike(t *testing.T) {
	observe := func(rng *rand.Rand, m Model, factor float64) {
		for i := range 400 {
			x := Features{Uncached: 1000 + (i*131)%4000}
			base := float64(x.Uncached) / 20000
			m.Observe(Observation{X: x, Compute: base * factor * math.Exp(0.25*rng.NormFloat64()), Predicted: base})
		}
	}
	x := Features{Uncached: 2048}
	for _, shrink := range []float64{0, 1} {
		l, err := NewLearned(Options{Shrink: shrink})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(7, 7))
		a, b := l.Model("a", 20000), l.Model("b", 20000)
		observe(rng, a, 1.1)
		observe(rng, b, 0.9)
		pa, pb := a.Prefill(x).Seconds, b.Prefill(x).Seconds
		apart := math.Abs(math.Log(pa / pb))
		if shrink > 0 && apart > 0.02 {
			t.Errorf("shrink: alike endpoints predicted %.4f and %.4f s", pa, pb)
		}
		if shrink == 0 && apart < 0.1 {
			t.Errorf("no shrink: a and b (1.1× and 0.9×) predicted %.4f and %.4f s", pa, pb)
		}

		l, _ = NewLearned(Options{Shrink: shrink})
		var slow Model
		for _, name := range []string{"n1", "n2", "n3", "slow"} {
			m := l.Model(name, 20000)
			f := 1.0
			if name == "slow" {
				f, slow = 4, m
			}
			observe(rng, m, f)
		}
		if ps, want := slow.Prefill(x).Seconds, 4*2048.0/20000; math.Abs(ps-want)/want > 0.15 {
			t.Errorf("shrink %g: the slow endpoint predicted %.4f s, want about %.4f", shrink, ps, want)
		}
	}
	if _, err := NewLearned(Options{Shrink: 11}); err == nil {
		t.Error("shrink 11 accepted")
	}
}

// TestBusyWindowPaysFixedCostOnce: a busy window's prefills overlap their
// fixed cost (the first token's trip back), so the window takes their
// compute summed plus that cost once. Fed windows of four 2 000-token
// prefills and lone 300- and 2 000-token ones on an engine at 20 000
// tokens/s with a 30 ms fixed cost, the model predicts the lone prefills as
// the engine takes them. Summing the fixed cost over the window (four
// times) pulls the fit off them.
func TestBusyWindowPaysFixedCostOnce(t *testing.T) {
	l, err := NewLearned(Options{NonNegative: true})
	if err != nil {
		t.Fatal(err)
	}
	m := l.Model("a", 20000)
	small, big := Features{Uncached: 300}, Features{Uncached: 2000}
	const fixed = 0.03
	for range 300 {
		m.Observe(Observation{X: big, Also: []Features{big, big, big}, Compute: 4*0.1 + fixed, Predicted: 0.4})
		m.Observe(Observation{X: small, Compute: 0.015 + fixed, Predicted: 0.015})
		m.Observe(Observation{X: big, Compute: 0.1 + fixed, Predicted: 0.1})
	}
	for _, tc := range []struct {
		x    Features
		want float64
	}{{small, 0.015 + fixed}, {big, 0.1 + fixed}} {
		if got := m.Prefill(tc.x).Seconds; math.Abs(got-tc.want)/tc.want > 0.05 {
			t.Errorf("a lone %d-token prefill predicted %.4f s, the engine takes %.4f s", tc.x.Uncached, got, tc.want)
		}
	}
}
