package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/sim"
)

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// TestTimingMatchesPerfModel drives one engine with a seeded Poisson load
// over HTTP and checks that the TTFT and TPOT a streaming client measures
// agree at median within 10% with the simulator's prediction for the same
// arrival times (internal/sim.SimulateEngine, queueing included).
func TestTimingMatchesPerfModel(t *testing.T) {
	if testing.Short() {
		t.Skip("timing test")
	}
	const (
		promptLen = 8000 // 0.4 s of prefill: HTTP overhead stays small
		outputLen = 33
		requests  = 20
		rate      = 0.7 // requests per modelled second; utilisation ~0.5
	)
	scale := 5.0
	if raceEnabled {
		scale = 3 // the race detector slows request handling
	}
	e := startEngine(t, func(c *Config) { c.TimeScale = scale; c.NumGPUBlocks = 8192 })
	m := e.cfg.Perf

	rng := rand.New(rand.NewPCG(42, 43))
	bodies := make([][]byte, requests)
	filler := strings.Repeat(" x", promptLen-1)
	for i := range bodies {
		// A unique first token defeats the prefix cache for the whole prompt.
		bodies[i], _ = json.Marshal(map[string]any{"prompt": fmt.Sprintf("r%dz%x", i, rng.Uint64()) + filler, "max_tokens": outputLen, "stream": true})
	}
	ttfts := make([]float64, requests)
	tpots := make([]float64, requests)
	arrivals := make([]float64, requests)
	var wg sync.WaitGroup
	t0 := time.Now()
	next := t0
	for i := range requests {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate / scale * float64(time.Second)))
		time.Sleep(time.Until(next))
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			arrivals[i] = start.Sub(t0).Seconds() * scale
			resp, err := http.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(bodies[i]))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			evs := readSSE(t, resp.Body)
			if len(evs) != outputLen+1 {
				t.Errorf("request %d: %d events", i, len(evs))
				return
			}
			first, last := evs[0].at, evs[outputLen-1].at
			ttfts[i] = first.Sub(start).Seconds() * scale
			tpots[i] = last.Sub(first).Seconds() * scale / (outputLen - 1)
		}()
	}
	wg.Wait()
	offered := make([]sim.EngineRequest, requests)
	for i, at := range arrivals {
		offered[i] = sim.EngineRequest{Arrival: at, Uncached: promptLen, Context: promptLen, Output: outputLen}
	}
	pred, err := sim.SimulateEngine(sim.EngineConfig{Model: m, MaxBatchedTokens: e.cfg.MaxNumBatchedTokens, MaxSeqs: e.cfg.MaxNumSeqs}, offered)
	if err != nil {
		t.Fatal(err)
	}
	predTTFT, predTPOT := make([]float64, requests), make([]float64, requests)
	for i, l := range pred {
		predTTFT[i], predTPOT[i] = l.TTFT, l.TPOT
	}
	gotTTFT, gotTPOT := median(ttfts), median(tpots)
	wantTTFT, wantTPOT := median(predTTFT), median(predTPOT)
	errTTFT := (gotTTFT - wantTTFT) / wantTTFT
	errTPOT := (gotTPOT - wantTPOT) / wantTPOT
	t.Logf("median TTFT %.4f s vs predicted %.4f s (%+.1f%%; idle-engine %.4f); median TPOT %.5f s vs predicted %.5f s (%+.1f%%; idle-engine %.5f); time scale %v",
		gotTTFT, wantTTFT, 100*errTTFT, m.PrefillTime(promptLen), gotTPOT, wantTPOT, 100*errTPOT, m.DecodeStepTime(1, promptLen+outputLen/2), scale)
	if math.Abs(errTTFT) > 0.10 || math.Abs(errTPOT) > 0.10 {
		t.Errorf("timing disagrees with the perf model by more than 10%%\nmeasured TTFT %.3f\npredicted TTFT %.3f\nmeasured TPOT %.4f\npredicted TPOT %.4f",
			ttfts, predTTFT, tpots, predTPOT)
	}
}
