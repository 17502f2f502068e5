package sched

// Investing is an investment in progress (Decision.Invests): the
// snapshot index of the endpoint computing it and its predicted compute
// left (seconds).
type Investing struct {
	Endpoint  int
	Remaining float64
}

// queuedBehind is the slack (seconds) within which an endpoint's queue
// wait counts as the investment's own remainder: nothing queued behind it.
const queuedBehind = 1e-6

// YieldFor picks the investment that gives its endpoint up to req, which
// the scheduler rejected for the load (RejectedForPrefill): among those
// with nothing queued behind them, the one on whose endpoint req alone
// would have the lowest pessimistic TTFT, if that fits req's SLO. It
// returns its index in investing; -1 if none fits. The caller stops it
// (its client gets the 429 that early rejection would have given it; the
// blocks it computed stay in the engine's prefix cache), updates the load
// and decides req again.
//
// An investment is compute lent to a request that is late whatever
// happens, for what its prompt leaves in the cache (docs/policies.md,
// the hold); a request that can still make its SLO needs that compute
// more.
func (sc *Scheduler) YieldFor(req *Request, s *Snapshot, investing []Investing) int {
	r := *req
	r.SLO = sc.WithDefaults(r.SLO)
	best, bt := -1, r.SLO.TTFT
	for k, in := range investing {
		if in.Endpoint < 0 || in.Endpoint >= len(s.Endpoints) {
			continue
		}
		e := &s.Endpoints[in.Endpoint]
		if !e.Role.CanPrefill() || !(in.Remaining >= 0) || e.QueueWait > in.Remaining+queuedBehind {
			// Not a prefill endpoint, no sane remainder, or requests
			// queued behind the investment (they fit their SLO with it:
			// it is not what stands in the way).
			continue
		}
		if t := aloneTTFT(&r, e); t <= bt {
			best, bt = k, t
		}
	}
	return best
}
