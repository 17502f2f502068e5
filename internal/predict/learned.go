package predict

import (
	"fmt"
	"math"
)

// Options configure the learned predictor and the error statistics of both.
// A zero field takes its default.
type Options struct {
	// Forget is the recursive least squares forgetting factor per sample,
	// in [0.5, 1]: the model's memory is about 1/(1-Forget) samples
	// (default 0.98: about 50).
	Forget float64
	// MinSamples is how many of its own observations an endpoint needs
	// before its own model replaces its pool's (endpoints with the same
	// configured speed are pooled); default 16, at most 1e6.
	MinSamples int
	// Quantile is the pessimistic quantile of the compute-time ratio
	// observed/predicted (default 0.9), in [0.5, 0.999].
	Quantile float64
	// QuantileStep is the quantile tracker's step in log units (default
	// 0.05), in (0, 1].
	QuantileStep float64
	// InitialMargin is the pessimistic factor before any data (default
	// 1.5), in [1, 7].
	InitialMargin float64
	// ErrorWeight is the weight of the newest sample in the recent error
	// (default 0.05), in (0, 1].
	ErrorWeight float64
	// Shrink, when > 0, predicts an endpoint by its pool where its own fit
	// differs from the pool's by at most Shrink × its own noise (the
	// relative residual spread), blending to its own fit at twice that:
	// alike endpoints measured through noisy observations (batching
	// engines, a network) are predicted alike. 0 (default): the own fit
	// once it has MinSamples. In [0, 10].
	Shrink float64
	// NonNegative keeps a prefill fit physical for observations that
	// cover a narrow range of prompts (live traffic): no quadratic term
	// (prompts of one length cannot tell it from the linear one), the
	// cached-attention term on a narrow prior (one cached length cannot
	// tell it from the linear one either; newPrefillRLS) and with the
	// per-request term at zero or above, the linear
	// one within maxSpeedFactor of the prior (rls.nonNegative). Off
	// (default): the unconstrained fit, best where the data span the
	// range (the simulator).
	NonNegative bool
}

// LiveOptions are the learned predictor's options for endpoints that
// are real engines, observed through busy windows of batched prefills
// and a network (kvgate serve, and kvgate sim's engines that prefill in
// steps): Shrink 1, alike endpoints predicted alike unless their fits
// differ beyond their noise; NonNegative, since what such an endpoint
// observes is mostly short follow-up turns, too narrow a range to fit
// the non-linear terms freely.
func LiveOptions() Options { return Options{Shrink: 1, NonNegative: true} }

func (o Options) withDefaults() (Options, error) {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Forget, 0.98)
	def(&o.Quantile, 0.9)
	def(&o.QuantileStep, 0.05)
	def(&o.InitialMargin, 1.5)
	def(&o.ErrorWeight, 0.05)
	if o.MinSamples == 0 {
		o.MinSamples = 16
	}
	switch {
	case !(o.Forget >= 0.5 && o.Forget <= 1):
		return o, fmt.Errorf("predict: forgetting factor %g not in [0.5, 1]", o.Forget)
	case o.MinSamples < 1 || o.MinSamples > 1e6:
		return o, fmt.Errorf("predict: min samples %d not in [1, 1000000]", o.MinSamples)
	case !(o.Quantile >= 0.5 && o.Quantile <= 0.999):
		return o, fmt.Errorf("predict: quantile %g not in [0.5, 0.999]", o.Quantile)
	case !(o.QuantileStep > 0 && o.QuantileStep <= 1):
		return o, fmt.Errorf("predict: quantile step %g not in (0, 1]", o.QuantileStep)
	case !(o.InitialMargin >= 1 && o.InitialMargin <= 7):
		return o, fmt.Errorf("predict: initial margin %g not in [1, 7]", o.InitialMargin)
	case !(o.ErrorWeight > 0 && o.ErrorWeight <= 1):
		return o, fmt.Errorf("predict: error weight %g not in (0, 1]", o.ErrorWeight)
	case !(o.Shrink >= 0 && o.Shrink <= 10):
		return o, fmt.Errorf("predict: shrink %g not in [0, 10]", o.Shrink)
	}
	return o, nil
}

