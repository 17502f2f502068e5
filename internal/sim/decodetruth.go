package sim

import (
	"math"
	"slices"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/predict"
)

// decodeTruth is a Truth's decode side: decode instances whose steps take
// Truth.DecodeFactors times the configured model's (hidden from the
// router), and the router's predictor judging each decode instance's TPOT
// (sched's decode choice and admission ask the forecast). The analytic
// TPOT is the decode pool's forecast at the configured step time; the
// learned predictor corrects it from the TPOT of every finished stream,
// reported through load.Fleet.Finished as the gateway reports it.
type decodeTruth struct {
	r *run
	// x is, per decode instance, the features of the last forecast: the
	// current request's.
	x       []predict.DecodeFeatures
	flights []*load.Flight
	// Per request: the TPOT predicted on its decode instance, and the one
	// observed (0: none).
	pred, obs []float64
}

// withDecode sets up the decode truth of a run with decode instances.
func (tr *truthRun) withDecode(r *run, p predict.Predictor, infos []load.Info) {
	nr := len(r.tr.Requests)
	dt := &decodeTruth{r: r, x: make([]predict.DecodeFeatures, r.cfg.Decode), flights: make([]*load.Flight, nr),
		pred: make([]float64, nr), obs: make([]float64, nr)}
	r.dec.hidden = tr.t
	r.dec.onFinish = dt.finished
	r.dec.onProbe = dt.probed
	r.fc.truth = dt
	tr.dec = dt
	if o, ok := p.(*oracle); ok {
		for j, in := range infos[r.n:] {
			o.didx[in.Name] = j
		}
	}
}

// forecast is decodePool.forecast with the TPOT the router's predictor
// expects (the analytic forecast without a TPOT model).
func (dt *decodeTruth) forecast(j int, now, at float64, prompt int) (int, float64) {
	pool := dt.r.dec
	kv, batch, ctx := pool.forecastState(j, now, at, prompt)
	x := predict.DecodeFeatures{Streams: batch, Context: ctx, Prior: pool.model.DecodeStepTime(batch, ctx)}
	dt.x[j] = x
	if est, ok := dt.r.load.PredictTPOT(dt.r.eps[dt.r.n+j], x); ok && est.Seconds > 0 {
		return kv, est.Seconds
	}
	return kv, x.Prior
}

// unproven is decode instance j's DecodeUnproven now: how many more
// streams of its own the router's predictor needs to learn its TPOT from
// them (load.Fleet.DecodeUnproven).
func (dt *decodeTruth) unproven(j int) int {
	x := predict.DecodeFeatures{Streams: 1, Prior: dt.r.dec.model.DecodeStepTime(1, 0)}
	return dt.r.load.DecodeUnproven(dt.r.eps[dt.r.n+j], dt.r.snap.Now, x)
}

// decode records that request ri decodes on decode instance j with the
// predicted TPOT.
func (tr *truthRun) decode(r *run, fl *load.Flight, ri, j int, predicted float64) {
	if tr.dec != nil {
		tr.dec.decode(r, fl, ri, j, predicted)
	}
}

func (dt *decodeTruth) decode(r *run, fl *load.Flight, ri, j int, predicted float64) {
	dt.flights[ri], dt.pred[ri] = fl, predicted
	r.load.DecodeWith(fl, r.eps[r.n+j], dt.x[j])
}

// finished reports a stream's end and TPOT to the router.
func (dt *decodeTruth) finished(ri int, at, tpot float64) {
	dt.obs[ri] = tpot
	if fl := dt.flights[ri]; fl != nil {
		dt.r.load.Finished(fl, at, tpot)
	}
}

// probed reports a stream's TPOT over its first tokens to the router.
func (dt *decodeTruth) probed(ri int, _, tpot float64) {
	if fl := dt.flights[ri]; fl != nil {
		dt.r.load.TPOTProbe(fl, tpot)
	}
}

// errors is the median and p90 absolute percentage error of the predicted
// TPOT over admitted streams of more than one token arriving after warm.
func (dt *decodeTruth) errors(r *run, warm float64) (mdape, p90 float64) {
	var apes []float64
	for ri, ok := range r.admitted {
		if ok && r.tr.Requests[ri].Arrival >= warm && dt.obs[ri] > 0 && dt.pred[ri] > 0 {
			apes = append(apes, math.Abs(dt.pred[ri]-dt.obs[ri])/dt.obs[ri])
		}
	}
	return apeQuantiles(apes)
}

// apeQuantiles is the median and p90 of apes (0, 0 for none); it sorts
// apes.
func apeQuantiles(apes []float64) (mdape, p90 float64) {
	if len(apes) == 0 {
		return 0, 0
	}
	slices.Sort(apes)
	return apes[len(apes)/2], apes[min(len(apes)*9/10, len(apes)-1)]
}

// decodeFactor is decode instance j's hidden factor on its step time at
// time at: DecodeFactorsThen's from DecodeChangeAt on, else
// DecodeFactors', else 1.
func (t *Truth) decodeFactor(j int, at float64) float64 {
	switch {
	case t.DecodeFactorsThen != nil && at >= t.DecodeChangeAt:
		return t.DecodeFactorsThen[j]
	case t.DecodeFactors != nil:
		return t.DecodeFactors[j]
	}
	return 1
}

// DecodeModel makes the oracle a predict.DecodePredictor: it knows each
// decode instance's hidden factor, and the factor it changes to at
// Truth.DecodeChangeAt (not how its batch will evolve).
func (o *oracle) DecodeModel(name string) predict.DecodeModel {
	j, ok := o.didx[name]
	if !ok {
		j = -1
	}
	a, _ := predict.NewAnalytic(predict.Options{InitialMargin: 1})
	return &oracleDecode{o: o, j: j, err: a.DecodeModel(name)}
}

type oracleDecode struct {
	o   *oracle
	j   int                 // the decode instance (-1: not one)
	err predict.DecodeModel // tracks the error only
}

func (m *oracleDecode) TPOT(x predict.DecodeFeatures) predict.Estimate {
	f := 1.0
	if m.j >= 0 {
		f = m.o.t.decodeFactor(m.j, *m.o.now)
	}
	s := x.Prior * f
	return predict.Estimate{Seconds: s, Pessimistic: s}
}

func (m *oracleDecode) ObserveTPOT(o predict.DecodeObservation) { m.err.ObserveTPOT(o) }

func (m *oracleDecode) Stats(x predict.DecodeFeatures) predict.DecodeStats {
	st := m.err.Stats(x)
	st.TPOT = m.TPOT(x).Seconds
	return st
}

// HeterogeneousDecode returns the decode factors of n decode instances
// for the heterogeneous scenario: the first half step 1.25× faster than
// configured, the rest spread times slower than those.
func HeterogeneousDecode(n int, spread float64) []float64 {
	out := make([]float64, n)
	for j := range out {
		out[j] = 0.8
		if j >= (n+1)/2 {
			out[j] *= spread
		}
	}
	return out
}
