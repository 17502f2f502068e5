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

// TestBatchingEnginesTrainOnBusyWindows: with batching engines two
// prefills that share engine steps end together, and neither first token
// tells its own compute (the second reads 0.1 ms). Their window, from the
// first one's routing to the last first token, is their compute summed:
// it trains the model, as a lone prefill does. Without batching every
// first token is read as FIFO compute, and the pairs' (0.2 s for the
// first, 0.0001 s for the second) pull the fit off the engine's speed.
func TestBatchingEnginesTrainOnBusyWindows(t *testing.T) {
	for _, tc := range []struct {
		batching bool
		samples  int
	}{{true, 100}, {false, 150}} {
		f := learnedEndpoint(t, predict.Options{}, tc.batching)
		_, eps := snap(f, 0, 0, nil)
		now := 0.0
		for range 50 {
			// Two batched prefills: 4 000 tokens in 0.2 s.
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
			t.Errorf("batching %v: learned %g tokens/s (the engine does 20 000)", tc.batching, st.Speed)
		}
	}
}

// TestBusyEndpointKeepsLearning: an endpoint that is never idle (arrivals
// faster than it prefills, completions in batches of up to two) has no lone
// prefill to learn from; its busy windows, cut every windowCut first
// tokens, still teach it the engine's speed. Learned too fast at first
// (100 000 tokens/s, the kvgate demo's failure: it was sent ever more and
// never ran alone again), it is corrected.
func TestBusyEndpointKeepsLearning(t *testing.T) {
	f := learnedEndpoint(t, predict.Options{Shrink: 1, NonNegative: true}, true)
	_, eps := snap(f, 0, 0, nil)
	// Teach it 100 000 tokens/s with lone prefills.
	now := 0.0
	for range 40 {
		fl := f.Route(eps[0], now, Work{Uncached: 2000})
		f.FirstToken(fl, now+0.02)
		f.Finish(fl, now+0.02)
		now += 1
	}
	if st, _ := f.PredictorStats("a"); st.Speed < 60000 {
		t.Fatalf("setup: learned %g tokens/s, want about 100 000", st.Speed)
	}
	// Now the engine's true 20 000: a 2 000-token prefill arrives every
	// 0.09 s; the engine takes up to two waiting ones into a batch that
	// ends at once, 0.1 s per prefill: it is never idle. The schedule is
	// computed first, then replayed in time order.
	const n = 400
	arrival := func(i int) float64 { return now + 0.09*float64(i) }
	done := make([]float64, n)
	free := now
	for i := 0; i < n; {
		start := max(free, arrival(i))
		k := 1
		if i+1 < n && arrival(i+1) <= start {
			k = 2
		}
		free = start + 0.1*float64(k)
		for j := i; j < i+k; j++ {
			done[j] = free
		}
		i += k
	}
	flights := make([]*Flight, n)
	next := 0 // the next first token, in order
	for i := range n {
		for next < i && done[next] <= arrival(i) {
			f.FirstToken(flights[next], done[next])
			f.Finish(flights[next], done[next])
			next++
		}
		flights[i] = f.Route(eps[0], arrival(i), Work{Uncached: 2000})
	}
	for ; next < n; next++ {
		f.FirstToken(flights[next], done[next])
		f.Finish(flights[next], done[next])
	}
	if st, _ := f.PredictorStats("a"); st.Samples < 40+n/windowCut/2 {
		t.Errorf("%d samples: the busy endpoint's windows were not observed", st.Samples)
	}
	st, _ := f.PredictorStats("a")
	if off := math.Abs(st.Speed-20000) / 20000; off > 0.15 {
		t.Errorf("learned %g tokens/s on a busy endpoint (the engine does 20 000)", st.Speed)
	}
}

// TestFailedPrefillClosesItsWindow: a prefill that ends without a first
// token (its engine failed, its client left) took an unknown part of its
// busy window, which is then not reported: the next first token on the
// endpoint trains nothing until the endpoint has been idle.
func TestFailedPrefillClosesItsWindow(t *testing.T) {
	f := learnedEndpoint(t, predict.Options{}, true)
	_, eps := snap(f, 0, 0, nil)
	f1 := f.Route(eps[0], 0, Work{Uncached: 2000})
	f2 := f.Route(eps[0], 0.01, Work{Uncached: 2000})
	f.Finish(f1, 0.05) // failed: no first token
	f.FirstToken(f2, 0.3)
	f.Finish(f2, 0.3)
	if st, _ := f.PredictorStats("a"); st.Samples != 0 {
		t.Fatalf("a window with a failed prefill was reported: %d samples", st.Samples)
	}
	f3 := f.Route(eps[0], 1, Work{Uncached: 2000})
	f.FirstToken(f3, 1.1)
	f.Finish(f3, 1.1)
	if st, _ := f.PredictorStats("a"); st.Samples != 1 {
		t.Fatalf("the next window after idle: %d samples, want 1", st.Samples)
	}
}