// Learned is the online-learned predictor. Each endpoint's compute time is
// modelled as
//
//	t = θ0·u + θ1·u² + θ2·u·c + θ3      (u, c: uncached, cached kilotokens)
//
// — linear compute, attention over the new tokens (quadratic) and over the
// cached context, and a fixed overhead — fitted by recursive least squares
// with exponential forgetting on relative errors (each sample is scaled by
// the analytic prediction, so a 10% miss counts the same on short and long
// prompts). It starts from the analytic model (θ0 = 1/speed, the rest 0);
// an endpoint with fewer than MinSamples observations of its own is
// predicted by the pool of endpoints with its configured speed, which all
// of them train.
type Learned struct {
	o      Options
	models map[string]*learnedModel
	pools  map[uint64]*learnedPool // by poolKey
	// TPOT (decode.go): per endpoint, and one pool for all.
	decode     map[string]*learnedDecode
	decodePool *rls
	decodeErr  errStats
}

// NewLearned returns a learned predictor.
func NewLearned(o Options) (*Learned, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Learned{o: o, models: map[string]*learnedModel{}, pools: map[uint64]*learnedPool{},
		decode: map[string]*learnedDecode{}, decodePool: newDecodeRLS(o.Forget), decodeErr: newErrStats(o)}, nil
}

// Name implements Predictor.
func (*Learned) Name() string { return "learned" }

// Model implements Predictor.
func (l *Learned) Model(name string, speed float64) Model {
	key, speed := poolKey(speed)
	pool := l.pools[key]
	if pool == nil {
		pool = &learnedPool{fit: newPrefillRLS(speed, l.o), err: newErrStats(l.o)}
		l.pools[key] = pool
	}
	m := l.models[name]
	if m == nil || m.speed != speed {
		// New, or its configuration changed: start again from the prior.
		m = &learnedModel{speed: speed, own: newPrefillRLS(speed, l.o), err: newPooledErr(l.o, &pool.err),
			min: l.o.MinSamples, shrink: l.o.Shrink}
		l.models[name] = m
	}
	m.pool, m.peers = pool.fit, l.models
	return m
}

// Forget drops what the endpoint called name learned of itself (its own
// prefill and TPOT fits and errors): the next Model or DecodeModel starts
// it again, predicted by its pool until it has data of its own. For an
// endpoint that may have restarted as another engine (the health checks
// took it out and brought it back): one restarted 4× faster kept its old
// speed, and the faster engine was left idle.
func (l *Learned) Forget(name string) {
	delete(l.models, name)
	delete(l.decode, name)
}

// learnedPool is what the endpoints configured at one speed share: the
// fit that predicts those without data of their own, and the error
// statistics whose margin they use meanwhile.
type learnedPool struct {
	fit *rls
	err errStats
}

type learnedModel struct {
	speed     float64
	own, pool *rls
	err       pooledErr
	min       int
	shrink    float64 // Options.Shrink
	// peers are the predictor's models (Learned.models): those of this
	// one's pool with fits of their own bound what the pool predicts for
	// it (peerBounded).
	peers map[string]*learnedModel
	// ownSq and poolSq are the own and the pool's fits' recent squared
	// log errors on this endpoint's samples (weight cmpWeight), over
	// compared of them (fitsApart).
	ownSq, poolSq float64
	compared      int
}

// cmpWeight is the weight of the newest sample in learnedModel's
// comparison of its own fit with its pool's: a memory of about 10.
const cmpWeight = 0.1

// fitsApart is how far, from 0 to 1, the pool's fit predicts this
// endpoint worse than its own on its recent samples: 0 while the pool's
// squared log error is within four times the own one's (endpoints alike
// but for noise; at twice, alike engines in the simulator's steps came
// apart, kvgate −0.09 points on chat at 70 req/s), 1 from eight times
// on. Shrinking by the own fit's noise alone kept unlike endpoints
// pooled: the noise counts the own fit's
// misses while it learned from the configured prior, so in front of two
// engines of one configured speed doing 3 000 and 2 000 tokens/s, both
// were predicted at 2 656 after 101 and 36 samples, one 25 % off
// (TestUnlikeEndpointsLeaveTheirPool).
func (m *learnedModel) fitsApart() float64 {
	if m.compared < fitsCompared || m.ownSq <= 0 {
		return 0
	}
	return min(max((m.poolSq/m.ownSq-4)/4, 0), 1)
}

