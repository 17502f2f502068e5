// Package sim is kvgate's discrete-event fleet simulator. It runs the same
// scheduling code as the gateway (internal/sched) against simulated engines
// whose timing comes from internal/perfmodel, on a simulated clock, so a run
// is deterministic for a given workload and seed.
//
// Prefill instances are FIFO servers with a per-instance LRU prefix cache
// over blocks: a request computes only its uncached part. As in the baseline
// chapter's model, the prefix match is taken and the request's blocks are
// entered into the cache when the request is dispatched to the instance.
// Decode instances, when modelled, run continuous batching with a step time
// that grows with batch size and context and a KV capacity that bounds the
// batch.
package sim

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/load"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// Config is the simulated fleet.
type Config struct {
	// Prefill is the number of instances that compute prompts.
	Prefill int
	// Decode is the number of decode instances; 0 models prefill only and
	// measures TTFT at the end of prefill, as the baseline chapter does.
	Decode int
	Model  perfmodel.Model
	// CacheTokens is each prefill instance's prefix-cache capacity in tokens.
	CacheTokens int
	// Eviction is the order in which a cache gives up a request's blocks
	// (default: tail first, as the engines do).
	Eviction Eviction
	// DecodeKVTokens is each decode instance's KV capacity in tokens.
	DecodeKVTokens int
	SLO            sched.SLO
	// EventLag is how late (seconds) the router hears of blocks an
	// instance stores, as a gateway hears KV events; 0 models a router
	// that knows every cache exactly (the baseline chapter's model).
	EventLag float64
	// ApproxTTL, with EventLag > 0 or EventsAtPrefill, is how long the
	// router's own routing decisions count as approximate cache entries
	// (kvindex's approximate tier); 0: none.
	ApproxTTL float64
	// EventsAtPrefill: the router hears of a request's blocks (and of the
	// evictions they cause) when its prefill starts, plus EventLag, as
	// vLLM allocates them when it schedules the request, not when the
	// request is dispatched. The true caches change at dispatch either
	// way (an instance serves its queue in order, so a request finds
	// what its queue ahead left), so the router routes on prefixes the
	// queue ahead is about to evict, as a gateway does.
	EventsAtPrefill bool
	// OnDecision, when set, is called with every request's index and
	// decision (tests compare the simulator's choices with the gateway's).
	OnDecision func(request int, d sched.Decision)
	// Truth, when set, makes the prefill instances differ from the
	// configured Model in hidden ways (truth.go); Predictor is then the
	// router's predictor: "analytic" (default), "learned" or "true".
	Truth     *Truth
	Predictor string
	// BatchingEngines, with a Truth, has the router learn as the gateway
	// does in front of batching engines (load.Fleet.SetBatchingEngines:
	// from busy windows, not from each first token), so that the
	// gateway's learning rule can be measured on the simulator's hidden
	// speeds. The simulator's engines still run FIFO.
	BatchingEngines bool
}

