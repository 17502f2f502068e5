package predict

import (
	"math"
	"math/rand/v2"
	"testing"
)

// step is the analytic decode step the tests configure (perfmodel's
// default engine).
var step = DecodeStep{Base: 0.010, PerSeq: 0.00005, PerKContext: 0.00001}

// decodeTruth is a hidden decode engine: its step takes factor × the
// configured one plus extra seconds per stream, times lognormal noise.
type decodeTruth struct {
	factor, perSeq, noise float64
}

func (t decodeTruth) tpot(x DecodeFeatures, rng *rand.Rand) float64 {
	s := t.factor*step.Seconds(x.Streams, x.Context) + t.perSeq*float64(x.Streams)
	if t.noise > 0 {
		s *= math.Exp(t.noise * rng.NormFloat64())
	}
	return s
}

func decodeSample(rng *rand.Rand) DecodeFeatures {
	b := 1 + rng.IntN(128)
	ctx := b * (500 + rng.IntN(3000))
	return DecodeFeatures{Streams: b, Context: ctx, Prior: step.Seconds(b, ctx)}
}

func trainDecode(m DecodeModel, tr decodeTruth, n int, rng *rand.Rand) {
	for range n {
		x := decodeSample(rng)
		m.ObserveTPOT(DecodeObservation{X: x, TPOT: tr.tpot(x, rng), Predicted: m.TPOT(x).Seconds})
	}
}

// evalDecode is the median and p90 absolute percentage error of 500
// predictions against the noise-free truth.
func evalDecode(m DecodeModel, tr decodeTruth, rng *rand.Rand) (mdape, p90 float64) {
	exact := tr
	exact.noise = 0
	return apeQuantiles(func() (pred, want float64) {
		x := decodeSample(rng)
		return m.TPOT(x).Seconds, exact.tpot(x, rng)
	})
}