// fitsCompared is how many samples the comparison of the fits needs.
const fitsCompared = 8

const nFeat = 4

// fixedTerm is the index of the fixed cost in features: the terms before
// it grow with the prefill's tokens.
const fixedTerm = 3

// features returns the regressors of x.
func features(x Features) [nFeat]float64 {
	u := float64(max(x.Uncached, 0)) / 1024
	c := float64(max(x.Cached, 0)) / 1024
	return [nFeat]float64{u, u * u, u * c, 1}
}

// scale is the analytic prediction the sample is divided by (relative
// errors), at least a millisecond.
func (r *rls) scale(x Features) float64 {
	return max(AnalyticSeconds(x.Uncached, r.speed), 1e-3)
}

// activeFit is the fit that predicts for an endpoint: its own once it has
// min samples (or more than its pool), else the pool's.
func activeFit(own, pool *rls, min int) *rls {
	if own.n < min && pool.n > own.n {
		return pool
	}
	return own
}

func (m *learnedModel) active() *rls { return activeFit(m.own, m.pool, m.min) }

func (m *learnedModel) Prefill(x Features) Estimate {
	s := m.seconds(x)
	return Estimate{Seconds: s, Pessimistic: s * m.err.margin()}
}

// seconds is the endpoint's prediction: its pool's until it has data of
// its own, then its own fit — with Options.Shrink, shrunk to the pool's
// where the two differ by no more than Shrink × the endpoint's own noise,
// so that a router does not move requests off their caches for a
// difference that is not there (measured in kvgate demo, the gateway in
// front of identical emulated engines: without shrinking they were
// learned ±20 % apart and kvgate's attainment ranged 78–99 % over four
// runs; with Shrink 1, 97.7–100 %). Beyond twice that the own fit is taken
// whole (a slower GPU, a drift).
func (m *learnedModel) seconds(x Features) float64 {
	fit := m.active()
	own := fit.predict(x)
	if fit == m.pool {
		return m.peerBounded(x, own)
	}
	if m.shrink <= 0 || m.pool.n <= m.own.n {
		return own
	}
	pool := m.pool.predict(x)
	sigma := m.shrink * m.own.noise()
	if !(own > 0) || !(pool > 0) || sigma <= 0 {
		return own
	}
	d := math.Log(own / pool)
	w := max(min(max((math.Abs(d)-sigma)/sigma, 0), 1), m.fitsApart())
	return pool * math.Exp(w*d)
}

// peerBounded is s, the pool's prediction of x for this endpoint (it
// has not the samples of its own to predict), never faster than the
// fastest of the pool's endpoints with fits of their own predicts x: a
// live pool's fit trains on every endpoint of one configured speed,
// whatever each really does, and on samples from engines of unlike
// speeds (fixed-cost-heavy short turns above all) its terms trade
// against each other and its change detection trips as the samples
// alternate; on synthetic traffic of that kind its speed for a fresh
// 2 048-token prompt wandered between 2 700 and 100 000 tokens/s where
// its endpoints did 5 000 and 20 000. An endpoint back from out was
// then predicted at 49 555 tokens/s where its pool-mates were learned
// at 3 249–14 195 and the configured speed was 20 000, and took every
// fresh prompt (TestRestartedEndpointWithinItsPool). Bounded on that
// side only: an endpoint predicted slower than its pool-mates is one the
// router tries with care, and bounding that side too cost the simulator
// with engines that prefill in steps 0.4–1.9 points of attainment
// without rejection (long prompts 1.5× and 3×) where this costs nothing.
// Without such endpoints (a pool all new, or all forgotten), and for
// the simulator's free fits, s as it is.
func (m *learnedModel) peerBounded(x Features, s float64) float64 {
	if !m.pool.nonNeg {
		return s
	}
	lo := math.Inf(1)
	for _, p := range m.peers {
		if p == m || p.pool != m.pool || p.own.n < p.min {
			continue
		}
		lo = min(lo, p.seconds(x)) // its own fit: never back here
	}
	if math.IsInf(lo, 1) {
		return s
	}
	return max(s, lo)
}

