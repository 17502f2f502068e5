package gateway

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/sched"
)

// The hold queue (sched.HoldQueue, docs/policies.md): without early
// rejection, a request whose predicted TTFT misses its SLO on every
// endpoint waits at the gateway, not in an engine's queue, until an
// endpoint has slack or its deadline passes; with early rejection, one
// that misses its SLO even on an idle endpoint waits for an idle endpoint
// in a quiet fleet, and is rejected (429) at its deadline. Its handler blocks in hold;
// each model fleet's release loop (running while anything is held) makes
// the scheduler's release passes and hands the handler its plan, already
// routed in the load accounting so that the next release sees the
// endpoint busy.

// holdPoll bounds how long the release loop sleeps (Options.HoldPoll):
// the slack it looks for also grows as queues drain, between the prefill
// ends that wake it.
const holdPoll = 50 * time.Millisecond

// holdMinGap is the least time between the starts of two release passes
// when woken: prefill ends that leave slack sooner than predicted wake the
// loop (load.Fleet.WakeOnSlack), up to one per prefill, and a pass over a
// long hold on a large fleet costs a third of a millisecond
// (BenchmarkReleaseHeldBacklog).
const holdMinGap = 2 * time.Millisecond

// defaultHoldGrace is how long past its deadline a held request may still
// wait (no endpoint could take it: the fleet is gone) before it gets 503
// (Options.HoldGrace).
const defaultHoldGrace = 30 * time.Second

// holdQueue is one model fleet's hold queue and its release loop's state.
type holdQueue struct {
	q       *sched.HoldQueue
	mu      sync.Mutex
	running bool
	wake    chan struct{}
}

func newHoldQueue(capacity int) *holdQueue {
	return &holdQueue{q: sched.NewHoldQueue(capacity), wake: make(chan struct{}, 1)}
}

// waiter is a held request's handler, waiting for its plan.
type waiter struct {
	rt    *routed
	ready chan *plan // buffered: the release never blocks
}

// hold parks rt until the scheduler releases it, and returns the plan the
// release made (routed already). It fails when the queue is full or the
// client leaves.
func (g *Gateway) hold(ctx context.Context, rt *routed, p *plan) (*plan, error) {
	hq := p.mf.hold
	w := &waiter{rt: rt, ready: make(chan *plan, 1)}
	h := &sched.Held{Req: p.req, Until: p.dec.HoldUntil, Compute: p.dec.HoldCompute, Value: w, Keys: rt.prep.Keys}
	if !g.cfg.NoFairness {
		h.Tenant = rt.tenant
	}
	if err := hq.q.Push(h); err != nil {
		if errors.Is(err, sched.ErrHoldFull) {
			return nil, openai.TooManyRequests(time.Second, "kvgate: %d requests already held at the router for model %q", g.cfg.Hold.MaxRequests, rt.req.Model)
		}
		return nil, openai.Errorf(http.StatusInternalServerError, "kvgate: %v", err)
	}
	g.met.held.Inc()
	g.startRelease(p.mf)
	limit := time.NewTimer(time.Duration(max(h.Until-g.clock(), 0)*float64(time.Second)) + g.holdGrace)
	defer limit.Stop()
	var err error
	select {
	case np := <-w.ready:
		g.met.holdSeconds.Observe(g.clock() - p.req.Arrival)
		return np, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-limit.C:
		err = openai.Unavailable(5*time.Second, "kvgate: held past its deadline and no endpoint of model %q could take it", rt.req.Model)
	}
	if !hq.q.Remove(h) {
		// Released meanwhile: its flight is routed; end it.
		np := <-w.ready
		np.mf.load.Finish(np.flight, g.clock())
	}
	return nil, err
}

// holdOutcome names a failed hold in the outcome metric.
func holdOutcome(ctx context.Context, err error) string {
	var oe *openai.Error
	switch {
	case ctx.Err() != nil:
		return outcomeClientGone
	case errors.As(err, &oe) && oe.Status == http.StatusServiceUnavailable:
		return outcomeUnavailable
	case errors.As(err, &oe) && oe.Status == http.StatusTooManyRequests:
		return outcomeHoldFull
	}
	return outcomeInternalError // the hold queue refused the request (500)
}

// startRelease runs mf's release loop unless it runs already, and wakes it.
func (g *Gateway) startRelease(mf *modelFleet) {
	hq := mf.hold
	hq.mu.Lock()
	start := !hq.running
	hq.running = true
	hq.mu.Unlock()
	if start {
		go g.releaseLoop(mf)
		return
	}
	select {
	case hq.wake <- struct{}{}:
	default:
	}
}

// releaseLoop makes release passes until nothing is held: at once, at the
// next deadline or predicted idle endpoint, when woken (a new hold, or a
// prefill end that left slack sooner than predicted; at most every
// holdMinGap), and at least every holdPoll.
func (g *Gateway) releaseLoop(mf *modelFleet) {
	hq := mf.hold
	rf := &releaseFleet{g: g, mf: mf}
	var snap sched.Snapshot
	t := time.NewTimer(0)
	defer t.Stop()
	var last time.Time
	for {
		if d := holdMinGap - time.Since(last); d > 0 {
			time.Sleep(d)
		}
		last = time.Now()
		now := g.clock()
		sc := g.sched.Load()
		sc.ReleaseHeld(hq.q, now, rf, &snap)
		sc.TouchHeld(hq.q, now, rf, &snap)
		hq.mu.Lock()
		if hq.q.Len() == 0 {
			hq.running = false
			hq.mu.Unlock()
			return
		}
		hq.mu.Unlock()
		next := min(hq.q.NextDeadline(), mf.load.NextIdle(now)) - now
		wait := min(max(time.Duration(next*float64(time.Second)), time.Millisecond), g.holdPoll)
		t.Reset(wait) // Go ≥ 1.23 timers: Reset drops a value not yet received
		select {
		case <-hq.wake:
		case <-t.C:
		}
	}
}

// releaseFleet is a model fleet as a release pass sees it
// (sched.HoldFleet).
type releaseFleet struct {
	g    *Gateway
	mf   *modelFleet
	view *fleetView // the last snapshot's, for Dispatch
}

func (f *releaseFleet) SnapshotFor(h *sched.Held, now float64, s *sched.Snapshot) {
	w := h.Value.(*waiter)
	fv, err := f.g.fleetFor(f.mf, w.rt, "", now)
	if err != nil {
		// No endpoint now: nothing can be released.
		f.view = nil
		*s = sched.Snapshot{Now: now, BlockSize: f.g.cfg.BlockSize}
		return
	}
	f.view = fv
	*s = fv.snap
}

func (f *releaseFleet) Dispatch(h *sched.Held, d sched.Decision) {
	w := h.Value.(*waiter)
	if !d.Admit {
		// Early rejection, no slack before its deadline: the handler
		// rejects it (it misses alone: no class is shed for it).
		w.ready <- &plan{dec: d, mf: f.mf, req: h.Req, missesAlone: true}
		return
	}
	p := f.g.planFor(w.rt, f.view, &h.Req, d)
	p.flight = f.g.route(w.rt, p)
	p.invests = d.Invests
	w.ready <- p
}

// holdReturns is each model's hold returns rate now (sched.Returns.Rate).
func (g *Gateway) holdReturns() map[string]float64 {
	now := g.clock()
	return g.perModel(func(mf *modelFleet) float64 { return mf.hold.q.ReturnsRate(now) })
}

// heldNow counts the requests held over every model.
func (g *Gateway) heldNow() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	n := 0
	for _, mf := range g.models {
		n += mf.hold.q.Len()
	}
	return n
}
