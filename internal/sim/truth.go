package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/predict"
)

// Truth is a heterogeneous fleet's hidden timing: what each prefill
// instance really takes, which the router does not know (it is configured
// with Config.Model's speed for all of them). A prefill of u uncached
// tokens after c cached ones on instance i takes
//
//	(u / Speeds[i]) · (1 + (c + u/2) / Knees[i]) + Overheads[i]
//
// seconds (attention makes long prompts cost more than linearly; Knee 0:
// linear), times a lognormal jitter of sigma Noise; from DriftAt on,
// instance DriftInstance runs at DriftFactor times its speed. The router
// hears of each first token MeasureNoise (sigma, seconds) off.
//
// DecodeFactors, when set (one per decode instance), make each decode
// instance's step take that many times the configured model's step: the
// router's TPOT predictor has to learn them (decodetruth.go). From
// DecodeChangeAt (seconds; 0: never) on, DecodeFactorsThen (one per decode
// instance) replace them: an engine slow at first (warming up, sharing its
// GPU) that recovers, or one that slows.
//
// StepTokens, when above 0, has the instances prefill as vLLM's chunked
// prefill does, in steps of at most that many tokens served first come
// first served: a prompt's last chunk shares its step with the first
// chunk of the prompt queued behind it (if it arrived before that step
// began), so its first token waits for that chunk too (chunked.go). The
// instance's throughput is the same; only first tokens move later.
// 0: each prompt is prefilled whole, alone (the baseline chapter's FIFO).
type Truth struct {
	Speeds, Knees, Overheads []float64
	DecodeFactors            []float64
	DecodeFactorsThen        []float64
	DecodeChangeAt           float64
	Noise, MeasureNoise      float64
	StepTokens               int
	// DriftAt is when the drift starts (seconds); 0: no drift.
	DriftAt       float64
	DriftInstance int
	DriftFactor   float64
	Seed          uint64
}

// Predictors are the Config.Predictor names.
var Predictors = []string{"analytic", "learned", "true"}

func (t *Truth) validate(n, decode int) error {
	if len(t.Speeds) != n || len(t.Knees) != n || len(t.Overheads) != n {
		return fmt.Errorf("sim: truth needs a speed, knee and overhead for each of the %d prefill instances", n)
	}
	var errs []error
	if t.DecodeFactors != nil && len(t.DecodeFactors) != decode {
		errs = append(errs, fmt.Errorf("sim: truth has %d decode factors for %d decode instances", len(t.DecodeFactors), decode))
	}
	if (t.DecodeChangeAt != 0 || t.DecodeFactorsThen != nil) && (t.DecodeFactors == nil || len(t.DecodeFactorsThen) != decode || !(t.DecodeChangeAt > 0 && t.DecodeChangeAt <= 86400)) {
		errs = append(errs, fmt.Errorf("sim: a decode change needs decode factors, %d factors after it and a time in (0, 86400] s", decode))
	}
	for _, fs := range []struct {
		name string
		fs   []float64
	}{{"factor", t.DecodeFactors}, {"factor after the change", t.DecodeFactorsThen}} {
		for j, f := range fs.fs {
			if !(f >= 0.01 && f <= 100) {
				errs = append(errs, fmt.Errorf("sim: decode instance %d: %s must be in [0.01, 100], got %v", j, fs.name, f))
			}
		}
	}
	for i := range n {
		if !(t.Speeds[i] >= 1 && t.Speeds[i] <= 1e9) || !(t.Knees[i] >= 0 && t.Knees[i] <= 1e12) || !(t.Overheads[i] >= 0 && t.Overheads[i] <= 60) {
			errs = append(errs, fmt.Errorf("sim: instance %d: speed must be in [1, 1e9] tokens/s, knee in [0, 1e12] tokens, overhead in [0, 60] s", i))
		}
	}
	if t.StepTokens < 0 || t.StepTokens > MaxStepTokens {
		errs = append(errs, fmt.Errorf("sim: step tokens must be in [0, %d], got %d", MaxStepTokens, t.StepTokens))
	}
	if t.StepTokens > 0 && decode > 0 {
		errs = append(errs, errors.New("sim: chunked prefill steps model aggregated instances (no decode instances)"))
	}
	if !(t.Noise >= 0 && t.Noise <= 2) || !(t.MeasureNoise >= 0 && t.MeasureNoise <= 60) {
		errs = append(errs, errors.New("sim: noise must be in [0, 2] and measurement noise in [0, 60] s"))
	}
	if !(t.DriftAt >= 0 && t.DriftAt <= 1e9) {
		errs = append(errs, errors.New("sim: drift time must be in [0, 1e9] s"))
	}
	if t.DriftAt > 0 && (t.DriftInstance < 0 || t.DriftInstance >= n || !(t.DriftFactor >= 0.01 && t.DriftFactor <= 100)) {
		errs = append(errs, fmt.Errorf("sim: drift needs an instance in [0, %d) and a factor in [0.01, 100]", n))
	}
	return errors.Join(errs...)
}

