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
	// An adapter named only by the deprecated lora_id (vLLM before
	// lora_name) matches neither the base model nor a named adapter; id 0
	// is no adapter.
	other := seqTokens(64, 4)
	byID := storedEvent(other, 16, 500, nil)
	byID.LoRAID, byID.HasLoRAID = 2, true
	f.apply(byID)
	if got := f.matched(other, nil) + f.matched(other, tokens.LoRAExtra("adapter")); got != 0 {
		t.Errorf("lora_id only: a request's lookup matched %d blocks", got)
	}
	zero := storedEvent(seqTokens(64, 5), 16, 600, nil)
	zero.HasLoRAID = true
	f.apply(zero)
	if got := f.matched(seqTokens(64, 5), nil); got != 4 {
		t.Errorf("lora_id 0 is the base model's: matched %d blocks, want 4", got)
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

// boundSink checks the map's bound at every Store: after each chunk of an
// event, where the map is at its largest.
type boundSink struct {
	*kvindex.Index
	m    *mapper
	peak int
}

func (s *boundSink) Store(ep kvindex.EndpointID, g int, t kvindex.Tier, keys []tokens.BlockKey) {
	s.peak = max(s.peak, s.m.nodes.len())
	s.Index.Store(ep, g, t, keys)
}

// TestMapperBoundWithinEvent: one event with ten times more blocks than
// the map's bound keeps the map within the bound (issue 14 item 6: 4 M
// blocks in one event held 7.46 M entries against a 2 Mi bound), every
// router key still reaches the index, and the chain goes on from the
// event's last block.
func TestMapperBoundWithinEvent(t *testing.T) {
	const maxNodes, blocks = 1000, 10000
	for _, sizes := range [][2]int{{16, 16}, {16, 64}, {64, 16}} {
		ebs, rbs := sizes[0], sizes[1]
		t.Run(fmt.Sprintf("engine %d router %d", ebs, rbs), func(t *testing.T) {
			idx := kvindex.New(kvindex.Config{BlockSize: rbs})
			id, _ := idx.AddEndpoint("e", "m")
			sink := &boundSink{Index: idx}
			st := &EngineStats{}
			m := newMapper(id, "m", rbs, maxNodes, sink, st)
			sink.m = m
			toks := seqTokens(blocks*ebs+2*ebs, 7)
			m.apply(&Batch{Events: []Event{storedEvent(toks[:blocks*ebs], ebs, 1, nil)}})
			if sink.peak > maxNodes || m.nodes.len() > maxNodes {
				t.Errorf("map held %d blocks at its peak, %d after; bound %d", sink.peak, m.nodes.len(), maxNodes)
			}
			if len(m.nodes.slots) > 2048 {
				t.Errorf("map capacity %d slots for a bound of %d", len(m.nodes.slots), maxNodes)
			}
			h := tokens.NewHasher(rbs)
			want := blocks * ebs / rbs
			if got := idx.Lookup("m", h.Keys(toks[:blocks*ebs], nil), nil)[0].Blocks; got != want {
				t.Errorf("index matches %d router blocks, want %d", got, want)
			}
			m.apply(&Batch{Events: []Event{storedEvent(toks[blocks*ebs:], ebs, 1+blocks, u64(blocks))}})
			if st.orphans.Load() != 0 {
				t.Errorf("the next event was orphaned")
			}
			if got, want := idx.Lookup("m", h.Keys(toks, nil), nil)[0].Blocks, len(toks)/rbs; got != want {
				t.Errorf("after the next event: %d router blocks, want %d", got, want)
			}
		})
	}
}

// TestMapperReleasesMemory: after a large map empties (removals or a
// clear), its memory is given back.
func TestMapperReleasesMemory(t *testing.T) {
	f := newFixture(t, 16)
	const blocks = 50000
	toks := seqTokens(blocks*16, 3)
	f.apply(storedEvent(toks, 16, 1, nil))
	if n := f.m.nodes.len(); n != blocks {
		t.Fatalf("%d nodes", n)
	}
	big := len(f.m.nodes.slots)
	hashes := make([]uint64, blocks)
	for i := range hashes {
		hashes[i] = uint64(1 + i)
	}
	f.apply(removedEvent(hashes[:blocks-10]...))
	if n := f.m.nodes.len(); n != 10 {
		t.Fatalf("%d nodes left", n)
	}
	if c := len(f.m.nodes.slots); c > 64 {
		t.Errorf("map still has %d slots for 10 blocks (had %d)", c, big)
	}
	if cap(f.m.keys) > maxBufKeep {
		t.Errorf("key buffer kept %d", cap(f.m.keys))
	}
	// The survivors are intact.
	if got := f.matched(toks, nil); got != 0 {
		t.Errorf("prefix after removing its start: %d", got)
	}
	f.apply(removedEvent(hashes[blocks-10:]...))

	// Unequal block sizes (extras) and a clear.
	g := newFixture(t, 64)
	g.apply(storedEvent(toks, 16, 1, nil))
	if len(g.m.nodes.exts) == 0 {
		t.Fatal("no extras with unequal block sizes")
	}
	g.apply(Event{Kind: KindAllBlocksCleared})
	if g.m.nodes.len() != 0 || len(g.m.nodes.slots) > keepOnReset || g.m.nodes.exts != nil {
		t.Errorf("after a clear: %d nodes, %d slots, %d extras", g.m.nodes.len(), len(g.m.nodes.slots), len(g.m.nodes.exts))
	}
	huge := &nodeTable{}
	huge.init(2 * keepOnReset)
	huge.upsert(5)
	if huge.reset(); len(huge.slots) != minNodeCap || huge.len() != 0 {
		t.Errorf("a large table kept %d slots after reset", len(huge.slots))
	}
	// Shrinking keeps entries and their extras.
	g.apply(storedEvent(toks, 16, 1, nil))
	g.apply(removedEvent(hashes[:blocks-100]...))
	if n := g.m.nodes.len(); n != 100 || len(g.m.nodes.slots) > 256 || len(g.m.nodes.exts) != 100 {
		t.Errorf("after removals: %d nodes, %d slots, %d extras", n, len(g.m.nodes.slots), len(g.m.nodes.exts))
	}
	g.apply(storedEvent(seqTokens(64, 9), 16, 900000, u64(uint64(blocks))))
	if g.st.orphans.Load() != 0 {
		t.Error("surviving block lost after the shrink")
	}
}
