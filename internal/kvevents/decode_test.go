package kvevents

import (
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvgate/kvgate/internal/kvindex"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.Join(strings.Fields(s), "")
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Hand-assembled payloads, byte by byte.
var (
	// [1.5, [["BlockStored", [1, 2], nil, [10,11,12,13], 2, nil, "GPU"]], 0]
	// (vLLM ≤ 0.9 positional form without lora_name and later fields).
	handPositional = `
		93
		cb 3ff8000000000000
		91
		97
		ab 426c6f636b53746f726564
		92 01 02
		c0
		94 0a 0b 0c 0d
		02
		c0
		a3 475055
		00`
	// {"ts": 2, "events": [{"type": "BlockRemoved",
	//   "block_hashes": [bin 10 bytes 00 00 01..08, uint64 0xffffffffffffffff, int8 -2],
	//   "medium": "cpu", "group_idx": 1, "future": [1, 2]}], "data_parallel_rank": 3}
	handMap = `
		83
		a2 7473 02
		a6 6576656e7473
		91
		85
		a4 74797065 ac 426c6f636b52656d6f766564
		ac 626c6f636b5f686173686573
		93
		c4 0a 0000 0102030405060708
		cf ffffffffffffffff
		d0 fe
		a6 6d656469756d a3 637075
		a9 67726f75705f696478 01
		a6 667574757265 92 01 02
		b2 646174615f706172616c6c656c5f72616e6b 03`
)

func TestDecodeHandChecked(t *testing.T) {
	var b Batch
	if err := Decode(unhex(t, handPositional), &b); err != nil {
		t.Fatal(err)
	}
	want := Batch{TS: 1.5, HasDPRank: true, Events: []Event{{
		Kind: KindBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{10, 11, 12, 13},
		BlockSize: 2, Medium: kvindex.TierGPU,
	}}}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("positional:\n got %+v\nwant %+v", b, want)
	}

	if err := Decode(unhex(t, handMap), &b); err != nil {
		t.Fatal(err)
	}
	want = Batch{TS: 2, DPRank: 3, HasDPRank: true, Events: []Event{{
		Kind: KindBlockRemoved, BlockHashes: []uint64{0x0102030405060708, 0xffffffffffffffff, 0xfffffffffffffffe},
		Medium: kvindex.TierCPU, Group: 1, TokenIDs: []uint32{},
	}}}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("map:\n got %+v\nwant %+v", b, want)
	}
}

func enc(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeForms(t *testing.T) {
	hash32 := make([]byte, 32)
	for i := range hash32 {
		hash32[i] = byte(i)
	}
	tests := []struct {
		name    string
		payload any
		want    []Event
		dp      int
	}{
		{
			name: "positional full with extra trailing fields",
			payload: []any{1.0, []any{
				[]any{"BlockStored", []any{uint64(1) << 63, int64(-1)}, hash32, []any{1, 300, 70000}, 16, 7, "cpu", "adapter",
					[]any{nil, []any{"salt"}}, 2, "sliding_window", 4096, "unknown-future-field"},
			}, 5},
			dp: 5,
			want: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{1 << 63, 0xffffffffffffffff},
				Parent: 0x18191a1b1c1d1e1f, HasParent: true, TokenIDs: []uint32{1, 300, 70000}, BlockSize: 16,
				LoRAID: 7, HasLoRAID: true, Medium: kvindex.TierCPU, LoRAName: "adapter", Group: 2,
				GroupKind: kvindex.GroupSlidingWindow, HasGroupKind: true, Window: 4096,
				ExtraKeys: [][]byte{nil, {0x91, 0xa4, 's', 'a', 'l', 't'}}}},
		},
		{
			name: "map form, omitted defaults, unknown keys",
			payload: map[string]any{"ts": 3.25, "events": []any{
				map[string]any{"type": "BlockStored", "block_hashes": []any{hash32[:8]}, "parent_block_hash": nil,
					"token_ids": []any{5, 6}, "block_size": 2, "lora_id": nil, "medium": nil, "lora_name": nil, "new_field": map[string]any{"x": 1}},
				map[string]any{"type": "AllBlocksCleared"},
				map[string]any{"type": "SomethingNew", "block_hashes": []any{1}},
				map[string]any{"type": "BlockRemoved", "block_hashes": []any{9}, "medium": "Storage"},
			}},
			want: []Event{
				{Kind: KindBlockStored, BlockHashes: []uint64{0x0001020304050607}, TokenIDs: []uint32{5, 6}, BlockSize: 2, Medium: kvindex.TierGPU},
				{Kind: KindAllBlocksCleared, Medium: kvindex.TierGPU},
				{Kind: KindUnknown, BlockHashes: []uint64{1}, Medium: kvindex.TierGPU},
				{Kind: KindBlockRemoved, BlockHashes: []uint64{9}, Medium: kvindex.TierStorage},
			},
		},
		{
			name: "positional minimal: AllBlocksCleared and short BlockRemoved",
			payload: []any{0, []any{
				[]any{"AllBlocksCleared"},
				[]any{"BlockRemoved", []any{uint8(3), uint16(300), uint32(70000)}},
			}},
			want: []Event{
				{Kind: KindAllBlocksCleared, Medium: kvindex.TierGPU},
				{Kind: KindBlockRemoved, BlockHashes: []uint64{3, 300, 70000}, Medium: kvindex.TierGPU},
			},
		},
		{
			name:    "integer tag is an unknown event",
			payload: []any{0, []any{[]any{7, 1, 2}}, nil},
			want:    []Event{{Kind: KindUnknown, Medium: kvindex.TierGPU}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			if err := Decode(enc(t, tc.payload), &b); err != nil {
				t.Fatal(err)
			}
			if b.DPRank != tc.dp {
				t.Errorf("dp rank %d, want %d", b.DPRank, tc.dp)
			}
			if len(b.Events) != len(tc.want) {
				t.Fatalf("%d events, want %d", len(b.Events), len(tc.want))
			}
			for i := range tc.want {
				g, w := b.Events[i], tc.want[i]
				if len(g.TokenIDs) == 0 {
					g.TokenIDs = nil
				}
				if len(g.BlockHashes) == 0 {
					g.BlockHashes = nil
				}
				if !reflect.DeepEqual(g, w) {
					t.Errorf("event %d:\n got %+v\nwant %+v", i, g, w)
				}
			}
		})
	}
}

