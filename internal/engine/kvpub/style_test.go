package kvpub

import (
	"context"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestStyleLLMDSim: in llm-d-inference-sim's style the first batch is
// numbered 1 and a chain start carries parent 0 in the array form (nil in
// the map form); vLLM's style numbers from 0 with a nil parent.
func TestStyleLLMDSim(t *testing.T) {
	one := uint64(7)
	events := []Event{
		&BlockStored{Hashes: []uint64{1}, TokenIDs: make([]uint32, 4), BlockSize: 4},
		&BlockStored{Hashes: []uint64{2}, Parent: &one, TokenIDs: make([]uint32, 4), BlockSize: 4},
	}
	tests := []struct {
		style    Style
		format   Format
		firstSeq uint64
		parent0  any // decoded parent of the chain start
	}{
		{StyleVLLM, FormatArray, 0, nil},
		{StyleVLLM, FormatMap, 0, nil},
		{StyleLLMDSim, FormatArray, 1, uint64(0)},
		{StyleLLMDSim, FormatMap, 1, nil},
	}
	for _, tc := range tests {
		t.Run(tc.style.String()+"/"+tc.format.String(), func(t *testing.T) {
			p, err := New(context.Background(), Config{Endpoint: "tcp://127.0.0.1:0", Format: tc.format, Style: tc.style})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if err := p.Publish(1, events); err != nil {
				t.Fatal(err)
			}
			bs := p.buffered(0)
			if len(bs) != 1 || bs[0].seq != tc.firstSeq || p.Seq() != tc.firstSeq+1 {
				t.Fatalf("batches %v, next seq %d; want first seq %d", bs, p.Seq(), tc.firstSeq)
			}
			var batch []any
			if err := msgpack.Unmarshal(bs[0].payload, &batch); err != nil {
				t.Fatal(err)
			}
			evs := batch[1].([]any)
			parent := func(ev any) any {
				if m, ok := ev.(map[string]any); ok {
					return m["parent_block_hash"]
				}
				return ev.([]any)[2]
			}
			got0, got1 := parent(evs[0]), parent(evs[1])
			if !sameUint(got0, tc.parent0) || !sameUint(got1, uint64(7)) {
				t.Errorf("parents %#v, %#v; want %#v, 7", got0, got1, tc.parent0)
			}
			if _, err := ParseStyle(tc.style.String()); err != nil {
				t.Error(err)
			}
		})
	}
	if _, err := ParseStyle("sglang"); err == nil {
		t.Error("ParseStyle accepted an unknown style")
	}
}

// sameUint compares a decoded msgpack value with want (nil or uint64),
// whatever integer width the decoder chose.
func sameUint(v, want any) bool {
	if want == nil || v == nil {
		return v == want
	}
	var got uint64
	switch x := v.(type) {
	case uint8:
		got = uint64(x)
	case uint16:
		got = uint64(x)
	case uint32:
		got = uint64(x)
	case uint64:
		got = x
	case int8:
		got = uint64(x)
	case int64:
		got = uint64(x)
	default:
		return false
	}
	return got == want.(uint64)
}
