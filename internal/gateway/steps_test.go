package gateway

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/sched"
)

// TestQueueTailStepFromConfig: engine_step_tokens reaches the load
// accounting, and a routed request's deadline (its arrival plus its
// class's TTFT SLO) with it: a 400-token prompt at 1 000 tokens/s in
// 256-token steps ends in a step of 144 tokens, 112 free, with 2 − 0.4 s
// of slack. With engine_step_tokens 0 nothing is told.
func TestQueueTailStepFromConfig(t *testing.T) {
	for _, tc := range []struct {
		steps int
		room  int
		slack float64
	}{{256, 112, 1.6}, {0, 0, 0}} {
		inUpstream := make(chan struct{}, 1)
		up := holdUpstream(t, &atomic.Int64{}, inUpstream)
		clock := &atomic.Int64{}
		clock.Store(time.Unix(1000, 0).UnixNano())
		steps := tc.steps
		cfg := Config{
			Endpoints:        []fleet.Endpoint{{Name: "a", URL: up.URL, Model: testModel, PrefillSpeed: 1000}},
			Classes:          []Class{{Name: "standard", Priority: 1, TTFT: 2}},
			Predictor:        PredictorAnalytic,
			EngineStepTokens: &steps,
		}
		g, url, _ := startGateway(t, cfg, Options{Now: func() time.Time { return time.Unix(0, clock.Load()) }})
		done := make(chan result, 1)
		go func() {
			done <- post(t, url+"/v1/completions", tokenPrompt(40, 400, true), map[string]string{"X-Hold": "headers"})
		}()
		select {
		case <-inUpstream:
		case r := <-done:
			t.Fatalf("steps %d: answered before reaching the engine: %d %s", tc.steps, r.status, r.body)
		case <-time.After(30 * time.Second):
			t.Fatalf("steps %d: never reached the engine", tc.steps)
		}
		g.mu.RLock()
		mf := g.models[testModel]
		g.mu.RUnlock()
		var s sched.Snapshot
		mf.load.Snapshot(g.clock(), 10, nil, nil, nil, &s)
		if e := s.Endpoints[0]; e.TailRoom != tc.room || math.Abs(e.TailSlack-tc.slack) > 1e-6 {
			t.Errorf("steps %d: tail room %d slack %v, want %d %v", tc.steps, e.TailRoom, e.TailSlack, tc.room, tc.slack)
		}
		up.CloseClientConnections()
		<-done
	}
}

// TestStepSlackMetric: kvgate_step_slack_seconds reports the model
// fleet's step slack, which its load accounting learns from first tokens
// that come late near their deadline (at 1 000 tokens/s in 256-token
// steps, 0.1 s late each time: about 0.1 s).
func TestStepSlackMetric(t *testing.T) {
	steps := 256
	cfg := Config{
		Endpoints:        []fleet.Endpoint{{Name: "a", URL: "http://127.0.0.1:1", Model: testModel, PrefillSpeed: 1000}},
		Classes:          []Class{{Name: "standard", Priority: 1, TTFT: 2}},
		Predictor:        PredictorAnalytic,
		EngineStepTokens: &steps,
	}
	g, _, admin := startGateway(t, cfg, Options{})
	g.mu.RLock()
	lf := g.models[testModel].load
	g.mu.RUnlock()
	var s sched.Snapshot
	eps := lf.Snapshot(0, 10, nil, nil, nil, &s)
	for k := range 300 {
		at := 0.35 * float64(k) // rounds back to back: the slack ages only while no first token comes
		lf.FirstToken(lf.Route(eps[0], at, load.Work{Uncached: 100, PrefillSeconds: 0.1}), at+0.1)
		lf.FirstToken(lf.Route(eps[0], at, load.Work{Uncached: 100, PrefillSeconds: 0.1, Deadline: at + 0.25}), at+0.3)
	}
	want := lf.StepSlack()
	if math.Abs(want-0.1) > 0.01 {
		t.Fatalf("the fleet learned a step slack of %v s, want about 0.1", want)
	}
	name := fmt.Sprintf(`kvgate_step_slack_seconds{model=%q}`, testModel)
	if got, err := gauge(t, admin, name); err != nil || math.Abs(got-want) > 1e-9 {
		t.Errorf("%s %v (%v), want %v", name, got, err, want)
	}
}