func (c Config) validate(tr *workload.Trace) error {
	if c.Prefill <= 0 {
		return fmt.Errorf("sim: need at least one prefill instance")
	}
	if c.Decode < 0 || c.CacheTokens < 0 {
		return fmt.Errorf("sim: instance counts and cache size must be >= 0")
	}
	if !(c.EventLag >= 0 && c.EventLag <= 3600) || !(c.ApproxTTL >= 0 && c.ApproxTTL <= 86400) {
		return fmt.Errorf("sim: event lag must be in [0, 3600] s and approximate TTL in [0, 86400] s")
	}
	if c.Decode > 0 && c.DecodeKVTokens <= 0 {
		return fmt.Errorf("sim: decode instances need a KV capacity > 0")
	}
	if err := c.Model.Validate(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if c.Truth != nil {
		if err := c.Truth.validate(c.Prefill, c.Decode); err != nil {
			return err
		}
	} else if c.Predictor != "" || c.BatchingEngines {
		return fmt.Errorf("sim: a predictor or BatchingEngines needs a fleet truth")
	}
	return tr.Validate()
}

// Result summarises one run. Attainment counts rejected and unserved
// requests as misses; latencies are over served requests only.
type Result struct {
	Policy      string  `json:"policy"`
	EarlyReject bool    `json:"early_reject"`
	Rate        float64 `json:"rate"`
	// Load and Capacity, when the rate was set as a multiple of the
	// fleet's prefill capacity (requests per second, MeasureCapacity):
	// Rate = Load × Capacity.
	Load     float64 `json:"load,omitempty"`
	Capacity float64 `json:"capacity,omitempty"`
	Requests int     `json:"requests"`
	// Served counts the requests served: with none, the latencies below
	// are unknown (0 here, "-" in kvgate sim's table).
	Served  int     `json:"served"`
	HitRate float64 `json:"hit_rate"`
	TTFTP50 float64 `json:"ttft_p50"`
	TTFTP99 float64 `json:"ttft_p99"`
	// TTFTMax is the longest TTFT of a served request: next to
	// attainment without rejection it shows how late the misses are.
	TTFTMax float64 `json:"ttft_max"`
	// LateTTFTP50 is the median TTFT of the served requests that missed
	// their TTFT SLO (0 when none did, or without a TTFT SLO).
	LateTTFTP50 float64 `json:"late_ttft_p50"`
	// Seed is the seed the workload was generated with (Trace.Seed; 0 for
	// a recorded trace unless its reader's caller sets one).
	Seed       uint64  `json:"seed"`
	Attainment float64 `json:"attainment"`
	Rejected   float64 `json:"rejected"`
	// Unserved is the share of admitted requests that were never served
	// (a sequence longer than any decode instance's KV): misses.
	Unserved float64 `json:"unserved,omitempty"`
	// Held is the share of requests held at the router before being
	// served (sched.Scheduler.Hold): their TTFT counts the hold.
	Held float64 `json:"held,omitempty"`
	// Yielded is the share of requests served late as investments that
	// gave their endpoint up to a request that would otherwise have been
	// rejected for the load (sched.Scheduler.YieldFor); they count as
	// rejected.
	Yielded float64 `json:"yielded,omitempty"`
	// Displaced is the share of requests rejected after they were
	// admitted, before their prefill started, for a request rejected for
	// the load that then fit in their place, computing less
	// (sched.Scheduler.DisplaceFor); they count as rejected.
	Displaced float64 `json:"displaced,omitempty"`
	// Touches is the number of touches per request: one-token requests
	// that kept held requests' cached prefixes warm
	// (sched.Scheduler.TouchHeld), engine work the requests' figures
	// do not count.
	Touches float64 `json:"touches,omitempty"`
	// TouchTokens is the prompt tokens the touches computed per touch:
	// one each, and what their instance no longer held of the prefix
	// the router believed cached.
	TouchTokens float64 `json:"touch_tokens,omitempty"`
	// Copies is the number of prefix copies per request: one-token
	// requests that warmed a shared prefix on an instance ahead of the
	// conversations kvgate's balance sends there
	// (sched.Decision.CopyTokens); CopyTokens the prompt tokens each
	// computed.
	Copies     float64 `json:"copies,omitempty"`
	CopyTokens float64 `json:"copy_tokens,omitempty"`
	Goodput    float64 `json:"goodput"`
	TPOTP50    float64 `json:"tpot_p50,omitempty"`
	TPOTP99    float64 `json:"tpot_p99,omitempty"`
	// With a Truth: the router's predictor and its TTFT error (absolute
	// percentage, median and p90) over admitted requests after warm-up;
	// with drift, the error's recovery and the stale routing (truth.go).
	Predictor     string   `json:"predictor,omitempty"`
	TTFTMdAPE     float64  `json:"ttft_mdape,omitempty"`
	TTFTAPEP90    float64  `json:"ttft_ape_p90,omitempty"`
	DriftRecovery *float64 `json:"drift_recovery_s,omitempty"`
	StaleRouting  *float64 `json:"stale_routing_s,omitempty"`
	// With a Truth and decode instances: the TPOT error (decodetruth.go).
	TPOTMdAPE  float64 `json:"tpot_mdape,omitempty"`
	TPOTAPEP90 float64 `json:"tpot_ape_p90,omitempty"`
}

// Run simulates the trace on the fleet under the scheduler. Each request
// carries cfg.SLO as its own SLO. It stops with ctx's error when ctx is
// cancelled.
func Run(ctx context.Context, cfg Config, tr *workload.Trace, sc *sched.Scheduler) (Result, error) {
	if err := cfg.validate(tr); err != nil {
		return Result{}, err
	}
	r, err := newRun(cfg, tr, sc)
	if err != nil {
		return Result{}, err
	}
	for ri := range tr.Requests {
		if ri&1023 == 0 && ctx.Err() != nil {
			return Result{}, fmt.Errorf("sim: stopped after %d of %d requests: %w", ri, len(tr.Requests), ctx.Err())
		}
		if err := r.releaseUntil(tr.Requests[ri].Arrival); err != nil {
			return Result{}, err
		}
		if err := r.step(ri); err != nil {
			return Result{}, err
		}
		r.touchHeld()
	}
	if err := r.releaseUntil(math.Inf(1)); err != nil {
		return Result{}, err
	}
	if r.dec != nil {
		if err := r.dec.drain(ctx); err != nil {
			return Result{}, fmt.Errorf("sim: decode: %w", err)
		}
	}
	return r.summarise(), nil
}

// run is one simulation's state.
type run struct {
	cfg   Config
	tr    *workload.Trace
	sc    *sched.Scheduler
	n     int         // prefill instances; decode instances follow them
	cache *fleetCache // the engines' true caches
	view  *routerView // what the router knows of them; nil: cache itself
	load  *load.Fleet
	eps   []*load.Endpoint
	dec   *decodePool
	fc    *decodeForecast
	snap  sched.Snapshot
	truth *truthRun // nil: the engines run exactly as predicted

	matched []int
	trueHit []int  // per prefill instance, when the view is not the truth
	opens   []bool // per request: it opens its conversation
	// Per request: admitted, end of prefill, the SLO it was judged by.
	admitted    []bool
	prefillDone []float64
	slo         []sched.SLO
	hitTok      int64
	totTok      int64
	rejected    int
	// hold is the router's hold queue (sched.Scheduler.Hold); held
	// counts the requests that were held.
	hold    *sched.HoldQueue
	held    int
	holdErr error
	// investing are the investments in progress (sched.Decision.Invests):
	// their blocks enter the cache as they finish, or, stopped for a
	// request that would be rejected for the load, as far as they got.
	investing []investment
	yields    int
	// touches counts the touches of held requests' prefixes sent
	// (touch.go), touchComputed the prompt tokens they computed;
	// touchSeq numbers them for the true engine.
	touches, touchSeq, touchComputed int
	// copies counts the prefixes copied ahead of the conversation
	// balance (sched.Decision.CopyTokens), copyComputed the prompt
	// tokens they computed.
	copies, copyComputed int
	// queued are, per prefill instance, the requests dispatched and not
	// started (sched.Scheduler.Displace: displace.go); displaced counts
	// those displaced.
	queued    [][]queuedReq
	displaced int
}

func newRun(cfg Config, tr *workload.Trace, sc *sched.Scheduler) (*run, error) {
	n := cfg.Prefill
	r := &run{cfg: cfg, tr: tr, sc: sc, n: n,
		cache:       newFleetCache(n, cfg.CacheTokens/tr.BlockSize, cfg.Eviction),
		matched:     make([]int, n+cfg.Decode),
		admitted:    make([]bool, len(tr.Requests)),
		prefillDone: make([]float64, len(tr.Requests)),
		slo:         make([]sched.SLO, len(tr.Requests)),
		opens:       tr.Openings(),
	}
	if cfg.EventLag > 0 || cfg.EventsAtPrefill {
		r.view = newRouterView(n, cfg.CacheTokens/tr.BlockSize, cfg.Eviction, cfg.EventLag, cfg.ApproxTTL)
		r.trueHit = make([]int, n)
	}
	role := fleet.RoleBoth
	if cfg.Decode > 0 {
		role = fleet.RolePrefill
		r.dec = newDecodePool(cfg.Decode, cfg.DecodeKVTokens, cfg.Model, len(tr.Requests))
		r.fc = &decodeForecast{pool: r.dec, first: n}
		r.snap.Forecast = r.fc
	}
	infos := make([]load.Info, n+cfg.Decode)
	for i := range infos {
		infos[i] = load.Info{Name: fmt.Sprintf("p%d", i), Role: role, PrefillSpeed: cfg.Model.PrefillTokensPerSec}
		if cfg.Truth != nil {
			// The router is told the engines' step budget, as kvgate
			// serve's engine_step_tokens tells it.
			infos[i].StepTokens = cfg.Truth.StepTokens
		}
		if i >= n {
			infos[i] = load.Info{Name: fmt.Sprintf("d%d", i-n), Role: fleet.RoleDecode}
		}
	}
	r.load = load.New(infos, load.NeedsActive(sc.Policy))
	r.hold = sched.NewHoldQueue(max(len(tr.Requests), 1))
	r.snap.BlockSize = tr.BlockSize
	return r, r.withTruth(infos)
}

// CachedBlocks implements load.PrefixCache: what the router knows of the
// prefill instances' caches; decode instances hold no prefixes for new
// requests.
func (r *run) CachedBlocks(keys []uint64, matched []int) {
	if r.view != nil {
		r.view.match(r.snap.Now, keys, matched[:r.n])
	} else {
		r.cache.match(keys, matched[:r.n])
	}
	clear(matched[r.n:])
	r.investedBlocks(keys, matched)
}

// HeldBlocks implements load.CacheSizer: the blocks the router knows
// prefill instance i holds (its cache's occupancy, or with event lag what
// the events have told so far); decode instances hold none for new
// requests.
func (r *run) HeldBlocks(i int) int {
	switch {
	case i >= r.n:
		return 0
	case r.view != nil:
		return r.view.precise.inst[i].len()
	}
	return r.cache.inst[i].len()
}

// advance moves the simulated fleet to time t.
func (r *run) advance(t float64) {
	if r.dec != nil {
		r.dec.advance(t)
		r.fc.now = t
	}
	r.expire(t)
	r.investmentsDone(t)
	if r.view != nil {
		r.view.advance(t)
	}
	r.snap.Now = t
}

// snapshot fills r.snap (and r.eps) for request ri at the current time.
func (r *run) snapshot(ri int) {
	q := &r.tr.Requests[ri]
	r.eps = r.load.Snapshot(r.snap.Now, q.PromptTokens, q.Keys, r, r.matched, &r.snap)
	r.snap.HeldCompute = r.hold.Compute()
	r.hold.FillRejections(&r.snap)
	r.fillCapacity(q.PromptTokens)
}

// step decides request ri at its arrival: it is rejected, held at the
// router or dispatched.
func (r *run) step(ri int) error {
	q := &r.tr.Requests[ri]
	t := q.Arrival
	r.advance(t)
	r.snapshot(ri)
	req := sched.Request{Arrival: t, PromptTokens: q.PromptTokens, PromptBlocks: len(q.Keys),
		OutputTokens: q.OutputTokens, SLO: r.cfg.SLO, OpensConversation: r.opens[ri], CanCopy: true}
	r.hold.NoteArrival(t, q.Keys)
	d := r.sc.Decide(&req, &r.snap)
	if r.yieldFor(ri, &req, &d) || r.displaceFor(ri, &req, &d) {
		r.snapshot(ri)
		d = r.sc.Decide(&req, &r.snap)
	}
	if r.cfg.OnDecision != nil {
		r.cfg.OnDecision(ri, d)
	}
	r.slo[ri] = d.SLO
	if d.Hold {
		if err := r.hold.Push(&sched.Held{Req: req, Until: d.HoldUntil, Compute: d.HoldCompute, Value: ri, Keys: q.Keys}); err != nil {
			return fmt.Errorf("sim: request %d: %w", ri, err)
		}
		r.held++
		r.sc.ReleaseHeld(r.hold, t, r, &r.snap)
		return r.holdErr
	}
	if !d.Admit {
		r.rejected++
		if sched.RejectedForPrefill(&req, &r.snap, &d) {
			r.hold.NoteLoadRejection(t, sched.AnyPrefillIdle(&r.snap))
		}
		return nil
	}
	return r.dispatch(ri, t, d)
}

// releaseUntil runs the hold queue's release passes up to time t: at each
// deadline and each time an instance's queue runs empty.
func (r *run) releaseUntil(t float64) error {
	last := math.Inf(-1)
	for r.hold.Len() > 0 {
		te := min(r.hold.NextDeadline(), r.load.NextIdle(r.snap.Now))
		te = max(te, r.snap.Now)
		if te > t || math.IsInf(te, 1) {
			return nil
		}
		r.advance(te)
		n := r.sc.ReleaseHeld(r.hold, te, r, &r.snap)
		if r.holdErr != nil {
			return r.holdErr
		}
		r.touchHeld()
		if n == 0 && te <= last {
			// Nothing can be released (no decode endpoint): what is
			// still held stays unserved.
			return nil
		}
		last = te
	}
	return nil
}

// SnapshotFor implements sched.HoldFleet: the run has advanced to the
// pass's time before the pass (r.snap.Now), so every snapshot is at it.
func (r *run) SnapshotFor(h *sched.Held, _ float64, _ *sched.Snapshot) { r.snapshot(h.Value.(int)) }

// Dispatch implements sched.HoldFleet: a held request leaves the hold,
// served or (early rejection, no slack before its deadline) rejected.
func (r *run) Dispatch(h *sched.Held, d sched.Decision) {
	if !d.Admit {
		r.rejected++
		return
	}
	if r.holdErr == nil {
		r.holdErr = r.dispatch(h.Value.(int), r.snap.Now, d)
	}
}

// dispatch sends request ri where d says at time t, with r.snap and r.eps
// the snapshot d was decided on.
func (r *run) dispatch(ri int, t float64, d sched.Decision) error {
	q := &r.tr.Requests[ri]
	if d.Prefill < 0 || d.Prefill >= r.n {
		return fmt.Errorf("sim: policy %s chose prefill endpoint %d of %d", r.sc.Policy.Name(), d.Prefill, r.n)
	}
	i := d.Prefill
	// An investment on an aggregated instance has its blocks cached as it
	// finishes or stops (invest.go); everything else at once.
	tracked := d.Invests && r.dec == nil
	hit := r.snap.Endpoints[i].CachedTokens
	if r.view != nil {
		// The engine computes what its true cache lacks, whatever the
		// router believed.
		r.cache.match(q.Keys, r.trueHit)
		hit = load.CachedPrefix(r.trueHit[i], r.tr.BlockSize, q.PromptTokens)
		if !tracked {
			from := t
			if r.cfg.EventsAtPrefill {
				from = r.snap.Endpoints[i].FreeAt
			}
			r.view.stored(t, from, i, q.Keys)
		}
	}
	unc, hitBlocks := q.PromptTokens-hit, hit/r.tr.BlockSize
	fl := r.load.Route(r.eps[i], t, load.Work{Uncached: unc, Cached: hit, UncachedBlocks: len(q.Keys) - hitBlocks,
		Keys: q.Keys, PrefillSeconds: r.cfg.Model.PrefillTime(unc), OpensConversation: r.opens[ri], Deadline: r.deadline(ri)})
	done := r.load.PredictedPrefillEnd(fl)
	if r.truth != nil {
		done = r.truth.route(r.load, fl, ri, i, unc, hit, t, r.snap.Endpoints[i].FreeAt)
	}
	if tracked {
		r.investing = append(r.investing, investment{ri: ri, ep: i, fl: fl, start: max(t, r.snap.Endpoints[i].FreeAt), end: done, hitBlocks: hitBlocks})
	} else {
		if r.displaces() {
			added := r.cache.missing(i, q.Keys) // what a displacement takes back
			r.cache.insert(i, q.Keys)
			r.noteQueued(ri, i, t, fl, hit, added)
		} else {
			r.cache.insert(i, q.Keys)
		}
	}
	if d.CopyTokens > 0 {
		r.copyPrefix(ri, d.CopyTo, d.CopyTokens)
	}
	r.hitTok += int64(hit)
	r.totTok += int64(q.PromptTokens)
	r.admitted[ri] = true
	r.prefillDone[ri] = done
	if r.dec != nil {
		dj := d.Decode - r.n
		if dj < 0 || dj >= r.cfg.Decode {
			return fmt.Errorf("sim: no decode endpoint chosen for request %d", ri)
		}
		if r.truth != nil {
			r.truth.decode(r, fl, ri, dj, d.PredictedTPOT)
		}
		r.dec.join(done+r.cfg.Model.TransferTime(q.PromptTokens), dj, ri, q.PromptTokens, q.OutputTokens)
	}
	return nil
}

// deadline is when request ri's first token is due (0: no TTFT SLO).
func (r *run) deadline(ri int) float64 {
	if s := r.slo[ri].TTFT; s > 0 {
		return r.tr.Requests[ri].Arrival + s
	}
	return 0
}

// fillCapacity sets the snapshot's KV fields: prefix-cache occupancy on
// prefill instances, the decode pool's state on decode instances.
func (r *run) fillCapacity(prompt int) {
	bs := r.tr.BlockSize
	for i := 0; i < r.n; i++ {
		if c := r.cache.inst[i]; c.cap > 0 {
			e := &r.snap.Endpoints[i]
			e.KVUsage = float64(c.len()) / float64(c.cap)
			e.KVFreeTokens = (c.cap - c.len()) * bs
		}
	}
	if r.dec == nil {
		return
	}
	for j := range r.dec.inst {
		e := &r.snap.Endpoints[r.n+j]
		r.dec.fill(j, e, prompt)
		if r.fc.truth != nil {
			e.DecodeUnproven = r.fc.truth.unproven(j)
		}
	}
}

// decodeForecast lets the scheduler ask the decode pool about the end of a
// request's prefill (sched.DecodeForecaster).
type decodeForecast struct {
	pool  *decodePool
	first int // index of the first decode endpoint in the snapshot
	now   float64
	// truth, when set, has the router's predictor judge TPOT
	// (decodetruth.go).
	truth *decodeTruth
}

func (f *decodeForecast) ForecastDecode(e int, at float64, req *sched.Request) (int, float64) {
	if f.truth != nil {
		return f.truth.forecast(e-f.first, f.now, at, req.PromptTokens)
	}
	return f.pool.forecast(e-f.first, f.now, at, req.PromptTokens)
}

func (r *run) summarise() Result {
	var ttfts, tpots, late []float64
	good, unserved := 0, 0
	dec := r.dec
	for ri, ok := range r.admitted {
		if !ok {
			continue
		}
		q := &r.tr.Requests[ri]
		slo := r.slo[ri]
		ttft := r.prefillDone[ri] - q.Arrival
		tpot := 0.0
		if dec != nil {
			if !dec.served(ri) {
				// Admitted but never decoded (its sequence can never
				// fit a decode instance): a miss, and no latency.
				unserved++
				continue
			}
			ttft = dec.first[ri] - q.Arrival
			if o := dec.out[ri]; o > 1 {
				tpot = (dec.finish[ri] - dec.first[ri]) / float64(o-1)
			}
			tpots = append(tpots, tpot)
		}
		ttfts = append(ttfts, ttft)
		if slo.TTFT > 0 && ttft > slo.TTFT {
			late = append(late, ttft)
		}
		if (slo.TTFT <= 0 || ttft <= slo.TTFT) && (dec == nil || slo.TPOT <= 0 || tpot <= slo.TPOT) {
			good++
		}
	}
	total := len(r.tr.Requests)
	res := Result{Policy: r.sc.Policy.Name(), EarlyReject: r.sc.EarlyReject, Requests: total, Seed: r.tr.Seed}
	if r.tr.Duration > 0 {
		res.Rate = float64(total) / r.tr.Duration
		res.Goodput = float64(good) / r.tr.Duration
	}
	if r.totTok > 0 {
		res.HitRate = float64(r.hitTok) / float64(r.totTok)
	}
	res.setTTFTs(ttfts, late)
	res.TPOTP50, res.TPOTP99 = percentiles(tpots)
	if total > 0 {
		res.Attainment = float64(good) / float64(total)
		res.Rejected = float64(r.rejected) / float64(total)
		res.Unserved = float64(unserved+r.hold.Len()) / float64(total)
		res.Held = float64(r.held) / float64(total)
		res.Yielded = float64(r.yields) / float64(total)
		res.Displaced = float64(r.displaced) / float64(total)
		res.Touches = float64(r.touches) / float64(total)
		res.Copies = float64(r.copies) / float64(total)
	}
	if r.touches > 0 {
		res.TouchTokens = float64(r.touchComputed) / float64(r.touches)
	}
	if r.copies > 0 {
		res.CopyTokens = float64(r.copyComputed) / float64(r.copies)
	}
	if r.truth != nil {
		r.truth.summarise(r, &res)
	}
	return res
}

// setTTFTs sets the TTFT measures from the served requests' TTFTs and
// those of the ones that missed their TTFT SLO (both sorted in place).
func (res *Result) setTTFTs(ttfts, late []float64) {
	res.Served = len(ttfts)
	res.TTFTP50, res.TTFTP99 = percentiles(ttfts)
	if len(ttfts) > 0 {
		res.TTFTMax = ttfts[len(ttfts)-1] // sorted by percentiles
	}
	res.LateTTFTP50, _ = percentiles(late)
}

// percentiles returns the median and 99th percentile as the baseline
// chapter computes them: sorted[n/2] and sorted[int(n*0.99)].
func percentiles(xs []float64) (p50, p99 float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2], xs[min(int(float64(len(xs))*0.99), len(xs)-1)]
}
