package load

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/predict"
)

// TestPredictorLearnsFromFirstTokens routes a stream of requests to an
// endpoint configured at 20 000 tokens/s that really computes 8 000/s,
// reporting each first token at its true FIFO time: the snapshot's speed
// and the queued compute become the true ones. A second endpoint alike
// whose prefills end only by PrefillDone (no observation) learns nothing
// itself and is predicted by the pool a trains.
func TestPredictorLearnsFromFirstTokens(t *testing.T) {
	f := New([]Info{{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 20000}, {Name: "b", PrefillSpeed: 20000},
		{Name: "d", Role: fleet.RoleDecode}}, false)
	l, err := predict.NewLearned(predict.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.SetPredictor(l)
	_, eps := snap(f, 0, 0, nil)
	const trueSpeed = 8000
	now, free := 0.0, 0.0
	for i := range 200 {
		u := 500 + (i*137)%3000
		fa := f.Route(eps[0], now, Work{Uncached: u, PrefillSeconds: 99})
		fb := f.Route(eps[1], now, Work{Uncached: u})
		free = max(free, now) + float64(u)/trueSpeed
		f.FirstToken(fa, free)
		f.PrefillDone(fb, now+0.01)
		f.Finish(fa, free)
		f.Finish(fb, now+0.01)
		now += 0.05
	}
	s, _ := snap(f, now+100, 2048, nil)
	if got := s.Endpoints[0].PrefillSpeed; math.Abs(got-trueSpeed)/trueSpeed > 0.03 {
		t.Errorf("learned speed %g, want about %d", got, trueSpeed)
	}
	if got := s.Endpoints[1].PrefillSpeed; math.Abs(got-trueSpeed)/trueSpeed > 0.03 {
		t.Errorf("endpoint without observations: speed %g, want its pool's (a's) %d", got, trueSpeed)
	}
	if s.Endpoints[2].PrefillSpeed != 0 {
		t.Errorf("decode endpoint got a prefill speed %g", s.Endpoints[2].PrefillSpeed)
	}
	// The compute queued for a new request is the model's, not the caller's.
	f.Route(eps[0], now+100, Work{Uncached: 4000, PrefillSeconds: 99})
	s, _ = snap(f, now+100, 0, nil)
	if w := s.Endpoints[0].QueueWait; math.Abs(w-0.5)/0.5 > 0.05 {
		t.Errorf("queued 4000 tokens at 8000/s: wait %g, want about 0.5", w)
	}
	st, ok := f.PredictorStats("a")
	if !ok || st.Samples != 200 || st.APE > 0.1 || math.Abs(st.Speed-trueSpeed)/trueSpeed > 0.03 {
		t.Errorf("stats of a: %+v %v", st, ok)
	}
	if st, _ := f.PredictorStats("b"); st.Samples != 0 {
		t.Errorf("PrefillDone trained the model: %+v", st)
	}
	if _, ok := f.PredictorStats("nope"); ok {
		t.Error("stats for an unknown endpoint")
	}
	f.SetPredictor(nil)
	s, _ = snap(f, now+100, 2048, nil)
	if s.Endpoints[0].PrefillSpeed != 20000 {
		t.Errorf("without the predictor: speed %g", s.Endpoints[0].PrefillSpeed)
	}
}

// TestBatchingEnginesTrainOnLonePrefills: with batching engines, prefills
// that share engine steps end together, so their first tokens say nothing
// of their own compute; only a prefill that ran alone (none in flight when
// it was routed, none routed before its first token) trains the model.
// Here a prefill routed to an idle endpoint is joined 50 ms later by a
// second; the step ends both at 0.2 s, the joiner's token heard first.
// Read as FIFO, the first one took 0.1 ms (what the gateway learned as
// 400 000 tokens/s against the emulator's 20 000 before lone meant "for
// its whole prefill"). FIFO engines (the default) train on all.
func TestBatchingEnginesTrainOnLonePrefills(t *testing.T) {
	for _, tc := range []struct {
		batching bool
		samples  int
	}{{true, 50}, {false, 150}} {
		f := New([]Info{{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 20000}}, false)
		l, err := predict.NewLearned(predict.Options{})
		if err != nil {
			t.Fatal(err)
		}
		f.SetPredictor(l)
		f.SetBatchingEngines(tc.batching)
		_, eps := snap(f, 0, 0, nil)
		now := 0.0
		for range 50 {
			f1 := f.Route(eps[0], now, Work{Uncached: 2000})
			f2 := f.Route(eps[0], now+0.05, Work{Uncached: 2000})
			f.FirstToken(f2, now+0.2)
			f.FirstToken(f1, now+0.2001)
			f.Finish(f2, now+0.2)
			f.Finish(f1, now+0.2001)
			now += 1
			// A lone prefill: 2 000 tokens in 0.1 s.
			f3 := f.Route(eps[0], now, Work{Uncached: 2000})
			f.FirstToken(f3, now+0.1)
			f.Finish(f3, now+0.1)
			now += 1
		}
		st, _ := f.PredictorStats("a")
		if st.Samples != tc.samples {
			t.Errorf("batching %v: %d samples, want %d", tc.batching, st.Samples, tc.samples)
		}
		if off := math.Abs(st.Speed-20000) / 20000; tc.batching && off > 0.1 || !tc.batching && off < 0.15 {
			t.Errorf("batching %v: learned %g tokens/s (20 000 alone)", tc.batching, st.Speed)
		}
	}
}