func TestLearnedTPOT(t *testing.T) {
	cases := []struct {
		name string
		tr   decodeTruth
	}{
		{"2.5x slower", decodeTruth{factor: 2.5, noise: 0.05}},
		{"faster", decodeTruth{factor: 0.6, noise: 0.05}},
		{"costlier per stream", decodeTruth{factor: 1, perSeq: 0.0002, noise: 0.05}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, 12))
			l, err := NewLearned(Options{})
			if err != nil {
				t.Fatal(err)
			}
			a, _ := NewAnalytic(Options{})
			m := l.DecodeModel("d")
			if md, _ := evalDecode(m, c.tr, rng); md < 0.1 {
				t.Fatalf("untrained learned model error %.3f: the truth is not far from the prior", md)
			}
			amd, _ := evalDecode(a.DecodeModel("d"), c.tr, rng)
			trainDecode(m, c.tr, 400, rng)
			md, p90 := evalDecode(m, c.tr, rng)
			t.Logf("learned mdape %.3f p90 %.3f; analytic mdape %.3f", md, p90, amd)
			if md > 0.03 || p90 > 0.08 {
				t.Errorf("learned mdape %.3f p90 %.3f, want < 0.03 and < 0.08", md, p90)
			}
			if st := m.Stats(decodeSample(rng)); st.Samples != 400 || st.APE > 0.15 || st.TPOT <= 0 || st.Margin < 1 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestLearnedTPOTStartsAnalytic: before data the learned TPOT is the
// prior; an endpoint without data of its own is predicted by the pool
// the others train; the analytic model is the prior whatever it observes.
func TestLearnedTPOTStartsAnalytic(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	l, _ := NewLearned(Options{MinSamples: 16})
	a, _ := NewAnalytic(Options{})
	x := DecodeFeatures{Streams: 10, Context: 20000, Prior: step.Seconds(10, 20000)}
	for _, m := range []DecodeModel{l.DecodeModel("new"), a.DecodeModel("new")} {
		if e := m.TPOT(x); math.Abs(e.Seconds-x.Prior) > 1e-12 || e.Pessimistic < e.Seconds {
			t.Errorf("%T before data: %+v, want the prior %g", m, e, x.Prior)
		}
	}
	tr := decodeTruth{factor: 2, noise: 0.02}
	trainDecode(l.DecodeModel("a"), tr, 200, rng)
	trainDecode(a.DecodeModel("a"), tr, 200, rng)
	if md, _ := evalDecode(l.DecodeModel("new"), tr, rng); md > 0.05 {
		t.Errorf("endpoint without data: mdape %.3f, want its pool's fit (< 0.05)", md)
	}
	if e := a.DecodeModel("a").TPOT(x); e.Seconds != x.Prior {
		t.Errorf("analytic after data: %g, want the prior %g", e.Seconds, x.Prior)
	}
	if st := a.DecodeModel("a").Stats(x); st.Samples != 200 || math.Abs(st.APE-0.5) > 0.05 {
		t.Errorf("analytic stats %+v, want 200 samples and about 50%% error", st)
	}
	if e := l.DecodeModel("a").TPOT(DecodeFeatures{Streams: 3}); e.Seconds != 0 {
		t.Errorf("no prior: %g, want 0", e.Seconds)
	}
	// Unproven until the endpoint's own MinSamples streams, counting
	// down; the analytic model never learns, so never claims to have.
	if u := [3]int{l.DecodeModel("new").TPOT(x).Unproven, l.DecodeModel("a").TPOT(x).Unproven, a.DecodeModel("a").TPOT(x).Unproven}; u != [3]int{16, 0, 0} {
		t.Errorf("Unproven %v, want 16 for the endpoint without streams, 0 for the others", u)
	}
	trainDecode(l.DecodeModel("new"), tr, 15, rng)
	if u := l.DecodeModel("new").TPOT(x).Unproven; u != 1 {
		t.Errorf("after 15 of its own streams Unproven %d, want 1", u)
	}
	trainDecode(l.DecodeModel("new"), tr, 1, rng)
	if u := l.DecodeModel("new").TPOT(x).Unproven; u != 0 {
		t.Errorf("after 16 of its own streams Unproven %d, want 0", u)
	}
}

func TestLearnedTPOTRecoversFromDrift(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	l, _ := NewLearned(Options{})
	m := l.DecodeModel("d")
	tr := decodeTruth{factor: 1.2, noise: 0.05}
	trainDecode(m, tr, 300, rng)
	tr.factor *= 2
	if md, _ := evalDecode(m, tr, rng); md < 0.3 {
		t.Fatalf("before any slowed sample the error is %.3f: the test does not drift", md)
	}
	trainDecode(m, tr, 60, rng)
	if md, _ := evalDecode(m, tr, rng); md > 0.05 {
		t.Errorf("60 samples after the drift mdape %.3f, want < 0.05", md)
	}
}

func TestDecodeStep(t *testing.T) {
	for _, c := range []struct {
		streams, ctx int
		want         float64
	}{{0, 1000, 0}, {1, 0, 0.01005}, {10, 20000, 0.0107}, {2, -5, 0.0101}} {
		if got := step.Seconds(c.streams, c.ctx); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Seconds(%d, %d) = %g, want %g", c.streams, c.ctx, got, c.want)
		}
	}
}

func decodeBenchModels(b *testing.B) map[string]DecodeModel {
	a, err := NewAnalytic(Options{})
	if err != nil {
		b.Fatal(err)
	}
	l, err := NewLearned(Options{})
	if err != nil {
		b.Fatal(err)
	}
	return map[string]DecodeModel{"analytic": a.DecodeModel("d"), "learned": l.DecodeModel("d")}
}

func BenchmarkTPOT(b *testing.B) {
	for _, name := range []string{"analytic", "learned"} {
		m := decodeBenchModels(b)[name]
		b.Run(name, func(b *testing.B) {
			x := DecodeFeatures{Streams: 32, Context: 64000}
			var s float64
			for i := 0; b.Loop(); i++ {
				x.Streams = 1 + i&63
				x.Prior = step.Seconds(x.Streams, x.Context)
				s += m.TPOT(x).Seconds
			}
			if s < 0 {
				b.Fatal(s)
			}
		})
	}
}

func BenchmarkObserveTPOT(b *testing.B) {
	for _, name := range []string{"analytic", "learned"} {
		m := decodeBenchModels(b)[name]
		b.Run(name, func(b *testing.B) {
			o := DecodeObservation{X: DecodeFeatures{Streams: 32, Context: 64000}, Predicted: 0.012}
			for i := 0; b.Loop(); i++ {
				o.X.Streams = 1 + i&63
				o.X.Prior = step.Seconds(o.X.Streams, o.X.Context)
				o.TPOT = 1.5 * o.X.Prior
				m.ObserveTPOT(o)
			}
		})
	}
}
