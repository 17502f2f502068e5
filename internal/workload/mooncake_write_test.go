package workload

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// TestWriteMooncakeRoundTrip: generated workloads written as Mooncake
// traces read back with the same arrivals (from the first, to the
// microsecond), lengths, and prefix sharing: two requests share exactly
// as many leading 512-token hash blocks as they share whole groups of
// leading keys.
func TestWriteMooncakeRoundTrip(t *testing.T) {
	docs := LongDocs()
	docs.Rate, docs.Duration, docs.Seed = 4, 20, 3
	dtr, err := Docs(docs)
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := Chat(ChatConfig{Systems: 3, Sessions: 20, SystemTokens: 1500, TurnTokens: 300, OutputTokens: 50, Rate: 20, Duration: 10, BlockSize: 64, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range []*Trace{dtr, ctr} {
		var buf bytes.Buffer
		if err := WriteMooncake(&buf, tr); err != nil {
			t.Fatal(err)
		}
		back, err := ReadMooncake(&buf, 1)
		if err != nil {
			t.Fatalf("%s: %v", tr.Name, err)
		}
		if len(back.Requests) != len(tr.Requests) {
			t.Fatalf("%s: %d requests back, want %d", tr.Name, len(back.Requests), len(tr.Requests))
		}
		per := MooncakeBlockTokens / tr.BlockSize
		first := tr.Requests[0].Arrival
		shared := 0
		for i := range tr.Requests {
			a, b := &tr.Requests[i], &back.Requests[i]
			if math.Abs(b.Arrival-(a.Arrival-first)) > 1e-6 || a.PromptTokens != b.PromptTokens || a.OutputTokens != b.OutputTokens {
				t.Fatalf("%s request %d: %+v back as %+v", tr.Name, i, *a, *b)
			}
			if len(b.Keys) != a.PromptTokens/MooncakeBlockTokens {
				t.Fatalf("%s request %d: %d hash blocks back for %d tokens", tr.Name, i, len(b.Keys), a.PromptTokens)
			}
			for j := max(0, i-40); j < i; j++ {
				want := commonPrefix(a.Keys, tr.Requests[j].Keys) / per
				if got := commonPrefix(b.Keys, back.Requests[j].Keys); got != want {
					t.Fatalf("%s requests %d and %d: share %d hash blocks, want %d", tr.Name, j, i, got, want)
				}
				shared += want
			}
		}
		if shared == 0 {
			t.Fatalf("%s: no request shares a hash block with another: the test checks nothing", tr.Name)
		}
	}
}

// TestWriteMooncakeTails: a prompt's last, partial hash block is shared
// where the keys in it are, and otherwise is its own; blocks that do not
// divide 512 tokens are refused.
func TestWriteMooncakeTails(t *testing.T) {
	tr := &Trace{Name: "t", BlockSize: 256, Requests: []Request{
		{Arrival: 0, PromptTokens: 700, Keys: []uint64{1, 2}},        // blocks [1 2], tail [] of 188 tokens
		{Arrival: 0.5, PromptTokens: 700, Keys: []uint64{1, 2}},      // the same: its tail has no key, its own id
		{Arrival: 1, PromptTokens: 800, Keys: []uint64{1, 2, 3}},     // tail [3] of 288 tokens
		{Arrival: 1.5, PromptTokens: 800, Keys: []uint64{1, 2, 3}},   // the same tail: shared
		{Arrival: 2, PromptTokens: 1100, Keys: []uint64{1, 2, 3, 4}}, // [3 4] full, then a tail without a key
	}}
	var buf bytes.Buffer
	if err := WriteMooncake(&buf, tr); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"timestamp": 0.000, "input_length": 700, "output_length": 0, "hash_ids": [0,1]}`,
		`{"timestamp": 500.000, "input_length": 700, "output_length": 0, "hash_ids": [0,2]}`,
		`{"timestamp": 1000.000, "input_length": 800, "output_length": 0, "hash_ids": [0,3]}`,
		`{"timestamp": 1500.000, "input_length": 800, "output_length": 0, "hash_ids": [0,3]}`,
		`{"timestamp": 2000.000, "input_length": 1100, "output_length": 0, "hash_ids": [0,4,5]}`,
	}
	if got := strings.Split(strings.TrimSpace(buf.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	tr.BlockSize = 96
	if err := WriteMooncake(&buf, tr); err == nil || !strings.Contains(err.Error(), "do not divide 512") {
		t.Fatalf("96-token blocks: %v", err)
	}
}

func commonPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
