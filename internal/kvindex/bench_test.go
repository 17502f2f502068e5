package kvindex

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/tokens"
)

const (
	benchEndpoints = 64
	benchPrompt    = 2000  // blocks
	benchOther     = 20000 // unrelated blocks per endpoint
)

// benchFleet fills an index and the naive baseline alike: 64 endpoints; the
// 2 000-block prompt is held by endpoint e up to 2000·(e+1)/64 blocks (4 of
// them hold it all); each endpoint also holds 20 000 unrelated blocks.
func benchFleet(b *testing.B, withNaive bool) (*Index, *naive, []tokens.BlockKey) {
	x, n := fillFleet(b, [][]tokens.BlockKey{chain(benchPrompt, 1)}, withNaive)
	return x, n, chain(benchPrompt, 1)
}

// fillFleet stores prompts ps on 64 endpoints, endpoint e holding the
// first rotatingHeld(e, p) blocks of prompt p, and 20 000 unrelated blocks
// per endpoint, in the index and (withNaive) the naive baseline.
func fillFleet(b *testing.B, ps [][]tokens.BlockKey, withNaive bool) (*Index, *naive) {
	b.Helper()
	x := New(Config{})
	n := newNaive()
	for e := 0; e < benchEndpoints; e++ {
		name := fmt.Sprintf("10.0.0.%d:8000", e)
		id, _ := x.AddEndpoint(name, "m")
		for p, prompt := range ps {
			held := rotatingHeld(e, p)
			x.Store(id, 0, TierGPU, prompt[:held])
			if withNaive {
				n.store(name, prompt[:held])
			}
		}
		other := chain(benchOther, uint32(100+e))
		x.Store(id, 0, TierGPU, other)
		if withNaive {
			n.store(name, other)
		}
	}
	runtime.GC()
	return x, n
}

// naive is the baseline: block key → set of endpoint names, one lock.
type naive struct {
	mu     sync.RWMutex
	blocks map[uint64]map[string]struct{}
	eps    []string
}

func newNaive() *naive { return &naive{blocks: map[uint64]map[string]struct{}{}} }

func (n *naive) store(ep string, keys []tokens.BlockKey) {
	n.mu.Lock()
	defer n.mu.Unlock()
	found := false
	for _, e := range n.eps {
		found = found || e == ep
	}
	if !found {
		n.eps = append(n.eps, ep)
	}
	for _, k := range keys {
		s := n.blocks[k]
		if s == nil {
			s = map[string]struct{}{}
			n.blocks[k] = s
		}
		s[ep] = struct{}{}
	}
}

// lookup walks the keys per endpoint until the first miss.
func (n *naive) lookup(keys []tokens.BlockKey) map[string]int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := make(map[string]int, len(n.eps))
	for _, ep := range n.eps {
		i := 0
		for ; i < len(keys); i++ {
			if _, ok := n.blocks[keys[i]][ep]; !ok {
				break
			}
		}
		out[ep] = i
	}
	return out
}

func BenchmarkLookup(b *testing.B) {
	x, _, prompt := benchFleet(b, false)
	var ms []Match
	ms = x.Lookup("m", prompt, ms)
	if ms[63].Blocks != benchPrompt || ms[0].Blocks != benchPrompt/64 {
		b.Fatalf("bad fleet: %+v %+v", ms[0], ms[63])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ms = x.Lookup("m", prompt, ms)
	}
}

// addMixed adds to benchFleet's index what a running gateway has besides
// GPU entries. Approximate entries: every 4th endpoint was routed the
// prompt up to 300 blocks past what it holds, and 5 000 unrelated blocks.
// With tiers, CPU and storage entries too: endpoints e%4 == 1 hold the 200
// blocks after their GPU prefix on CPU and e%4 == 2 the 200 after it on
// storage, each with 20 000 unrelated blocks on that tier.
func addMixed(x *Index, prompt []tokens.BlockKey, tiers bool) {
	for e := 0; e < benchEndpoints; e++ {
		id := EndpointID(e)
		held := benchPrompt * (e + 1) / benchEndpoints
		if e%16 == 15 {
			held = benchPrompt
		}
		switch {
		case e%4 == 0:
			x.Routed(id, prompt[:min(benchPrompt, held+300)])
			x.Routed(id, chain(5000, uint32(1000+e)))
		case tiers && e%4 == 1:
			x.Store(id, 0, TierCPU, prompt[held:min(benchPrompt, held+200)])
			x.Store(id, 0, TierCPU, chain(benchOther, uint32(2000+e)))
		case tiers && e%4 == 2:
			x.Store(id, 0, TierStorage, prompt[held:min(benchPrompt, held+200)])
			x.Store(id, 0, TierStorage, chain(benchOther, uint32(3000+e)))
		}
	}
	runtime.GC()
}

