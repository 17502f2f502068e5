// Package predict is kvgate's latency predictor: how long an endpoint takes
// to prefill a request, learned online from the outcomes of the requests it
// already routes, or computed from a configured speed.
//
// internal/load asks a Predictor for each endpoint's Model and uses it to
// fill the scheduling snapshot (an effective prefill speed per endpoint and
// request, so sched.PredictTTFT = QueueWait + uncached/speed is the model's
// prediction) and to predict the compute time it queues for a routed
// request; it reports each observed prefill back with Observe. The
// simulator and the gateway share this through load.Fleet.
//
// Models are not safe for concurrent use: load.Fleet calls them under its
// lock.
package predict

import "math"

// Features describe one prefill on one endpoint, as known when it is routed.
type Features struct {
	// Uncached is the prompt tokens to compute; Cached those already held.
	Uncached, Cached int
	// QueuedTokens is the uncached tokens routed to the endpoint ahead of
	// this request and not yet past their prefill.
	QueuedTokens int
	// Running is the requests in flight on the endpoint.
	Running int
}

// Estimate is a prediction of the compute time of one prefill, in seconds.
type Estimate struct {
	Seconds float64
	// Pessimistic is an upper quantile (see Options.Quantile): admission
	// can judge with it so that an endpoint with little data or erratic
	// outcomes is not over-trusted. Pessimistic >= Seconds.
	Pessimistic float64
	// Unproven (TPOT models) is how many more observations of its own
	// the endpoint needs (Options.MinSamples) before the estimate is
	// its own; until then it is its pool's (other endpoints') or its
	// prior's. A router should not reject by such an estimate: judged by
	// others' streams, a fast endpoint in a pool of slow ones is
	// predicted to miss, is sent nothing, and is never observed. 0: the
	// estimate is the endpoint's own.
	Unproven int
}

// Observation is the outcome of one prefill, or of a busy window: the
// prefills an engine computed back to back, batched, from the first one's
// start to the last one's first token.
type Observation struct {
	X Features
	// Also are the other prefills of a busy window (nil for one prefill):
	// an engine that batches prefills tells no single one's compute, but
	// the window's time is their compute summed, which the model's terms
	// summed over the window predict (load.Fleet.SetBatchingEngines).
	// Valid only during the Observe call: a model must not keep it.
	Also []Features
	// Compute is the observed compute time (first token minus the start
	// of the prefill, or of the window, seconds); Predicted the compute
	// time predicted at routing (the window's, summed).
	Compute, Predicted float64
	// TTFT and PredictedTTFT are the observed and predicted time from
	// routing to the first token (queue wait included); they feed the
	// error statistics only.
	TTFT, PredictedTTFT float64
}

// Stats describe an endpoint's model, for /admin/endpoints and /metrics.
type Stats struct {
	// Speed is the effective prefill speed (tokens/s) the model predicts
	// for an uncached prompt of RefTokens tokens.
	Speed float64 `json:"learned_speed"`
	// Samples counts the observations the endpoint's own model has had.
	Samples int `json:"samples"`
	// APE is the recent absolute percentage error of predicted TTFT (an
	// exponentially weighted mean, 0..; 0.1 is 10%).
	APE float64 `json:"recent_ttft_ape"`
	// Margin is Pessimistic/Seconds: the pessimistic quantile's factor.
	Margin float64 `json:"pessimistic_margin"`
}

// RefTokens is the prompt length at which Stats.Speed is reported.
const RefTokens = 2048

// Model predicts one endpoint's prefill time.
type Model interface {
	Prefill(x Features) Estimate
	Observe(o Observation)
	Stats() Stats
}

// Predictor hands out one Model per endpoint.
type Predictor interface {
	// Name is "analytic", "learned" or another implementation's name.
	Name() string
	// Model returns the model of the endpoint named name whose configured
	// prefill speed is speed (tokens/s; the analytic prior): the same
	// model for the same name, its prior updated when speed changes.
	Model(name string, speed float64) Model
}

// errStats tracks a model's recent error: an exponentially weighted mean
// of the TTFT's absolute percentage error and a running upper quantile of
// the log ratio observed/predicted compute time (stochastic quantile
// tracking: O(1) per sample).
type errStats struct {
	ape   float64
	q     float64 // the quantile of ln(observed/predicted)
	n     int     // error samples
	nq    int     // ratio samples (the quantile's)
	alpha float64
	tau   float64
	step  float64
}

