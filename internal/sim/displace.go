package sim

import (
	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/sched"
)

// queuedReq is a request dispatched to a prefill instance whose prefill
// has not started (sched.Scheduler.Displace): what displacing it takes
// back.
type queuedReq struct {
	ri    int
	fl    *load.Flight
	hit   int      // prompt tokens it found cached
	added []uint64 // the blocks its dispatch entered in the cache
}

// displaces reports whether the run displaces: the scheduler asks it, on
// the engines that run as predicted (no Config.Truth: no true engine to
// take a request off), whose caches the router knows exactly (no event
// lag), aggregated (no decode instances).
func (r *run) displaces() bool {
	return r.sc.Displace && r.sc.EarlyReject && r.truth == nil && r.view == nil && r.dec == nil
}

// noteQueued records request ri, just dispatched at t to instance i with
// flight fl, which found hit tokens cached and whose keys not cached
// before its dispatch are added, if its prefill is predicted to start
// later. (The blocks its dispatch evicted stay evicted if it is
// displaced: the simulator does not know them.)
func (r *run) noteQueued(ri, i int, t float64, fl *load.Flight, hit int, added []uint64) {
	if start, _, ok := r.load.Queued(fl); !ok || !(start > t) {
		return
	}
	if r.queued == nil {
		r.queued = make([][]queuedReq, r.n)
	}
	r.queued[i] = append(r.queued[i], queuedReq{ri: ri, fl: fl, hit: hit, added: added})
}

// displaceFor takes back, for request ri which the scheduler rejected
// for the load (d), the queued request sched.Scheduler.DisplaceFor picks:
// rejected (its client gets early rejection's 429 late, no compute
// spent), its flight ended now so that the instance's queue moves up, its
// blocks taken out of the cache. It reports whether it displaced one.
func (r *run) displaceFor(ri int, req *sched.Request, d *sched.Decision) bool {
	if d.Admit || d.Hold || !r.displaces() || !sched.RejectedForPrefill(req, &r.snap, d) {
		return false
	}
	now := r.snap.Now
	var cands []sched.Queued
	var where [][2]int
	for i := range r.queued {
		// Predicted as the load accounting predicts them now: a
		// displacement ahead moved them up.
		keep := r.queued[i][:0]
		for _, q := range r.queued[i] {
			start, compute, ok := r.load.Queued(q.fl)
			if !ok || !(start > now) || !r.admitted[q.ri] {
				continue
			}
			cands = append(cands, sched.Queued{Endpoint: i, Compute: compute, Start: start})
			where = append(where, [2]int{i, len(keep)})
			keep = append(keep, q)
		}
		clear(r.queued[i][len(keep):])
		r.queued[i] = keep
	}
	k := r.sc.DisplaceFor(req, &r.snap, cands)
	if k < 0 {
		return false
	}
	i, j := where[k][0], where[k][1]
	q := r.queued[i][j]
	r.queued[i] = append(r.queued[i][:j], r.queued[i][j+1:]...)
	r.load.Finish(q.fl, now)
	r.cache.remove(i, q.added)
	p := r.tr.Requests[q.ri].PromptTokens
	r.hitTok -= int64(q.hit)
	r.totTok -= int64(p)
	r.admitted[q.ri] = false
	r.rejected++
	r.displaced++
	return true
}