func (m *learnedModel) Observe(o Observation) {
	f, _ := m.own.window(o.X, o.Also) // the regressors do not depend on the fit
	if fit := m.active(); !fit.nonNeg || !fit.fixedBound(f) || !m.own.fixedBound(f) {
		// A sample of the fixed cost (rls.fixedBound) is left out of
		// the margin and the error too: its ratio measures a step's
		// jitter, not the compute of a prompt the margin stretches.
		// Behind a bench repeating its prompts the margin rose to
		// 2.2–2.8 and an idle fleet turned away a fresh 17 000-token
		// prompt it serves in 0.88 s (pessimistic 2.23 s). Only when
		// the endpoint's own fit agrees: the pool's terms are other
		// engines', and a pool fit gone to its linear floor took a
		// fresh 2 048-token prompt for a fixed-cost one, so an
		// endpoint back from out missed by 95 % with its error at 0
		// (TestRestartedEndpointWithinItsPool).
		m.err.observe(o)
	}
	if !finitePos(o.Compute) || o.X.Uncached < 0 {
		return
	}
	m.compare(f, o.Compute)
	m.own.updatePrefill(o.X, o.Also, o.Compute)
	m.pool.updatePrefill(o.X, o.Also, o.Compute)
}

// compare scores the own and the pool's fits on a sample, regressors f
// that took compute seconds, before they learn from it (fitsApart), once
// the own fit has the samples to predict (Options.MinSamples).
func (m *learnedModel) compare(f [nFeat]float64, compute float64) {
	if m.own.n < m.min {
		// Before the own fit predicts, both fits mostly measure the
		// configured prior they start from.
		return
	}
	sq := func(r *rls) float64 {
		p := r.dot(f)
		if !(p > 0) {
			return 1.5 * 1.5
		}
		e := min(max(math.Log(compute/p), -1.5), 1.5)
		return e * e
	}
	m.ownSq += cmpWeight * (sq(m.own) - m.ownSq)
	m.poolSq += cmpWeight * (sq(m.pool) - m.poolSq)
	m.compared++
}

func (m *learnedModel) Stats() Stats {
	st := Stats{Samples: m.own.n, APE: m.err.own.ape, Margin: m.err.margin()}
	if s := m.seconds(Features{Uncached: RefTokens}); s > 0 {
		st.Speed = RefTokens / s
	}
	return st
}

// rls is one recursive least squares fit of nFeat regressors on relative
// errors: each sample's regressors and target are divided by a scale (the
// analytic prediction). θ0 is the term a change of the endpoint's speed
// moves (change detection resets its variance).
type rls struct {
	speed  float64 // prefill fits: the configured speed (the analytic prior)
	forget float64
	theta  [nFeat]float64
	p      [nFeat][nFeat]float64
	p0     [nFeat]float64 // the prior's diagonal
	pmax   [nFeat]float64
	nonNeg bool    // prefill fits: Options.NonNegative
	bias   float64 // exponentially weighted relative residual
	msq    float64 // exponentially weighted squared relative residual
	n      int
}

// Prior standard deviations, relative to θ0 = 1/speed per kilotoken (the
// samples are relative errors, whose variance is taken as noiseVar).
const (
	noiseVar = 0.01
	// windup bounds how far P's diagonal may grow over its prior when
	// forgetting outpaces data in a direction.
	windup = 10
)

// newPrefillRLS is a prefill fit starting from the analytic model of the
// configured speed, with o's forgetting and NonNegative.
func newPrefillRLS(speed float64, o Options) *rls {
	t0 := priorLinear(speed)
	r := newRLS([nFeat]float64{t0}, [nFeat]float64{t0, t0 / 16, t0 / 16, 0.005}, o.Forget)
	r.speed, r.nonNeg = speed, o.NonNegative
	if r.nonNeg {
		// Live traffic cannot tell a quadratic term from the linear one
		// (see nonNegative): it stays at its prior, 0, with no variance,
		// so that no update moves it.
		for j := range r.p {
			r.p[quadTerm][j], r.p[j][quadTerm] = 0, 0
		}
		r.p0[quadTerm], r.pmax[quadTerm] = 0, 0
		// Nor can traffic whose cached part is always the same length
		// (one shared system prompt) tell the cached-attention term from
		// the linear one: under forgetting the fit wandered along the
		// direction the data do not see, and a fresh 10 000-token prompt
		// or a short one after a long cached context came to be predicted
		// 89–109 % off within 3 000 such observations
		// (TestSharedPrefixTrafficPredictsFreshPrompts). Its prior is
		// ten times narrower and its variance never grows past it: data
		// of varied cached lengths still learn it, data of one length
		// leave it at its prior, 0, and put the cost in the linear term.
		r.p0[attnTerm] *= attnPriorShrink * attnPriorShrink
		r.p[attnTerm][attnTerm], r.pmax[attnTerm] = r.p0[attnTerm], r.p0[attnTerm]
	}
	return r
}