func newErrStats(o Options) errStats {
	return errStats{q: math.Log(o.InitialMargin), alpha: o.ErrorWeight, tau: o.Quantile, step: o.QuantileStep}
}

// addError adds the absolute percentage error of pred against obs to the
// recent error.
func (s *errStats) addError(obs, pred float64) {
	if finitePos(obs) && pred >= 0 && !math.IsInf(pred, 0) {
		a := math.Abs(pred-obs) / obs
		if s.n == 0 {
			s.ape = a
		} else {
			s.ape += s.alpha * (a - s.ape)
		}
		s.n++
	}
}

// addRatio moves the pessimistic quantile by the ratio obs/pred.
func (s *errStats) addRatio(obs, pred float64) {
	if finitePos(obs) && finitePos(pred) {
		r := math.Log(obs / pred)
		s.nq++
		if r < s.q {
			s.q -= s.step * (1 - s.tau)
		} else {
			s.q += s.step * s.tau
		}
		s.q = min(max(s.q, 0), maxLogMargin)
	}
}

func finitePos(v float64) bool { return v > 0 && !math.IsInf(v, 0) }

// poolKey is the key of the pool of endpoints configured at speed, and
// the speed as pooled (a speed that is not finite and positive pools as
// 0: no analytic prior).
func poolKey(speed float64) (uint64, float64) {
	if !finitePos(speed) {
		speed = 0
	}
	return math.Float64bits(speed), speed
}

// maxLogMargin caps the pessimistic factor at e^2 ≈ 7.4.
const maxLogMargin = 2

func (s *errStats) margin() float64 { return math.Exp(s.q) }

// pooledErr is an endpoint's error statistics backed by those of its
// pool (the endpoints alike to it, itself included), as the learned fits
// are. The quantile tracker moves by a small step per sample, so one
// endpoint alone takes about a hundred requests to walk its margin from
// the initial 1.5 to the ratio it observes: a whole two-minute live
// replay on 8 engines, which then held a quarter of its requests as
// missing their SLO alone on the margin. The pool learns from every
// endpoint's samples. An endpoint uses the pool's margin until it has
// min ratio samples of its own; its own tracker then starts from the
// pool's quantile of that moment (not from the prior, nor from the pool's
// quantile at its first sample, which on a fleet started together is the
// prior again), so a new or restarted endpoint inherits what the fleet
// has learned.
type pooledErr struct {
	own  errStats
	pool *errStats
	min  int
	q0   float64 // the prior's quantile, ln InitialMargin
}

func newPooledErr(o Options, pool *errStats) pooledErr {
	return pooledErr{own: newErrStats(o), pool: pool, min: o.MinSamples, q0: math.Log(o.InitialMargin)}
}

// active is the statistics whose margin the endpoint uses.
func (p *pooledErr) active() *errStats {
	if p.own.nq < p.min {
		return p.pool
	}
	return &p.own
}

func (p *pooledErr) margin() float64 { return p.active().margin() }

// addError records a sample's error in the endpoint's statistics (the
// recent error is reported per endpoint; the pool keeps none).
func (p *pooledErr) addError(obs, pred float64) { p.own.addError(obs, pred) }

// addRatio moves the pool's quantile and, once the endpoint has min
// ratio samples, its own; before that its own follows the pool's, at most
// the prior: the tracker climbs nine times faster than it descends, so an
// endpoint faster than a pool of mixed speeds (which the pool's quantile
// covers) would take long to walk down from the pool's, while one slower
// than the prior climbs from it within a few samples.
func (p *pooledErr) addRatio(obs, pred float64) {
	n := p.pool.nq
	p.pool.addRatio(obs, pred)
	switch {
	case p.pool.nq == n: // not a sample
	case p.own.nq < p.min:
		p.own.q = min(p.pool.q, p.q0)
		p.own.nq++
	default:
		p.own.addRatio(obs, pred)
	}
}

func (p *pooledErr) observe(o Observation) {
	p.addError(o.TTFT, o.PredictedTTFT)
	p.addRatio(o.Compute, o.Predicted)
}
