package sim

import (
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/perfmodel"
)

func TestSimulateEngineIdle(t *testing.T) {
	m := perfmodel.Default()
	lat, err := SimulateEngine(EngineConfig{Model: m, MaxBatchedTokens: 8192},
		[]EngineRequest{{Arrival: 0, Uncached: 4000, Context: 4000, Output: 11}, {Arrival: 100, Uncached: 4000, Context: 4000, Output: 11}})
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range lat {
		if math.Abs(l.TTFT-m.PrefillTime(4000)) > 1e-9 {
			t.Errorf("request %d: TTFT %v, want %v", i, l.TTFT, m.PrefillTime(4000))
		}
		// Ten decode steps with contexts 4001 … 4010.
		var sum float64
		for k := 1; k <= 10; k++ {
			sum += m.DecodeStepTime(1, 4000+k)
		}
		if math.Abs(l.TPOT-sum/10) > 1e-9 {
			t.Errorf("request %d: TPOT %v, want %v", i, l.TPOT, sum/10)
		}
	}
}

func TestSimulateEngineChunkingAndQueueing(t *testing.T) {
	m := perfmodel.Default()
	// Two 6000-token prompts at once with a 4096-token budget: step 1
	// prefills 4096 of A; step 2 the last 1904 of A and 2192 of B; step 3
	// decodes A and prefills the rest of B (3808).
	lat, err := SimulateEngine(EngineConfig{Model: m, MaxBatchedTokens: 4096},
		[]EngineRequest{{Uncached: 6000, Context: 6000, Output: 2}, {Uncached: 6000, Context: 6000, Output: 2}})
	if err != nil {
		t.Fatal(err)
	}
	s1 := m.StepTime(4096, 0, 0)
	s2 := m.StepTime(4096, 0, 0)
	s3 := m.StepTime(3808, 1, 6001)
	if math.Abs(lat[0].TTFT-(s1+s2)) > 1e-9 || math.Abs(lat[1].TTFT-(s1+s2+s3)) > 1e-9 {
		t.Errorf("TTFTs %v %v, want %v %v", lat[0].TTFT, lat[1].TTFT, s1+s2, s1+s2+s3)
	}
	if math.Abs(lat[0].TPOT-s3) > 1e-9 {
		t.Errorf("A's second token comes with step 3: TPOT %v, want %v", lat[0].TPOT, s3)
	}
	if _, err := SimulateEngine(EngineConfig{Model: m}, nil); err == nil {
		t.Error("a zero token budget must fail")
	}
	if _, err := SimulateEngine(EngineConfig{Model: m, MaxBatchedTokens: 10}, []EngineRequest{{Uncached: 0, Output: 1}}); err == nil {
		t.Error("an empty prompt must fail")
	}
}
