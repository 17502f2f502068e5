// Package sim is kvgate's discrete-event fleet simulator. It runs the same
// scheduling code as the gateway (internal/sched) against simulated engines
// whose timing comes from internal/perfmodel, on a simulated clock, so a run
// is deterministic for a given workload and seed.
//
// Prefill instances are FIFO servers with a per-instance LRU prefix cache
// over blocks: a request computes only its uncached part. As in the seed
// chapter's model, the prefix match is taken and the request's blocks are
// entered into the cache when the request is dispatched to the instance.
// Decode instances, when modelled, run continuous batching with a step time
// that grows with batch size and context and a KV capacity that bounds the
// batch.
package sim

import (
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// Config is the simulated fleet.
type Config struct {
	// Prefill is the number of instances that compute prompts.
	Prefill int
	// Decode is the number of decode instances; 0 models prefill only and
	// measures TTFT at the end of prefill, as the seed chapter does.
	Decode int
	Model  perfmodel.Model
	// CacheTokens is each prefill instance's prefix-cache capacity in tokens.
	CacheTokens int
	// DecodeKVTokens is each decode instance's KV capacity in tokens.
	DecodeKVTokens int
	SLO            sched.SLO
}

func (c Config) validate(tr *workload.Trace) error {
	if c.Prefill <= 0 {
		return fmt.Errorf("sim: need at least one prefill instance")
	}
	if c.Decode < 0 || c.CacheTokens < 0 {
		return fmt.Errorf("sim: instance counts and cache size must be >= 0")
	}
	if c.Decode > 0 && c.DecodeKVTokens <= 0 {
		return fmt.Errorf("sim: decode instances need a KV capacity > 0")
	}
	if err := c.Model.Validate(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	return tr.Validate()
}

// Result summarises one run. Attainment counts rejected requests as misses.
type Result struct {
	Policy      string  `json:"policy"`
	EarlyReject bool    `json:"early_reject"`
	Rate        float64 `json:"rate"`
	Requests    int     `json:"requests"`
	HitRate     float64 `json:"hit_rate"`
	TTFTP50     float64 `json:"ttft_p50"`
	TTFTP99     float64 `json:"ttft_p99"`
	Attainment  float64 `json:"attainment"`
	Rejected    float64 `json:"rejected"`
	Goodput     float64 `json:"goodput"`
	TPOTP50     float64 `json:"tpot_p50,omitempty"`
	TPOTP99     float64 `json:"tpot_p99,omitempty"`
}

type inflight struct {
	done            float64
	uncached, ublks int
	keys            []uint64
}

type prefillInst struct {
	busy       float64
	q          []inflight
	head       int
	uncached   int
	ublocks    int
	lastPicked float64
	// active counts in-flight sequences per block: its size is the number
	// of distinct blocks the instance holds for them. nil unless the
	// policy reads active blocks (sched.SignalActiveBlocks).
	active map[uint64]int32
}

func (p *prefillInst) hold(keys []uint64) {
	if p.active == nil {
		return
	}
	for _, k := range keys {
		p.active[k]++
	}
}

func (p *prefillInst) drain(t float64) {
	for p.head < len(p.q) && p.q[p.head].done <= t {
		f := p.q[p.head]
		p.uncached -= f.uncached
		p.ublocks -= f.ublks
		for _, k := range f.keys {
			if p.active == nil {
				break
			}
			if c := p.active[k]; c <= 1 {
				delete(p.active, k)
			} else {
				p.active[k] = c - 1
			}
		}
		p.head++
	}
	if p.head > 1024 && p.head*2 > len(p.q) {
		p.q = append(p.q[:0], p.q[p.head:]...)
		p.head = 0
	}
}

// Run simulates the trace on the fleet under the scheduler.
func Run(cfg Config, tr *workload.Trace, sc *sched.Scheduler) (Result, error) {
	if err := cfg.validate(tr); err != nil {
		return Result{}, err
	}
	bs := tr.BlockSize
	n := cfg.Prefill
	cache := newFleetCache(n, cfg.CacheTokens/bs)
	pre := make([]prefillInst, n)
	for i := range pre {
		pre[i].lastPicked = -1
		if sched.Needs(sc.Policy)&sched.SignalActiveBlocks != 0 {
			pre[i].active = make(map[uint64]int32)
		}
	}
	var dec *decodePool
	if cfg.Decode > 0 {
		dec = newDecodePool(cfg.Decode, cfg.DecodeKVTokens, cfg.Model, len(tr.Requests))
	}
	role := sched.RoleBoth
	if cfg.Decode > 0 {
		role = sched.RolePrefill
	}
	snap := &sched.Snapshot{BlockSize: bs, Endpoints: make([]sched.Endpoint, n+cfg.Decode)}
	for i := range snap.Endpoints {
		snap.Endpoints[i].Name = fmt.Sprintf("p%d", i)
		snap.Endpoints[i].Role = role
		snap.Endpoints[i].PrefillSpeed = cfg.Model.PrefillTokensPerSec
		if i >= n {
			snap.Endpoints[i].Name = fmt.Sprintf("d%d", i-n)
			snap.Endpoints[i].Role = sched.RoleDecode
		}
	}
	var fc *decodeForecast
	if dec != nil {
		fc = &decodeForecast{pool: dec, first: n}
		snap.Forecast = fc
	}
	matched := make([]int, n)
	prefillDone := make([]float64, len(tr.Requests))
	admitted := make([]bool, len(tr.Requests))
	var hitTok, totTok int64
	rejected := 0

	for ri := range tr.Requests {
		r := &tr.Requests[ri]
		t := r.Arrival
		if dec != nil {
			dec.advance(t)
		}
		cache.match(r.Keys, matched)
		req := sched.Request{Arrival: t, PromptTokens: r.PromptTokens, PromptBlocks: len(r.Keys),
			OutputTokens: r.OutputTokens, SLO: cfg.SLO}
		snap.Now = t
		if fc != nil {
			fc.now = t
		}
		for i := range pre {
			p := &pre[i]
			p.drain(t)
			e := &snap.Endpoints[i]
			e.CachedTokens = min(matched[i]*bs, r.PromptTokens)
			e.QueueWait = max(p.busy-t, 0)
			e.FreeAt = p.busy
			e.InflightUncached = p.uncached
			e.InflightRequests = len(p.q) - p.head
			e.ActivePrefillBlocks = p.ublocks
			e.ActiveDecodeBlocks = len(p.active)
			if cap := cache.inst[i].cap; cap > 0 {
				e.KVUsage = float64(cache.inst[i].len()) / float64(cap)
				e.KVFreeTokens = (cap - cache.inst[i].len()) * bs
			}
			e.LastPicked = p.lastPicked
		}
		if dec != nil {
			for j := range dec.inst {
				d := &dec.inst[j]
				e := &snap.Endpoints[n+j]
				e.DecodeStreams = d.batch + len(d.pending) + len(d.waiting)
				e.KVFreeTokens = d.kvCap - d.kvUsed
				e.KVUsage = float64(d.kvUsed) / float64(d.kvCap)
				e.DecodeTPOT = cfg.Model.DecodeStepTime(d.batch+len(d.pending)+1, d.ctx+d.pendingCtx+r.PromptTokens)
			}
		}
		dcs := sc.Decide(&req, snap)
		if !dcs.Admit {
			rejected++
			continue
		}
		if dcs.Prefill < 0 || dcs.Prefill >= n {
			return Result{}, fmt.Errorf("sim: policy %s chose prefill endpoint %d of %d", sc.Policy.Name(), dcs.Prefill, n)
		}
		i := dcs.Prefill
		p := &pre[i]
		hit := snap.Endpoints[i].CachedTokens
		unc := r.PromptTokens - hit
		start := max(p.busy, t)
		p.busy = start + cfg.Model.PrefillTime(unc)
		ublk := len(r.Keys) - matched[i]
		p.q = append(p.q, inflight{done: p.busy, uncached: unc, ublks: ublk, keys: r.Keys})
		p.uncached += unc
		p.hold(r.Keys)
		p.ublocks += ublk
		p.lastPicked = t
		cache.insert(i, r.Keys)
		hitTok += int64(hit)
		totTok += int64(r.PromptTokens)
		admitted[ri] = true
		prefillDone[ri] = p.busy
		if dec != nil {
			d := dcs.Decode - n
			if d < 0 || d >= cfg.Decode {
				return Result{}, fmt.Errorf("sim: no decode endpoint chosen for request %d", ri)
			}
			dec.join(p.busy+cfg.Model.TransferTime(r.PromptTokens), d, ri, r.PromptTokens, r.OutputTokens)
		}
	}
	if dec != nil {
		dec.drain()
	}
	return summarise(cfg, tr, sc, admitted, prefillDone, dec, hitTok, totTok, rejected), nil
}

// decodeForecast lets the scheduler ask the decode pool about the end of a
// request's prefill (sched.DecodeForecaster).
type decodeForecast struct {
	pool  *decodePool
	first int // index of the first decode endpoint in the snapshot
	now   float64
}

func (f *decodeForecast) ForecastDecode(e int, at float64, req *sched.Request) (int, float64) {
	return f.pool.forecast(e-f.first, f.now, at, req.PromptTokens)
}

func summarise(cfg Config, tr *workload.Trace, sc *sched.Scheduler, admitted []bool, prefillDone []float64,
	dec *decodePool, hitTok, totTok int64, rejected int) Result {
	var ttfts, tpots []float64
	good := 0
	for ri, ok := range admitted {
		if !ok {
			continue
		}
		r := &tr.Requests[ri]
		ttft := prefillDone[ri] - r.Arrival
		tpot := 0.0
		if dec != nil {
			ttft = dec.first[ri] - r.Arrival
			if o := dec.out[ri]; o > 1 {
				tpot = (dec.finish[ri] - dec.first[ri]) / float64(o-1)
			}
			tpots = append(tpots, tpot)
		}
		ttfts = append(ttfts, ttft)
		if (cfg.SLO.TTFT <= 0 || ttft <= cfg.SLO.TTFT) && (dec == nil || cfg.SLO.TPOT <= 0 || tpot <= cfg.SLO.TPOT) {
			good++
		}
	}
	total := len(tr.Requests)
	res := Result{Policy: sc.Policy.Name(), EarlyReject: sc.EarlyReject, Requests: total}
	if tr.Duration > 0 {
		res.Rate = float64(total) / tr.Duration
		res.Goodput = float64(good) / tr.Duration
	}
	if totTok > 0 {
		res.HitRate = float64(hitTok) / float64(totTok)
	}
	res.TTFTP50, res.TTFTP99 = percentiles(ttfts)
	res.TPOTP50, res.TPOTP99 = percentiles(tpots)
	if total > 0 {
		res.Attainment = float64(good) / float64(total)
		res.Rejected = float64(rejected) / float64(total)
	}
	return res
}

// percentiles returns the median and 99th percentile as the seed computes
// them: sorted[n/2] and sorted[int(n*0.99)].
func percentiles(xs []float64) (p50, p99 float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2], xs[min(int(float64(len(xs))*0.99), len(xs)-1)]
}