// BenchmarkLookupMixed is BenchmarkLookup once approximate entries exist
// (gpu+approx, the common case of a gateway routing with events) and once
// CPU and storage entries exist as well (all).
func BenchmarkLookupMixed(b *testing.B) {
	for _, tiers := range []bool{false, true} {
		name := "gpu+approx"
		if tiers {
			name = "gpu+cpu+storage+approx"
		}
		b.Run(name, func(b *testing.B) {
			x, _, prompt := benchFleet(b, false)
			addMixed(x, prompt, tiers)
			var ms []Match
			ms = x.Lookup("m", prompt, ms)
			if ms[0].Blocks != benchPrompt/64+300 || !ms[0].Approx || ms[63].Blocks != benchPrompt {
				b.Fatalf("bad fleet: %+v %+v", ms[0], ms[63])
			}
			if tiers && (ms[1].Tier != TierCPU || ms[2].Tier != TierStorage || ms[1].GPUBlocks != 2*benchPrompt/64) {
				b.Fatalf("bad fleet: %+v %+v", ms[1], ms[2])
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ms = x.Lookup("m", prompt, ms)
			}
		})
	}
}

func BenchmarkLookupNaive(b *testing.B) {
	_, n, prompt := benchFleet(b, true)
	if got := n.lookup(prompt); got["10.0.0.63:8000"] != benchPrompt {
		b.Fatalf("bad fleet: %v", got)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = n.lookup(prompt)
	}
}

// BenchmarkLookupParallel runs lookups on every core while one writer per
// endpoint page keeps storing and removing.
func BenchmarkLookupParallel(b *testing.B) {
	x, _, prompt := benchFleet(b, false)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		churn := chain(512, 9999)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := EndpointID(i % benchEndpoints)
			x.Store(id, 0, TierGPU, churn)
			x.Remove(id, 0, TierGPU, churn)
		}
	}()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var ms []Match
		for pb.Next() {
			ms = x.Lookup("m", prompt, ms)
		}
	})
	b.StopTimer()
	close(stop)
	wg.Wait()
}

func heapBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// benchMemory reports heap bytes per (block, endpoint) entry for 1 M
// entries over 64 endpoints with each block held by `holders` endpoints.
func benchMemory(b *testing.B, holders int, useNaive bool) {
	const entries = 1 << 20
	blocks := entries / holders
	keys := chain(blocks, 42)
	for i := 0; i < b.N; i++ {
		before := heapBytes()
		var keep any
		if useNaive {
			n := newNaive()
			for h := 0; h < holders; h++ {
				for e := h; e < benchEndpoints; e += holders {
					lo, hi := blocks*(e/holders)/(benchEndpoints/holders), blocks*(e/holders+1)/(benchEndpoints/holders)
					n.store(fmt.Sprintf("10.0.0.%d:8000", e), keys[lo:hi])
				}
			}
			keep = n
		} else {
			x := New(Config{})
			ids := make([]EndpointID, benchEndpoints)
			for e := range ids {
				ids[e], _ = x.AddEndpoint(fmt.Sprintf("10.0.0.%d:8000", e), "m")
			}
			for h := 0; h < holders; h++ {
				for e := h; e < benchEndpoints; e += holders {
					lo, hi := blocks*(e/holders)/(benchEndpoints/holders), blocks*(e/holders+1)/(benchEndpoints/holders)
					x.Store(ids[e], 0, TierGPU, keys[lo:hi])
				}
			}
			keep = x
		}
		after := heapBytes()
		runtime.KeepAlive(keep)
		b.ReportMetric(float64(after-before)/entries, "B/entry")
	}
}

func BenchmarkMemoryPerEntry(b *testing.B) {
	for _, holders := range []int{1, 4} {
		b.Run(fmt.Sprintf("holders=%d", holders), func(b *testing.B) { benchMemory(b, holders, false) })
		b.Run(fmt.Sprintf("holders=%d/naive", holders), func(b *testing.B) { benchMemory(b, holders, true) })
	}
}

