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

	"github.com/kvgate/kvgate/internal/perfmodel"
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

// predictEngine is a reference discrete-event model of one engine, written
// independently of the scheduler from the perf model alone: FCFS, one step
// at a time, running sequences first (prefill chunks or one decode token)
// then new arrivals, within a token budget; a step lasts PrefillTime(prefill
// tokens) + DecodeStepTime(decoding sequences, their context). No cache hits
// and ample KV. It returns each request's TTFT and TPOT in modelled seconds.
func predictEngine(m perfmodel.Model, budget int, arrivals []float64, prompt, output int) (ttft, tpot []float64) {
	type req struct {
		at          float64
		pre, out    int
		first, last float64
	}
	order := make([]int, len(arrivals))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(math.Copysign(1, arrivals[a]-arrivals[b])) })
	reqs := make([]req, len(arrivals))
	for i, at := range arrivals {
		reqs[i] = req{at: at, pre: prompt}
	}
	var waiting, running []*req
	t, next, done := 0.0, 0, 0
	for done < len(reqs) {
		for next < len(order) && reqs[order[next]].at <= t {
			waiting = append(waiting, &reqs[order[next]])
			next++
		}
		if len(running) == 0 && len(waiting) == 0 {
			t = reqs[order[next]].at
			continue
		}
		left := budget
		prefill, decodes, ctx := 0, 0, 0
		type item struct {
			r *req
			n int
		}
		var items []item
		for _, r := range running {
			if left == 0 {
				break
			}
			if r.pre > 0 {
				n := min(r.pre, left)
				items = append(items, item{r, n})
				prefill += n
				left -= n
			} else {
				items = append(items, item{r, 1})
				decodes++
				ctx += prompt + r.out
				left--
			}
		}
		for len(waiting) > 0 && left > 0 {
			r := waiting[0]
			waiting = waiting[1:]
			running = append(running, r)
			n := min(r.pre, left)
			items = append(items, item{r, n})
			prefill += n
			left -= n
		}
		t += m.PrefillTime(prefill) + m.DecodeStepTime(decodes, ctx)
		for _, it := range items {
			r := it.r
			if r.pre > 0 {
				r.pre -= it.n
				if r.pre == 0 {
					r.out, r.first, r.last = 1, t, t
				}
			} else {
				r.out++
				r.last = t
			}
			if r.pre == 0 && r.out == output {
				done++
			}
		}
		running = slices.DeleteFunc(running, func(r *req) bool { return r.pre == 0 && r.out == output })
	}
	for _, r := range reqs {
		ttft = append(ttft, r.first-r.at)
		tpot = append(tpot, (r.last-r.first)/float64(output-1))
	}
	return ttft, tpot
}

// TestTimingMatchesPerfModel drives one engine with a seeded Poisson load
// over HTTP and checks that the TTFT and TPOT a streaming client measures
// agree at median within 10% with the perf-model prediction for the same
// arrival times (queueing included, from predictEngine).
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
	predTTFT, predTPOT := predictEngine(m, e.cfg.MaxNumBatchedTokens, arrivals, promptLen, outputLen)
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

func TestPredictEngineIdle(t *testing.T) {
	m := perfmodel.Default()
	ttft, tpot := predictEngine(m, 8192, []float64{0, 100}, 4000, 11)
	for i := range ttft {
		if math.Abs(ttft[i]-m.PrefillTime(4000)) > 1e-9 {
			t.Errorf("ttft %v", ttft[i])
		}
		if w := (m.DecodeStepTime(1, 4001) + m.DecodeStepTime(1, 4010)) / 2; math.Abs(tpot[i]-w) > 1e-7 {
			t.Errorf("tpot %v want %v", tpot[i], w)
		}
	}
}
