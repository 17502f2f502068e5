package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// PhasedConfig is a disaggregated fleet whose instances change role during
// a run (RunPhased). Each of Instances instances is a prefill or a decode
// instance; a role switch takes it out of routing at once, drains it (a
// prefill instance finishes its queue; a decode instance finishes its
// streams, including requests whose prefill is still on the way to it),
// warms it up for Warmup seconds, and then it serves in its new role with an
// empty cache.
type PhasedConfig struct {
	Instances int
	// Prefill is how many instances start as prefill instances (the first
	// ones); the rest start as decode instances.
	Prefill int
	Model   perfmodel.Model
	// CacheTokens is a prefill instance's prefix-cache capacity, and
	// DecodeKVTokens a decode instance's KV capacity, in tokens.
	CacheTokens    int
	DecodeKVTokens int
	// Eviction is the order in which a cache gives up a request's blocks
	// (default: tail first, as the engines do).
	Eviction Eviction
	SLO      sched.SLO
	// Warmup is the seconds between the end of an instance's drain and
	// its first request in the new role (load, CUDA graphs, JIT).
	Warmup float64
	// Interval is the simulated seconds between Controller ticks.
	Interval float64
	// Segments, when set, get their own summary (requests by arrival time).
	Segments []Segment
}

// Phased-run limits.
const (
	MaxPhasedInstances = 4096
	maxWarmup          = 3600
	maxSegments        = 1024
	// windowLookback bounds how far before a window Live.Window looks for
	// requests that finish in it: a request longer than this (arrival to
	// last token) is not counted as finished in any window.
	windowLookback = 900.0
)

