package sched

import (
	"math"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// pick runs a policy through the Scheduler, which hands it only the
// candidates, and returns the chosen endpoint's index in s.
func pick(p Policy, r *Request, s *Snapshot) int {
	return (&Scheduler{Policy: p}).Decide(r, s).Prefill
}

// snapOf builds a snapshot of prefill-capable endpoints at 10 000 tokens/s
// with block size 64.
func snapOf(eps ...Endpoint) *Snapshot {
	for i := range eps {
		if eps[i].PrefillSpeed == 0 {
			eps[i].PrefillSpeed = 10000
		}
		if eps[i].Name == "" {
			eps[i].Name = string(rune('a' + i))
		}
	}
	return &Snapshot{BlockSize: 64, Endpoints: eps}
}

func req(prompt int) *Request {
	return &Request{PromptTokens: prompt, PromptBlocks: prompt / 64, SLO: SLO{TTFT: 2}}
}

func mustNew(t *testing.T, name string, o Options) Policy {
	t.Helper()
	p, err := New(name, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyChoices(t *testing.T) {
	tests := []struct {
		name   string
		policy string
		opts   Options
		req    *Request
		snap   *Snapshot
		want   int
	}{
		{"least-queue takes the queue that empties first", "least-queue", Options{}, req(6400),
			snapOf(Endpoint{FreeAt: 5, QueueWait: 1}, Endpoint{FreeAt: 3}, Endpoint{FreeAt: 4}), 1},
		{"least-queue skips decode-only endpoints", "least-queue", Options{}, req(6400),
			snapOf(Endpoint{FreeAt: 5}, Endpoint{Role: fleet.RoleDecode}), 0},
		{"cache-only takes the longest prefix even behind a long queue", "cache-only", Options{}, req(6400),
			snapOf(Endpoint{CachedTokens: 640}, Endpoint{CachedTokens: 6400, QueueWait: 30, FreeAt: 30}), 1},
		{"cache-only breaks ties by the queue", "cache-only", Options{}, req(6400),
			snapOf(Endpoint{CachedTokens: 640, FreeAt: 2}, Endpoint{CachedTokens: 640, FreeAt: 1}), 1},
		{"predicted-ttft trades hits for queue", "predicted-ttft", Options{}, req(6400),
			// a: 0.3 s queue + 0 s compute; b: idle, 0.576 s compute.
			snapOf(Endpoint{CachedTokens: 6400, QueueWait: 0.3}, Endpoint{CachedTokens: 640}), 0},
		{"predicted-ttft leaves a hot endpoint", "predicted-ttft", Options{}, req(6400),
			snapOf(Endpoint{CachedTokens: 6400, QueueWait: 0.7}, Endpoint{CachedTokens: 640}), 1},
		{"sglang balanced: best prefix over threshold", "sglang-cache-aware", Options{}, req(6400),
			snapOf(Endpoint{InflightRequests: 3}, Endpoint{CachedTokens: 3200, InflightRequests: 10}), 1},
		{"sglang balanced: low match rate goes to least loaded", "sglang-cache-aware", Options{}, req(6400),
			snapOf(Endpoint{InflightRequests: 3}, Endpoint{CachedTokens: 640, InflightRequests: 10}), 0},
		{"sglang imbalanced (abs and rel exceeded): shortest queue", "sglang-cache-aware", Options{}, req(6400),
			snapOf(Endpoint{InflightRequests: 10}, Endpoint{CachedTokens: 6400, InflightRequests: 100}), 0},
		{"sglang gap over abs but under rel stays cache-aware", "sglang-cache-aware", Options{}, req(6400),
			snapOf(Endpoint{InflightRequests: 200}, Endpoint{CachedTokens: 6400, InflightRequests: 280}), 1},
		{"llm-d affinity keeps the sticky endpoint while the gate is closed", "llmd-token-aware", Options{}, req(6400),
			// sticky: 9000 in-flight uncached tokens = 0.9 s; other idle: gap 0.9 s < 1 s penalty.
			snapOf(Endpoint{CachedTokens: 6400, InflightUncached: 9000}, Endpoint{}), 0},
		{"llm-d gate opens past the penalty", "llmd-token-aware", Options{}, req(6400),
			snapOf(Endpoint{CachedTokens: 6400, InflightUncached: 11000}, Endpoint{}), 1},
		{"llm-d token load among sticky endpoints", "llmd-token-aware", Options{}, req(6400),
			snapOf(Endpoint{CachedTokens: 6400, InflightUncached: 5000}, Endpoint{CachedTokens: 5760, InflightUncached: 1000}, Endpoint{}), 1},
		{"llm-d below affinity threshold scores everyone by token load", "llmd-token-aware", Options{}, req(6400),
			snapOf(Endpoint{CachedTokens: 3200, InflightUncached: 5000}, Endpoint{InflightUncached: 0}), 1},
		{"llm-d decode-bound variant scores active requests", "llmd-token-aware", Options{LLMDDecodeBound: true}, req(6400),
			snapOf(Endpoint{InflightRequests: 5, InflightUncached: 0}, Endpoint{InflightRequests: 2, InflightUncached: 9000}), 1},
		{"dynamo overlap credit beats a small load", "dynamo-kv", Options{}, req(6400),
			// a: 1*(10+100-100)+50+100 = 160; b: 1*(0+100-10)+0+100 = 190.
			snapOf(Endpoint{CachedTokens: 6400, ActivePrefillBlocks: 10, ActiveDecodeBlocks: 50}, Endpoint{CachedTokens: 640}), 0},
		{"dynamo load outweighs overlap", "dynamo-kv", Options{}, req(6400),
			snapOf(Endpoint{CachedTokens: 6400, ActivePrefillBlocks: 10, ActiveDecodeBlocks: 150}, Endpoint{CachedTokens: 640}), 1},
		{"blend prefers the cached endpoint at equal load", "llmd-weighted-blend", Options{}, req(6400),
			snapOf(Endpoint{InflightRequests: 2}, Endpoint{CachedTokens: 6400, InflightRequests: 2}), 1},
		{"blend's queue score overrides a weak match", "llmd-weighted-blend", Options{}, req(6400),
			snapOf(Endpoint{InflightRequests: 0}, Endpoint{CachedTokens: 640, InflightRequests: 20}), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, tt.policy, tt.opts)
			if got := pick(p, tt.req, tt.snap); got != tt.want {
				t.Errorf("%s picked %d, want %d", tt.policy, got, tt.want)
			}
		})
	}
}

func TestRoundRobinAndRandom(t *testing.T) {
	s := snapOf(Endpoint{}, Endpoint{Role: fleet.RoleDecode}, Endpoint{}, Endpoint{})
	rr := mustNew(t, "round-robin", Options{})
	var got []int
	for range 6 {
		got = append(got, pick(rr, req(64), s))
	}
	want := []int{0, 2, 3, 0, 2, 3}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("round-robin order %v, want %v", got, want)
		}
	}
	rnd := mustNew(t, "random", Options{Seed: 7})
	seen := map[int]int{}
	for range 3000 {
		seen[pick(rnd, req(64), s)]++
	}
	if seen[1] != 0 || len(seen) != 3 {
		t.Fatalf("random must pick every prefill endpoint and never the decode one: %v", seen)
	}
	for i, c := range seen {
		if c < 800 {
			t.Errorf("random picked %d only %d times of 3000", i, c)
		}
	}
}

