package sim

import (
	"math"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/sched"
)

// investment is a request served late on an idle endpoint for what it
// leaves in the cache (sched.Decision.Invests).
type investment struct {
	ri, ep    int
	fl        *load.Flight
	start     float64 // its prefill's start and (true) end
	end       float64
	hitBlocks int
}

// investmentsDone caches the prompts of the investments that finished by
// t.
func (r *run) investmentsDone(t float64) {
	keep := r.investing[:0]
	for _, v := range r.investing {
		if v.end > t {
			keep = append(keep, v)
			continue
		}
		r.cacheComputed(v, len(r.tr.Requests[v.ri].Keys))
	}
	clear(r.investing[len(keep):])
	r.investing = keep
}

// investedBlocks raises matched to the prefix of keys that each
// investment in progress will have cached: the router counts what it sent
// an endpoint as cached there (kvindex's approximate entries), and a
// request queued behind the investment finds it so.
func (r *run) investedBlocks(keys []uint64, matched []int) {
	for _, v := range r.investing {
		ik := r.tr.Requests[v.ri].Keys
		n := 0
		for n < len(keys) && n < len(ik) && keys[n] == ik[n] {
			n++
		}
		matched[v.ep] = max(matched[v.ep], n)
	}
}

// cacheComputed enters the first blocks of investment v's prompt in its
// endpoint's cache (and, with event lag, in what the router will hear).
func (r *run) cacheComputed(v investment, blocks int) {
	if blocks <= 0 {
		return
	}
	keys := r.tr.Requests[v.ri].Keys[:blocks]
	r.cache.insert(v.ep, keys)
	if r.view != nil {
		r.view.stored(r.snap.Now, r.snap.Now, v.ep, keys)
	}
}

// yieldFor stops, for request ri which the scheduler rejected for the
// load (d), the investment whose endpoint it would then fit on
// (sched.Scheduler.YieldFor): the investment's request is rejected, the
// blocks it computed stay cached. It reports whether one was stopped;
// the caller decides ri again.
func (r *run) yieldFor(ri int, req *sched.Request, d *sched.Decision) bool {
	if len(r.investing) == 0 || d.Admit || d.Hold || !sched.RejectedForPrefill(req, &r.snap, d) {
		return false
	}
	t := r.snap.Now
	in := make([]sched.Investing, len(r.investing))
	for k, v := range r.investing {
		in[k] = sched.Investing{Endpoint: v.ep, Remaining: r.load.PredictedPrefillEnd(v.fl) - t}
	}
	k := r.sc.YieldFor(req, &r.snap, in)
	if k < 0 {
		return false
	}
	v := r.investing[k]
	r.investing = append(r.investing[:k], r.investing[k+1:]...)
	// The share of its uncached blocks computed by now, at the engine's
	// true pace.
	frac := 1.0
	if v.end > v.start {
		frac = min(max((t-v.start)/(v.end-v.start), 0), 1)
	}
	total := len(r.tr.Requests[v.ri].Keys)
	r.cacheComputed(v, v.hitBlocks+int(math.Floor(frac*float64(total-v.hitBlocks))))
	if r.truth != nil {
		r.truth.stop(v.fl, v.ep, t)
	}
	r.load.PrefillDone(v.fl, t)
	r.load.Finish(v.fl, t)
	r.admitted[v.ri] = false
	r.rejected++
	r.yields++
	return true
}