// quadTerm and attnTerm are the indices of the quadratic and the
// cached-attention terms in features.
const (
	quadTerm = 1
	attnTerm = 2
)

// attnPriorShrink narrows a NonNegative fit's cached-attention prior
// (standard deviation) against the free fit's.
const attnPriorShrink = 0.1

// newRLS starts a fit at theta with prior standard deviations sd.
func newRLS(theta, sd [nFeat]float64, forget float64) *rls {
	r := &rls{forget: forget, theta: theta}
	for i, s := range sd {
		r.p0[i] = s * s / noiseVar
		r.pmax[i] = windup * r.p0[i]
	}
	for i, v := range r.p0 {
		r.p[i][i] = v
	}
	return r
}

// reset gives the linear term its prior uncertainty again (keeping θ):
// after a change of the endpoint's speed, the new data outweigh the old at
// once. Only the linear term: a speed change scales every per-token term,
// but the data after a change (often short prompts only) cannot tell the
// terms apart, and freeing all of them lets the fit trade the quadratic
// terms against the linear one into nonsense for long prompts. Zeroing the
// row and column keeps P positive semi-definite.
func (r *rls) reset() {
	for j := range r.p {
		r.p[0][j], r.p[j][0] = 0, 0
	}
	r.p[0][0] = r.p0[0]
	r.bias = 0
}

// Change detection: when the relative residual's weighted mean (weight
// biasWeight per sample, each residual clipped to ±0.5 so that one
// outlier cannot trip it) drifts beyond ±biasLimit, or beyond three times
// its own spread on a noisy endpoint, the endpoint changed.
const (
	biasWeight = 0.1
	biasLimit  = 0.15
	msqWeight  = 0.02
)

// priorLinear is a prefill fit's prior linear term θ0: seconds per
// kilotoken at the configured speed (a guess when none is configured).
func priorLinear(speed float64) float64 {
	if speed > 0 {
		return 1024 / speed
	}
	return 1e-4
}

// predict returns the compute seconds of x, kept within maxSpeedFactor of
// the analytic prediction (a guard against a fit gone astray) and >= 0.
func (r *rls) predict(x Features) float64 {
	s := r.dot(features(x))
	a := AnalyticSeconds(x.Uncached, r.speed)
	if a > 0 {
		hi := a * maxSpeedFactor
		if r.nonNeg {
			// The fixed term on top of the bound, for live engines: a
			// prompt of a few tokens to compute costs a step (~10–20
			// ms), beyond 20× its per-token time (0.4 ms for 8
			// tokens), and was predicted at most 8 ms for 20 observed.
			// (The simulator's free fit keeps the plain bound: with it,
			// the heterogeneous scenario lost 0.2–0.3 points.)
			hi += max(r.theta[fixedTerm], 0)
		}
		return min(max(s, a/maxSpeedFactor), hi)
	}
	return min(max(s, 0), 60)
}

// noise is the fit's relative residual spread: √msq, corrected for the
// exponential average's start-up.
func (r *rls) noise() float64 {
	if r.n == 0 {
		return 0
	}
	c := 1 - math.Pow(1-msqWeight, float64(r.n))
	return math.Sqrt(r.msq / c)
}

// dot is θ·f.
func (r *rls) dot(f [nFeat]float64) float64 {
	var s float64
	for i := range f {
		s += r.theta[i] * f[i]
	}
	return s
}

// gain returns P·φ and λ + φᵀ·P·φ.
func (r *rls) gain(phi [nFeat]float64) (pphi [nFeat]float64, den float64) {
	den = r.forget
	for i := range phi {
		var s float64
		for j := range phi {
			s += r.p[i][j] * phi[j]
		}
		pphi[i] = s
		den += phi[i] * s
	}
	return pphi, den
}

