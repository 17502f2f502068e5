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
	b.Helper()
	x := New(Config{})
	n := newNaive()
	prompt := chain(benchPrompt, 1)
	for e := 0; e < benchEndpoints; e++ {
		name := fmt.Sprintf("10.0.0.%d:8000", e)
		id, _ := x.AddEndpoint(name, "m")
		held := benchPrompt * (e + 1) / benchEndpoints
		if e%16 == 15 {
			held = benchPrompt
		}
		x.Store(id, 0, TierGPU, prompt[:held])
		if withNaive {
			n.store(name, prompt[:held])
		}
		other := chain(benchOther, uint32(100+e))
		x.Store(id, 0, TierGPU, other)
		if withNaive {
			n.store(name, other)
		}
	}
	runtime.GC()
	return x, n, prompt
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