// seconds is instance i's noise-free prefill time starting at time at.
func (t *Truth) seconds(i, uncached, cached int, at float64) float64 {
	if uncached <= 0 {
		return 0
	}
	speed := t.Speeds[i]
	if t.DriftAt > 0 && i == t.DriftInstance && at >= t.DriftAt {
		speed *= t.DriftFactor
	}
	u, c := float64(uncached), float64(cached)
	s := u / speed
	if k := t.Knees[i]; k > 0 {
		s *= 1 + (c+u/2)/k
	}
	return s + t.Overheads[i]
}

// truthRun is the true engines of a run with a Truth: FIFO prefill
// servers whose completions the router hears of as first tokens.
type truthRun struct {
	t       *Truth
	name    string // the predictor
	rng     *rand.Rand
	free    []float64      // per instance: when its prefill queue empties
	pending [][]completion // per instance, in completion order
	// With Truth.StepTokens: per instance, the step its queue ends with,
	// and what to tell when a request's first token moves later.
	last    []lastStep
	onDelay func(ri int, end float64)
	// Per request: the prediction at routing (the TTFT from the routing
	// on), the noise-free truth, and when it was routed (a held request
	// after its arrival).
	predTTFT, predCompute, trueCompute, routedAt []float64
	inst                                         []int
	dec                                          *decodeTruth // nil: no decode instances
}

type completion struct {
	ri      int
	fl      *load.Flight
	end     float64 // true end
	heardAt float64 // when the router hears of it
}

func newTruthRun(t *Truth, n, requests int) *truthRun {
	tr := &truthRun{t: t, rng: rand.New(rand.NewPCG(t.Seed, 0x7275746821)), free: make([]float64, n),
		pending: make([][]completion, n), last: make([]lastStep, n), predTTFT: make([]float64, requests), predCompute: make([]float64, requests),
		trueCompute: make([]float64, requests), routedAt: make([]float64, requests), inst: make([]int, requests)}
	for i := range tr.inst {
		tr.inst[i] = -1
	}
	return tr
}

// predictor returns the predictor a run with this truth uses: "analytic"
// (the configured speed), "learned" or "true" (an oracle that knows the
// hidden timing, noise aside). A learned predictor of engines that
// prefill in steps, observed through busy windows (windows), is the
// gateway's (predict.LiveOptions); otherwise the unconstrained fit, best
// where observations are exact.
func (tr *truthRun) predictor(name string, names []string, clock *float64, windows bool) (predict.Predictor, error) {
	switch name {
	case "analytic":
		return predict.NewAnalytic(predict.Options{})
	case "learned":
		if windows && tr.t.StepTokens > 0 {
			return predict.NewLearned(predict.LiveOptions())
		}
		return predict.NewLearned(predict.Options{})
	case "true":
		idx := make(map[string]int, len(names))
		for i, n := range names {
			idx[n] = i
		}
		return &oracle{t: tr.t, idx: idx, now: clock, didx: map[string]int{}}, nil
	}
	return nil, fmt.Errorf("sim: unknown predictor %q (known: analytic, learned, true)", name)
}

// route runs request ri (< 0: a touch, touch.go), routed at time at to
// instance i with the given uncached and cached tokens, on the true
// engine; it returns the true end of its prefill. freeAt is when the
// router predicted the instance's queue to empty before this request.
func (tr *truthRun) route(lf *load.Fleet, fl *load.Flight, ri, i, uncached, cached int, at, freeAt float64) float64 {
	exact := tr.t.seconds(i, uncached, cached, max(at, tr.free[i]))
	compute := exact
	if tr.t.Noise > 0 {
		compute *= math.Exp(tr.t.Noise * tr.rng.NormFloat64())
	}
	end := tr.place(i, ri, at, uncached, compute)
	heard := end
	if tr.t.MeasureNoise > 0 {
		heard = max(end+tr.t.MeasureNoise*tr.rng.NormFloat64(), at)
	}
	tr.pending[i] = append(tr.pending[i], completion{ri: ri, fl: fl, end: end, heardAt: heard})
	if ri < 0 {
		return end // a touch (touch.go): no request's record
	}
	pred := lf.PredictedPrefillEnd(fl)
	tr.predTTFT[ri] = pred - at
	tr.routedAt[ri] = at
	tr.predCompute[ri] = pred - max(at, freeAt)
	tr.trueCompute[ri] = exact
	tr.inst[ri] = i
	return end
}