// updatePrefill adds one prefill sample, x took y seconds, or a busy
// window's: x and also took y seconds together.
func (r *rls) updatePrefill(x Features, also []Features, y float64) {
	f, scale := r.window(x, also)
	if r.nonNeg && r.fixedBound(f) {
		r.updateFixed(f, 1/scale, y)
	} else {
		r.update(f, 1/scale, y)
	}
	if r.nonNeg {
		r.nonNegative()
	}
}

// window is the regressors and scale of a prefill x, or of a busy
// window of x and also: its time is the sum of its prefills' compute
// terms, and the fixed cost (the first token's trip back, its step)
// once: its prefills overlap it.
func (r *rls) window(x Features, also []Features) (f [nFeat]float64, scale float64) {
	f, scale = features(x), r.scale(x)
	for _, a := range also {
		fa := features(a)
		for i := range fixedTerm {
			f[i] += fa[i]
		}
		scale += r.scale(a)
	}
	return f, scale
}

// fixedBound reports whether a sample of regressors f is the fixed
// cost's: its per-token terms, by the fit, come to less than
// fixedBoundShare of its fixed one (a prompt all but cached, a step's
// worth of tokens to compute).
//
// Such samples cannot tell a slow per-token cost from the fixed one,
// and under forgetting the linear term, not excited by them, gains the
// variance to take their errors: behind kvgate bench repeating its
// prompts (99.5 % cached, 4–12 tokens to compute, ~20 ms a step) the
// gateway learned 1 400–2 400 tokens/s for engines doing 20 000 and
// predicted a fresh 7 000-token prompt at 1.6 s (it took 0.36 s), held
// or turned away what fitted and left an idle endpoint idle
// (TestCachedTurnsKeepTheSpeed). They teach the fixed term alone.
func (r *rls) fixedBound(f [nFeat]float64) bool {
	var perToken float64
	for i := range fixedTerm {
		perToken += r.theta[i] * f[i]
	}
	return perToken < fixedBoundShare*r.theta[fixedTerm]*f[fixedTerm]
}

// fixedBoundShare is the share of the fixed cost below which a sample's
// per-token cost is too small to learn from (rls.fixedBound).
const fixedBoundShare = 0.25

// updateFixed adds one sample as update does, but moving only the fixed
// term: the error is the whole prediction's, the per-token terms taken
// as known. The fixed term's covariance with them is dropped first (as
// reset drops the linear one's, keeping P positive semi-definite): held,
// it moved the linear term against the fixed one, which such samples
// cannot tell apart. It feeds no change detection (a speed change is
// the per-token terms').
func (r *rls) updateFixed(f [nFeat]float64, w, y float64) {
	var pred float64
	for i := range f {
		pred += r.theta[i] * f[i] * w
	}
	for j := range fixedTerm {
		r.p[fixedTerm][j], r.p[j][fixedTerm] = 0, 0
	}
	var phi [nFeat]float64
	phi[fixedTerm] = f[fixedTerm] * w
	r.step(phi, min(max(y*w-pred, -1.5), 1.5))
}