func TestNoCandidates(t *testing.T) {
	s := snapOf(Endpoint{Role: fleet.RoleDecode})
	for _, n := range Names() {
		if got := pick(mustNew(t, n, Options{}), req(640), s); got != -1 {
			t.Errorf("%s picked %d from a fleet without prefill endpoints", n, got)
		}
	}
	sc := Scheduler{Policy: mustNew(t, "least-queue", Options{})}
	if d := sc.Decide(req(640), s); d.Admit || d.Reason == "" {
		t.Errorf("want a rejection with a reason, got %+v", d)
	}
}

func TestUnknownPolicy(t *testing.T) {
	_, err := New("fastest", Options{})
	if err == nil || !strings.Contains(err.Error(), "predicted-ttft") {
		t.Fatalf("want an error listing the known policies, got %v", err)
	}
}

func TestEarlyRejection(t *testing.T) {
	s := snapOf(Endpoint{QueueWait: 1.9, CachedTokens: 0}, Endpoint{QueueWait: 2.5, CachedTokens: 6400})
	sc := Scheduler{Policy: mustNew(t, "predicted-ttft", Options{}), EarlyReject: true}
	d := sc.Decide(req(6400), s) // a: 1.9 + 0.64 = 2.54 s; b: 2.5 s; both > 2 s
	if d.Admit || !strings.Contains(d.Reason, "TTFT") {
		t.Fatalf("want a TTFT rejection, got %+v", d)
	}
	sc.EarlyReject = false
	if d := sc.Decide(req(6400), s); !d.Admit || d.Prefill != 1 || d.PredictedTTFT != 2.5 {
		t.Fatalf("without early rejection the request is admitted to b, got %+v", d)
	}
	ok := snapOf(Endpoint{QueueWait: 0.5})
	sc.EarlyReject = true
	if d := sc.Decide(req(6400), ok); !d.Admit || math.Abs(d.PredictedTTFT-1.14) > 1e-9 {
		t.Fatalf("want admission with predicted TTFT 1.14, got %+v", d)
	}
}

