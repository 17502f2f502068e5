package kvindex

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/tokens"
)

func chain(n int, seed uint32) []tokens.BlockKey {
	h := tokens.NewHasher(16)
	toks := make([]uint32, n*16)
	for i := range toks {
		toks[i] = seed*100003 + uint32(i)
	}
	return h.Keys(toks, nil)
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func mustAdd(t *testing.T, x *Index, name, m string) EndpointID {
	t.Helper()
	id, err := x.AddEndpoint(name, m)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestLookupTiersAndRemove(t *testing.T) {
	x := New(Config{BlockSize: 16})
	a := mustAdd(t, x, "a:1", "m")
	b := mustAdd(t, x, "b:1", "m")
	c := mustAdd(t, x, "c:1", "m")
	if again := mustAdd(t, x, "a:1", "m"); again != a {
		t.Fatalf("AddEndpoint not idempotent: %d vs %d", again, a)
	}
	keys := chain(10, 1)
	x.Store(a, 0, TierGPU, keys[:10])
	x.Store(b, 0, TierGPU, keys[:3])
	x.Store(b, 0, TierCPU, keys[3:6])
	x.Store(c, 0, TierStorage, keys[:2])
	x.Store(c, 0, TierGPU, keys[3:8]) // hole at 2: only 2 usable

	type want struct {
		blocks, gpu int
		tier        Tier
	}
	check := func(name string, ws map[EndpointID]want) {
		t.Helper()
		ms := x.Lookup("m", keys, nil)
		if len(ms) != 3 {
			t.Fatalf("%s: %d matches", name, len(ms))
		}
		for _, m := range ms {
			w := ws[m.Endpoint]
			if m.Blocks != w.blocks || m.GPUBlocks != w.gpu || m.Tier != w.tier || m.Tokens != w.blocks*16 {
				t.Errorf("%s: endpoint %d: got %+v, want %+v", name, m.Endpoint, m, w)
			}
		}
	}
	check("initial", map[EndpointID]want{a: {10, 10, TierGPU}, b: {6, 3, TierCPU}, c: {2, 0, TierStorage}})

	x.Remove(a, 0, TierGPU, keys[5:6])
	x.Remove(b, 0, TierGPU, keys[0:1])
	check("after remove", map[EndpointID]want{a: {5, 5, TierGPU}, b: {0, 0, TierNone}, c: {2, 0, TierStorage}})

	x.ClearEndpoint(c)
	check("after clear", map[EndpointID]want{a: {5, 5, TierGPU}, b: {0, 0, TierNone}})

	st := x.Stats()
	if st[a].GPUBlocks != 9 || st[b].GPUBlocks != 2 || st[b].CPUBlocks != 3 || st[c].GPUBlocks != 0 || st[c].StorageBlocks != 0 {
		t.Errorf("stats: %+v", st)
	}
	// Duplicate stores do not double count.
	x.Store(a, 0, TierGPU, keys[:2])
	if got := x.Stats()[a].GPUBlocks; got != 9 {
		t.Errorf("duplicate store counted: %d", got)
	}
	if ms := x.Lookup("other", keys, nil); len(ms) != 0 {
		t.Errorf("unknown model: %v", ms)
	}
}

func TestApproxTTL(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	x := New(Config{ApproxTTL: time.Minute, Now: clk.Now})
	a := mustAdd(t, x, "a", "m")
	b := mustAdd(t, x, "b", "m")
	keys := chain(8, 2)
	x.Routed(a, keys[:6])
	x.Store(b, 0, TierGPU, keys[:2])
	ms := x.Lookup("m", keys, nil)
	if ms[0].Blocks != 6 || !ms[0].Approx || ms[0].Tier != TierGPU || ms[0].GPUBlocks != 6 {
		t.Errorf("approx: %+v", ms[0])
	}
	if ms[1].Blocks != 2 || ms[1].Approx {
		t.Errorf("precise: %+v", ms[1])
	}
	// Precise remove drops the approximate entry.
	x.Remove(a, 0, TierGPU, keys[3:4])
	if ms = x.Lookup("m", keys, ms); ms[0].Blocks != 3 {
		t.Errorf("after remove: %+v", ms[0])
	}
	// Expiry: alive through one TTL, gone after two.
	clk.Add(70 * time.Second)
	if ms = x.Lookup("m", keys, ms); ms[0].Blocks != 3 {
		t.Errorf("after 70s: %+v", ms[0])
	}
	clk.Add(60 * time.Second)
	if ms = x.Lookup("m", keys, ms); ms[0].Blocks != 0 {
		t.Errorf("after 130s: %+v", ms[0])
	}
	// Refresh keeps it alive.
	x.Routed(a, keys[:4])
	clk.Add(50 * time.Second)
	x.Routed(a, keys[:4])
	clk.Add(50 * time.Second)
	if ms = x.Lookup("m", keys, ms); ms[0].Blocks != 4 {
		t.Errorf("after refresh: %+v", ms[0])
	}
	x.ClearEndpoint(a)
	if ms = x.Lookup("m", keys, ms); ms[0].Blocks != 0 {
		t.Errorf("after clear: %+v", ms[0])
	}
}

// TestUnrouted: withdrawing a routed request's approximate entries leaves
// what the engine reported (precise entries, of ep and of others) and
// other endpoints' approximate entries for the same keys.
func TestUnrouted(t *testing.T) {
	x := New(Config{})
	a := mustAdd(t, x, "a", "m")
	b := mustAdd(t, x, "b", "m")
	keys := chain(10, 3)
	x.Routed(a, keys)
	x.Routed(b, keys[:5])
	x.Store(a, 0, TierGPU, keys[:3]) // a computed 3 blocks before the abort
	x.Unrouted(a, keys)
	ms := x.Lookup("m", keys, nil)
	if ms[0].Blocks != 3 || ms[0].Approx {
		t.Errorf("a after unrouted: %+v, want its 3 precise blocks", ms[0])
	}
	if ms[1].Blocks != 5 || !ms[1].Approx {
		t.Errorf("b: %+v, want its 5 approximate blocks", ms[1])
	}
	x.Unrouted(b, keys[:5])
	x.Unrouted(b, keys) // again, and beyond what was routed: nothing to do
	if ms = x.Lookup("m", keys, ms); ms[1].Blocks != 0 {
		t.Errorf("b after unrouted: %+v", ms[1])
	}
	x.Unrouted(EndpointID(999), keys) // unknown endpoint: ignored
}

func TestManyPages(t *testing.T) {
	x := New(Config{})
	var ids []EndpointID
	for i := 0; i < 150; i++ {
		ids = append(ids, mustAdd(t, x, fmt.Sprintf("e%d", i), "m"))
	}
	keys := chain(200, 3)
	for i, id := range ids {
		x.Store(id, 0, TierGPU, keys[:i+1])
	}
	ms := x.Lookup("m", keys, nil)
	if len(ms) != 150 {
		t.Fatalf("%d matches", len(ms))
	}
	for i, m := range ms {
		if m.Endpoint != ids[i] || m.Blocks != i+1 {
			t.Fatalf("slot %d: %+v", i, m)
		}
	}
}

func TestEvictionBound(t *testing.T) {
	x := New(Config{MaxKeys: 1000, Shards: 4})
	a := mustAdd(t, x, "a", "m")
	for s := uint32(0); s < 100; s++ {
		x.Store(a, 0, TierGPU, chain(100, s+10))
	}
	mem := x.Mem()
	if mem.Keys > 1000 || mem.Evicted == 0 {
		t.Errorf("bound not kept: %+v", mem)
	}
	if got := x.Stats()[a].GPUBlocks; got != mem.Keys {
		t.Errorf("counter %d != keys %d", got, mem.Keys)
	}
	// Eviction keeps the memory bounded.
	if mem.Bytes > 64<<10 {
		t.Errorf("bytes %d", mem.Bytes)
	}
}

func TestHybridGroups(t *testing.T) {
	x := New(Config{BlockSize: 16})
	a := mustAdd(t, x, "a", "m")
	b := mustAdd(t, x, "b", "m")
	x.SetGroup("m", 1, GroupSlidingWindow, 33) // needs ceil(32/16) = 2 blocks
	keys := chain(20, 4)
	// Full attention holds 20 blocks on both.
	x.Store(a, 0, TierGPU, keys)
	x.Store(b, 0, TierGPU, keys)
	// a's window group holds only blocks 10..14: usable prefix is 15.
	x.Store(a, 1, TierGPU, keys[10:15])
	// b's window group holds 0..3 and 17: block 17 alone is not a window,
	// so the longest is 4 (blocks 2,3 end a window).
	x.Store(b, 1, TierGPU, keys[0:4])
	x.Store(b, 1, TierGPU, keys[17:18])
	ms := x.Lookup("m", keys, nil)
	if ms[0].Blocks != 15 || ms[1].Blocks != 4 {
		t.Errorf("sliding: %+v", ms)
	}
	// A second full-attention group must hold the whole prefix.
	x.SetGroup("m", 2, GroupFullAttention, 0)
	x.Store(a, 2, TierGPU, keys[:12])
	x.Store(b, 2, TierGPU, keys[:20])
	ms = x.Lookup("m", keys, ms)
	if ms[0].Blocks != 12 || ms[1].Blocks != 4 {
		t.Errorf("two full groups: %+v", ms)
	}
	// A state group needs the block at the end only.
	x.SetGroup("m", 3, GroupState, 0)
	x.Store(a, 3, TierGPU, keys[7:8])
	ms = x.Lookup("m", keys, ms)
	if ms[0].Blocks != 8 || ms[1].Blocks != 0 {
		t.Errorf("state group: %+v", ms)
	}
}

// TestConcurrent runs writers (one per endpoint) against lock-free readers;
// run with -race.
func TestConcurrent(t *testing.T) {
	x := New(Config{MaxKeys: 5000, Shards: 8})
	const writers = 4
	var ids []EndpointID
	for i := 0; i < writers; i++ {
		ids = append(ids, mustAdd(t, x, fmt.Sprintf("w%d", i), "m"))
	}
	keys := chain(300, 5)
	var writersWG, readersWG sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < writers; w++ {
		writersWG.Add(1)
		go func(id EndpointID, w int) {
			defer writersWG.Done()
			for round := 0; round < 30; round++ {
				x.Store(id, 0, TierGPU, keys[:100+w*50])
				x.Store(id, 0, TierGPU, chain(50, uint32(1000+round*writers+w)))
				x.Routed(id, keys[:20])
				x.Remove(id, 0, TierGPU, keys[50:60])
				if round%10 == 9 {
					x.ClearEndpoint(id)
				}
			}
		}(ids[w], w)
	}
	for r := 0; r < 2; r++ {
		readersWG.Add(1)
		go func() {
			defer readersWG.Done()
			var ms []Match
			for {
				select {
				case <-stop:
					return
				default:
				}
				ms = x.Lookup("m", keys, ms)
				for _, m := range ms {
					if m.Blocks > len(keys) || m.GPUBlocks > m.Blocks {
						t.Errorf("bad match %+v", m)
						return
					}
				}
			}
		}()
	}
	writersWG.Wait()
	close(stop)
	readersWG.Wait()
	for _, s := range x.Stats() {
		if s.GPUBlocks < 0 {
			t.Errorf("negative count %+v", s)
		}
	}
}