// TestQueueSlackWithBatchingEngines: with batching engines (busy windows)
// the snapshot stretches the queue wait by the same pessimistic margin as
// the compute (sched.Endpoint.QueueSlack); with FIFO engines, whose first
// tokens are each observed, it does not.
func TestQueueSlackWithBatchingEngines(t *testing.T) {
	for _, batching := range []bool{false, true} {
		f := learnedEndpoint(t, predict.Options{}, batching)
		s, _ := snap(f, 0, 2000, nil)
		e := s.Endpoints[0]
		if e.PrefillSlack <= 1 {
			t.Fatalf("setup: a model without data should be unsure, slack %g", e.PrefillSlack)
		}
		if want := map[bool]float64{false: 0, true: e.PrefillSlack}[batching]; e.QueueSlack != want {
			t.Errorf("batching %v: queue slack %g, want %g", batching, e.QueueSlack, want)
		}
	}
}

// learnedEndpoint is a fleet of one endpoint "a" (20 000 tokens/s, both
// roles) with a learned predictor of options o, its engines batching or
// not.
func learnedEndpoint(t *testing.T, o predict.Options, batching bool) *Fleet {
	t.Helper()
	f := New([]Info{{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 20000}}, false)
	l, err := predict.NewLearned(o)
	if err != nil {
		t.Fatal(err)
	}
	f.SetPredictor(l)
	f.SetBatchingEngines(batching)
	return f
}

// TestTouchesTrainNothing: a touch (Work.Touch) of a held request's
// prefix ends inside a busy window without being observed and without
// closing it, with batching engines or not: the window of the two
// prefills around it is reported as before, and a lone touch teaches
// nothing.
func TestTouchesTrainNothing(t *testing.T) {
	for _, batching := range []bool{true, false} {
		f := learnedEndpoint(t, predict.Options{}, batching)
		_, eps := snap(f, 0, 0, nil)
		f1 := f.Route(eps[0], 0, Work{Uncached: 2000})
		tc := f.Route(eps[0], 0.01, Work{Uncached: 1, Cached: 4000, Touch: true})
		f2 := f.Route(eps[0], 0.02, Work{Uncached: 2000})
		f.FirstToken(tc, 0.05)
		f.Finish(tc, 0.05)
		f.FirstToken(f1, 0.1)
		f.FirstToken(f2, 0.2)
		want := 1
		if !batching {
			want = 2 // each first token is observed
		}
		if st, _ := f.PredictorStats("a"); st.Samples != want {
			t.Errorf("batching %v: %d samples around a touch, want %d", batching, st.Samples, want)
		}
		lone := f.Route(eps[0], 1, Work{Uncached: 1, Cached: 4000, Touch: true})
		f.FirstToken(lone, 1.01)
		if st, _ := f.PredictorStats("a"); st.Samples != want {
			t.Errorf("batching %v: a lone touch was observed (%d samples)", batching, st.Samples)
		}
	}
}

// TestForgetStartsAnEndpointAgain: Forget drops what the learned
// predictor knows of one endpoint (an engine that may have restarted as
// another), which its pool then predicts; the others keep theirs.
func TestForgetStartsAnEndpointAgain(t *testing.T) {
	p, err := predict.NewLearned(predict.LiveOptions())
	if err != nil {
		t.Fatal(err)
	}
	f := New([]Info{{Name: "a", PrefillSpeed: 20000}, {Name: "b", PrefillSpeed: 20000}}, false)
	f.SetPredictor(p)
	for _, name := range []string{"a", "b"} {
		m := p.Model(name, 20000)
		for i := range 40 {
			x := predict.Features{Uncached: 1000 + 10*i}
			m.Observe(predict.Observation{X: x, Compute: float64(x.Uncached) / 5000})
		}
	}
	f.Forget("a")
	if st, _ := f.PredictorStats("a"); st.Samples != 0 {
		t.Errorf("a after Forget: %d samples of its own, want 0", st.Samples)
	}
	if st, _ := f.PredictorStats("b"); st.Samples != 40 {
		t.Errorf("b: %d samples, want its 40 kept", st.Samples)
	}
	f.Forget("nope") // unknown: nothing
}
