package kvevents

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

// TestMapperParentZeroStartsChain: llm-d-inference-sim's positional form
// sends parent_block_hash 0 (not nil) for the first block of a chain. A
// parent 0 that was never stored starts a chain; one that was stored (an
// engine hash that happens to be 0) is a parent like any other.
func TestMapperParentZeroStartsChain(t *testing.T) {
	f := newFixture(t, 16)
	a := seqTokens(96, 21)
	f.apply(storedEvent(a[:48], 16, 100, u64(0)))
	f.apply(storedEvent(a[48:], 16, 103, u64(102)))
	if got := f.matched(a, nil); got != 6 || f.st.orphans.Load() != 0 {
		t.Fatalf("parent 0 never stored: matched %d blocks, %d orphans; want 6, 0", got, f.st.orphans.Load())
	}
	// An engine block whose hash is 0, then a child naming it.
	b := seqTokens(48, 22)
	f.apply(storedEvent(b[:16], 16, 0, nil))
	f.apply(storedEvent(b[16:], 16, 200, u64(0)))
	if got := f.matched(b, nil); got != 3 {
		t.Errorf("parent 0 stored: matched %d blocks, want 3", got)
	}
	// An unknown non-zero parent is still an orphan.
	f.apply(storedEvent(seqTokens(32, 23), 16, 300, u64(999)))
	if f.st.orphans.Load() != 2 {
		t.Errorf("orphans %d, want 2", f.st.orphans.Load())
	}
}

// simFixture is a capture of llm-d-inference-sim's KV events (see the
// file's note): the batches it published and, for each request, its
// prompt token ids, the cached tokens it reported and how many batches
// had been published before it was served.
type simFixture struct {
	Note    string
	Batches []struct {
		Topic   string
		Seq     uint64
		Payload string // hex
	}
	Requests []struct {
		Tokens        []uint32
		CachedTokens  int `json:"cached_tokens"`
		BatchesBefore int `json:"batches_before"`
	}
}

func loadSimFixture(t *testing.T, name string) simFixture {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var fx simFixture
	if err := json.Unmarshal(data, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Batches) == 0 || len(fx.Requests) == 0 {
		t.Fatalf("%s: empty fixture", name)
	}
	return fx
}

// TestLLMDSimCapture feeds batches captured from llm-d-inference-sim, in
// its positional (parent 0, batches from 1) and map forms, to an engine
// stream and checks, before every request, that a lookup of its prompt
// finds what a prefix cache holding the blocks the events describe would
// hold: an oracle kept beside the stream from the decoded events, by block
// content (no two chain positions in the capture have equal tokens). While
// the simulator's cache holds whole prefixes, that is also the number of
// tokens it reported as cached.
//
// What the capture taught: after its eviction removed the first blocks of
// a prompt but not later ones, the simulator counts the later ones as
// cached (32 where a prefix cache has 0 or 16), and its next BlockStored
// for that prompt names the last surviving block as the parent of the
// re-stored first blocks. vLLM's cache and kvgate count prefixes only; the
// blocks stored under a wrong parent get wrong keys, so requests after
// such an event are not checked.
func TestLLMDSimCapture(t *testing.T) {
	for _, form := range []string{"array", "map"} {
		t.Run(form, func(t *testing.T) {
			fx := loadSimFixture(t, "llmd-sim-"+form+".json")
			name, model, err := ParseTopic(fx.Batches[0].Topic)
			if err != nil {
				t.Fatal(err)
			}
			idx := kvindex.New(kvindex.Config{BlockSize: 16})
			sub, err := New(Config{Engines: []EngineConfig{{Name: name, Model: model}}, Logger: quietLogger()}, idx)
			if err != nil {
				t.Fatal(err)
			}
			st := sub.byTopic[name+"@"+model]
			o := newContentOracle()
			applied, checked, agreed := 0, 0, 0
			for i, r := range fx.Requests {
				for ; applied < r.BatchesBefore; applied++ {
					b := fx.Batches[applied]
					payload, err := hex.DecodeString(b.Payload)
					if err != nil {
						t.Fatal(err)
					}
					st.onFrames(context.Background(), [][]byte{[]byte(b.Topic), seq8(b.Seq), payload})
					o.apply(t, payload)
				}
				if o.wrongParent {
					continue
				}
				want := o.prefixTokens(r.Tokens)
				got := 16 * idx.Lookup(model, tokens.NewHasher(16).Keys(r.Tokens, nil), nil)[0].Blocks
				if got != want {
					t.Errorf("request %d after %d batches: index finds %d tokens, a prefix cache holds %d (simulator reported %d)", i, applied, got, want, r.CachedTokens)
				}
				checked++
				if want == r.CachedTokens {
					agreed++
				}
			}
			if checked < 4 || agreed < 4 {
				t.Errorf("only %d requests checked, %d of them as the simulator reported", checked, agreed)
			}
			sn := statsOf(sub, name)
			if sn.OrphanBlocks != 0 || sn.Malformed != 0 || sn.BadEvents != 0 || sn.UnknownRemoves != 0 || sn.RemovedBlocks == 0 || sn.Unrecovered != 0 {
				t.Errorf("stats %+v", sn)
			}
		})
	}
}

// contentOracle tracks which engine blocks are present, knowing each by
// its 16 tokens, and each block's depth in its chain (fixed, as engine
// hashes chain the prefix).
type contentOracle struct {
	byContent   map[[16]uint32]uint64 // block tokens → engine hash
	depth       map[uint64]int
	present     map[uint64]bool
	wrongParent bool // a block was stored again at another depth
}

func newContentOracle() *contentOracle {
	return &contentOracle{byContent: map[[16]uint32]uint64{}, depth: map[uint64]int{}, present: map[uint64]bool{}}
}

func (o *contentOracle) apply(t *testing.T, payload []byte) {
	t.Helper()
	var b Batch
	if err := Decode(payload, &b); err != nil {
		t.Fatal(err)
	}
	for _, e := range b.Events {
		switch e.Kind {
		case KindBlockStored:
			if e.BlockSize != 16 {
				t.Fatalf("block size %d", e.BlockSize)
			}
			d := 0
			if e.HasParent && e.Parent != 0 {
				pd, ok := o.depth[e.Parent]
				if !ok {
					t.Fatalf("parent %x never stored", e.Parent)
				}
				d = pd + 1
			}
			for j, h := range e.BlockHashes {
				var c [16]uint32
				copy(c[:], e.TokenIDs[16*j:])
				if old, ok := o.byContent[c]; ok && old != h {
					t.Fatalf("two hashes for one block content: the oracle does not apply")
				}
				if old, ok := o.depth[h]; ok && old != d+j {
					o.wrongParent = true
				}
				o.byContent[c], o.depth[h], o.present[h] = h, d+j, true
			}
		case KindBlockRemoved:
			for _, h := range e.BlockHashes {
				delete(o.present, h)
			}
		case KindAllBlocksCleared:
			clear(o.present)
		}
	}
}

// prefixTokens is the tokens of the longest prefix of toks whose blocks
// are all present.
func (o *contentOracle) prefixTokens(toks []uint32) int {
	n := 0
	for ; 16*(n+1) <= len(toks); n++ {
		var c [16]uint32
		copy(c[:], toks[16*n:])
		h, ok := o.byContent[c]
		if !ok || !o.present[h] {
			break
		}
	}
	return 16 * n
}
