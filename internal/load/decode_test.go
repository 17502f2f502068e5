package load

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/predict"
)

var testStep = predict.DecodeStep{Base: 0.01, PerSeq: 0.0001, PerKContext: 0.00001}

// TestTPOTLearnsFromFinished: streams on an aggregated endpoint and on a
// decode endpoint that really decode 2× and 3× slower than the analytic
// step report their TPOT at Finished; the snapshot's DecodeTPOT becomes
// the true one, the analytic predictor keeps the prior, and the context
// accounting returns to zero.
func TestTPOTLearnsFromFinished(t *testing.T) {
	infos := []Info{{Name: "agg", Role: fleet.RoleBoth, PrefillSpeed: 1e6, Decode: testStep},
		{Name: "p", Role: fleet.RolePrefill, PrefillSpeed: 1e6, Decode: testStep},
		{Name: "d", Role: fleet.RoleDecode, Decode: testStep}}
	slow := map[string]float64{"agg": 2, "d": 3}
	for _, c := range []struct {
		name    string
		learned bool
	}{{"learned", true}, {"analytic", false}} {
		t.Run(c.name, func(t *testing.T) {
			f := New(infos, false)
			var p predict.Predictor
			if c.learned {
				p, _ = predict.NewLearned(predict.Options{})
			} else {
				p, _ = predict.NewAnalytic(predict.Options{})
			}
			f.SetPredictor(p)
			_, eps := snap(f, 0, 0, nil)
			now := 0.0
			for i := range 100 {
				prompt := 500 + (i*311)%4000
				// Two streams in flight on each decoder, then one more.
				var open []*Flight
				for k := range 3 {
					agg := f.Route(eps[0], now, Work{Uncached: prompt + k})
					dis := f.Route(eps[1], now, Work{Uncached: prompt + k})
					f.Decode(dis, eps[2])
					f.FirstToken(agg, now+0.01)
					f.FirstToken(dis, now+0.01)
					open = append(open, agg, dis)
				}
				for k, fl := range open {
					d := fl.decoder()
					tpot := slow[d.info.Name] * fl.dx.Prior
					if k < 2 {
						tpot = 0 // one output token: no observation
					}
					f.Finished(fl, now+1, tpot)
				}
				now++
			}
			s, _ := snap(f, now, 1000, nil)
			for i, want := range []float64{2, 0, 3} {
				e := s.Endpoints[i]
				prior := testStep.Seconds(1, 1000)
				if !c.learned && want != 0 {
					want = 1
				}
				if want == 0 {
					if e.DecodeTPOT != 0 {
						t.Errorf("%s: prefill endpoint got a TPOT %g", e.Name, e.DecodeTPOT)
					}
					continue
				}
				if got := e.DecodeTPOT / prior; math.Abs(got-want) > 0.05*want {
					t.Errorf("%s: TPOT %g = %.3f × the prior, want %g×", e.Name, e.DecodeTPOT, got, want)
				}
				st, ok := f.DecodeStats(e.Name, 1000)
				if !ok || st.Samples != 200 || st.Analytic != prior || math.Abs(st.TPOT-e.DecodeTPOT) > 1e-12 {
					t.Errorf("%s: stats %+v %v (200 samples: one stream in three has no TPOT)", e.Name, st, ok)
				}
				if eps[i].ctx != 0 || eps[i].requests != 0 {
					t.Errorf("%s: context %d and requests %d left after every stream finished", e.Name, eps[i].ctx, eps[i].requests)
				}
			}
			if _, ok := f.DecodeStats("p", 0); ok {
				t.Error("decode stats for a prefill-only endpoint")
			}
		})
	}
}

