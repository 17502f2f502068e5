package predict

// Decode: the time per output token (TPOT) a stream joining a decode
// endpoint will see, learned from the TPOT observed at the end of each
// stream. The caller gives with every prediction the analytic TPOT for the
// same features (Prior: perfmodel's step time in the simulator, the
// gateway's configured step model); the learned model is a correction of
// it, so it starts as the analytic model and needs no decode parameters of
// its own.

// DecodeFeatures describe a stream joining a decode endpoint, as known when
// its decode endpoint is chosen.
type DecodeFeatures struct {
	// Streams is the sequences in the decode batch, this one included.
	Streams int
	// Context is the context tokens summed over the batch, this
	// sequence's prompt included.
	Context int
	// Prior is the analytic TPOT for these features (seconds).
	Prior float64
}

// DecodeObservation is the outcome of one stream.
type DecodeObservation struct {
	X DecodeFeatures
	// TPOT is the stream's observed time per output token after the first;
	// Predicted the TPOT predicted when it was routed.
	TPOT, Predicted float64
}

// DecodeStats describe an endpoint's TPOT model, for /admin/endpoints and
// /metrics.
type DecodeStats struct {
	// TPOT is the model's TPOT for the features asked about (a stream
	// joining the endpoint now), and Analytic the analytic one.
	TPOT     float64 `json:"learned_tpot_seconds"`
	Analytic float64 `json:"analytic_tpot_seconds"`
	// Samples counts the endpoint's own observations.
	Samples int `json:"samples"`
	// APE is the recent absolute percentage error of predicted TPOT
	// (exponentially weighted; 0.1 is 10%).
	APE float64 `json:"recent_tpot_ape"`
	// Margin is Pessimistic/Seconds of the TPOT estimates.
	Margin float64 `json:"pessimistic_margin"`
}

// DecodeModel predicts one endpoint's TPOT.
type DecodeModel interface {
	TPOT(x DecodeFeatures) Estimate
	ObserveTPOT(o DecodeObservation)
	// Stats describes the model, its TPOT given for x.
	Stats(x DecodeFeatures) DecodeStats
}

// DecodePredictor is a Predictor that also predicts TPOT.
type DecodePredictor interface {
	Predictor
	// DecodeModel returns the TPOT model of the endpoint named name (the
	// same model for the same name).
	DecodeModel(name string) DecodeModel
}

// DecodeStep is the analytic decode step (perfmodel's form): Base +
// PerSeq·streams + PerKContext·context/1000 seconds. The zero value
// predicts nothing.
type DecodeStep struct {
	Base, PerSeq, PerKContext float64
}

// Seconds is the step time of a batch of streams sequences with context
// tokens in all (0 for no streams).
func (d DecodeStep) Seconds(streams, context int) float64 {
	if streams <= 0 {
		return 0
	}
	return d.Base + d.PerSeq*float64(streams) + d.PerKContext*float64(max(context, 0))/1000
}

// DecodeModel implements DecodePredictor: the analytic TPOT is the prior
// itself; the model keeps its error statistics.
func (a *Analytic) DecodeModel(name string) DecodeModel {
	m := a.decode[name]
	if m == nil {
		m = &analyticDecode{err: newPooledErr(a.o, &a.decodeErr)}
		a.decode[name] = m
	}
	return m
}

type analyticDecode struct{ err pooledErr }

func (m *analyticDecode) TPOT(x DecodeFeatures) Estimate {
	s := max(x.Prior, 0)
	return Estimate{Seconds: s, Pessimistic: s * m.err.margin()}
}

func (m *analyticDecode) ObserveTPOT(o DecodeObservation) { observeDecodeErr(&m.err, o) }

func (m *analyticDecode) Stats(x DecodeFeatures) DecodeStats {
	return decodeStats(m, &m.err, x, m.err.own.n)
}

func observeDecodeErr(s *pooledErr, o DecodeObservation) {
	s.addError(o.TPOT, o.Predicted)
	s.addRatio(o.TPOT, o.Predicted)
}

func decodeStats(m DecodeModel, s *pooledErr, x DecodeFeatures, samples int) DecodeStats {
	return DecodeStats{TPOT: m.TPOT(x).Seconds, Analytic: max(x.Prior, 0), Samples: samples, APE: s.own.ape, Margin: s.margin()}
}

// The learned TPOT model of an endpoint is
//
//	tpot = θ0·prior + θ1 + θ2·streams + θ3·context/1000
//
// — a factor on the analytic TPOT (a faster or slower engine than
// configured) and corrections of its fixed, per-stream and per-context
// terms — fitted by the same recursive least squares as prefill (relative
// errors, forgetting, anti-windup, change detection on θ0), starting at
// θ = (1, 0, 0, 0): the analytic prediction. Endpoints without
// MinSamples observations of their own are predicted by the pool of all
// the predictor's decode endpoints.

// Prior standard deviations of the decode terms: the factor 100%; 0.5 ms
// of fixed cost; 0.01 ms per stream; 0.001 ms per 1 000 context tokens.
// The corrections are kept tight: the prior varies little with the batch
// (its fixed cost dominates), so free corrections trade off against the
// factor, and a fit that flattens the load terms makes every stream go to
// the endpoint it predicts fastest (5× σ: TPOT error p90 70% instead of
// 13% on the heterogeneous scenario at 40 req/s).
var decodeSD = [nFeat]float64{1, 0.0005, 1e-5, 1e-6}

// minPrior is the smallest TPOT scale a sample is divided by.
const minPrior = 1e-4

func decodeFeatures(x DecodeFeatures) [nFeat]float64 {
	return [nFeat]float64{max(x.Prior, 0), 1, float64(max(x.Streams, 0)), float64(max(x.Context, 0)) / 1000}
}

func newDecodeRLS(forget float64) *rls {
	return newRLS([nFeat]float64{1}, decodeSD, forget)
}

// DecodeModel implements DecodePredictor.
func (l *Learned) DecodeModel(name string) DecodeModel {
	m := l.decode[name]
	if m == nil {
		m = &learnedDecode{own: newDecodeRLS(l.o.Forget), pool: l.decodePool, err: newPooledErr(l.o, &l.decodeErr), min: l.o.MinSamples}
		l.decode[name] = m
	}
	return m
}

type learnedDecode struct {
	own, pool *rls
	err       pooledErr
	min       int
}

// predictTPOT is the fit's TPOT for x, within a factor of 20 of the prior.
func (r *rls) predictTPOT(x DecodeFeatures) float64 {
	if !finitePos(x.Prior) {
		return 0
	}
	return min(max(r.dot(decodeFeatures(x)), x.Prior/20), x.Prior*20)
}

func (m *learnedDecode) TPOT(x DecodeFeatures) Estimate {
	s := activeFit(m.own, m.pool, m.min).predictTPOT(x)
	return Estimate{Seconds: s, Pessimistic: s * m.err.margin(), Unproven: max(m.min-m.own.n, 0)}
}

func (m *learnedDecode) ObserveTPOT(o DecodeObservation) {
	observeDecodeErr(&m.err, o)
	if !finitePos(o.TPOT) || !finitePos(o.X.Prior) {
		return
	}
	f, w := decodeFeatures(o.X), 1/max(o.X.Prior, minPrior)
	m.own.update(f, w, o.TPOT)
	m.pool.update(f, w, o.TPOT)
}

func (m *learnedDecode) Stats(x DecodeFeatures) DecodeStats {
	return decodeStats(m, &m.err, x, m.own.n)
}
