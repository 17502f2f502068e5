package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/kvindex"
)

// mpw writes msgpack the way msgspec (vLLM's encoder) does: integers in
// their smallest form, floats as float64, strings and lists with the
// smallest header, struct fields as map entries in declaration order.
// Tests build vLLM's payloads with it byte by byte, in the order vLLM
// writes them, which a map-based encoder would not keep.
type mpw struct{ b []byte }

func (w *mpw) nil() *mpw { w.b = append(w.b, 0xc0); return w }

func (w *mpw) uint(v uint64) *mpw {
	switch {
	case v <= 0x7f:
		w.b = append(w.b, byte(v))
	case v <= 0xff:
		w.b = append(w.b, 0xcc, byte(v))
	case v <= 0xffff:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xcd), uint16(v))
	case v <= 0xffffffff:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xce), uint32(v))
	default:
		w.b = binary.BigEndian.AppendUint64(append(w.b, 0xcf), v)
	}
	return w
}

func (w *mpw) int(v int64) *mpw {
	switch {
	case v >= 0:
		return w.uint(uint64(v))
	case v >= -32:
		w.b = append(w.b, byte(v))
	case v >= math.MinInt8:
		w.b = append(w.b, 0xd0, byte(v))
	case v >= math.MinInt16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xd1), uint16(v))
	case v >= math.MinInt32:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xd2), uint32(v))
	default:
		w.b = binary.BigEndian.AppendUint64(append(w.b, 0xd3), uint64(v))
	}
	return w
}

func (w *mpw) float(v float64) *mpw {
	w.b = binary.BigEndian.AppendUint64(append(w.b, 0xcb), math.Float64bits(v))
	return w
}

func (w *mpw) str(s string) *mpw {
	switch n := len(s); {
	case n < 32:
		w.b = append(w.b, 0xa0|byte(n))
	case n <= 0xff:
		w.b = append(w.b, 0xd9, byte(n))
	default:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xda), uint16(n))
	}
	w.b = append(w.b, s...)
	return w
}

func (w *mpw) bin(p []byte) *mpw {
	w.b = append(append(w.b, 0xc4, byte(len(p))), p...)
	return w
}

func (w *mpw) array(n int) *mpw {
	if n < 16 {
		w.b = append(w.b, 0x90|byte(n))
	} else {
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xdc), uint16(n))
	}
	return w
}

// uints writes a list of integers.
func (w *mpw) uints(vs []uint64) *mpw {
	w.array(len(vs))
	for _, v := range vs {
		w.uint(v)
	}
	return w
}

func (w *mpw) mapHdr(n int) *mpw {
	w.b = append(w.b, 0x80|byte(n))
	return w
}

// vllmStored is a BlockStored as vLLM's kv_events.py declares it (fields
// in order; the last four have defaults and msgspec's omit_defaults drops
// them when they equal the default, None). Hashes are integers
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
type vllmStored struct {
	hashes     []uint64
	parent     *uint64
	tokens     []uint32
	blockSize  int
	loraID     *int64
	medium     *string
	loraName   *string
	extraKeys  func(w *mpw) // writes the value; nil omits the field
	groupIdx   *int64
	specKind   *string
	specWindow *int64
}

func (s vllmStored) write(w *mpw) {
	n := 8
	for _, set := range []bool{s.extraKeys != nil, s.groupIdx != nil, s.specKind != nil, s.specWindow != nil} {
		if set {
			n++
		}
	}
	w.mapHdr(n).str("type").str("BlockStored")
	w.str("block_hashes").uints(s.hashes)
	w.str("parent_block_hash")
	optUint(w, s.parent)
	w.str("token_ids").array(len(s.tokens))
	for _, t := range s.tokens {
		w.uint(uint64(t))
	}
	w.str("block_size").int(int64(s.blockSize))
	w.str("lora_id")
	optInt(w, s.loraID)
	w.str("medium")
	optStr(w, s.medium)
	w.str("lora_name")
	optStr(w, s.loraName)
	if s.extraKeys != nil {
		w.str("extra_keys")
		s.extraKeys(w)
	}
	if s.groupIdx != nil {
		w.str("group_idx").int(*s.groupIdx)
	}
	if s.specKind != nil {
		w.str("kv_cache_spec_kind").str(*s.specKind)
	}
	if s.specWindow != nil {
		w.str("kv_cache_spec_sliding_window").int(*s.specWindow)
	}
}

// vllmRemoved is a BlockRemoved (group_idx has a default).
type vllmRemoved struct {
	hashes   []uint64
	medium   *string
	groupIdx *int64
}