// TestDecodeWith: the caller's features are what the model trains on and
// what PredictTPOT answers for; the fleet's own state does not enter.
func TestDecodeWith(t *testing.T) {
	f := New([]Info{{Name: "p", Role: fleet.RolePrefill, PrefillSpeed: 1e6}, {Name: "d", Role: fleet.RoleDecode}}, false)
	_, eps := snap(f, 0, 0, nil)
	if _, ok := f.PredictTPOT(eps[1], predict.DecodeFeatures{Streams: 1, Prior: 0.01}); ok {
		t.Fatal("TPOT without a predictor")
	}
	l, _ := predict.NewLearned(predict.Options{})
	f.SetPredictor(l)
	s, _ := snap(f, 0, 0, nil)
	if s.Endpoints[1].DecodeTPOT != 0 {
		t.Errorf("no analytic step: DecodeTPOT %g, want none", s.Endpoints[1].DecodeTPOT)
	}
	x := predict.DecodeFeatures{Streams: 40, Context: 80000, Prior: 0.02}
	for range 200 {
		fl := f.Route(eps[0], 0, Work{Uncached: 100})
		f.DecodeWith(fl, eps[1], x)
		f.Finished(fl, 1, 0.05)
	}
	if est, ok := f.PredictTPOT(eps[1], x); !ok || math.Abs(est.Seconds-0.05) > 0.002 {
		t.Errorf("PredictTPOT %+v %v, want about 0.05", est, ok)
	}
	if _, ok := f.PredictTPOT(eps[0], x); ok {
		t.Error("a prefill-only endpoint has a TPOT model")
	}
}

// TestTPOTProbeTrainsOnce: a stream's early TPOT reading trains its decode
// endpoint's model at once, and its end does not train it again; a
// reading of 0, a second one, or one after the stream ended trains
// nothing, and a stream never probed trains at its end as before.
func TestTPOTProbeTrainsOnce(t *testing.T) {
	f := New([]Info{{Name: "p", Role: fleet.RolePrefill, PrefillSpeed: 1e6, Decode: testStep},
		{Name: "d", Role: fleet.RoleDecode, Decode: testStep}}, false)
	p, _ := predict.NewLearned(predict.Options{})
	f.SetPredictor(p)
	_, eps := snap(f, 0, 0, nil)
	samples := func() int {
		st, ok := f.DecodeStats("d", 100)
		if !ok {
			t.Fatal("no decode stats for d")
		}
		return st.Samples
	}
	stream := func() *Flight {
		fl := f.Route(eps[0], 0, Work{Uncached: 100})
		f.Decode(fl, eps[1])
		f.FirstToken(fl, 0.01)
		return fl
	}
	steps := []struct {
		name  string
		do    func(*Flight)
		fresh bool // on a new stream
		want  int  // samples after
	}{
		{"a probe of 0 trains nothing", func(fl *Flight) { f.TPOTProbe(fl, 0) }, true, 0},
		{"a probe trains", func(fl *Flight) { f.TPOTProbe(fl, 0.02) }, false, 1},
		{"a second probe does not", func(fl *Flight) { f.TPOTProbe(fl, 0.03) }, false, 1},
		{"nor its end", func(fl *Flight) { f.Finished(fl, 1, 0.025) }, false, 1},
		{"a probe after the end does not", func(fl *Flight) { f.TPOTProbe(fl, 0.02) }, false, 1},
		{"a stream never probed trains at its end", func(fl *Flight) { f.Finished(fl, 2, 0.025) }, true, 2},
	}
	var fl *Flight
	for _, s := range steps {
		if s.fresh {
			fl = stream()
		}
		s.do(fl)
		if got := samples(); got != s.want {
			t.Fatalf("%s: %d samples, want %d", s.name, got, s.want)
		}
	}
}

// learnedPD is a fleet of a prefill and a decode endpoint ("p", "d") with
// the learned predictor proving an endpoint with minSamples streams.
func learnedPD(minSamples int) (*Fleet, []*Endpoint) {
	f := New([]Info{{Name: "p", Role: fleet.RolePrefill, PrefillSpeed: 1e6, Decode: testStep},
		{Name: "d", Role: fleet.RoleDecode, Decode: testStep}}, false)
	p, _ := predict.NewLearned(predict.Options{MinSamples: minSamples})
	f.SetPredictor(p)
	_, eps := snap(f, 0, 0, nil)
	return f, eps
}

// TestTPOTStale: a decode endpoint whose TPOT it has learned from its own
// streams is unproven again (one stream) once it has been sent none for
// TPOTStaleAfter and decodes nothing; a stream in flight, or one sent
// within that time, keeps it proven.
func TestTPOTStale(t *testing.T) {
	f, eps := learnedPD(16)
	var last *Flight
	for i := range 16 {
		at := float64(i)
		last = f.Route(eps[0], at, Work{Uncached: 100})
		f.Decode(last, eps[1])
		f.FirstToken(last, at+0.01)
		if i < 15 {
			f.Finished(last, at+0.5, 0.02)
		}
	}
	unproven := func(now float64) int {
		s, _ := snap(f, now, 100, nil)
		return s.Endpoints[1].DecodeUnproven
	}
	f.TPOTProbe(last, 0.02) // its 16th stream, still decoding
	if u := unproven(15 + TPOTStaleAfter + 5); u != 0 {
		t.Fatalf("a stream in flight: DecodeUnproven %d, want 0", u)
	}
	f.Finished(last, 16, 0.02)
	for _, c := range []struct {
		now  float64
		want int
	}{{15 + TPOTStaleAfter - 1, 0}, {15 + TPOTStaleAfter + 1, 1}} {
		if u := unproven(c.now); u != c.want {
			t.Errorf("at %v, the last stream sent at 15: DecodeUnproven %d, want %d", c.now, u, c.want)
		}
	}
}

