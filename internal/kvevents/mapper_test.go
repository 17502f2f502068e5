package kvevents

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

func seqTokens(n int, seed uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = seed*7919 + uint32(i)
	}
	return t
}

// storedEvent builds a BlockStored for tokens split into engine blocks of
// ebs, with engine hashes base+i.
func storedEvent(toks []uint32, ebs int, base uint64, parent *uint64) Event {
	n := len(toks) / ebs
	e := Event{Kind: KindBlockStored, TokenIDs: toks[:n*ebs], BlockSize: ebs, Medium: kvindex.TierGPU}
	for i := 0; i < n; i++ {
		e.BlockHashes = append(e.BlockHashes, base+uint64(i))
	}
	if parent != nil {
		e.Parent, e.HasParent = *parent, true
	}
	return e
}

func removedEvent(hashes ...uint64) Event {
	return Event{Kind: KindBlockRemoved, BlockHashes: hashes, Medium: kvindex.TierGPU}
}

type mapperFixture struct {
	idx *kvindex.Index
	m   *mapper
	st  *EngineStats
	h   *tokens.Hasher
}

func newFixture(t *testing.T, routerBS int) *mapperFixture {
	idx := kvindex.New(kvindex.Config{BlockSize: routerBS})
	id, err := idx.AddEndpoint("e", "m")
	if err != nil {
		t.Fatal(err)
	}
	st := &EngineStats{}
	return &mapperFixture{idx: idx, m: newMapper(id, "m", routerBS, 1<<20, idx, st), st: st, h: tokens.NewHasher(routerBS)}
}

func (f *mapperFixture) apply(evs ...Event) {
	f.m.apply(&Batch{Events: evs})
}

func (f *mapperFixture) matched(toks []uint32, extra []byte) int {
	ms := f.idx.Lookup("m", f.h.Keys(toks, extra), nil)
	return ms[0].Blocks
}

func u64(v uint64) *uint64 { return &v }

func TestMapperBlockSizes(t *testing.T) {
	toks := seqTokens(192, 1)
	tests := []struct {
		name          string
		ebs, rbs      int
		stored        int    // tokens stored (two events: half, then the rest with a parent)
		wantAll       int    // router blocks matched after storing
		remove        uint64 // engine block to remove
		wantAfterRm   int
		wantNodesLeft int
	}{
		{"equal 16/16", 16, 16, 128, 8, 100 + 5, 5, 7},
		{"engine 16 router 64", 16, 64, 192, 3, 100 + 5, 1, 11}, // block 5 (tokens 80..95) is inside router block 1
		{"engine 16 router 64, last of block", 16, 64, 192, 3, 100 + 3, 0, 11},
		{"engine 64 router 16", 64, 16, 192, 12, 100 + 1, 4, 2},
		{"engine 16 router 24", 16, 24, 96, 4, 100 + 1, 0, 5}, // block 1 (16..31) completes router block 0 and starts 1
		{"engine 16 router 24, aligned", 16, 24, 96, 4, 100 + 2, 1, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.rbs)
			half := tc.stored / tc.ebs / 2 * tc.ebs
			f.apply(storedEvent(toks[:half], tc.ebs, 100, nil))
			n1 := uint64(half / tc.ebs)
			f.apply(storedEvent(toks[half:tc.stored], tc.ebs, 100+n1, u64(100+n1-1)))
			if got := f.matched(toks[:tc.stored], nil); got != tc.wantAll {
				t.Fatalf("after store: %d router blocks, want %d", got, tc.wantAll)
			}
			f.apply(removedEvent(tc.remove))
			if got := f.matched(toks[:tc.stored], nil); got != tc.wantAfterRm {
				t.Errorf("after removing %d: %d router blocks, want %d", tc.remove, got, tc.wantAfterRm)
			}
			if f.m.nodes.len() != tc.wantNodesLeft {
				t.Errorf("%d nodes left, want %d", f.m.nodes.len(), tc.wantNodesLeft)
			}
		})
	}
}

