package kvindex

import (
	"container/list"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/internal/tokens"
	"github.com/kvgate/kvgate/internal/workload"
)

// An experiment, not used by Lookup: find where each endpoint's match ends
// by bisecting the prompt's chain instead of walking it. Along one chain,
// the endpoints holding a block are nearly a shrinking set (an engine
// holds a prefix of what it computed: it evicts a chain's later blocks
// first), so each endpoint's end can be found with O(log n) probes, and
// the probes of one bisection level are independent (prefetched together).
//
// What it may miss: the search assumes that an endpoint holding block i
// holds every block before it. Where that fails (an entry dropped from the
// middle of a chain: the index's own random eviction at --max-keys, a lost
// BlockRemoved/BlockStored, an approximate entry expiring), it can report
// a longer prefix than the walk: any position where the endpoint holds
// block a-1 but not block a, not necessarily the first. It never reports
// a shorter one (the first missing block is at or before any such a), and
// it answers only the GPU length: the tier a prefix needs and whether
// approximate entries were used depend on every block of it.

// searchGPU fills blocks[e] for the endpoints of all with the bisected
// GPU prefix of keys in t and returns the number of probes.
func searchGPU(t *table, keys []tokens.BlockKey, all uint64, blocks *[64]int32) int {
	// seg: the endpoints of set hold block lo (or lo == -1) and not block
	// hi (or hi == len(keys)): their match ends in (lo, hi].
	type seg struct {
		lo, hi int32
		set    uint64
	}
	var bufA, bufB [64]seg
	cur, next := bufA[:0], bufB[:0]
	cur = append(cur, seg{-1, int32(len(keys)), all})
	var ks [64]tokens.BlockKey
	var pf [walkAhead]uintptr
	probes := 0
	for len(cur) > 0 {
		m := 0
		for _, s := range cur {
			if s.hi-s.lo > 1 {
				ks[m] = keys[(s.lo+s.hi)>>1]
				m++
			}
		}
		t.prefetchKeys(ks[:m], 0, &pf)
		t.prefetchKeys(ks[:m], walkAhead, &pf)
		next = next[:0]
		for _, s := range cur {
			if s.hi-s.lo == 1 {
				for d := s.set; d != 0; d &= d - 1 {
					blocks[bits.TrailingZeros64(d)] = s.hi
				}
				continue
			}
			mid := (s.lo + s.hi) >> 1
			h := getGPU(t, keys[mid])
			probes++
			if l := s.set &^ h; l != 0 {
				next = append(next, seg{s.lo, mid, l})
			}
			if r := s.set & h; r != 0 {
				next = append(next, seg{mid, s.hi, r})
			}
		}
		cur, next = next, cur
	}
	return probes
}

// searchLookup is Lookup's GPU-only answer (blocks per slot of page 0) by
// searchGPU.
func searchLookup(x *Index, model string, keys []tokens.BlockKey, blocks *[64]int32) int {
	v := x.model(model).view.Load()
	n := min(len(v.eps), 64)
	all := uint64(1)<<n - 1
	if n == 64 {
		all = ^uint64(0)
	}
	return searchGPU(v.groups[0].pages[0].prec, keys, all, blocks)
}