// rotatingFleet is benchFleet with `prompts` distinct 2 000-block prompts:
// for prompt p, endpoint e holds the prefix benchFleet gives endpoint
// (e+p) mod 64, so every prompt has the same shape (4 endpoints hold all
// of it) but its slots are elsewhere. Cycling through the prompts, a
// lookup finds its slots out of the CPU's caches once the prompts' slots
// outgrow them, which is what a router meets (one request's prompt is
// rarely the previous one's). Each endpoint also holds 20 000 unrelated
// blocks, as in benchFleet.
func rotatingFleet(b *testing.B, prompts int, withNaive bool) (*Index, *naive, [][]tokens.BlockKey) {
	ps := make([][]tokens.BlockKey, prompts)
	for p := range ps {
		ps[p] = chain(benchPrompt, uint32(10000+p))
	}
	x, n := fillFleet(b, ps, withNaive)
	return x, n, ps
}

// rotatingHeld is how many blocks of prompt p endpoint e holds.
func rotatingHeld(e, p int) int {
	r := (e + p) % benchEndpoints
	if r%16 == 15 {
		return benchPrompt
	}
	return benchPrompt * (r + 1) / benchEndpoints
}

// rotatingPromptCounts is how many distinct prompts the cold benchmarks
// cycle through: 64 is the setting (~8 MB of slot lines, which
// stays in this machine's 32 MB L3), 256 (~32 MB per cycle) outgrows it
// and 1 024 leaves nothing in cache.
var rotatingPromptCounts = []int{64, 256, 1024}

// addMixedRotating is addMixed for every prompt of rotatingFleet, endpoint
// e playing the part of endpoint (e+p) mod 64 for prompt p.
func addMixedRotating(x *Index, ps [][]tokens.BlockKey, tiers bool) {
	for e := 0; e < benchEndpoints; e++ {
		id := EndpointID(e)
		for p, prompt := range ps {
			held := rotatingHeld(e, p)
			switch r := (e + p) % benchEndpoints; {
			case r%4 == 0:
				x.Routed(id, prompt[held:min(benchPrompt, held+300)])
			case tiers && r%4 == 1:
				x.Store(id, 0, TierCPU, prompt[held:min(benchPrompt, held+200)])
			case tiers && r%4 == 2:
				x.Store(id, 0, TierStorage, prompt[held:min(benchPrompt, held+200)])
			}
		}
		switch {
		case e%4 == 0:
			x.Routed(id, chain(5000, uint32(1000+e)))
		case tiers && e%4 == 1:
			x.Store(id, 0, TierCPU, chain(benchOther, uint32(2000+e)))
		case tiers && e%4 == 2:
			x.Store(id, 0, TierStorage, chain(benchOther, uint32(3000+e)))
		}
	}
	runtime.GC()
}

// BenchmarkLookupCold is BenchmarkLookup over distinct prompts in turn
// (rotatingFleet): each lookup's slots are out of cache. The mixed cases
// add approximate, CPU and storage entries per prompt as LookupMixed does.
func BenchmarkLookupCold(b *testing.B) {
	type tc struct {
		name    string
		prompts int
		mixed   int // 0 GPU only, 1 +approx, 2 +CPU +storage
	}
	var cases []tc
	for _, np := range rotatingPromptCounts {
		cases = append(cases, tc{fmt.Sprintf("gpu/prompts=%d", np), np, 0})
	}
	cases = append(cases, tc{"gpu+approx/prompts=256", 256, 1}, tc{"gpu+cpu+storage+approx/prompts=256", 256, 2})
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			x, _, ps := rotatingFleet(b, c.prompts, false)
			if c.mixed > 0 {
				addMixedRotating(x, ps, c.mixed == 2)
			}
			var ms []Match
			for p := 0; p < c.prompts; p += c.prompts / 4 {
				ms = x.Lookup("m", ps[p], ms)
				for e := range ms {
					want := rotatingHeld(e, p)
					r := (e + p) % benchEndpoints
					switch {
					case c.mixed > 0 && r%4 == 0:
						want = min(benchPrompt, want+300)
					case c.mixed == 2 && (r%4 == 1 || r%4 == 2):
						want = min(benchPrompt, want+200)
					}
					if ms[e].Blocks != want {
						b.Fatalf("prompt %d endpoint %d: %+v, want %d blocks", p, e, ms[e], want)
					}
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ms = x.Lookup("m", ps[i%c.prompts], ms)
			}
		})
	}
}

// BenchmarkLookupColdNaive is the naive baseline over 64 rotating prompts.
func BenchmarkLookupColdNaive(b *testing.B) {
	const np = 64
	_, n, ps := rotatingFleet(b, np, true)
	if got := n.lookup(ps[1]); got["10.0.0.14:8000"] != benchPrompt {
		b.Fatalf("bad fleet: %v", got)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = n.lookup(ps[i%np])
	}
}
