package sched

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Policy picks the prefill endpoint for a request. The Scheduler passes
// only candidates (endpoints whose role can compute the prompt) and a
// request whose SLO has its defaults filled in; Pick returns an index into
// s.Endpoints, or -1 when it will not choose. Pick must not write to the
// request or the snapshot, and must be safe for concurrent use: policies
// with state (a round-robin cursor, a random source) guard it themselves.
type Policy interface {
	Name() string
	Pick(req *Request, s *Snapshot) int
}

// CostReporter is a Policy that can say what each candidate cost it, to
// explain a decision: dst is reused and returned with one cost per
// endpoint of s (lower is better; +Inf: ruled out).
type CostReporter interface {
	Costs(req *Request, s *Snapshot, dst []float64) []float64
}

// CopyPicker is a Policy that, for a request whose prefix the fleet can
// copy (Request.CanCopy), may keep the request where its prefix is cached
// and have the prefix warmed on another endpoint instead of moving the
// request there (kvgate's conversation balance: Decision.CopyTokens).
type CopyPicker interface {
	// PickCopy is Pick, with the endpoint to warm the first tokens
	// tokens of the prompt on (tokens 0: none).
	PickCopy(req *Request, s *Snapshot) (pick, copyTo, tokens int)
}

var nan = math.NaN()

// lockedRand is a random source safe for concurrent use.
type lockedRand struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func (r *lockedRand) IntN(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rng.IntN(n)
}

func (r *lockedRand) Float64() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rng.Float64()
}

// Options configures policies. Zero values take the documented defaults.
type Options struct {
	// Seed drives random choices and tie-breaks; runs are deterministic
	// for a seed.
	Seed uint64

	// SGLang cache-aware router (defaults abs 64, rel 1.5, threshold 0.3).
	SGLangBalanceAbs     float64
	SGLangBalanceRel     float64
	SGLangCacheThreshold float64

	// llm-d token-aware: affinity threshold (0.80), TTFT gate penalty in
	// seconds (1.0) and the token-load scorer's threshold in tokens
	// (defaults to 2 s of the endpoint's prefill speed).
	LLMDAffinity     float64
	LLMDTTFTPenalty  float64
	LLMDTokenLoadCap float64
	// LLMDDecodeBound selects the decode-bound variant (active-request
	// scorer instead of the token-load scorer).
	LLMDDecodeBound bool

	// llm-d weighted blend weights (defaults prefix 3, queue 2, KV 2, LRU 1).
	BlendPrefix, BlendQueue, BlendKV, BlendLRU float64

	// Dynamo KV router: overlap weight (1.0) and softmax temperature (0 =
	// argmin).
	DynamoPrefillScale float64
	DynamoTemperature  float64

	// kvgate: KVGateGain scales the price of compute with the fleet's
	// queue wait relative to the SLO (default 8); KVGateFit is the fraction
	// of the SLO a predicted TTFT must fit in to compete (default 1);
	// KVGatePressure (SLOs, default 30, as Scheduler.HoldQuiet) is how
	// long after a rejection for the load the fleet counts as
	// compute-bound (Snapshot.SinceLoadRejection).
	KVGateGain     float64
	KVGateFit      float64
	KVGatePressure float64
	// KVGateBalance is ε₀ of kvgate's bounded-load placement of new
	// conversations (default 0.25): an endpoint holding part of a new
	// conversation's prompt takes it only while it would hold at most
	// ⌈(1 + ε) × the fleet's mean⌉ conversations (Endpoint.Conversations),
	// ε = ε₀ × (1 + λ), when another endpoint that fits the SLO can;
	// negative: off.
	KVGateBalance float64
}

func (o Options) withDefaults() Options {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.SGLangBalanceAbs, 64)
	def(&o.SGLangBalanceRel, 1.5)
	def(&o.SGLangCacheThreshold, 0.3)
	def(&o.LLMDAffinity, 0.80)
	def(&o.LLMDTTFTPenalty, 1.0)
	def(&o.BlendPrefix, 3)
	def(&o.BlendQueue, 2)
	def(&o.BlendKV, 2)
	def(&o.BlendLRU, 1)
	def(&o.DynamoPrefillScale, 1.0)
	def(&o.KVGateGain, 8)
	def(&o.KVGateFit, 1)
	def(&o.KVGatePressure, 30)
	def(&o.KVGateBalance, 0.25)
	return o
}

type constructor func(o Options, rng *lockedRand) Policy

func registry() map[string]constructor {
	return map[string]constructor{
		"random":              func(o Options, r *lockedRand) Policy { return &randomPolicy{rng: r} },
		"round-robin":         func(o Options, r *lockedRand) Policy { return &roundRobin{} },
		"least-queue":         func(o Options, r *lockedRand) Policy { return leastQueue{} },
		"cache-only":          func(o Options, r *lockedRand) Policy { return cacheOnly{} },
		"predicted-ttft":      func(o Options, r *lockedRand) Policy { return predictedTTFT{} },
		"sglang-cache-aware":  func(o Options, r *lockedRand) Policy { return &sglangCacheAware{o: o} },
		"sglang-least-load":   func(o Options, r *lockedRand) Policy { return &sglangCacheAware{o: o, leastLoad: true} },
		"llmd-token-aware":    func(o Options, r *lockedRand) Policy { return &llmdTokenAware{o: o, rng: r} },
		"llmd-weighted-blend": func(o Options, r *lockedRand) Policy { return &llmdBlend{o: o, rng: r} },
		"dynamo-kv":           func(o Options, r *lockedRand) Policy { return &dynamoKV{o: o, rng: r} },
		"kvgate":              func(o Options, r *lockedRand) Policy { return newKVGate(o) },
	}
}