// BenchmarkLookupColdSearch is BenchmarkLookupCold's GPU-only case by
// bisection (searchLookup); it checks that the search agrees with Lookup
// on the benchmark's prefix-closed holdings.
func BenchmarkLookupColdSearch(b *testing.B) {
	const np = 256
	x, _, ps := rotatingFleet(b, np, false)
	var blocks [64]int32
	probes := 0
	for p := 0; p < np; p += np / 4 {
		probes = searchLookup(x, "m", ps[p], &blocks)
		for e := range benchEndpoints {
			if int(blocks[e]) != rotatingHeld(e, p) {
				b.Fatalf("prompt %d endpoint %d: %d blocks, want %d", p, e, blocks[e], rotatingHeld(e, p))
			}
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		searchLookup(x, "m", ps[i%np], &blocks)
	}
	b.ReportMetric(float64(probes), "probes/lookup")
}

// simEngine is an engine's prefix cache as vLLM keeps it: LRU over
// blocks, a request's blocks touched last-first so that its first blocks
// are the most recent (vLLM frees a request's blocks tail first, and
// evicts from the head of that queue).
type simEngine struct {
	id    EndpointID
	cap   int
	lru   *list.List // front = most recent
	where map[uint64]*list.Element
}

// serve caches keys, reporting stored and evicted keys to the index.
func (s *simEngine) serve(x *Index, keys []uint64) {
	var stored []uint64
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		if el, ok := s.where[k]; ok {
			s.lru.MoveToFront(el)
			continue
		}
		s.where[k] = s.lru.PushFront(k)
		stored = append(stored, k)
	}
	x.Store(s.id, 0, TierGPU, stored)
	var gone []uint64
	for s.lru.Len() > s.cap {
		el := s.lru.Back()
		k := s.lru.Remove(el).(uint64)
		delete(s.where, k)
		gone = append(gone, k)
	}
	x.Remove(s.id, 0, TierGPU, gone)
}

func (s *simEngine) prefix(keys []uint64) int {
	for i, k := range keys {
		if _, ok := s.where[k]; !ok {
			return i
		}
	}
	return len(keys)
}