func TestDecodeChoiceAndAdmission(t *testing.T) {
	s := snapOf(
		Endpoint{Role: fleet.RolePrefill},
		Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 100, DecodeTPOT: 0.01},
		Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 100000, DecodeTPOT: 0.04, DecodeStreams: 9},
		Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 100000, DecodeTPOT: 0.03, DecodeStreams: 12},
	)
	r := req(6400)
	r.OutputTokens = 500
	r.SLO.TPOT = 0.05
	sc := Scheduler{Policy: mustNew(t, "least-queue", Options{}), EarlyReject: true}
	d := sc.Decide(r, s)
	if !d.Admit || d.Prefill != 0 || d.Decode != 3 {
		t.Fatalf("want prefill 0 and decode 3 (room, lowest TPOT), got %+v", d)
	}
	r.SLO.TPOT = 0.02
	if d := sc.Decide(r, s); d.Admit || !strings.Contains(d.Reason, "TPOT") {
		t.Fatalf("want a TPOT rejection, got %+v", d)
	}
	// A TPOT not yet learned from the endpoint's own streams rejects
	// nothing: it is other endpoints' (the predictor's pool's).
	s.Endpoints[3].DecodeUnproven = 16
	if d := sc.Decide(r, s); !d.Admit || d.Decode != 3 {
		t.Fatalf("want an unproven endpoint's TPOT not to reject, got %+v", d)
	}
	// An unproven endpoint with as many streams as it still needs has
	// enough in flight to prove itself: the others with room go first.
	s.Endpoints[3].DecodeUnproven = 12
	if d := sc.Decide(r, s); d.Admit || d.Decode != 2 || !strings.Contains(d.Reason, "TPOT") {
		t.Fatalf("want the proven endpoint 2 chosen (and missing the target), got %+v", d)
	}
	s.Endpoints[3].DecodeUnproven = 0
	// The proven choice misses the target, but an unproven endpoint with
	// room, predicted higher by its pool, is tried instead of rejecting;
	// the fewest streams first, and only while it has fewer streams than
	// it still needs. Without room it is not.
	s.Endpoints[2].DecodeUnproven = 16
	if d := sc.Decide(r, s); !d.Admit || d.Decode != 2 || d.PredictedTPOT != 0.04 {
		t.Fatalf("want the unproven endpoint 2 tried, got %+v", d)
	}
	s.Endpoints = append(s.Endpoints, Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 100000, DecodeTPOT: 0.05, DecodeStreams: 3, DecodeUnproven: 16})
	if d := sc.Decide(r, s); !d.Admit || d.Decode != 4 {
		t.Fatalf("want the unproven endpoint with the fewest streams (4), got %+v", d)
	}
	s.Endpoints[4].DecodeUnproven = 3
	if d := sc.Decide(r, s); !d.Admit || d.Decode != 2 {
		t.Fatalf("want endpoint 4, with the 3 streams it needs, passed over for 2, got %+v", d)
	}
	s.Endpoints[2].KVFreeTokens, s.Endpoints[4].KVFreeTokens = 100, 100
	if d := sc.Decide(r, s); d.Admit || !strings.Contains(d.Reason, "TPOT") {
		t.Fatalf("unproven endpoints without room: want the TPOT rejection, got %+v", d)
	}
	full := snapOf(Endpoint{Role: fleet.RolePrefill}, Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 10, DecodeUnproven: 16})
	if d := sc.Decide(r, full); d.Admit || !strings.Contains(d.Reason, "KV") {
		t.Fatalf("want a KV-room rejection, unproven or not, got %+v", d)
	}
}