func TestMapperOrphansLoRAGroupsClear(t *testing.T) {
	f := newFixture(t, 16)
	toks := seqTokens(64, 2)
	// Parent never seen: cannot be placed.
	f.apply(storedEvent(toks[16:], 16, 200, u64(999)))
	if f.st.orphans.Load() != 3 || f.matched(toks, nil) != 0 {
		t.Errorf("orphans %d", f.st.orphans.Load())
	}
	// LoRA blocks only match keys with the same extra.
	e := storedEvent(toks, 16, 300, nil)
	e.LoRAName = "adapter"
	f.apply(e)
	if f.matched(toks, nil) != 0 || f.matched(toks, tokens.LoRAExtra("adapter")) != 4 {
		t.Errorf("lora: base %d, adapter %d", f.matched(toks, nil), f.matched(toks, tokens.LoRAExtra("adapter")))
	}
	// Same hash on CPU too: a GPU removal leaves the CPU copy.
	e.Medium = kvindex.TierCPU
	f.apply(e)
	rm := removedEvent(300, 301, 302, 303)
	f.apply(rm)
	ms := f.idx.Lookup("m", f.h.Keys(toks, tokens.LoRAExtra("adapter")), nil)
	if ms[0].Blocks != 4 || ms[0].Tier != kvindex.TierCPU || ms[0].GPUBlocks != 0 {
		t.Errorf("cpu copy: %+v", ms[0])
	}
	// Sliding-window group: learned and applied.
	b := seqTokens(64, 3)
	f.apply(storedEvent(b, 16, 400, nil))
	sw := storedEvent(b[16:], 16, 401, u64(400))
	sw.Group, sw.GroupKind, sw.HasGroupKind, sw.Window = 1, kvindex.GroupSlidingWindow, true, 32
	f.apply(sw)
	if got := f.matched(b, nil); got != 4 {
		t.Errorf("sliding window: %d", got)
	}
	f.apply(Event{Kind: KindBlockRemoved, BlockHashes: []uint64{403}, Medium: kvindex.TierGPU, Group: 1})
	if got := f.matched(b, nil); got != 3 {
		t.Errorf("sliding window after removing the last block: %d", got)
	}
	// Malformed token count.
	bad := storedEvent(b, 16, 500, nil)
	bad.TokenIDs = bad.TokenIDs[:10]
	f.apply(bad)
	if f.st.badEvents.Load() != 1 {
		t.Errorf("bad events %d", f.st.badEvents.Load())
	}
	f.apply(Event{Kind: KindAllBlocksCleared})
	if f.matched(b, nil) != 0 || f.m.nodes.len() != 0 || f.idx.Stats()[0].CPUBlocks != 0 {
		t.Errorf("after clear: %d, %d nodes", f.matched(b, nil), f.m.nodes.len())
	}
}

func TestMapperBounded(t *testing.T) {
	f := newFixture(t, 16)
	f.m.maxNodes = 100
	for i := 0; i < 50; i++ {
		f.apply(storedEvent(seqTokens(64, uint32(10+i)), 16, uint64(1000*i), nil))
	}
	if f.m.nodes.len() > 100 || f.st.mapEvicted.Load() == 0 {
		t.Errorf("map not bounded: %d nodes, %d evicted", f.m.nodes.len(), f.st.mapEvicted.Load())
	}
}

// recordSink records every call as text.
type recordSink struct{ calls []string }

func (r *recordSink) Store(ep kvindex.EndpointID, g int, t kvindex.Tier, keys []tokens.BlockKey) {
	r.calls = append(r.calls, fmt.Sprint("store", g, t, keys))
}
func (r *recordSink) Remove(ep kvindex.EndpointID, g int, t kvindex.Tier, keys []tokens.BlockKey) {
	r.calls = append(r.calls, fmt.Sprint("remove", g, t, keys))
}
func (r *recordSink) ClearEndpoint(ep kvindex.EndpointID) { r.calls = append(r.calls, "clear") }
func (r *recordSink) SetGroup(model string, g int, k kvindex.GroupKind, w int) {
	r.calls = append(r.calls, fmt.Sprint("group", g, k, w))
}

// TestStoredEqualMatchesGeneralPath drives two mappers, one with the
// equal-size fast path and one without, through random stores (chains,
// duplicates, engine hashes reused under other parents, other tiers,
// unequal engine block sizes mixed in), removals and clears, and requires
// the same calls to the sink.
func TestStoredEqualMatchesGeneralPath(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	fast, slow := &recordSink{}, &recordSink{}
	mf := newMapper(0, "m", 16, 1<<20, fast, &EngineStats{})
	ms := newMapper(0, "m", 16, 1<<20, slow, &EngineStats{})
	ms.noFast = true
	var known []uint64
	for op := 0; op < 3000; op++ {
		var e Event
		switch x := r.IntN(20); {
		case x < 14:
			n := 1 + r.IntN(6)
			ebs := 16
			if x == 13 {
				ebs = []int{8, 24, 32}[r.IntN(3)]
			}
			e = Event{Kind: KindBlockStored, BlockSize: ebs, Medium: kvindex.Tier(1 + r.IntN(3))}
			if len(known) > 0 && r.IntN(4) != 0 {
				e.Parent, e.HasParent = known[r.IntN(len(known))], true
			}
			for i := 0; i < n; i++ {
				h := uint64(r.IntN(400))
				if len(known) > 0 && r.IntN(5) == 0 {
					h = known[r.IntN(len(known))] // reused hash
				}
				e.BlockHashes = append(e.BlockHashes, h)
				known = append(known, h)
			}
			e.TokenIDs = seqTokens(n*ebs, uint32(r.IntN(50)))
		case x < 19 && len(known) > 0:
			e = removedEvent(known[r.IntN(len(known))], known[r.IntN(len(known))])
			e.Medium = kvindex.Tier(1 + r.IntN(3))
		default:
			e = Event{Kind: KindAllBlocksCleared}
			known = known[:0]
		}
		mf.apply(&Batch{Events: []Event{e}})
		ms.apply(&Batch{Events: []Event{e}})
	}
	if len(fast.calls) != len(slow.calls) {
		t.Fatalf("%d calls with the fast path, %d without", len(fast.calls), len(slow.calls))
	}
	for i := range fast.calls {
		if fast.calls[i] != slow.calls[i] {
			t.Fatalf("call %d: fast %s, general %s", i, fast.calls[i], slow.calls[i])
		}
	}
}
