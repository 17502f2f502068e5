package predict

// Analytic is the fallback predictor: compute time = uncached tokens /
// configured speed. It still tracks each endpoint's error, so a wrong
// configured speed shows in /admin/endpoints.
type Analytic struct {
	o      Options
	models map[string]*analyticModel
	// errPools are the error statistics pooled by configured speed.
	errPools map[uint64]*errStats
	decode   map[string]*analyticDecode
	// decodeErr is the TPOT error statistics pooled over all endpoints.
	decodeErr errStats
}

// NewAnalytic returns the analytic predictor; o sets only the error
// statistics (zero fields take their defaults).
func NewAnalytic(o Options) (*Analytic, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Analytic{o: o, models: map[string]*analyticModel{}, errPools: map[uint64]*errStats{}, decode: map[string]*analyticDecode{},
		decodeErr: newErrStats(o)}, nil
}

// Name implements Predictor.
func (*Analytic) Name() string { return "analytic" }

// Model implements Predictor.
func (a *Analytic) Model(name string, speed float64) Model {
	pool := errPool(a.errPools, speed, a.o)
	m := a.models[name]
	if m == nil {
		m = &analyticModel{err: newPooledErr(a.o, pool)}
		a.models[name] = m
	}
	m.speed, m.err.pool = speed, pool
	return m
}

// errPool is the pooled error statistics of the endpoints configured at
// speed, created on first use.
func errPool(pools map[uint64]*errStats, speed float64, o Options) *errStats {
	key, _ := poolKey(speed)
	p := pools[key]
	if p == nil {
		s := newErrStats(o)
		p = &s
		pools[key] = p
	}
	return p
}

type analyticModel struct {
	speed float64
	err   pooledErr
}

// AnalyticSeconds is uncached / speed (0 for no speed or no tokens).
func AnalyticSeconds(uncached int, speed float64) float64 {
	if uncached <= 0 || !(speed > 0) {
		return 0
	}
	return float64(uncached) / speed
}

func (m *analyticModel) Prefill(x Features) Estimate {
	s := AnalyticSeconds(x.Uncached, m.speed)
	return Estimate{Seconds: s, Pessimistic: s * m.err.margin()}
}

func (m *analyticModel) Observe(o Observation) { m.err.observe(o) }

func (m *analyticModel) Stats() Stats {
	return Stats{Speed: m.speed, Samples: m.err.own.n, APE: m.err.own.ape, Margin: m.err.margin()}
}
