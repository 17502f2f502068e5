package engine

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/engine/kvpub"
)

func seqTokens(n int, base uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

func TestBlockPoolSemantics(t *testing.T) {
	p := newBlockPool(6, 2)
	// A sequence of 3 full blocks.
	a, ok := p.allocate(nil, 3)
	if !ok || p.numFree != 3 {
		t.Fatalf("allocate: %v free %d", ok, p.numFree)
	}
	ha := []uint64{11, 12, 13}
	p.store(a, ha, nil, seqTokens(6, 0), 0, "")
	ev := p.takeEvents()
	if len(ev) != 1 {
		t.Fatalf("events %v", ev)
	}
	if st := ev[0].(*kvpub.BlockStored); !slices.Equal(st.Hashes, ha) || st.Parent != nil || len(st.TokenIDs) != 6 || st.BlockSize != 2 {
		t.Errorf("stored %+v", st)
	}
	// In use: not evictable; only 3 blocks can be allocated.
	if _, ok := p.allocate(nil, 4); ok {
		t.Fatal("allocated blocks that are in use")
	}
	// A prefix hit on a running request's blocks shares them.
	hit, hitFree := p.lookup([]uint64{11, 12, 99}, 3)
	if hit != 2 || hitFree != 0 {
		t.Errorf("lookup hit %d free %d", hit, hitFree)
	}
	b := p.acquireCached(nil, ha[:2])
	if p.blocks[b[0]].ref != 2 {
		t.Errorf("shared block ref %d", p.blocks[b[0]].ref)
	}
	p.release(b)
	p.release(a)
	if p.numFree != 6 || p.usage() != 0 {
		t.Fatalf("after release free %d usage %v", p.numFree, p.usage())
	}
	// Freed cached blocks stay findable.
	if hit, hitFree := p.lookup(ha, 3); hit != 3 || hitFree != 3 {
		t.Errorf("cached free blocks: hit %d free %d", hit, hitFree)
	}
	// Allocation takes never-cached blocks first, then cached ones LRU,
	// a sequence's tail before its head.
	c, _ := p.allocate(nil, 4)
	ev = p.takeEvents()
	if len(ev) != 1 {
		t.Fatalf("want one BlockRemoved, got %v", ev)
	}
	if rm := ev[0].(*kvpub.BlockRemoved); !slices.Equal(rm.Hashes, []uint64{13}) {
		t.Errorf("evicted %v, want the tail block 13", rm.Hashes)
	}
	if hit, _ := p.lookup(ha, 3); hit != 2 {
		t.Errorf("head blocks should survive, hit %d", hit)
	}
	// A duplicate hash stays uncached; the chain continues with the right
	// parent.
	p.store(c[:2], []uint64{11, 21}, nil, seqTokens(4, 100), 0, "")
	ev = p.takeEvents()
	if len(ev) != 1 {
		t.Fatalf("events %v", ev)
	}
	if st := ev[0].(*kvpub.BlockStored); !slices.Equal(st.Hashes, []uint64{21}) || st.Parent == nil || *st.Parent != 11 {
		t.Errorf("stored after duplicate %+v", st)
	}
	if n := p.reset(); n != 3 {
		t.Errorf("reset dropped %d hashes", n)
	}
	if _, ok := p.takeEvents()[0].(kvpub.AllBlocksCleared); !ok || len(p.cached) != 0 {
		t.Error("reset did not clear")
	}
	p.release(c)
	if p.numFree != 6 {
		t.Errorf("free %d", p.numFree)
	}
}

func TestPreemptionUnderKVPressure(t *testing.T) {
	// 20 blocks of 16 tokens; each request grows to 64+150 tokens = 14
	// blocks, so three at once must preempt.
	e := startEngine(t, func(c *Config) { c.NumGPUBlocks = 20; c.TimeScale = 200 })
	rng := rand.New(rand.NewPCG(5, 6))
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		prompt := words(rng, 64)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := tryComplete(e.URL(), map[string]any{"prompt": prompt, "max_tokens": 150})
			if err == nil && (c.Usage.CompletionTokens != 150 || c.Choices[0].FinishReason != "length") {
				t.Errorf("usage %+v", c.Usage)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if v := metricValue(t, e, "vllm:num_preemptions_total"); v < 1 {
		t.Errorf("no preemption recorded (%v)", v)
	}
	var used int
	onScheduler(t, e, func(s *scheduler) { used = s.pool.total() - s.pool.numFree })
	if used != 0 {
		t.Errorf("%d blocks leaked", used)
	}
}

// TestFollowerFindsBlocksOfTheStepItJoins: a step's blocks enter the
// prefix cache when the step is planned, as in vLLM v1
// (KVCacheManager.allocate_slots caches the blocks of the tokens it
// schedules). A request that extends a 100-token prompt and is admitted
// into the step of that prompt's last chunk (a 64-token budget: 64, then
// 36 + the follower) finds all six of its full blocks, not only the four
// of the step before.
func TestFollowerFindsBlocksOfTheStepItJoins(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumBatchedTokens, cfg.BlockSize = 64, 16
	s := newScheduler(cfg, cfg.Logger, newMetrics(cfg), nil)
	prompt := seqTokens(100, 7)
	leader := &request{id: "leader", tokens: prompt, promptLen: 100, maxTokens: 2, notify: make(chan struct{}, 1)}
	s.waiting = []*request{leader}
	s.commit(s.schedule(leader.arrival), leader.arrival)
	if leader.numComputed != 64 {
		t.Fatalf("the leader computed %d tokens in its first step, want 64", leader.numComputed)
	}
	followerTokens := append(append([]uint32(nil), prompt...), seqTokens(20, 5000)...)
	follower := &request{id: "follower", tokens: followerTokens, promptLen: 120, maxTokens: 2, notify: make(chan struct{}, 1)}
	s.waiting = []*request{follower}
	p := s.schedule(leader.arrival)
	if len(p.items) != 2 || p.items[1].r != follower {
		t.Fatalf("the step plans %d items, want the leader's last chunk and the follower", len(p.items))
	}
	if follower.numComputed != 96 {
		t.Fatalf("the follower found %d tokens cached, want the leader's 96 (six full blocks)", follower.numComputed)
	}
}

func TestChunkedPrefillStepBudget(t *testing.T) {
	// A 1000-token prompt with a 256-token budget takes 4 prefill steps;
	// the plan of each step never exceeds the budget.
	cfg := testConfig()
	cfg.MaxNumBatchedTokens = 256
	s := newScheduler(cfg, cfg.Logger, newMetrics(cfg), nil)
	r := &request{tokens: seqTokens(1000, 7), promptLen: 1000, maxTokens: 3, notify: make(chan struct{}, 1)}
	s.waiting = append(s.waiting, r)
	steps := 0
	for r.generated < r.maxTokens {
		p := s.schedule(r.arrival)
		tot := 0
		for _, it := range p.items {
			tot += it.n
		}
		if tot > 256 || len(p.items) != 1 {
			t.Fatalf("step %d plans %d tokens", steps, tot)
		}
		want := cfg.Perf.PrefillTime(256)
		switch {
		case steps == 3:
			want = cfg.Perf.PrefillTime(1000 - 768)
		case steps > 3:
			want = cfg.Perf.DecodeStepTime(1, r.numComputed+1)
		}
		if got := s.stepTime(p); got != want {
			t.Errorf("step %d time %v want %v", steps, got, want)
		}
		s.commit(p, r.arrival)
		steps++
	}
	if steps != 4+2 {
		t.Errorf("%d steps, want 4 prefill + 2 decode", steps)
	}
}