// TestReprobeAfterSurprise: a stream sent to a stale decode endpoint
// whose reading agrees with the model ends the doubt, as does one slower
// than predicted; one whose reading is under half the prediction (the
// engine recovered while it was sent nothing) has the endpoint explored
// with ReprobeStreams streams at once, until a reading of a stream sent
// to test it agrees with its prediction.
func TestReprobeAfterSurprise(t *testing.T) {
	f, eps := learnedPD(16)
	stream := func(at float64) *Flight {
		fl := f.Route(eps[0], at, Work{Uncached: 100})
		f.Decode(fl, eps[1])
		f.FirstToken(fl, at+0.01)
		return fl
	}
	for i := range 16 {
		f.Finished(stream(float64(i)), float64(i)+0.5, 0.02)
	}
	unproven := func(now float64) int {
		s, _ := snap(f, now, 100, nil)
		return s.Endpoints[1].DecodeUnproven
	}
	steps := []struct {
		name    string
		at      float64
		reading func(fl *Flight) float64
		want    int // DecodeUnproven a second later
	}{
		{"a stale endpoint's reading agrees", 50, func(fl *Flight) float64 { return fl.dpred }, 0},
		{"a stale endpoint's reading is 4× slower", 90, func(fl *Flight) float64 { return fl.dpred * 4 }, 0},
		{"a stale endpoint's reading is 4× faster", 130, func(fl *Flight) float64 { return fl.dpred / 4 }, ReprobeStreams},
		{"a test stream's reading is still 3× faster", 131, func(fl *Flight) float64 { return fl.dpred / 3 }, ReprobeStreams},
		{"a test stream's reading agrees", 132, func(fl *Flight) float64 { return fl.dpred }, 0},
		{"a stream of a proven endpoint surprises nobody", 133, func(fl *Flight) float64 { return fl.dpred / 4 }, 0},
	}
	for _, st := range steps {
		if st.at == 50 || st.at == 90 || st.at == 130 {
			if u := unproven(st.at); u != 1 {
				t.Fatalf("%s: DecodeUnproven %d before, want 1 (stale)", st.name, u)
			}
		}
		fl := stream(st.at)
		f.TPOTProbe(fl, st.reading(fl))
		if u := unproven(st.at + 1); u != st.want {
			t.Fatalf("%s: DecodeUnproven %d, want %d", st.name, u, st.want)
		}
		f.Finished(fl, st.at+0.5, 0)
	}
}

// TestSequencesAreStreams: a request sampling n sequences decodes n
// streams on its decode endpoint until it ends.
func TestSequencesAreStreams(t *testing.T) {
	f := New([]Info{{Name: "p", Role: fleet.RolePrefill, PrefillSpeed: 1e6, Decode: testStep},
		{Name: "d", Role: fleet.RoleDecode, Decode: testStep}}, false)
	_, eps := snap(f, 0, 0, nil)
	streams := func() int {
		s, _ := snap(f, 1, 0, nil)
		return s.Endpoints[1].DecodeStreams
	}
	one := f.Route(eps[0], 0, Work{Uncached: 100})
	f.Decode(one, eps[1])
	four := f.Route(eps[0], 0, Work{Uncached: 100, Sequences: 4})
	f.Decode(four, eps[1])
	if got := streams(); got != 5 {
		t.Fatalf("%d decode streams, want 1 + 4", got)
	}
	f.Finish(four, 1)
	f.Finish(four, 1)
	if got := streams(); got != 1 {
		t.Fatalf("%d decode streams after the 4 ended (twice), want 1", got)
	}
	f.Finish(one, 1)
	if got := streams(); got != 0 {
		t.Fatalf("%d decode streams at the end, want 0", got)
	}
}