// Signals names snapshot fields that cost their producer work to fill; a
// producer (the simulator, the gateway) may leave them zero unless the
// policy asks for them.
type Signals uint32

const (
	// SignalActiveBlocks: Endpoint.ActivePrefillBlocks and
	// ActiveDecodeBlocks (distinct blocks of in-flight sequences).
	SignalActiveBlocks Signals = 1 << iota
)

// SignalUser is implemented by policies that read costly signals.
type SignalUser interface {
	Signals() Signals
}

// Holder is a policy meant to run with Scheduler.Hold: it holds at the
// router the requests that fit nowhere (kvgate's does).
type Holder interface {
	HoldsLost() bool
}

// HoldsLost reports whether p is meant to run with Scheduler.Hold.
func HoldsLost(p Policy) bool {
	h, ok := p.(Holder)
	return ok && h.HoldsLost()
}

// Needs returns the costly signals a policy reads.
func Needs(p Policy) Signals {
	if u, ok := p.(SignalUser); ok {
		return u.Signals()
	}
	return 0
}

// Names lists the policy names, kvgate's own last.
func Names() []string {
	var names []string
	for n := range registry() {
		if n != "kvgate" {
			names = append(names, n)
		}
	}
	order := map[string]int{"random": 0, "round-robin": 1, "least-queue": 2, "cache-only": 3, "predicted-ttft": 4}
	sort.Slice(names, func(i, j int) bool {
		oi, iok := order[names[i]]
		oj, jok := order[names[j]]
		switch {
		case iok && jok:
			return oi < oj
		case iok != jok:
			return iok
		}
		return names[i] < names[j]
	})
	return append(names, "kvgate")
}

// New builds the named policy.
func New(name string, o Options) (Policy, error) {
	c, ok := registry()[name]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	o = o.withDefaults()
	rng := &lockedRand{rng: rand.New(rand.NewPCG(o.Seed, 0x6b7667617465))}
	return c(o, rng), nil
}

// tieBetter reports whether endpoint i should replace the current best b
// under the secondary order the baseline chapter's policies use for ties:
// the endpoint whose queue empties (or emptied) first, then the lower index.
func tieBetter(s *Snapshot, i, b int) bool {
	return s.Endpoints[i].FreeAt < s.Endpoints[b].FreeAt
}

// lowestIndex never replaces the current best: ties go to the lower index.
func lowestIndex(*Snapshot, int, int) bool { return false }

type randomPolicy struct{ rng *lockedRand }

func (randomPolicy) Name() string { return "random" }
func (p *randomPolicy) Pick(_ *Request, s *Snapshot) int {
	if len(s.Endpoints) == 0 {
		return -1
	}
	return p.rng.IntN(len(s.Endpoints))
}

type roundRobin struct{ next atomic.Uint64 }

func (*roundRobin) Name() string { return "round-robin" }
func (p *roundRobin) Pick(_ *Request, s *Snapshot) int {
	n := uint64(len(s.Endpoints))
	if n == 0 {
		return -1
	}
	return int((p.next.Add(1) - 1) % n)
}

// argBest returns the endpoint minimising key, ties broken
// by tieBetter.
func argBest(s *Snapshot, key func(e *Endpoint) float64, tie func(s *Snapshot, i, b int) bool) int {
	best, bk := -1, 0.0
	for i := range s.Endpoints {
		k := key(&s.Endpoints[i])
		if best < 0 || k < bk || (k == bk && tie(s, i, best)) {
			best, bk = i, k
		}
	}
	return best
}

// leastQueue sends each request to the endpoint whose queue empties first.
type leastQueue struct{}

func (leastQueue) Name() string { return "least-queue" }
func (leastQueue) Pick(_ *Request, s *Snapshot) int {
	return argBest(s, func(e *Endpoint) float64 { return e.FreeAt }, lowestIndex)
}

// cacheOnly takes the longest cached prefix, ties to the endpoint whose
// queue empties first.
type cacheOnly struct{}

func (cacheOnly) Name() string { return "cache-only" }
func (cacheOnly) Pick(_ *Request, s *Snapshot) int {
	return argBest(s, func(e *Endpoint) float64 { return -float64(e.CachedTokens) }, tieBetter)
}

// predictedTTFT minimises queue wait + uncached tokens / prefill speed, ties
// to the lowest index as in the baseline chapter's program.
type predictedTTFT struct{}

func (predictedTTFT) Name() string { return "predicted-ttft" }
func (predictedTTFT) Pick(req *Request, s *Snapshot) int {
	return argBest(s, func(e *Endpoint) float64 { return PredictTTFT(req, e) }, lowestIndex)
}

// Costs implements CostReporter: the predicted TTFT.
func (predictedTTFT) Costs(req *Request, s *Snapshot, dst []float64) []float64 {
	for i := range s.Endpoints {
		dst = append(dst, PredictTTFT(req, &s.Endpoints[i]))
	}
	return dst
}

// Costs implements CostReporter: the uncached tokens.
func (cacheOnly) Costs(req *Request, s *Snapshot, dst []float64) []float64 {
	for i := range s.Endpoints {
		dst = append(dst, float64(Uncached(req, &s.Endpoints[i])))
	}
	return dst
}