// place queues on instance i request ri, routed at time at, whose
// prefill of uncached tokens takes compute seconds, and returns when its
// first token comes: at the end of its prefill, or with
// Truth.StepTokens at the end of the step its last chunk shares
// (chunked).
func (tr *truthRun) place(i, ri int, at float64, uncached int, compute float64) float64 {
	start := max(at, tr.free[i])
	tr.free[i] = start + compute
	if tr.t.StepTokens > 0 && uncached > 0 {
		return tr.chunked(i, ri, at, start, uncached, compute)
	}
	return start + compute
}

// advance reports to the router every first token heard by time now.
func (tr *truthRun) advance(lf *load.Fleet, now float64) {
	for i, q := range tr.pending {
		k := 0
		for k < len(q) && q[k].heardAt <= now {
			lf.FirstToken(q[k].fl, q[k].heardAt)
			if tr.dec == nil || q[k].ri < 0 {
				// Prefill only: the request ends at its first token (with
				// decode instances, at its stream's end; a touch has
				// none).
				lf.Finish(q[k].fl, q[k].heardAt)
			}
			q[k] = completion{}
			k++
		}
		tr.pending[i] = q[k:]
		if len(tr.pending[i]) == 0 {
			tr.pending[i] = q[:0]
		}
	}
}

// summarise adds the prediction errors over admitted requests that arrived
// after warm-up, and the drift measures, to res.
func (tr *truthRun) summarise(r *run, res *Result) {
	res.Predictor = tr.name
	warm := min(30, r.tr.Duration/4)
	var apes []float64
	for ri, ok := range r.admitted {
		q := &r.tr.Requests[ri]
		if !ok || q.Arrival < warm {
			continue
		}
		if ape, ok := tr.ape(r, ri); ok {
			apes = append(apes, ape)
		}
	}
	res.TTFTMdAPE, res.TTFTAPEP90 = apeQuantiles(apes)
	if tr.t.DriftAt > 0 {
		rec, stale := tr.drift(r)
		res.DriftRecovery, res.StaleRouting = &rec, &stale
	}
	if tr.dec != nil {
		res.TPOTMdAPE, res.TPOTAPEP90 = tr.dec.errors(r, warm)
	}
}

// ape is request ri's TTFT prediction error relative to its true TTFT,
// both from its routing: a held request's wait at the router before it
// is no prediction's (counted from its arrival, the errors of kvgate's
// agents shape in steps mode, 60 % of whose requests are held, read
// 97 %).
func (tr *truthRun) ape(r *run, ri int) (float64, bool) {
	act := r.prefillDone[ri] - tr.routedAt[ri]
	if act <= 0 {
		return 0, false
	}
	return math.Abs(tr.predTTFT[ri]-act) / act, true
}

// driftBin is the width of the windows the drift recovery is judged in.
const driftBin = 5.0

// drift measures, over the requests routed to the drifted instance after
// the drift, in 5-second windows:
//   - recovery: seconds from the drift to the start of the first window
//     from which every window's median TTFT error is under 10% (-1: never);
//   - stale routing: seconds from the drift to the last request of the
//     last window whose median ratio of predicted to true compute time is
//     under 3/4 (the router still believing the instance about as fast as
//     before the drift; 0: none).
func (tr *truthRun) drift(r *run) (recovery, stale float64) {
	d := tr.t.DriftAt
	type bin struct {
		ape, ratio []float64
		last       float64
	}
	bins := map[int]*bin{}
	last := 0
	for ri, i := range tr.inst {
		q := &r.tr.Requests[ri]
		if i != tr.t.DriftInstance || q.Arrival < d {
			continue
		}
		k := int((q.Arrival - d) / driftBin)
		last = max(last, k)
		b := bins[k]
		if b == nil {
			b = &bin{}
			bins[k] = b
		}
		b.last = q.Arrival - d
		if ape, ok := tr.ape(r, ri); ok {
			b.ape = append(b.ape, ape)
		}
		if tr.trueCompute[ri] > 0 {
			b.ratio = append(b.ratio, tr.predCompute[ri]/tr.trueCompute[ri])
		}
	}
	recovery = -1
	for k := last; k >= 0; k-- {
		b := bins[k]
		if b == nil || len(b.ape) == 0 {
			continue
		}
		if median(b.ape) >= 0.1 {
			break
		}
		recovery = float64(k) * driftBin
	}
	for k := last; k >= 0; k-- {
		if b := bins[k]; b != nil && len(b.ratio) > 0 && median(b.ratio) < 0.75 {
			return recovery, b.last
		}
	}
	return recovery, 0
}

func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// oracle predicts with the hidden truth (noise aside): the "true speeds"
// run.
type oracle struct {
	t    *Truth
	idx  map[string]int
	now  *float64
	didx map[string]int // decode instances by name
}

func (*oracle) Name() string { return "true" }