func (c *PhasedConfig) validate(tr *workload.Trace) error {
	if c.Instances < 2 || c.Instances > MaxPhasedInstances {
		return fmt.Errorf("sim: phased run needs 2 to %d instances, got %d", MaxPhasedInstances, c.Instances)
	}
	if c.Prefill < 1 || c.Prefill >= c.Instances {
		return fmt.Errorf("sim: phased run needs at least one prefill and one decode instance, got %d of %d prefill", c.Prefill, c.Instances)
	}
	if c.CacheTokens < 0 || c.DecodeKVTokens <= 0 {
		return errors.New("sim: cache size must be >= 0 and decode KV capacity > 0")
	}
	if !(c.Warmup >= 0 && c.Warmup <= maxWarmup) {
		return fmt.Errorf("sim: warm-up must be in [0, %d] s, got %v", maxWarmup, c.Warmup)
	}
	if !(c.Interval >= 0 && c.Interval <= 86400) {
		return fmt.Errorf("sim: controller interval must be in [0, 86400] s, got %v", c.Interval)
	}
	if len(c.Segments) > maxSegments {
		return fmt.Errorf("sim: %d segments, at most %d", len(c.Segments), maxSegments)
	}
	for _, s := range c.Segments {
		if !(s.From <= s.To) || math.IsInf(s.To-s.From, 0) {
			return fmt.Errorf("sim: segment %q must have finite From <= To", s.Name)
		}
	}
	if err := c.Model.Validate(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	return tr.Validate()
}

// Segment is a span of arrival times reported on its own.
type Segment struct {
	Name     string  `json:"name"`
	From, To float64 `json:"-"`
}

// Controller is called every PhasedConfig.Interval simulated seconds and
// may start role switches through the Live fleet.
type Controller interface {
	Tick(ctx context.Context, f *Live) error
}

// Instance states.
const (
	StateServing  = "serving"
	StateDraining = "draining"
	StateWarming  = "warming"
)

// InstanceState is one instance as a controller sees it.
type InstanceState struct {
	ID   int
	Name string
	// Role is the role served, or being left while switching.
	Role fleet.Role
	// Target is the role being switched to (Role when serving).
	Target fleet.Role
	State  string
	// Load is the work on it, comparable between instances of one role:
	// seconds of queued prefill on a prefill instance, decode streams
	// (running and waiting) on a decode instance.
	Load float64
}

// SwitchRecord is one role switch: started, drained, serving again (Ready;
// 0 if the run ended first).
type SwitchRecord struct {
	Instance int        `json:"instance"`
	From     fleet.Role `json:"from"`
	To       fleet.Role `json:"to"`
	Start    float64    `json:"start"`
	Drained  float64    `json:"drained"`
	Ready    float64    `json:"ready"`
}

// SegmentResult summarises the requests arriving in one segment.
type SegmentResult struct {
	Name     string `json:"name"`
	Requests int    `json:"requests"`
	Outcome
}

// Outcome is SLO attainment over a set of requests: the share meeting both
// targets, each target alone (rejected and unserved requests miss both),
// and the share rejected.
type Outcome struct {
	Attainment     float64 `json:"attainment"`
	TTFTAttainment float64 `json:"ttft_attainment"`
	TPOTAttainment float64 `json:"tpot_attainment"`
	Rejected       float64 `json:"rejected"`
}

// PhasedResult is a phased run's summary.
type PhasedResult struct {
	Result
	TTFTAttainment float64         `json:"ttft_attainment"`
	TPOTAttainment float64         `json:"tpot_attainment"`
	Segments       []SegmentResult `json:"segments,omitempty"`
	Switches       []SwitchRecord  `json:"switches,omitempty"`
}

// WindowStats is what a gateway would have observed over [From, To):
// the requests that arrived (their sizes, the cached part of their prompts
// as routed, rejections by the side that caused them) and the requests
// that finished (their measured TTFT and TPOT against their SLOs).
type WindowStats struct {
	From, To float64
	// Arrivals, and their prompt, cached-prompt and output tokens.
	Arrivals       int
	PromptTokens   int64
	CachedTokens   int64
	OutputTokens   int64
	RejectedTTFT   int // predicted TTFT over the SLO: the prefill side
	RejectedDecode int // no KV room or predicted TPOT over the SLO
	// Finished requests (last token in the window) and their latencies.
	Finished int
	TTFTMiss int
	TPOTMiss int
	TTFTSum  float64
	TPOTSum  float64
}

// Request outcome kinds.
const (
	kindPending uint8 = iota
	kindAdmitted
	kindRejectTTFT
	kindRejectDecode
)

// phasedRun is one phased simulation's state. Instance i's prefill state is
// slot i of the fleet cache; its decode state is slot i of the decode pool.
type phasedRun struct {
	cfg   PhasedConfig
	tr    *workload.Trace
	sc    *sched.Scheduler
	now   float64
	cache *fleetCache
	load  *load.Fleet
	dec   *decodePool
	fc    phasedForecast
	snap  sched.Snapshot
	// rejections feeds Snapshot.SinceLoadRejection, as the plain run's
	// hold queue does.
	rejections sched.LoadRejections
	eps        []*load.Endpoint

	role   []fleet.Role
	state  []string
	target []fleet.Role
	epoch  []int
	busy   []float64 // prefill queue end
	joins  []float64 // last scheduled decode join
	ready  []float64 // end of warm-up
	sw     []int     // index in switches of the instance's current switch
	// members are the serving instances in snapshot order.
	members  []int
	matched  []int
	all      []int
	switches []SwitchRecord

	kind     []uint8
	uncached []int32
	done     []float64
	slo      []sched.SLO
	opens    []bool // per request: it opens its conversation
	hitTok   int64
	totTok   int64
}

// RunPhased simulates the trace on a fleet whose roles a controller may
// change (nil: fixed roles), under the scheduler. It stops with ctx's error
// when ctx is cancelled or with a controller's error.
func RunPhased(ctx context.Context, cfg PhasedConfig, tr *workload.Trace, sc *sched.Scheduler, ctl Controller) (PhasedResult, error) {
	if err := cfg.validate(tr); err != nil {
		return PhasedResult{}, err
	}
	r := newPhasedRun(cfg, tr, sc)
	live := &Live{r: r}
	next := cfg.Interval
	for ri := range tr.Requests {
		if ri&1023 == 0 && ctx.Err() != nil {
			return PhasedResult{}, fmt.Errorf("sim: stopped after %d of %d requests: %w", ri, len(tr.Requests), ctx.Err())
		}
		t := tr.Requests[ri].Arrival
		for ctl != nil && cfg.Interval > 0 && next <= t {
			r.advance(next)
			if err := ctl.Tick(ctx, live); err != nil {
				return PhasedResult{}, fmt.Errorf("sim: controller at %.1fs: %w", next, err)
			}
			next += cfg.Interval
		}
		r.advance(t)
		if err := r.step(ri); err != nil {
			return PhasedResult{}, err
		}
	}
	if err := r.dec.drain(ctx); err != nil {
		return PhasedResult{}, fmt.Errorf("sim: decode: %w", err)
	}
	return r.summarise(), nil
}

func newPhasedRun(cfg PhasedConfig, tr *workload.Trace, sc *sched.Scheduler) *phasedRun {
	n := cfg.Instances
	nr := len(tr.Requests)
	r := &phasedRun{cfg: cfg, tr: tr, sc: sc,
		cache: newFleetCache(n, cfg.CacheTokens/tr.BlockSize, cfg.Eviction),
		dec:   newDecodePool(n, cfg.DecodeKVTokens, cfg.Model, nr),
		role:  make([]fleet.Role, n), state: make([]string, n), target: make([]fleet.Role, n),
		epoch: make([]int, n), busy: make([]float64, n), joins: make([]float64, n), ready: make([]float64, n),
		sw: make([]int, n), matched: make([]int, n), all: make([]int, n),
		kind: make([]uint8, nr), uncached: make([]int32, nr), done: make([]float64, nr), slo: make([]sched.SLO, nr), opens: tr.Openings(),
	}
	for i := range n {
		r.role[i], r.target[i], r.state[i] = fleet.RoleDecode, fleet.RoleDecode, StateServing
		if i < cfg.Prefill {
			r.role[i], r.target[i] = fleet.RolePrefill, fleet.RolePrefill
		}
	}
	r.fc.r = r
	r.snap.Forecast = &r.fc
	r.snap.BlockSize = tr.BlockSize
	r.load = load.New(nil, load.NeedsActive(sc.Policy))
	r.setMembers()
	return r
}

// setMembers hands the serving instances to the load fleet, in id order.
func (r *phasedRun) setMembers() {
	r.members = r.members[:0]
	var infos []load.Info
	for i, st := range r.state {
		if st != StateServing {
			continue
		}
		r.members = append(r.members, i)
		in := load.Info{Name: fmt.Sprintf("%s%d.%d", r.role[i], i, r.epoch[i]), Role: r.role[i]}
		if r.role[i] == fleet.RolePrefill {
			in.PrefillSpeed = r.cfg.Model.PrefillTokensPerSec
		}
		infos = append(infos, in)
	}
	r.load.Set(infos)
}

// advance moves the clock to t: decode events up to t, then role switches
// whose drain or warm-up ended.
func (r *phasedRun) advance(t float64) {
	r.dec.advance(t)
	r.now = t
	r.fc.now = t
	changed := false
	for i, st := range r.state {
		switch st {
		case StateDraining:
			end, ok := r.drained(i)
			if !ok {
				continue
			}
			r.state[i] = StateWarming
			r.ready[i] = end + r.cfg.Warmup
			r.switches[r.sw[i]].Drained = end
			if r.ready[i] > t {
				continue
			}
			fallthrough
		case StateWarming:
			if r.ready[i] > t {
				continue
			}
			r.state[i], r.role[i] = StateServing, r.target[i]
			r.epoch[i]++
			r.switches[r.sw[i]].Ready = r.ready[i]
			changed = true
		}
	}
	if changed {
		r.setMembers()
	}
}

// drained reports whether draining instance i has no work left, and since
// when (for a decode instance: now, when it is first seen empty).
func (r *phasedRun) drained(i int) (float64, bool) {
	if r.role[i] == fleet.RolePrefill {
		end := max(r.busy[i], r.switches[r.sw[i]].Start)
		return end, end <= r.now
	}
	d := &r.dec.inst[i]
	if r.joins[i] > r.now || d.running || d.batch > 0 || len(d.pending) > 0 || len(d.waiting) > 0 {
		return 0, false
	}
	return r.now, true
}

// CachedBlocks implements load.PrefixCache over the serving instances:
// prefill instances report their cache, decode instances nothing.
func (r *phasedRun) CachedBlocks(keys []uint64, matched []int) {
	r.cache.match(keys, r.all)
	for k, id := range r.members {
		matched[k] = 0
		if r.role[id] == fleet.RolePrefill {
			matched[k] = r.all[id]
		}
	}
}

// HeldBlocks implements load.CacheSizer: a serving prefill instance's
// cache occupancy.
func (r *phasedRun) HeldBlocks(k int) int {
	if id := r.members[k]; r.role[id] == fleet.RolePrefill {
		return r.cache.inst[id].len()
	}
	return 0
}

func (r *phasedRun) step(ri int) error {
	q := &r.tr.Requests[ri]
	t := q.Arrival
	r.load.Expire(t)
	r.snap.Now = t
	r.eps = r.load.Snapshot(t, q.PromptTokens, q.Keys, r, r.matched, &r.snap)
	r.fillCapacity(q.PromptTokens)
	r.rejections.Fill(&r.snap)
	req := sched.Request{Arrival: t, PromptTokens: q.PromptTokens, PromptBlocks: len(q.Keys),
		OutputTokens: q.OutputTokens, SLO: r.cfg.SLO, OpensConversation: r.opens[ri]}
	d := r.sc.Decide(&req, &r.snap)
	r.slo[ri] = d.SLO
	r.uncached[ri] = int32(max(q.PromptTokens-d.CachedTokens, 0))
	if !d.Admit {
		if sched.RejectedForPrefill(&req, &r.snap, &d) {
			r.rejections.Note(t, sched.AnyPrefillIdle(&r.snap))
		}
		r.kind[ri] = kindRejectDecode
		if d.SLO.TTFT > 0 && d.PredictedTTFT > d.SLO.TTFT {
			r.kind[ri] = kindRejectTTFT
		}
		return nil
	}
	if d.Prefill < 0 || d.Prefill >= len(r.members) || d.Decode < 0 || d.Decode >= len(r.members) {
		return fmt.Errorf("sim: policy %s chose endpoints %d/%d of %d", r.sc.Policy.Name(), d.Prefill, d.Decode, len(r.members))
	}
	pi, di := r.members[d.Prefill], r.members[d.Decode]
	if r.role[pi] != fleet.RolePrefill || r.role[di] != fleet.RoleDecode {
		return fmt.Errorf("sim: request %d routed to %s instance %d for prefill and %s instance %d for decode", ri, r.role[pi], pi, r.role[di], di)
	}
	hit := d.CachedTokens
	unc := q.PromptTokens - hit
	fl := r.load.Route(r.eps[d.Prefill], t, load.Work{Uncached: unc, UncachedBlocks: len(q.Keys) - hit/r.tr.BlockSize,
		Keys: q.Keys, PrefillSeconds: r.cfg.Model.PrefillTime(unc), OpensConversation: r.opens[ri]})
	done := r.load.PredictedPrefillEnd(fl)
	r.busy[pi] = max(r.busy[pi], done)
	r.cache.insert(pi, q.Keys)
	r.hitTok += int64(hit)
	r.totTok += int64(q.PromptTokens)
	r.kind[ri] = kindAdmitted
	r.done[ri] = done
	at := done + r.cfg.Model.TransferTime(q.PromptTokens)
	r.joins[di] = max(r.joins[di], at)
	r.dec.join(at, di, ri, q.PromptTokens, q.OutputTokens)
	return nil
}

// fillCapacity sets the snapshot's KV fields from the instances' state.
func (r *phasedRun) fillCapacity(prompt int) {
	bs := r.tr.BlockSize
	for k, id := range r.members {
		e := &r.snap.Endpoints[k]
		if r.role[id] == fleet.RolePrefill {
			if c := r.cache.inst[id]; c.cap > 0 {
				e.KVUsage = float64(c.len()) / float64(c.cap)
				e.KVFreeTokens = (c.cap - c.len()) * bs
			}
			continue
		}
		r.dec.fill(id, e, prompt)
	}
}

// fill sets a snapshot endpoint's decode fields from decode instance i's
// state, as a request of prompt tokens would see it.
func (p *decodePool) fill(i int, e *sched.Endpoint, prompt int) {
	d := &p.inst[i]
	e.DecodeStreams = d.batch + len(d.pending) + len(d.waiting)
	e.KVFreeTokens = d.kvCap - d.kvUsed
	e.KVUsage = float64(d.kvUsed) / float64(d.kvCap)
	e.DecodeTPOT = p.model.DecodeStepTime(d.batch+len(d.pending)+1, d.ctx+d.pendingCtx+prompt)
}

// phasedForecast is the decode pool's sched.DecodeForecaster over the
// serving instances.
type phasedForecast struct {
	r   *phasedRun
	now float64
}

func (f *phasedForecast) ForecastDecode(e int, at float64, req *sched.Request) (int, float64) {
	return f.r.dec.forecast(f.r.members[e], f.now, at, req.PromptTokens)
}

// resetCache empties instance i's prefix cache (its memory goes to another
// role).
func (f *fleetCache) resetCache(i int) {
	c := f.inst[i]
	if f.holders != nil {
		bit := uint64(1) << uint(i)
		for k := range c.idx {
			if m := f.holders[k] &^ bit; m == 0 {
				delete(f.holders, k)
			} else {
				f.holders[k] = m
			}
		}
	}
	f.inst[i] = newLRU(c.cap)
}

// Live is a phased run's fleet as a Controller sees and changes it.
type Live struct{ r *phasedRun }

// Now is the simulated time.
func (l *Live) Now() float64 { return l.r.now }

// Instances lists every instance with its role and state.
func (l *Live) Instances() []InstanceState {
	r := l.r
	out := make([]InstanceState, len(r.role))
	for i := range out {
		s := InstanceState{ID: i, Name: InstanceName(i), Role: r.role[i], Target: r.target[i], State: r.state[i]}
		if r.role[i] == fleet.RolePrefill {
			s.Load = max(r.busy[i]-r.now, 0)
		} else {
			d := &r.dec.inst[i]
			s.Load = float64(d.batch + len(d.pending) + len(d.waiting))
		}
		out[i] = s
	}
	return out
}

// InstanceName is the name Live gives instance id.
func InstanceName(id int) string { return fmt.Sprintf("i%d", id) }

// Switch starts moving instance id to role to. An instance already
// switching, a role other than prefill or decode, and a switch that would
// leave no serving instance of the role it leaves are errors.
func (l *Live) Switch(id int, to fleet.Role) error {
	r := l.r
	if id < 0 || id >= len(r.role) {
		return fmt.Errorf("no instance %d", id)
	}
	if to != fleet.RolePrefill && to != fleet.RoleDecode {
		return fmt.Errorf("instance %d: cannot switch to %s", id, to)
	}
	if r.state[id] != StateServing {
		return fmt.Errorf("instance %d is already switching to %s", id, r.target[id])
	}
	from := r.role[id]
	if from == to {
		return nil
	}
	serving := 0
	for _, m := range r.members {
		if r.role[m] == from {
			serving++
		}
	}
	if serving <= 1 {
		return fmt.Errorf("instance %d is the last serving %s instance", id, from)
	}
	r.state[id], r.target[id] = StateDraining, to
	r.sw[id] = len(r.switches)
	r.switches = append(r.switches, SwitchRecord{Instance: id, From: from, To: to, Start: r.now})
	if from == fleet.RolePrefill {
		r.cache.resetCache(id)
	}
	r.setMembers()
	r.advance(r.now) // an idle instance drains at once
	return nil
}

// Window returns what was observed over [from, to) (to at most now).
func (l *Live) Window(from, to float64) WindowStats {
	r := l.r
	to = min(to, r.now)
	w := WindowStats{From: from, To: to}
	reqs := r.tr.Requests
	lo := sort.Search(len(reqs), func(i int) bool { return reqs[i].Arrival >= from-windowLookback })
	for i := lo; i < len(reqs) && reqs[i].Arrival < to; i++ {
		q := &reqs[i]
		if q.Arrival >= from {
			w.Arrivals++
			w.PromptTokens += int64(q.PromptTokens)
			w.CachedTokens += int64(q.PromptTokens) - int64(r.uncached[i])
			w.OutputTokens += int64(q.OutputTokens)
			switch r.kind[i] {
			case kindRejectTTFT:
				w.RejectedTTFT++
			case kindRejectDecode:
				w.RejectedDecode++
			}
		}
		if r.kind[i] != kindAdmitted || !r.dec.served(i) {
			continue
		}
		if f := r.dec.finish[i]; f < from || f >= to || f <= 0 {
			continue
		}
		ttft, tpot := r.latency(i)
		w.Finished++
		w.TTFTSum += ttft
		w.TPOTSum += tpot
		if s := r.slo[i]; s.TTFT > 0 && ttft > s.TTFT {
			w.TTFTMiss++
		}
		if s := r.slo[i]; s.TPOT > 0 && tpot > s.TPOT {
			w.TPOTMiss++
		}
	}
	return w
}

// latency is served request i's TTFT and TPOT.
func (r *phasedRun) latency(i int) (ttft, tpot float64) {
	ttft = r.dec.first[i] - r.tr.Requests[i].Arrival
	if o := r.dec.out[i]; o > 1 {
		tpot = (r.dec.finish[i] - r.dec.first[i]) / float64(o-1)
	}
	return ttft, tpot
}

// Trace returns the requests that arrived in [from, to), arrival times
// shifted to start at 0; they share the run's block keys (read-only).
func (l *Live) Trace(from, to float64) *workload.Trace {
	r := l.r
	reqs := r.tr.Requests
	lo := sort.Search(len(reqs), func(i int) bool { return reqs[i].Arrival >= from })
	hi := sort.Search(len(reqs), func(i int) bool { return reqs[i].Arrival >= min(to, r.now) })
	out := &workload.Trace{Name: r.tr.Name, BlockSize: r.tr.BlockSize, Duration: max(to-from, 0),
		Requests: slices.Clone(reqs[lo:max(lo, hi)])}
	for i := range out.Requests {
		out.Requests[i].Arrival -= from
	}
	return out
}

// summarise measures every request: overall and per segment.
func (r *phasedRun) summarise() PhasedResult {
	n := len(r.tr.Requests)
	var ttfts, tpots, late []float64
	var all tally
	seg := make([]tally, len(r.cfg.Segments))
	for i := range n {
		okTTFT, okTPOT := false, false
		switch {
		case r.kind[i] != kindAdmitted:
		case r.dec.served(i):
			ttft, tpot := r.latency(i)
			ttfts, tpots = append(ttfts, ttft), append(tpots, tpot)
			s := r.slo[i]
			okTTFT = s.TTFT <= 0 || ttft <= s.TTFT
			okTPOT = s.TPOT <= 0 || tpot <= s.TPOT
			if !okTTFT {
				late = append(late, ttft)
			}
		}
		rejected := r.kind[i] == kindRejectTTFT || r.kind[i] == kindRejectDecode
		all.add(okTTFT, okTPOT, rejected)
		at := r.tr.Requests[i].Arrival
		for k, s := range r.cfg.Segments {
			if at >= s.From && at < s.To {
				seg[k].add(okTTFT, okTPOT, rejected)
			}
		}
	}
	res := PhasedResult{Result: Result{Policy: r.sc.Policy.Name(), EarlyReject: r.sc.EarlyReject, Requests: n, Seed: r.tr.Seed}}
	o := all.outcome()
	res.Attainment, res.Rejected = o.Attainment, o.Rejected
	res.TTFTAttainment, res.TPOTAttainment = o.TTFTAttainment, o.TPOTAttainment
	if r.tr.Duration > 0 {
		res.Rate = float64(n) / r.tr.Duration
		res.Goodput = float64(all.good) / r.tr.Duration
	}
	if r.totTok > 0 {
		res.HitRate = float64(r.hitTok) / float64(r.totTok)
	}
	if n > 0 {
		res.Unserved = float64(all.n-len(ttfts)-all.rejected) / float64(n)
	}
	res.setTTFTs(ttfts, late)
	res.TPOTP50, res.TPOTP99 = percentiles(tpots)
	for k, s := range r.cfg.Segments {
		res.Segments = append(res.Segments, SegmentResult{Name: s.Name, Requests: seg[k].n, Outcome: seg[k].outcome()})
	}
	res.Switches = slices.Clone(r.switches)
	return res
}

// tally counts outcomes.
type tally struct{ n, good, ttft, tpot, rejected int }

func (t *tally) add(okTTFT, okTPOT, rejected bool) {
	t.n++
	if okTTFT {
		t.ttft++
	}
	if okTPOT {
		t.tpot++
	}
	if okTTFT && okTPOT {
		t.good++
	}
	if rejected {
		t.rejected++
	}
}

func (t *tally) outcome() Outcome {
	if t.n == 0 {
		return Outcome{}
	}
	n := float64(t.n)
	return Outcome{Attainment: float64(t.good) / n, TTFTAttainment: float64(t.ttft) / n,
		TPOTAttainment: float64(t.tpot) / n, Rejected: float64(t.rejected) / n}
}
