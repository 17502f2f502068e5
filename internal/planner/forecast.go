package planner

// holt is Holt's double exponential smoothing of one series observed at
// irregular times: a level and a trend per second. Forecasts are clamped
// at 0 (loads are never negative). It also keeps a plain exponential mean
// (no trend), which does not overshoot when a ramp ends.
type holt struct {
	alpha, beta float64
	level       float64
	trend       float64 // per second
	mean        float64
	last        float64 // time of the last observation
	n           int
}

func (h *holt) observe(t, x float64) {
	if h.n == 0 {
		h.level, h.mean, h.last, h.n = x, x, t, 1
		return
	}
	h.mean = h.alpha*x + (1-h.alpha)*h.mean
	dt := t - h.last
	if dt <= 0 {
		// Two observations at one time: keep the latest value.
		h.level = h.alpha*x + (1-h.alpha)*h.level
		return
	}
	prev := h.level
	h.level = h.alpha*x + (1-h.alpha)*(h.level+h.trend*dt)
	slope := (h.level - prev) / dt
	if h.n == 1 {
		h.trend = slope
	} else {
		h.trend = h.beta*slope + (1-h.beta)*h.trend
	}
	h.last = t
	h.n++
}

// at forecasts the series ahead seconds after the last observation.
func (h *holt) at(ahead float64) float64 { return max(h.level+h.trend*ahead, 0) }

// forecaster smooths the prefill and decode loads.
type forecaster struct {
	p, d holt
	// Last observed values, for the conservative (absorb) check.
	lastP, lastD float64
}

func newForecaster(alpha, beta float64) forecaster {
	return forecaster{p: holt{alpha: alpha, beta: beta}, d: holt{alpha: alpha, beta: beta}}
}

func (f *forecaster) observe(t, prefill, decode float64) {
	f.p.observe(t, prefill)
	f.d.observe(t, decode)
	f.lastP, f.lastD = prefill, decode
}

func (f *forecaster) windows() int { return f.p.n }

// at is the loads to size for ahead seconds on: the forecast where the
// load rises; where it falls, the larger of the smoothed level and the
// latest window (a fall is followed, not anticipated: the end of a ramp
// must not be extrapolated past it); and never more than band above the
// larger of the level and the latest window (nor a step past it).
func (f *forecaster) at(ahead, band float64) (prefill, decode float64) {
	side := func(h *holt, last float64) float64 {
		return min(max(h.at(ahead), h.level, last), max(h.level, last)*(1+band))
	}
	return side(&f.p, f.lastP), side(&f.d, f.lastD)
}

// smoothed is the loads' exponential means: what the current split is
// judged by.
func (f *forecaster) smoothed() (prefill, decode float64) { return f.p.mean, f.d.mean }

// steady reports whether neither load is expected to move by more than
// frac of its level ahead seconds on.
func (f *forecaster) steady(ahead, frac float64) bool {
	ok := func(h *holt) bool { return abs64(h.trend*ahead) <= frac*max(h.level, 1) }
	return ok(&f.p) && ok(&f.d)
}

func abs64(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