func (o *oracle) Model(name string, _ float64) predict.Model {
	i, ok := o.idx[name]
	if !ok {
		return nil
	}
	a, _ := predict.NewAnalytic(predict.Options{InitialMargin: 1})
	return &oracleModel{o: o, i: i, err: a.Model(name, 0)}
}

type oracleModel struct {
	o   *oracle
	i   int
	err predict.Model // tracks the error only
}

func (m *oracleModel) Prefill(x predict.Features) predict.Estimate {
	s := m.o.t.seconds(m.i, x.Uncached, x.Cached, *m.o.now)
	return predict.Estimate{Seconds: s, Pessimistic: s}
}

func (m *oracleModel) Observe(o predict.Observation) { m.err.Observe(o) }

func (m *oracleModel) Stats() predict.Stats {
	st := m.err.Stats()
	if s := m.o.t.seconds(m.i, predict.RefTokens, 0, *m.o.now); s > 0 {
		st.Speed = predict.RefTokens / s
	}
	return st
}

// withTruth sets up the true engines and the router's predictor when the
// run has a Truth.
func (r *run) withTruth(infos []load.Info) error {
	if r.cfg.Truth == nil {
		return nil
	}
	r.truth = newTruthRun(r.cfg.Truth, r.n, len(r.tr.Requests))
	name := r.cfg.Predictor
	if name == "" {
		name = "analytic"
	}
	names := make([]string, r.n)
	for i := range names {
		names[i] = infos[i].Name
	}
	p, err := r.truth.predictor(name, names, &r.snap.Now, r.cfg.BatchingEngines)
	if err != nil {
		return err
	}
	if r.dec != nil {
		r.truth.withDecode(r, p, infos)
	}
	r.truth.name = name
	r.truth.onDelay = r.delayed
	r.load.SetPredictor(p)
	r.load.SetBatchingEngines(r.cfg.BatchingEngines)
	return nil
}

// delayed records that request ri's first token moved to end (a chunked
// prefill step it shares: chunked.go).
func (r *run) delayed(ri int, end float64) {
	r.prefillDone[ri] = end
	for k := range r.investing {
		if r.investing[k].ri == ri {
			r.investing[k].end = end
		}
	}
}

// expire ends the prefills that ended by now: at their predicted times, or
// with a Truth when the router hears of their first tokens.
func (r *run) expire(now float64) {
	if r.truth == nil {
		r.load.Expire(now)
		return
	}
	r.truth.advance(r.load, now)
}

// Heterogeneous returns the documented heterogeneous fleet of n prefill
// instances for a router configured at speed tokens/s: the first half run
// at 1.25×speed, the rest spread times slower; attention knees of 16 000,
// 24 000 and 32 000 tokens and overheads of 5, 10 and 15 ms in turn;
// lognormal jitter noise and 2 ms of measurement noise. With driftFactor
// != 1, instance 0 runs at driftFactor of its speed from driftAt on.
func Heterogeneous(n int, speed, spread, noise, driftAt, driftFactor float64, seed uint64) *Truth {
	t := &Truth{Speeds: make([]float64, n), Knees: make([]float64, n), Overheads: make([]float64, n),
		Noise: noise, MeasureNoise: 0.002, Seed: seed}
	for i := range n {
		t.Speeds[i] = 1.25 * speed
		if i >= (n+1)/2 {
			t.Speeds[i] /= spread
		}
		t.Knees[i] = 16000 + 8000*float64(i%3)
		t.Overheads[i] = 0.005 * float64(1+i%3)
	}
	if driftFactor != 1 && driftAt > 0 {
		t.DriftAt, t.DriftInstance, t.DriftFactor = driftAt, 0, driftFactor
	}
	return t
}

// Chunked returns a fleet of n prefill instances that run exactly at the
// configured speed (no knee, overhead or noise) but prefill in chunked
// steps of stepTokens (Truth.StepTokens): the engines' scheduling, not
// their speed, is what the router does not know.
func Chunked(n int, speed float64, stepTokens int) *Truth {
	t := &Truth{Speeds: make([]float64, n), Knees: make([]float64, n), Overheads: make([]float64, n), StepTokens: stepTokens}
	for i := range n {
		t.Speeds[i] = speed
	}
	return t
}

// stop ends on instance i, at time at, the flight fl, the last in its
// queue (an investment given up: sched.Scheduler.YieldFor): the instance
// is free from then on.
func (tr *truthRun) stop(fl *load.Flight, i int, at float64) {
	q := tr.pending[i]
	for k := len(q) - 1; k >= 0; k-- {
		if q[k].fl == fl {
			tr.pending[i] = append(q[:k], q[k+1:]...)
			if k == len(q)-1 {
				tr.free[i] = min(tr.free[i], max(at, 0))
				tr.last[i] = lastStep{} // nothing may join a step that will not run
			}
			return
		}
	}
}