// nonNegative projects the cached-attention and fixed terms onto [0, ∞)
// and the linear one within maxSpeedFactor of the prior's after an
// update (P is left as it is; a NonNegative fit has no quadratic term,
// newPrefillRLS). Without it, samples that cover a narrow range let the
// fit trade its terms against each other along the directions the data
// do not see. In front of kvgate's emulator (kvgate
// demo), the prefills that run alone are nearly all short follow-up turns
// (300 uncached tokens after 2 000–5 000 cached) plus a fixed cost the
// network and the gateway add; replayed offline, endpoints' fits went to
// a negative linear or quadratic term and predicted a fresh 2 348-token
// prompt in 6 ms (400 000 tokens/s, the cap) where the engine takes
// 117 ms, and the gateway sent them everything. So every term but the
// linear one is kept at zero or above and the linear one within
// maxSpeedFactor of the prior's; bounding only the linear term, or only
// the others, still let one endpoint in three runs reach 141 000–400 000
// tokens/s, as did a wider prior on the fixed term or a tighter bound on
// P's windup.
//
// A term moved to its bound moves the others by their covariance with it
// (P's column over its diagonal: the fit's best estimate of the others
// given that term's value), a few passes until every term is within its
// bounds. Clamped alone, the next update's error carries the clamp and
// the gain pushes it into the correlated terms, round after round: on
// short follow-up turns, the pooled fit of eight endpoints drove the
// linear term to its floor and the quadratic one up until a fresh
// 10 000-token prompt was predicted at the 20× cap, 10 s for 0.5 s
// (TestShortTurnsPredictLongPrompts; docs/predictor.md).
func (r *rls) nonNegative() {
	for pass := 0; pass < nFeat; pass++ {
		moved := false
		for c := range r.theta {
			v := r.bounded(c)
			d := v - r.theta[c]
			if d == 0 {
				continue
			}
			if pc := r.p[c][c]; pc > 0 {
				for j := range r.theta {
					r.theta[j] += r.p[j][c] / pc * d
				}
			}
			r.theta[c] = v
			moved = true
		}
		if !moved {
			break
		}
	}
	// Whatever the passes left out of bounds is clamped.
	for c := range r.theta {
		r.theta[c] = r.bounded(c)
	}
}

// bounded is term c of a NonNegative fit within its bounds: the linear
// term within maxSpeedFactor of the prior's, the others at zero or above.
func (r *rls) bounded(c int) float64 {
	if c == 0 {
		t0 := priorLinear(r.speed)
		return min(max(r.theta[0], t0/maxSpeedFactor), t0*maxSpeedFactor)
	}
	return max(r.theta[c], 0)
}

// maxSpeedFactor bounds every prediction against the analytic one
// (rls.predict) and the linear term of a NonNegative fit: a speed within
// 20× of the configured one either way.
const maxSpeedFactor = 20

// update adds one sample: regressors f gave y, both to be weighted by w
// (1/scale: relative errors).
func (r *rls) update(f [nFeat]float64, w, y float64) {
	var phi [nFeat]float64
	for i := range f {
		phi[i] = f[i] * w
	}
	pphi, den := r.gain(phi)
	var pred float64
	for i := range phi {
		pred += r.theta[i] * phi[i]
	}
	// A relative miss beyond ±150% is clipped (a stall or a measurement
	// glitch should move the fit, not throw it).
	e := min(max(y*w-pred, -1.5), 1.5)
	ec := min(max(e, -0.5), 0.5)
	r.msq += msqWeight * (ec*ec - r.msq)
	// The bias's own spread for residuals of this size is
	// sqrt(msq·w/(2−w)); a change is a bias well beyond it.
	limit := max(biasLimit, 3*math.Sqrt(r.msq*biasWeight/(2-biasWeight)))
	if r.bias += biasWeight * (ec - r.bias); math.Abs(r.bias) > limit {
		r.reset()
		pphi, den = r.gain(phi)
	}
	r.stepGain(phi, pphi, den, e)
}

// step moves the fit by the error e of a sample of weighted regressors
// phi, and forgets (update without its change detection).
func (r *rls) step(phi [nFeat]float64, e float64) {
	pphi, den := r.gain(phi)
	ec := min(max(e, -0.5), 0.5)
	r.msq += msqWeight * (ec*ec - r.msq)
	r.stepGain(phi, pphi, den, e)
}

// stepGain is step with the gain computed.
func (r *rls) stepGain(phi, pphi [nFeat]float64, den, e float64) {
	inv := 1 / den
	for i := range phi {
		r.theta[i] += pphi[i] * inv * e
	}
	lf := 1 / r.forget
	for i := range phi {
		for j := i; j < nFeat; j++ {
			v := (r.p[i][j] - pphi[i]*pphi[j]*inv) * lf
			r.p[i][j], r.p[j][i] = v, v
		}
	}
	// Anti-windup: scale a row and column whose variance outgrew its cap
	// (a congruence with a diagonal matrix keeps P positive definite).
	for i := range phi {
		if d := r.p[i][i]; d > r.pmax[i] {
			k := math.Sqrt(r.pmax[i] / d)
			for j := range phi {
				r.p[i][j] *= k
				r.p[j][i] *= k
			}
		}
	}
	r.n++
}