func (s vllmRemoved) write(w *mpw) {
	n := 3
	if s.groupIdx != nil {
		n++
	}
	w.mapHdr(n).str("type").str("BlockRemoved")
	w.str("block_hashes").uints(s.hashes)
	w.str("medium")
	optStr(w, s.medium)
	if s.groupIdx != nil {
		w.str("group_idx").int(*s.groupIdx)
	}
}

// vllmBatch writes an EventBatch {ts, events, data_parallel_rank} (the
// rank has a default and is omitted when nil).
func vllmBatch(ts float64, dpRank *int64, events ...func(w *mpw)) []byte {
	w := &mpw{}
	n := 2
	if dpRank != nil {
		n++
	}
	w.mapHdr(n).str("ts").float(ts).str("events").array(len(events))
	for _, e := range events {
		e(w)
	}
	if dpRank != nil {
		w.str("data_parallel_rank").int(*dpRank)
	}
	return w.b
}

func optUint(w *mpw, v *uint64) {
	if v == nil {
		w.nil()
	} else {
		w.uint(*v)
	}
}

func optInt(w *mpw, v *int64) {
	if v == nil {
		w.nil()
	} else {
		w.int(*v)
	}
}

func optStr(w *mpw, v *string) {
	if v == nil {
		w.nil()
	} else {
		w.str(*v)
	}
}

func ptr[T any](v T) *T { return &v }

// TestDecodeVLLMMapForm decodes payloads written field by field as current
// vLLM's kv_events.py declares them (EventBatch{ts, events,
// data_parallel_rank}; BlockStored, BlockRemoved, AllBlocksCleared as maps
// tagged by "type"; integer hashes), every field present and absent.
func TestDecodeVLLMMapForm(t *testing.T) {
	allFields := vllmStored{
		// Hashes of every integer width msgspec may choose, and bit 63.
		hashes:    []uint64{0x7f, 0xcc, 0xbeef, 0xdeadbeef, 0x8000000000000001, 0xffffffffffffffff},
		parent:    ptr(uint64(0x0123456789abcdef)),
		tokens:    []uint32{0, 127, 128, 255, 256, 65535, 65536, 151643}, // fixint, uint8, uint16, uint32
		blockSize: 1, loraID: ptr(int64(3)), medium: ptr("CPU"), loraName: ptr("adapter-1"),
		// Per block: nil, a LoRA name and cache salt, a multimodal hash with
		// its offset, nested deeper (skipped, whatever they hold).
		extraKeys: func(w *mpw) {
			w.array(6).nil()
			w.array(2).str("adapter-1").str("salt")
			w.array(1).array(2).str("mm-0123").uint(40)
			w.array(1).array(2).array(1).float(0.5).int(-7)
			w.nil().nil()
		},
		groupIdx: ptr(int64(2)), specKind: ptr("sliding_window"), specWindow: ptr(int64(4096)),
	}
	want := Event{Kind: KindBlockStored, BlockHashes: allFields.hashes, Parent: 0x0123456789abcdef, HasParent: true,
		TokenIDs: allFields.tokens, BlockSize: 1, LoRAID: 3, HasLoRAID: true, LoRAName: "adapter-1",
		Medium: kvindex.TierCPU, Group: 2, GroupKind: kvindex.GroupSlidingWindow, HasGroupKind: true, Window: 4096}

	minimal := vllmStored{hashes: []uint64{1 << 40}, tokens: []uint32{5, 6}, blockSize: 2}
	wantMinimal := Event{Kind: KindBlockStored, BlockHashes: []uint64{1 << 40}, TokenIDs: []uint32{5, 6},
		BlockSize: 2, Medium: kvindex.TierGPU}

	tests := []struct {
		name    string
		payload []byte
		want    Batch
	}{
		{"BlockStored with every field", vllmBatch(1700000000.25, ptr(int64(1)), allFields.write),
			Batch{TS: 1700000000.25, DPRank: 1, HasDPRank: true, Events: []Event{want}}},
		{"BlockStored with defaults omitted and nil optionals, no dp rank", vllmBatch(2, nil, minimal.write),
			Batch{TS: 2, Events: []Event{wantMinimal}}},
		{"BlockStored on GPU, full attention, group 0, extra keys all nil",
			vllmBatch(3, ptr(int64(0)), vllmStored{hashes: []uint64{9}, tokens: []uint32{1}, blockSize: 1, medium: ptr("GPU"),
				groupIdx: ptr(int64(0)), specKind: ptr("full_attention"), extraKeys: func(w *mpw) { w.array(1).nil() }}.write),
			Batch{TS: 3, HasDPRank: true, Events: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{9}, TokenIDs: []uint32{1},
				BlockSize: 1, Medium: kvindex.TierGPU, HasGroupKind: true, GroupKind: kvindex.GroupFullAttention}}}},
		{"mamba group", vllmBatch(4, nil, vllmStored{hashes: []uint64{9}, tokens: []uint32{1}, blockSize: 1,
			groupIdx: ptr(int64(1)), specKind: ptr("mamba")}.write),
			Batch{TS: 4, Events: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{9}, TokenIDs: []uint32{1},
				BlockSize: 1, Medium: kvindex.TierGPU, Group: 1, HasGroupKind: true, GroupKind: kvindex.GroupState}}}},
		{"BlockRemoved with and without group_idx, then AllBlocksCleared", vllmBatch(5, ptr(int64(7)),
			vllmRemoved{hashes: []uint64{0xffffffffffffffff, 1}, medium: ptr("GPU"), groupIdx: ptr(int64(1))}.write,
			vllmRemoved{hashes: []uint64{42}}.write,
			func(w *mpw) { w.mapHdr(1).str("type").str("AllBlocksCleared") }),
			Batch{TS: 5, DPRank: 7, HasDPRank: true, Events: []Event{
				{Kind: KindBlockRemoved, BlockHashes: []uint64{0xffffffffffffffff, 1}, Medium: kvindex.TierGPU, Group: 1},
				{Kind: KindBlockRemoved, BlockHashes: []uint64{42}, Medium: kvindex.TierGPU},
				{Kind: KindAllBlocksCleared, Medium: kvindex.TierGPU},
			}}},
		{"storage medium", vllmBatch(6, nil, vllmRemoved{hashes: []uint64{3}, medium: ptr("DISK")}.write),
			Batch{TS: 6, Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{3}, Medium: kvindex.TierStorage}}}},
	}
	var b Batch // reused across cases: slots and slices left from the last batch must not leak
	for _, tc := range tests {
		if err := Decode(tc.payload, &b); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		// extra_keys are kept raw, one entry per stored block (their
		// meaning is tested in the mapper); compare the rest.
		got := b
		got.Events = append([]Event(nil), b.Events...)
		for i := range got.Events {
			if n := len(got.Events[i].ExtraKeys); n != 0 && n != len(got.Events[i].BlockHashes) {
				t.Errorf("%s: %d extra_keys entries for %d blocks", tc.name, n, len(got.Events[i].BlockHashes))
			}
			got.Events[i].ExtraKeys = nil
		}
		for i := range tc.want.Events {
			tc.want.Events[i].ExtraKeys = nil
		}
		if got, want := fmt.Sprintf("%+v", got), fmt.Sprintf("%+v", tc.want); got != want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, want)
		}
	}
}

