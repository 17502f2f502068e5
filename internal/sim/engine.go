package sim

import (
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/internal/perfmodel"
)

// EngineConfig is one aggregated engine (prefill and decode on the same
// instance) under vLLM-style continuous batching with chunked prefill.
type EngineConfig struct {
	Model perfmodel.Model
	// MaxBatchedTokens is the token budget of one step (prefill chunk tokens
	// plus one per decoding sequence).
	MaxBatchedTokens int
	// MaxSeqs bounds the running batch; 0 means no bound.
	MaxSeqs int
}

// EngineRequest is one request offered to the engine.
type EngineRequest struct {
	Arrival float64
	// Uncached is the number of prompt tokens to compute; Context is the
	// whole prompt (cached part included), which decode attention reads.
	Uncached int
	Context  int
	Output   int
}

// EngineLatency is what a streaming client would measure.
type EngineLatency struct {
	TTFT float64
	// TPOT is the mean time between output tokens after the first (0 for
	// one-token outputs).
	TPOT float64
}

// SimulateEngine predicts each request's TTFT and TPOT on one engine. Each
// step first serves the running sequences in admission order (a prefill
// chunk for one still prefilling, one token for one decoding), then admits
// waiting requests first come first served, within the token budget; a
// step lasts perfmodel.StepTime. KV capacity is taken as ample. The engine
// emulator (internal/engine) schedules the same way, so its measured
// latencies should match these predictions.
func SimulateEngine(cfg EngineConfig, reqs []EngineRequest) ([]EngineLatency, error) {
	if err := cfg.Model.Validate(); err != nil {
		return nil, fmt.Errorf("engine sim: %w", err)
	}
	if cfg.MaxBatchedTokens <= 0 {
		return nil, fmt.Errorf("engine sim: max batched tokens must be > 0")
	}
	e := &engineSim{cfg: cfg, st: make([]engineSeq, len(reqs)), order: make([]int, len(reqs))}
	for i, r := range reqs {
		if r.Uncached < 1 || r.Output < 1 || r.Context < r.Uncached {
			return nil, fmt.Errorf("engine sim: request %d needs uncached >= 1, output >= 1 and context >= uncached", i)
		}
		e.st[i] = engineSeq{left: r.Uncached, arrival: r.Arrival, context: r.Context, want: r.Output}
		e.order[i] = i
	}
	slices.SortStableFunc(e.order, func(a, b int) int {
		switch {
		case reqs[a].Arrival < reqs[b].Arrival:
			return -1
		case reqs[a].Arrival > reqs[b].Arrival:
			return 1
		}
		return 0
	})
	t := 0.0
	for e.done < len(reqs) {
		e.arrive(t)
		if len(e.running) == 0 && len(e.waiting) == 0 {
			t = e.st[e.order[e.next]].arrival
			continue
		}
		t += e.plan()
		e.commit(t)
	}
	out := make([]EngineLatency, len(reqs))
	for i, s := range e.st {
		out[i].TTFT = s.first - s.arrival
		if s.want > 1 {
			out[i].TPOT = (s.last - s.first) / float64(s.want-1)
		}
	}
	return out, nil
}

// engineSim is SimulateEngine's engine: its sequences, queues and the
// step being planned.
type engineSim struct {
	cfg              EngineConfig
	st               []engineSeq
	order            []int // requests by arrival
	next, done       int   // the next arrival in order; sequences finished
	waiting, running []int
	items            []engineItem // the step's work
}

// engineSeq is one request's progress.
type engineSeq struct {
	left, out     int // prompt tokens left to prefill; tokens out
	first, last   float64
	arrival       float64
	context, want int
}

// engineItem is n tokens of sequence r in a step.
type engineItem struct{ r, n int }

// arrive queues the requests arrived by t.
func (e *engineSim) arrive(t float64) {
	for e.next < len(e.order) && e.st[e.order[e.next]].arrival <= t {
		e.waiting = append(e.waiting, e.order[e.next])
		e.next++
	}
}

// plan fills the step (the running sequences in admission order, then
// waiting requests first come first served, within the token budget) and
// returns its duration.
func (e *engineSim) plan() float64 {
	budget := e.cfg.MaxBatchedTokens
	prefill, decodes, ctx := 0, 0, 0
	e.items = e.items[:0]
	for _, r := range e.running {
		if budget == 0 {
			break
		}
		s := &e.st[r]
		if s.left > 0 {
			n := min(s.left, budget)
			e.items = append(e.items, engineItem{r, n})
			prefill += n
			budget -= n
			continue
		}
		e.items = append(e.items, engineItem{r, 1})
		decodes++
		ctx += s.context + s.out
		budget--
	}
	for len(e.waiting) > 0 && budget > 0 && (e.cfg.MaxSeqs <= 0 || len(e.running) < e.cfg.MaxSeqs) {
		r := e.waiting[0]
		e.waiting = e.waiting[1:]
		e.running = append(e.running, r)
		n := min(e.st[r].left, budget)
		e.items = append(e.items, engineItem{r, n})
		prefill += n
		budget -= n
	}
	return e.cfg.Model.StepTime(prefill, decodes, ctx)
}

// commit ends the step at t: prefill chunks computed, tokens out, and
// finished sequences leave.
func (e *engineSim) commit(t float64) {
	for _, it := range e.items {
		s := &e.st[it.r]
		if s.left > 0 {
			s.left -= it.n
			if s.left == 0 { // the last prefill chunk emits the first token
				s.out, s.first, s.last = 1, t, t
			}
		} else {
			s.out++
			s.last = t
		}
		if s.left == 0 && s.out == s.want {
			e.done++
		}
	}
	e.running = slices.DeleteFunc(e.running, func(r int) bool { return e.st[r].left == 0 && e.st[r].out == e.st[r].want })
}