func TestDecodeMalformed(t *testing.T) {
	bad := map[string][]byte{
		"empty":            nil,
		"not array":        enc(t, "hello"),
		"short batch":      enc(t, []any{1.0}),
		"events not array": enc(t, []any{1.0, 5}),
		"event not array":  enc(t, []any{1.0, []any{5}}),
		"hash string list": enc(t, []any{1.0, []any{[]any{"BlockRemoved", "nope"}}}),
		"negative token":   enc(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1}}}),
		"bad block size":   enc(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1}, 0}}}),
		"truncated":        unhex(t, handPositional)[:20],
		"trailing bytes":   append(unhex(t, handPositional), 0x01),
		"huge array len":   unhex(t, "92 00 dd ffffffff"),
		"map without type": enc(t, []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}}),
		"deep nesting":     append(append(unhex(t, "92 00 91 92 a9 426c6f636b53746f72"), []byte("e")...), strings.Repeat("\x91", 100)...),
	}
	for name, p := range bad {
		var b Batch
		err := Decode(p, &b)
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v does not wrap ErrMalformed", name, err)
		}
	}
}

func TestDecodeReusesBuffers(t *testing.T) {
	p := enc(t, []any{1.0, []any{[]any{"BlockStored", []any{1, 2, 3, 4}, nil, make([]int, 64), 16, nil, nil, nil}}, 0})
	var b Batch
	if err := Decode(p, &b); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := Decode(p, &b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocs per decode, want 0", allocs)
	}
}

// FuzzDecode checks that no input makes the decoder panic or hang; run
// with `go test -fuzz=FuzzDecode ./internal/kvevents`.
func FuzzDecode(f *testing.F) {
	f.Add(unhex(f, handPositional))
	f.Add(unhex(f, handMap))
	f.Add(enc(f, []any{1.0, []any{[]any{"BlockStored", []any{1}, 7, []any{1, 2}, 2, nil, "GPU", "l", []any{nil}, 0, "full_attention", nil}}, 0}))
	f.Add(enc(f, map[string]any{"ts": 1, "events": []any{map[string]any{"type": "AllBlocksCleared"}}}))
	f.Add([]byte{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		var b Batch
		if err := Decode(p, &b); err != nil {
			return
		}
		for _, e := range b.Events {
			if e.Kind > KindAllBlocksCleared || e.Group < 0 || e.Group >= maxGroups {
				t.Fatalf("bad event %+v", e)
			}
		}
	})
}