// simSearch replays a trace over a fleet of engines, each request routed
// to the engine with the longest indexed match (ties at random) unless it
// is overloaded, and
// compares, before every request, the walk (Lookup) with the search
// (searchLookup) and both with what the engines hold. maxKeys bounds the
// index (0: the default, which this fleet never fills).
func simSearch(b *testing.B, tr *workload.Trace, engines, capBlocks, maxKeys int) {
	x := New(Config{MaxKeys: maxKeys})
	es := make([]*simEngine, engines)
	for e := range es {
		id, _ := x.AddEndpoint(string(rune('a'+e)), "m")
		es[e] = &simEngine{id: id, cap: capBlocks, lru: list.New(), where: map[uint64]*list.Element{}}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var ms []Match
	var blocks [64]int32
	var reqs, differ, overBlocks, routeChanged, walkShort, searchWrong, hits, keysTotal, probes, walked int
	var keys []uint64
	recent := make([]int, engines) // requests among the last 64 (window)
	var window []int
	for _, r := range tr.Requests {
		if len(r.Keys) == 0 {
			continue
		}
		// Index keys are hashes (the index takes its slot and shard from
		// their bits); Mooncake's keys are hash ids counted from 0.
		keys = keys[:0]
		for _, k := range r.Keys {
			keys = append(keys, mix64(k))
		}
		reqs++
		keysTotal += len(keys)
		ms = x.Lookup("m", keys, ms)
		probes += searchLookup(x, "m", keys, &blocks)
		best, bestS := -1, -1
		var ties []int
		d := false
		for e := range es {
			w, s := ms[e].Blocks, int(blocks[e])
			if s < w {
				b.Fatalf("search reported %d blocks for endpoint %d where the walk found %d: it must never report fewer", s, e, w)
			}
			if s != w {
				d = true
				overBlocks += s - w
			}
			truth := es[e].prefix(keys)
			if w < truth {
				walkShort++
			}
			if s != truth {
				searchWrong++
			}
			walked = max(walked, w)
			if w > best {
				best, ties = w, ties[:0]
			}
			if w == best {
				ties = append(ties, e)
			}
			bestS = max(bestS, s)
		}
		if d {
			differ++
			// Would the search have routed elsewhere: is the walk's best
			// endpoint still among the search's best?
			same := false
			for _, e := range ties {
				same = same || int(blocks[e]) == bestS
			}
			if !same {
				routeChanged++
			}
		}
		pick := ties[rng.IntN(len(ties))]
		// Load: an engine given more than twice its share of the last 64
		// requests is passed over for the least loaded one, as a
		// scheduler balancing load would.
		if recent[pick]*engines > 2*len(window) {
			for e := range es {
				if recent[e] < recent[pick] {
					pick = e
				}
			}
		}
		if len(window) == 64 {
			recent[window[0]]--
			window = window[1:]
		}
		window = append(window, pick)
		recent[pick]++
		hits += int(ms[pick].Blocks)
		es[pick].serve(x, keys)
	}
	b.ReportMetric(float64(reqs), "requests")
	b.ReportMetric(100*float64(differ)/float64(reqs), "%differ")
	b.ReportMetric(100*float64(routeChanged)/float64(reqs), "%route-changed")
	b.ReportMetric(float64(overBlocks)/float64(max(1, differ)), "over-blocks/differing")
	b.ReportMetric(100*float64(walkShort)/float64(reqs*engines), "%walk<engine")
	b.ReportMetric(100*float64(searchWrong)/float64(reqs*engines), "%search≠engine")
	b.ReportMetric(100*float64(hits)/float64(keysTotal), "%hit")
	b.ReportMetric(float64(probes)/float64(reqs), "probes/req")
	b.ReportMetric(float64(keysTotal)/float64(reqs), "keys/req")
	b.ReportMetric(float64(x.Mem().Evicted), "index-evicted")
	b.ReportMetric(float64(x.Mem().Keys), "index-keys")
}

// BenchmarkSearchAccuracy measures what the search misses on the chat
// workload and the Mooncake trace (run with -benchtime 1x): once with an
// index large enough for the fleet and once bounded so that it evicts.
func BenchmarkSearchAccuracy(b *testing.B) {
	chat := func(b *testing.B) *workload.Trace {
		c := workload.BaselineChat(10)
		c.BlockSize = 16
		tr, err := workload.Chat(c)
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}
	mooncake := func(b *testing.B) *workload.Trace {
		// shared/ lies beside the repository (../../../ from here), or
		// beside the worktrees' folder.
		var f *os.File
		var err error
		for _, up := range []string{"../../..", "../../../.."} {
			if f, err = os.Open(filepath.Join(up, "shared", "traces", "mooncake_conversation_trace.jsonl")); err == nil {
				break
			}
		}
		if err != nil {
			b.Skipf("no Mooncake trace: %v", err)
		}
		defer f.Close()
		tr, err := workload.ReadMooncake(f, 1)
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}
	for _, c := range []struct {
		name             string
		trace            func(*testing.B) *workload.Trace
		engines, capBlks int
		maxKeys          int
	}{
		{"chat/index-fits", chat, 16, 8000, 0},
		{"chat/index-evicts", chat, 16, 8000, 16000},
		{"mooncake/index-fits", mooncake, 16, 4000, 0},
		{"mooncake/index-evicts", mooncake, 16, 4000, 40000},
	} {
		b.Run(c.name, func(b *testing.B) {
			tr := c.trace(b)
			for i := 0; i < b.N; i++ {
				simSearch(b, tr, c.engines, c.capBlks, c.maxKeys)
			}
		})
	}
}

func mix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	return k ^ k>>33
}

// getGPU is the GPU bits of block key k in t (the probe of walkGPUSnap:
// it stops at the key instead of reading the whole run as getTiers does).
func getGPU(t *table, k tokens.BlockKey) uint64 {
	k = tkey(k, TierGPU)
	a := t.shards[t.shardIndex(k)].arr.Load()
	for p := home(k, a.mask); ; p = (p + 1) & a.mask {
		kk := a.w[p*preciseStride].Load()
		if kk == k {
			b := a.w[p*preciseStride+1].Load()
			if a.w[p*preciseStride].Load() != k {
				return 0
			}
			return b
		}
		if kk == emptyKey {
			return 0
		}
	}
}