func TestNamesComplete(t *testing.T) {
	want := []string{"random", "round-robin", "least-queue", "cache-only", "predicted-ttft",
		"sglang-cache-aware", "sglang-least-load", "llmd-token-aware", "llmd-weighted-blend", "dynamo-kv", "kvgate"}
	got := strings.Join(Names(), ",")
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("policy %s missing from %s", w, got)
		}
	}
	if Names()[len(Names())-1] != "kvgate" {
		t.Error("kvgate's own policy should come last")
	}
}

type fakeForecast struct{ free, calls int }

func (f *fakeForecast) ForecastDecode(e int, at float64, req *Request) (int, float64) {
	f.calls++
	return f.free, 0.02
}

// TestDecodeForecast: decode room is judged when the prefill ends.
func TestDecodeForecast(t *testing.T) {
	r := req(6400)
	r.OutputTokens = 500
	r.SLO.TPOT = 0.05
	full := func() *Snapshot {
		return snapOf(Endpoint{Role: fleet.RolePrefill, QueueWait: 1}, Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 10, DecodeTPOT: 0.02})
	}
	sc := Scheduler{Policy: mustNew(t, "least-queue", Options{}), EarlyReject: true}
	if d := sc.Decide(r, full()); d.Admit {
		t.Fatalf("a full decode endpoint must reject without a forecast: %+v", d)
	}
	s := full()
	f := &fakeForecast{free: 100000}
	s.Forecast = f
	if d := sc.Decide(r, s); !d.Admit || d.Decode != 1 || f.calls != 1 {
		t.Fatalf("room at the end of the prefill admits: %+v (calls %d)", d, f.calls)
	}
	s = full()
	s.Endpoints[1].KVFreeTokens = 100000
	s.Forecast = &fakeForecast{free: 0}
	if d := sc.Decide(r, s); d.Admit {
		t.Fatalf("no room at the end of the prefill rejects: %+v", d)
	}
}

// TestKVTokens: a request's sequences share the prompt's KV and each
// holds its own output's; sums and products that overflow are refused.
func TestKVTokens(t *testing.T) {
	const maxInt = int(^uint(0) >> 1)
	for _, tc := range []struct {
		prompt, out, seqs, want int
		ok                      bool
	}{
		{6400, 500, 0, 6900, true},
		{6400, 500, 1, 6900, true},
		{6400, 500, 8, 10400, true},
		{6400, maxInt / 4, 8, 0, false},
		{maxInt, 1, 1, 0, false},
		{6400, -1, 8, 0, false},
	} {
		r := Request{PromptTokens: tc.prompt, OutputTokens: tc.out, Sequences: tc.seqs}
		if got, ok := r.KVTokens(); got != tc.want || ok != tc.ok {
			t.Errorf("%d + %d × %d: got %d %v, want %d %v", tc.prompt, tc.out, tc.seqs, got, ok, tc.want, tc.ok)
		}
	}
	// Decode admission asks room for every sequence.
	s := snapOf(Endpoint{Role: fleet.RolePrefill}, Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 8000, DecodeTPOT: 0.01})
	r := req(6400)
	r.OutputTokens = 500
	sc := Scheduler{Policy: mustNew(t, "least-queue", Options{}), EarlyReject: true}
	if d := sc.Decide(r, s); !d.Admit {
		t.Fatalf("one sequence fits 8 000 tokens of room: %+v", d)
	}
	r.Sequences = 4
	if d := sc.Decide(r, s); d.Admit || !strings.Contains(d.Reason, "KV") {
		t.Fatalf("four sequences need 8 400 tokens: want a KV-room rejection, got %+v", d)
	}
}
