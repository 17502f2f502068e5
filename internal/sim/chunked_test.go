package sim

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/internal/perfmodel"
)

// TestChunkedMatchesEngine: the truth's chunked steps (truthRun.place)
// give each request the first token SimulateEngine, a step-by-step model
// of vLLM's scheduler, gives it, on random queues of prefills (one output
// token, so no decode shares the steps), budgets and arrivals: a last
// chunk shares its step with the first chunks of the prompts that
// arrived before the step began, as many as fit.
func TestChunkedMatchesEngine(t *testing.T) {
	m := perfmodel.Default()
	rng := rand.New(rand.NewPCG(3, 5))
	for n := range 300 {
		budget := []int{512, 2048, 8192}[rng.IntN(3)]
		reqs := make([]EngineRequest, 1+rng.IntN(12))
		at := 0.0
		for k := range reqs {
			at += rng.ExpFloat64() * 0.2
			u := 1 + rng.IntN(3*budget)
			reqs[k] = EngineRequest{Arrival: at, Uncached: u, Context: u, Output: 1}
		}
		want, err := SimulateEngine(EngineConfig{Model: m, MaxBatchedTokens: budget}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		tr := newTruthRun(Chunked(1, m.PrefillTokensPerSec, budget), 1, len(reqs))
		ends := make([]float64, len(reqs))
		tr.onDelay = func(ri int, end float64) { ends[ri] = end }
		for k, r := range reqs {
			ends[k] = tr.place(0, k, r.Arrival, r.Uncached, m.PrefillTime(r.Uncached))
		}
		for k, r := range reqs {
			if got := ends[k] - r.Arrival; math.Abs(got-want[k].TTFT) > 1e-9 {
				t.Fatalf("case %d (budget %d), request %d of %+v: TTFT %v, the engine model %v", n, budget, k, reqs, got, want[k].TTFT)
			}
		}
	}
}

// TestChunkedDelaysOnlyFirstTokens: a 12 000-token prompt at 0 and a
// 2 000-token one at 0.1 s, 8 192-token steps at 20 000 tokens/s. The
// first prompt's last step (3 808 tokens, from 0.4096 s) also carries the
// whole second prompt, so both first tokens come at 0.7 s, where whole
// prompts one after another give 0.6 and 0.7 s; the instance is free at
// 0.7 s either way. Without steps nothing moves.
func TestChunkedDelaysOnlyFirstTokens(t *testing.T) {
	for _, tc := range []struct {
		steps      int
		ends       [2]float64
		free       float64
		delayHeard bool
	}{{8192, [2]float64{0.7, 0.7}, 0.7, true}, {0, [2]float64{0.6, 0.7}, 0.7, false}} {
		tr := newTruthRun(Chunked(1, 20000, tc.steps), 1, 2)
		var got [2]float64
		tr.onDelay = func(ri int, end float64) { got[ri] = end }
		got[0] = tr.place(0, 0, 0, 12000, 0.6)
		tr.pending[0] = append(tr.pending[0], completion{ri: 0, end: got[0], heardAt: got[0]})
		got[1] = tr.place(0, 1, 0.1, 2000, 0.1)
		for k := range got {
			if math.Abs(got[k]-tc.ends[k]) > 1e-9 {
				t.Errorf("steps %d: request %d's first token at %v, want %v", tc.steps, k, got[k], tc.ends[k])
			}
		}
		if math.Abs(tr.free[0]-tc.free) > 1e-9 {
			t.Errorf("steps %d: instance free at %v, want %v", tc.steps, tr.free[0], tc.free)
		}
		if moved := tr.pending[0][0].heardAt != 0.6; moved != tc.delayHeard {
			t.Errorf("steps %d: the router hears of request 0 at %v", tc.steps, tr.pending[0][0].heardAt)
		}
	}
}
