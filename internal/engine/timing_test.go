package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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
//
// The engine runs its modelled timeline on the wall clock: a step that wakes
// up more than catchUpSlack late restarts the timeline from the late wake-up,
// so on a machine busy with other work the engine really is slower than the
// model (issue 14: 1 failure in 2 full runs on a 2-core machine; median TPOT
// +50% to +800% under load). A probe goroutine therefore sleeps like the
// scheduler does between decode steps and adds up the lateness that would
// have shifted the engine's timeline. A run within 10% passes (lag only
// makes the engine slower, never faster); a run off by more fails when the
// probe lost under maxLagShare of the run, and otherwise is not judged and
// is repeated, at most attempts times, then skipped with every measurement
// logged. The bound and what is measured are as before.
func TestTimingMatchesPerfModel(t *testing.T) {
	if testing.Short() {
		t.Skip("timing test")
	}
	const (
		attempts    = 4
		maxLagShare = 0.02
	)
	for a := 1; a <= attempts; a++ {
		r := measureTiming(t)
		if t.Failed() {
			return
		}
		share := r.lag.Seconds() / r.elapsed.Seconds()
		lag := fmt.Sprintf("probe lag %v in %v (%.1f%%)", r.lag.Round(time.Millisecond), r.elapsed.Round(time.Millisecond), 100*share)
		switch {
		case r.within(0.10):
			t.Logf("%s; %s", r, lag)
			return
		case share <= maxLagShare:
			t.Errorf("timing disagrees with the perf model by more than 10%% (%s; %s)\nmeasured TTFT %.3f\npredicted TTFT %.3f\nmeasured TPOT %.4f\npredicted TPOT %.4f",
				r, lag, r.ttfts, r.predTTFT, r.tpots, r.predTPOT)
			return
		}
		t.Logf("attempt %d not judged: %s, more than %.0f%%: the machine, not the engine, set the pace; %s", a, lag, 100*maxLagShare, r)
	}
	t.Skipf("machine too busy to judge the engine's timing in %d attempts", attempts)
}

// timingRun is one measurement: medians measured by the client and
// predicted by the simulator, in modelled seconds.
type timingRun struct {
	gotTTFT, wantTTFT, gotTPOT, wantTPOT float64
	ttfts, predTTFT, tpots, predTPOT     []float64
	idleTTFT, idleTPOT, scale            float64
	// lag is what the probe's wake-ups were late beyond catchUpSlack, over
	// elapsed wall-clock time.
	lag, elapsed time.Duration
}

func (r timingRun) String() string {
	return fmt.Sprintf("median TTFT %.4f s vs predicted %.4f s (%+.1f%%; idle-engine %.4f); median TPOT %.5f s vs predicted %.5f s (%+.1f%%; idle-engine %.5f); time scale %v",
		r.gotTTFT, r.wantTTFT, 100*(r.gotTTFT-r.wantTTFT)/r.wantTTFT, r.idleTTFT, r.gotTPOT, r.wantTPOT, 100*(r.gotTPOT-r.wantTPOT)/r.wantTPOT, r.idleTPOT, r.scale)
}

// within reports whether both medians are within share of the prediction.
func (r timingRun) within(share float64) bool {
	return math.Abs(r.gotTTFT-r.wantTTFT) <= share*r.wantTTFT && math.Abs(r.gotTPOT-r.wantTPOT) <= share*r.wantTPOT
}

// probeLag sleeps for step at a time, as the engine's scheduler does between
// decode steps, until stop is closed, and then sends the total lateness of
// the wake-ups that were later than catchUpSlack: by how much the machine
// would have shifted the engine's timeline.
func probeLag(step time.Duration, stop <-chan struct{}) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		var lag time.Duration
		tm := time.NewTimer(step)
		defer tm.Stop()
		due := time.Now().Add(step)
		for {
			select {
			case <-stop:
				out <- lag
				return
			case <-tm.C:
				now := time.Now()
				if late := now.Sub(due); late >= catchUpSlack {
					lag += late
				}
				due = now.Add(step)
				tm.Reset(step)
			}
		}
	}()
	return out
}

func measureTiming(t *testing.T) timingRun {
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
	stop := make(chan struct{})
	lagc := probeLag(e.cfg.real(m.DecodeStepTime(1, promptLen)), stop)

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
	elapsed := time.Since(t0)
	close(stop)
	lag := <-lagc
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
	return timingRun{gotTTFT: median(ttfts), wantTTFT: median(predTTFT), gotTPOT: median(tpots), wantTPOT: median(predTPOT),
		ttfts: ttfts, predTTFT: predTTFT, tpots: tpots, predTPOT: predTPOT,
		idleTTFT: m.PrefillTime(promptLen), idleTPOT: m.DecodeStepTime(1, promptLen+outputLen/2), scale: scale,
		lag: lag, elapsed: elapsed}
}

// TestLagCountsLateSteps: a scheduler goroutine held up between steps (a
// machine short of CPU, here a 60 ms command) starts its next step late,
// and Lag reports that much; an engine left alone reports no lag.
func TestLagCountsLateSteps(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.TimeScale = 1 })
	rng := rand.New(rand.NewPCG(1, 2))
	done := make(chan struct{})
	body, err := json.Marshal(map[string]any{"model": "test-model", "prompt": words(rng, 50), "max_tokens": 40, "min_tokens": 40})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		// 40 decode steps of about 10 ms: 0.4 s of back-to-back steps.
		resp, err := http.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	waitFor(t, "the request in flight", func() bool { return e.InFlight() == 1 })
	time.Sleep(50 * time.Millisecond)
	if l := e.Lag(); l > 20*time.Millisecond {
		t.Logf("lag %v before any stall (a busy machine)", l)
	}
	before := e.Lag()
	if err := e.sched.do(context.Background(), func() { time.Sleep(60 * time.Millisecond) }); err != nil {
		t.Fatal(err)
	}
	<-done
	if got := e.Lag() - before; got < 50*time.Millisecond {
		t.Fatalf("a 60 ms stall between steps: lag grew by %v", got)
	}
}
