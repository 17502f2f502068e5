package kvevents

import (
	"reflect"
	"testing"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

// Payloads assembled by hand from vLLM's vllm/distributed/kv_events.py:
// EventBatch{ts, events, data_parallel_rank} and the tagged KVCacheEvent
// structs (msgspec, tag=True, omit_defaults=True, not array_like: maps
// whose first key is "type", in field order; fields with a None default
// are left out when None, the others always written).
var (
	// Every current field set.
	vllmMapFull = `
		83
		a2 7473 cb 41d954fc40100000                         // ts: 1700000000.25
		a6 6576656e7473 93                                  // events: 3
		8c                                                  // BlockStored, 12 keys
		a4 74797065 ab 426c6f636b53746f726564
		ac 626c6f636b5f686173686573 92                      // block_hashes: sha256 digests (bytes)
		c4 20 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
		c4 20 202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f
		b1 706172656e745f626c6f636b5f68617368 c4 20 404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f
		a9 746f6b656e5f696473 94 01 02 cd 0100 ce 00010000  // [1, 2, 256, 65536]
		aa 626c6f636b5f73697a65 02
		a7 6c6f72615f6964 03                                // deprecated lora_id
		a6 6d656469756d a3 475055                           // "GPU"
		a9 6c6f72615f6e616d65 a2 6164                       // "ad"
		aa 65787472615f6b657973 92                          // extra_keys, per block
		91 a2 6164                                          // block 0: ("ad",)
		92 a7 696d673a616263 a2 6164                        // block 1: ("img:abc", "ad")
		a9 67726f75705f696478 01
		b2 6b765f63616368655f737065635f6b696e64 ae 736c6964696e675f77696e646f77
		bc 6b765f63616368655f737065635f736c6964696e675f77696e646f77 cd 1000
		84                                                  // BlockRemoved, 4 keys
		a4 74797065 ac 426c6f636b52656d6f766564
		ac 626c6f636b5f686173686573 91 cf fedcba9876543210  // int hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
		a6 6d656469756d a3 435055                           // "CPU"
		a9 67726f75705f696478 01
		81 a4 74797065 b0 416c6c426c6f636b73436c6561726564  // AllBlocksCleared
		b2 646174615f706172616c6c656c5f72616e6b 01`
	// Defaults left out: no extra_keys, group or spec; parent, lora_id and
	// lora_name written as nil, as msgspec does for fields without a
	// default.
	vllmMapMinimal = `
		83
		a2 7473 cb 41d954fc40100000
		a6 6576656e7473 92
		88
		a4 74797065 ab 426c6f636b53746f726564
		ac 626c6f636b5f686173686573 91 cf 8000000000000001
		b1 706172656e745f626c6f636b5f68617368 c0
		a9 746f6b656e5f696473 92 07 08
		aa 626c6f636b5f73697a65 02
		a7 6c6f72615f6964 c0
		a6 6d656469756d a3 475055
		a9 6c6f72615f6e616d65 c0
		83
		a4 74797065 ac 426c6f636b52656d6f766564
		ac 626c6f636b5f686173686573 91 cf 8000000000000001
		a6 6d656469756d c0                                  // None: GPU
		b2 646174615f706172616c6c656c5f72616e6b 00`
)

// stripComments drops // comments from a hex listing.
func stripComments(s string) string {
	out := []byte{}
	for i := 0; i < len(s); i++ {
		if s[i] == '/' && i+1 < len(s) && s[i+1] == '/' {
			for i < len(s) && s[i] != '\n' {
				i++
			}
		}
		if i < len(s) {
			out = append(out, s[i])
		}
	}
	return string(out)
}

func TestDecodeVLLMCurrentFields(t *testing.T) {
	var b Batch
	if err := Decode(unhex(t, stripComments(vllmMapFull)), &b); err != nil {
		t.Fatal(err)
	}
	want := Batch{TS: 1700000000.25, DPRank: 1, HasDPRank: true, Events: []Event{
		{Kind: KindBlockStored, BlockHashes: []uint64{0x18191a1b1c1d1e1f, 0x38393a3b3c3d3e3f},
			Parent: 0x58595a5b5c5d5e5f, HasParent: true, TokenIDs: []uint32{1, 2, 256, 65536}, BlockSize: 2,
			LoRAID: 3, HasLoRAID: true, LoRAName: "ad", Medium: kvindex.TierGPU, Group: 1,
			GroupKind: kvindex.GroupSlidingWindow, HasGroupKind: true, Window: 4096,
			ExtraKeys: [][]byte{unhex(t, "91 a2 6164"), unhex(t, "92 a7 696d673a616263 a2 6164")}},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{0xfedcba9876543210}, Medium: kvindex.TierCPU, Group: 1},
		{Kind: KindAllBlocksCleared, Medium: kvindex.TierGPU},
	}}
	for i := range b.Events {
		normalize(&b.Events[i])
	}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("full:\n got %+v\nwant %+v", b, want)
	}

	if err := Decode(unhex(t, stripComments(vllmMapMinimal)), &b); err != nil {
		t.Fatal(err)
	}
	want = Batch{TS: 1700000000.25, HasDPRank: true, Events: []Event{
		{Kind: KindBlockStored, BlockHashes: []uint64{1<<63 | 1}, TokenIDs: []uint32{7, 8}, BlockSize: 2, Medium: kvindex.TierGPU},
		{Kind: KindBlockRemoved, BlockHashes: []uint64{1<<63 | 1}, Medium: kvindex.TierGPU},
	}}
	for i := range b.Events {
		normalize(&b.Events[i])
	}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("minimal:\n got %+v\nwant %+v", b, want)
	}
}

// normalize turns empty slices into nil for comparison.
func normalize(e *Event) {
	if len(e.TokenIDs) == 0 {
		e.TokenIDs = nil
	}
	if len(e.BlockHashes) == 0 {
		e.BlockHashes = nil
	}
	if len(e.ExtraKeys) == 0 {
		e.ExtraKeys = nil
	}
}

// TestMapperExtraKeys: a block whose extra keys hold only the LoRA name
// keys as the router's LoRA keys do; a block hashed with a multimodal
// input (or a cache salt) never matches a lookup of its token ids alone.
func TestMapperExtraKeys(t *testing.T) {
	var b Batch
	if err := Decode(unhex(t, stripComments(vllmMapFull)), &b); err != nil {
		t.Fatal(err)
	}
	e := b.Events[0]
	e.Group, e.HasGroupKind, e.Window = 0, false, 0
	e.HasParent = false // a chain start
	f := newFixture(t, 2)
	f.apply(e)
	toks := []uint32{1, 2, 256, 65536}
	if got := f.matched(toks, tokens.LoRAExtra("ad")); got != 1 {
		t.Errorf("LoRA lookup matches %d blocks, want 1 (block 1 has a multimodal input)", got)
	}
	if got := f.matched(toks, nil); got != 0 {
		t.Errorf("base-model lookup matches %d blocks, want 0", got)
	}
	// The same event without extra keys: both blocks match.
	e.ExtraKeys = nil
	e.BlockHashes = []uint64{11, 12}
	f.apply(e)
	if got := f.matched(toks, tokens.LoRAExtra("ad")); got != 2 {
		t.Errorf("without extra keys: %d blocks, want 2", got)
	}
}
