package gateway

import (
	"errors"
	"sync"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/prometheus/client_golang/prometheus"
)

// Investments (sched.Decision.Invests, docs/policies.md): with early
// rejection the hold serves late, on an idle engine, a request that
// misses its SLO even alone, for what its prompt leaves in the cache. It
// gives that engine up to a request the scheduler would otherwise reject
// for the load (sched.Scheduler.YieldFor): its upstream request is
// aborted (vLLM keeps the blocks it computed in its prefix cache) and its
// client gets the 429 early rejection would have given it. An investment
// can be stopped until its first byte: its response headers are held back
// until then (relay), so that the 429 can still be sent.

// errYielded: an investment stopped for a request that can meet its SLO.
var errYielded = errors.New("kvgate: served late, the request gave its engine up to one that can meet its SLO")

// stoppable is an attempt in progress that may be stopped for another
// request: an investment (stopFor) or a queued request (displace.go).
type stoppable struct {
	m      *member
	flight *load.Flight
	cancel func(error)
	keys   []uint64 // its prompt's block keys, routed to m
	// priority is its class's and tenant its tenant (a queued
	// request: displace.go).
	priority int
	tenant   string
}

// stoppables are one model fleet's stoppable attempts of one kind.
type stoppables struct {
	mu  sync.Mutex
	set map[*stoppable]struct{}
}

func (v *stoppables) add(in *stoppable) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.set == nil {
		v.set = map[*stoppable]struct{}{}
	}
	v.set[in] = struct{}{}
}

// remove takes in out of the set; false if it was not there (stopped, or
// removed already).
func (v *stoppables) remove(in *stoppable) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.set[in]
	delete(v.set, in)
	return ok
}

// stopFor stops, for req which the scheduler rejected for the load on
// fs's snapshot, the investment sched.Scheduler.YieldFor picks: it aborts
// its upstream request and ends its flight now, so that the next snapshot
// shows its engine free. It reports whether it stopped one.
func (g *Gateway) stopFor(fs *fleetView, req *sched.Request) bool {
	var in []sched.Investing
	return g.stopPicked(fs, &fs.mf.investing, errYielded, g.met.yielded, func(c *stoppable, i int) bool {
		in = append(in, sched.Investing{Endpoint: i, Remaining: fs.mf.load.PredictedPrefillEnd(c.flight) - fs.snap.Now})
		return true
	}, func() int { return g.sched.Load().YieldFor(req, &fs.snap, in) })
}

// stopPicked stops the entry of v that pick chooses (-1: none) among
// those on fs's members for which add, told the entry and its endpoint's
// index in the snapshot, reports true (having noted it for pick): it
// takes it out of v, cancels its attempt with cause (its proxy answers
// its client), ends its flight now, so that the next snapshot shows its
// engine without it, and counts it in stopped. It reports whether it
// stopped one.
func (g *Gateway) stopPicked(fs *fleetView, v *stoppables, cause error, stopped prometheus.Counter,
	add func(c *stoppable, endpoint int) bool, pick func() int) bool {
	v.mu.Lock()
	if len(v.set) == 0 {
		v.mu.Unlock()
		return false
	}
	index := make(map[*member]int, len(fs.members))
	for i, m := range fs.members {
		index[m] = i
	}
	var cands []*stoppable
	for c := range v.set {
		if i, ok := index[c.m]; ok && add(c, i) {
			cands = append(cands, c)
		}
	}
	k := pick()
	if k < 0 {
		v.mu.Unlock()
		return false
	}
	stop := cands[k]
	delete(v.set, stop)
	v.mu.Unlock()
	stop.cancel(cause)
	// Its engine keeps only the blocks it computed, which its KV events
	// report: withdrawn now, not when its proxy returns, since the
	// request it stopped for is decided again at once and would find the
	// whole prompt claimed.
	g.unrouted(stop.m, stop.keys)
	fs.mf.load.Finish(stop.flight, g.clock())
	stopped.Inc()
	return true
}
