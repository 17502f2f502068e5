// Package enginemetrics reads an inference engine's Prometheus /metrics
// into a typed snapshot: queue and batch sizes, KV-cache usage and
// geometry, prefix-cache counters. vLLM's names (vllm:…) and SGLang's
// (sglang:…) are both understood; see docs/discovery.md for the list.
//
// Only the samples it needs are parsed: every other line is skipped after
// its name is read (histograms make up most of an engine's exposition).
// An engine serving several models or data-parallel ranks reports several
// label sets per metric: samples for another model (label model_name) are
// dropped when a model is given, series that differ only in tensor,
// pipeline or expert parallel rank (tp_rank, pp_rank, moe_ep_rank,
// attn_tp_rank: views of one scheduler) count once, and the remaining
// series (per engine or dp_rank) are summed — or averaged for fractions —
// unless one rank is asked for (ParseRank).
package enginemetrics

import (
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Field is a bit set of the values a scrape found.
type Field uint16

// The fields of Metrics that may be missing from an exposition.
const (
	FieldWaiting        Field = 1 << iota // Waiting
	FieldRunning                          // Running
	FieldKVUsage                          // KVUsage
	FieldCacheConfig                      // BlockSize, NumGPUBlocks (vLLM)
	FieldPrefixCounters                   // PrefixQueries, PrefixHits (vLLM)
	FieldCacheHitRate                     // CacheHitRate (SGLang)
	FieldMaxTotalTokens                   // MaxTotalTokens (SGLang)
	FieldLoRA                             // MaxLoRA, LoRARunning, LoRAWaiting (vLLM)
)

// Flavors: which engine's names the exposition used.
const (
	FlavorVLLM   = "vllm"
	FlavorSGLang = "sglang"
)

// maxCount bounds every count read from an engine.
const maxCount = 1 << 40

// Metrics is one scrape of one engine.
type Metrics struct {
	// Time is when the scrape completed; callers compare it with their
	// staleness limit (Fresh).
	Time time.Time
	// Flavor is FlavorVLLM or FlavorSGLang.
	Flavor string
	// Have says which of the fields below the engine reported; a field
	// not in Have is zero.
	Have Field

	Waiting int // requests queued (vllm:num_requests_waiting, sglang:num_queue_reqs)
	Running int // requests in the running batch (vllm:num_requests_running, sglang:num_running_reqs)
	// KVUsage is the fraction of the KV cache in use, in [0, 1]
	// (vllm:kv_cache_usage_perc, or the older gpu_cache_usage_perc;
	// sglang:token_usage).
	KVUsage float64
	// BlockSize and NumGPUBlocks come from vllm:cache_config_info's labels;
	// NumGPUBlocks is summed over data-parallel engines.
	BlockSize    int
	NumGPUBlocks int
	// PrefixQueries and PrefixHits are vLLM's cumulative prefix-cache
	// counters, in tokens (vllm:prefix_cache_queries_total and
	// …_hits_total, or the older gpu_prefix_cache_… names).
	PrefixQueries float64
	PrefixHits    float64
	// CacheHitRate is SGLang's prefix-cache hit rate gauge, in [0, 1].
	CacheHitRate float64
	// MaxTotalTokens is SGLang's KV pool size in tokens.
	MaxTotalTokens int
	// MaxLoRA is how many LoRA adapters one batch may hold (vLLM's
	// --max-loras), LoRARunning and LoRAWaiting the adapters of the
	// running and the waiting requests: vllm:lora_requests_info's labels,
	// from its series of the latest value (the time it was set: vLLM
	// leaves the older label sets behind).
	MaxLoRA                  int
	LoRARunning, LoRAWaiting []string
}

// Has reports whether every field in f was found.
func (m Metrics) Has(f Field) bool { return m.Have&f == f }

// Age is how old the scrape is at now.
func (m Metrics) Age(now time.Time) time.Duration { return now.Sub(m.Time) }

// Fresh reports whether the scrape happened and is at most maxAge old.
func (m Metrics) Fresh(now time.Time, maxAge time.Duration) bool {
	return !m.Time.IsZero() && m.Age(now) <= maxAge
}

// CapacityTokens is the KV cache size in tokens, 0 if unknown.
func (m Metrics) CapacityTokens() int {
	switch {
	case m.Has(FieldCacheConfig):
		return m.BlockSize * m.NumGPUBlocks
	case m.Has(FieldMaxTotalTokens):
		return m.MaxTotalTokens
	}
	return 0
}

// HitRate is the prefix-cache hit rate over the interval between two
// scrapes of one engine: from vLLM's counters (hits and queries between
// prev and cur), else SGLang's gauge in cur. ok is false when neither is
// known, no query happened in between, or a counter went back (restart).
func HitRate(prev, cur Metrics) (rate float64, ok bool) {
	if cur.Has(FieldPrefixCounters) && prev.Has(FieldPrefixCounters) {
		dq, dh := cur.PrefixQueries-prev.PrefixQueries, cur.PrefixHits-prev.PrefixHits
		if dq <= 0 || dh < 0 || dh > dq {
			return 0, false
		}
		return dh / dq, true
	}
	if cur.Has(FieldCacheHitRate) {
		return cur.CacheHitRate, true
	}
	return 0, false
}

// MarshalJSON writes the fields the engine reported and nothing else, so a
// missing value is not mistaken for zero.
func (m Metrics) MarshalJSON() ([]byte, error) {
	out := map[string]any{"time": m.Time, "flavor": m.Flavor}
	put := func(f Field, k string, v any) {
		if m.Has(f) {
			out[k] = v
		}
	}
	put(FieldWaiting, "waiting", m.Waiting)
	put(FieldRunning, "running", m.Running)
	put(FieldKVUsage, "kv_usage", m.KVUsage)
	put(FieldCacheConfig, "block_size", m.BlockSize)
	put(FieldCacheConfig, "num_gpu_blocks", m.NumGPUBlocks)
	put(FieldPrefixCounters, "prefix_cache_queries", m.PrefixQueries)
	put(FieldPrefixCounters, "prefix_cache_hits", m.PrefixHits)
	put(FieldCacheHitRate, "cache_hit_rate", m.CacheHitRate)
	put(FieldMaxTotalTokens, "max_total_tokens", m.MaxTotalTokens)
	put(FieldLoRA, "max_lora", m.MaxLoRA)
	put(FieldLoRA, "lora_running", m.LoRARunning)
	put(FieldLoRA, "lora_waiting", m.LoRAWaiting)
	return json.Marshal(out)
}

// ErrNoEngineMetrics is returned for an exposition without any vLLM or
// SGLang metric this package reads.
var ErrNoEngineMetrics = errors.New("no vLLM or SGLang metrics found")

// Parse reads a Prometheus text exposition. With model set, samples whose
// model_name label names another model are ignored. A malformed line of a
// metric this package reads is an error naming the line; other lines are
// not looked at beyond their name. The result's Time is zero.
func Parse(r io.Reader, model string) (Metrics, error) {
	return ParseRank(r, model, -1)
}

// ParseRank is Parse for one data-parallel rank of an engine that serves
// several behind one API: samples labelled with another rank (vLLM's
// engine label, SGLang's dp_rank) are ignored, and ones without such a
// label are kept. A negative rank keeps every rank (Parse: they are
// summed).
func ParseRank(r io.Reader, model string, rank int) (Metrics, error) {
	p := parser{model: model}
	if rank >= 0 {
		p.rank = strconv.Itoa(rank)
	}
	if err := p.parse(r); err != nil {
		return Metrics{}, err
	}
	return p.result()
}

// result reduces the series seen to one Metrics.
func (p *parser) result() (Metrics, error) {
	var m Metrics
	s := &p.seen
	switch {
	case anySeen(s, mVLLMWaiting, mVLLMGPUPrefixHits): // the LoRA info alone is no engine's
		m.Flavor = FlavorVLLM
	case anySeen(s, mSGLangQueue, numMetrics-1):
		m.Flavor = FlavorSGLang
	default:
		return m, ErrNoEngineMetrics
	}
	if v, ok := first(sum, s[mVLLMWaiting], s[mSGLangQueue]); ok {
		m.Waiting, m.Have = count(v), m.Have|FieldWaiting
	}
	if v, ok := first(sum, s[mVLLMRunning], s[mSGLangRunning]); ok {
		m.Running, m.Have = count(v), m.Have|FieldRunning
	}
	if v, ok := first(mean, s[mVLLMKVUsage], s[mVLLMGPUUsage], s[mSGLangTokenUsage]); ok {
		m.KVUsage, m.Have = fraction(v), m.Have|FieldKVUsage
	}
	if v, ok := first(mean, s[mSGLangHitRate]); ok {
		m.CacheHitRate, m.Have = fraction(v), m.Have|FieldCacheHitRate
	}
	if v, ok := first(sum, s[mSGLangMaxTokens]); ok {
		m.MaxTotalTokens, m.Have = count(v), m.Have|FieldMaxTotalTokens
	}
	q, h := s[mVLLMPrefixQueries], s[mVLLMPrefixHits]
	if len(q) == 0 || len(h) == 0 {
		q, h = s[mVLLMGPUPrefixQueries], s[mVLLMGPUPrefixHits]
	}
	if len(q) > 0 && len(h) > 0 {
		m.PrefixQueries, m.PrefixHits = counter(sum(q)), counter(sum(h))
		m.Have |= FieldPrefixCounters
	}
	m.BlockSize, m.NumGPUBlocks = cacheConfig(s[mVLLMCacheConfig])
	if m.BlockSize > 0 {
		m.Have |= FieldCacheConfig
	}
	if l := latestLoRA(s[mVLLMLoRAInfo]); l != nil && l.maxLoRA > 0 {
		m.MaxLoRA, m.LoRARunning, m.LoRAWaiting = l.maxLoRA, adapterList(l.running), adapterList(l.waiting)
		m.Have |= FieldLoRA
	}
	return m, nil
}

// latestLoRA is the labels of the vllm:lora_requests_info series set
// last (the largest value), nil if none. An engine without adapters
// reports max_lora 0, or no series. Series of the same value (llm-d's
// simulator sets whole seconds) are merged: their adapter lists joined,
// as a place taken is the safer reading.
func latestLoRA(list []series) *loraLabels {
	var out *loraLabels
	best := math.Inf(-1)
	for _, s := range list {
		switch {
		case s.lora == nil || s.value < best:
		case s.value > best || out == nil:
			l := *s.lora
			out, best = &l, s.value
		default:
			out.maxLoRA = max(out.maxLoRA, s.lora.maxLoRA)
			out.running = joinAdapters(out.running, s.lora.running)
			out.waiting = joinAdapters(out.waiting, s.lora.waiting)
		}
	}
	return out
}

// joinAdapters joins two comma-separated lists (duplicates are dropped
// by adapterList).
func joinAdapters(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "," + b
}

// adapterList splits a comma-separated list of adapter names, at most
// maxAdapters of them.
func adapterList(s string) []string {
	var out []string
	seen := map[string]bool{}
	for name := range strings.SplitSeq(s, ",") {
		if name = strings.TrimSpace(name); name != "" && len(out) < maxAdapters && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out
}

// maxAdapters bounds the adapter names read from one label.
const maxAdapters = 1024

// cacheConfig reads the block size of the first engine that reports one
// and sums the GPU blocks of all engines.
func cacheConfig(list []series) (blockSize, blocks int) {
	for _, s := range list {
		if !s.hasConfig || s.blockSize == 0 {
			continue
		}
		if blockSize == 0 {
			blockSize = s.blockSize
		}
		blocks = min(blocks+s.gpuBlocks, maxCount)
	}
	return blockSize, blocks
}

func anySeen(s *[numMetrics][]series, from, to metricID) bool {
	for id := from; id <= to; id++ {
		if len(s[id]) > 0 {
			return true
		}
	}
	return false
}

// first reduces the first non-empty list (names in order of preference).
func first(reduce func([]series) float64, lists ...[]series) (float64, bool) {
	for _, l := range lists {
		if len(l) > 0 {
			return reduce(l), true
		}
	}
	return 0, false
}

func sum(l []series) float64 {
	var t float64
	for _, s := range l {
		t += s.value
	}
	return t
}

func mean(l []series) float64 { return sum(l) / float64(len(l)) }

// count clamps a gauge to a non-negative integer.
func count(v float64) int {
	if !(v > 0) {
		return 0
	}
	return int(min(math.Round(v), maxCount))
}

// fraction clamps to [0, 1].
func fraction(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return min(v, 1)
}

// counter clamps a counter to [0, 2^53] (exact integers in a float64).
func counter(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return min(v, 1<<53)
}
