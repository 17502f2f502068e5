package sched

// Queued is a request admitted onto an endpoint and predicted not to
// have started its prefill there: the snapshot index of the endpoint,
// its predicted compute (seconds), when it is predicted to start (clock
// seconds) and its priority.
type Queued struct {
	Endpoint int
	Compute  float64
	Start    float64
	Priority int
}

// DisplaceFor picks the queued request that gives its place up to req,
// which the scheduler rejected for the load (RejectedForPrefill): among
// those of no higher priority, predicted to start after now and to
// compute more than req would on their endpoint, whose place makes req
// fit its SLO there, the one that frees the most compute (its compute
// less req's). It returns its index in queued; -1 if none. The caller
// takes it off its engine (its client gets the 429 that early rejection
// would have given it, no compute spent), updates the load and decides
// req again.
//
// Admission judges each request as it comes, first come first served,
// and an engine's queue keeps that order: a request that would fit had a
// larger one not come just before it is rejected, and the larger one
// holds the compute of both. Giving the place to the smaller request
// serves as many requests and leaves the difference for those still to
// come: the rule of Moore and Hodgson's algorithm, which serves the most
// jobs by their due dates on one machine (docs/policies.md).
func (sc *Scheduler) DisplaceFor(req *Request, s *Snapshot, queued []Queued) int {
	r := *req
	r.SLO = sc.WithDefaults(r.SLO)
	if r.SLO.TTFT <= 0 {
		return -1
	}
	best, gain := -1, 0.0
	for k, q := range queued {
		if q.Endpoint < 0 || q.Endpoint >= len(s.Endpoints) || q.Priority > r.Priority || !(q.Start > s.Now) {
			continue
		}
		e := &s.Endpoints[q.Endpoint]
		if !e.Role.CanPrefill() || e.PrefillSpeed <= 0 {
			continue
		}
		own := computeSeconds(&r, e) * max(e.PrefillSlack, 1)
		if !(q.Compute > own) || PessimisticTTFT(&r, e)-q.Compute*max(e.QueueSlack, 1) > r.SLO.TTFT {
			continue
		}
		if g := q.Compute - own; g > gain {
			best, gain = k, g
		}
	}
	return best
}