// TestDecodeVLLMMapFormAllocs: decoding vLLM's map form allocates nothing
// once the batch's buffers have grown (a lora_name costs its string).
func TestDecodeVLLMMapFormAllocs(t *testing.T) {
	for name, p := range map[string][]byte{"map-int": benchMapPayloads(1)[0], "array-bin32": benchPayloads(t, 1)[0]} {
		var b Batch
		if err := Decode(p, &b); err != nil {
			t.Fatal(err)
		}
		if allocs := testing.AllocsPerRun(100, func() {
			if err := Decode(p, &b); err != nil {
				t.Fatal(err)
			}
		}); allocs != 0 {
			t.Errorf("%s: %v allocs per decode, want 0", name, allocs)
		}
		if len(b.Events) != 1 || len(b.Events[0].BlockHashes) != 16 || len(b.Events[0].TokenIDs) != 256 {
			t.Errorf("%s: decoded %+v", name, b)
		}
	}
}

// TestDecodeVLLMMapFormErrors: a bad value names its field.
func TestDecodeVLLMMapFormErrors(t *testing.T) {
	for field, ev := range map[string]func(w *mpw){
		"block_size": vllmStored{hashes: []uint64{1}, tokens: []uint32{1}, blockSize: 0}.write,
		"group_idx":  vllmStored{hashes: []uint64{1}, tokens: []uint32{1}, blockSize: 1, groupIdx: ptr(int64(99))}.write,
		"kv_cache_spec_sliding_window": vllmStored{hashes: []uint64{1}, tokens: []uint32{1}, blockSize: 1,
			specWindow: ptr(int64(-1))}.write,
		"medium": func(w *mpw) { w.mapHdr(2).str("type").str("BlockRemoved").str("medium").uint(1) },
	} {
		var b Batch
		err := Decode(vllmBatch(1, nil, ev), &b)
		if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v, want a malformed-payload error naming the field", field, err)
		}
	}
}
