package sched

import (
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

type constForecast struct{ free int }

func (c constForecast) ForecastDecode(int, float64, *Request) (int, float64) { return c.free, 0.02 }

// TestDecideDoesNotWrite: a snapshot (with decode endpoints and a
// forecast) and a request are the same after Decide as before.
func TestDecideDoesNotWrite(t *testing.T) {
	for _, name := range Names() {
		s := snapOf(Endpoint{Role: fleet.RolePrefill, QueueWait: 0.1}, Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 5},
			Endpoint{Role: fleet.RolePrefill, CachedTokens: 640}, Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 7})
		s.Forecast = constForecast{free: 1 << 20}
		before := *s
		before.Endpoints = append([]Endpoint(nil), s.Endpoints...)
		r := &Request{PromptTokens: 6400, PromptBlocks: 100}
		rb := *r
		sc := Scheduler{Policy: mustNew(t, name, Options{}), EarlyReject: true, DefaultSLO: SLO{TTFT: 2}, Explain: true}
		d := sc.Decide(r, s)
		if !reflect.DeepEqual(before.Endpoints, s.Endpoints) || *r != rb {
			t.Fatalf("%s: Decide wrote to its input", name)
		}
		if !d.Admit || s.Endpoints[d.Prefill].Role != fleet.RolePrefill || s.Endpoints[d.Decode].Role != fleet.RoleDecode {
			t.Fatalf("%s: %+v", name, d)
		}
		if d.SLO.TTFT != 2 {
			t.Fatalf("%s: default SLO not applied: %+v", name, d.SLO)
		}
	}
}

func TestDefaultSLOFillsOnlyMissingFields(t *testing.T) {
	sc := Scheduler{DefaultSLO: SLO{TTFT: 2, TPOT: 0.05}}
	if got := sc.WithDefaults(SLO{TTFT: 10}); got != (SLO{TTFT: 10, TPOT: 0.05}) {
		t.Fatal(got)
	}
	// The request's own SLO decides admission, not the default.
	s := snapOf(Endpoint{QueueWait: 3})
	sc = Scheduler{Policy: mustNew(t, "predicted-ttft", Options{}), EarlyReject: true, DefaultSLO: SLO{TTFT: 2}}
	if d := sc.Decide(&Request{PromptTokens: 64, SLO: SLO{TTFT: 5}}, s); !d.Admit {
		t.Fatalf("5 s SLO, 3 s wait: %+v", d)
	}
	if d := sc.Decide(&Request{PromptTokens: 64}, s); d.Admit {
		t.Fatalf("default 2 s SLO, 3 s wait: %+v", d)
	}
}

func TestCostsExplainTheChoice(t *testing.T) {
	s := snapOf(Endpoint{Role: fleet.RoleDecode}, Endpoint{CachedTokens: 6400, QueueWait: 0.3}, Endpoint{CachedTokens: 640})
	for _, name := range []string{"predicted-ttft", "kvgate", "cache-only", "dynamo-kv", "llmd-token-aware"} {
		sc := Scheduler{Policy: mustNew(t, name, Options{}), Explain: true, DefaultSLO: SLO{TTFT: 2}}
		d := sc.Decide(req(6400), s)
		if len(d.Costs) != 3 || !math.IsNaN(d.Costs[0]) {
			t.Fatalf("%s: costs %v (decode endpoint must be NaN)", name, d.Costs)
		}
		best := 1
		if d.Costs[2] < d.Costs[1] {
			best = 2
		}
		if d.Prefill != best {
			t.Errorf("%s: picked %d but costs %v", name, d.Prefill, d.Costs)
		}
	}
}

// TestConcurrentDecide runs every policy from several goroutines on one
// shared snapshot (go test -race finds unguarded policy state).
func TestConcurrentDecide(t *testing.T) {
	r, s := benchFleet(16)
	for _, name := range Names() {
		sc := &Scheduler{Policy: mustNew(t, name, Options{DynamoTemperature: 0.5}), EarlyReject: true}
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					if d := sc.Decide(r, s); d.Prefill < 0 {
						t.Errorf("%s: no choice", name)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
}

// TestAdmissionUsesPessimisticTTFT: an endpoint the predictor is unsure of
// (PrefillSlack > 1) is judged by its pessimistic TTFT; a trusted one by
// its prediction.
func TestAdmissionUsesPessimisticTTFT(t *testing.T) {
	sc := Scheduler{Policy: mustNew(t, "predicted-ttft", Options{}), EarlyReject: true}
	r := &Request{PromptTokens: 15000, SLO: SLO{TTFT: 2}} // 1.5 s of compute at 10 000 tokens/s
	trusted := snapOf(Endpoint{QueueWait: 0.2})
	if d := sc.Decide(r, trusted); !d.Admit {
		t.Fatalf("1.7 s predicted against 2 s: %+v", d)
	}
	unsure := snapOf(Endpoint{QueueWait: 0.2, PrefillSlack: 1.5}) // 0.2 + 1.5 × 1.5 = 2.45 s
	d := sc.Decide(r, unsure)
	if d.Admit || !strings.Contains(d.Reason, "pessimistic 2.450s") || d.PredictedTTFT != 1.7 {
		t.Fatalf("pessimistic 2.45 s against 2 s: %+v", d)
	}
}

// TestPessimisticTTFTStretchesTheQueue: QueueSlack stretches the queue
// wait as PrefillSlack stretches the compute; 0 or 1 trusts it.
func TestPessimisticTTFTStretchesTheQueue(t *testing.T) {
	r := &Request{PromptTokens: 10000} // 1 s at 10 000 tokens/s
	for _, tc := range []struct {
		e    Endpoint
		want float64
	}{
		{Endpoint{QueueWait: 0.5}, 1.5},
		{Endpoint{QueueWait: 0.5, PrefillSlack: 1.5}, 2},
		{Endpoint{QueueWait: 0.5, PrefillSlack: 1.5, QueueSlack: 1.5}, 2.25},
		{Endpoint{QueueWait: 0.5, QueueSlack: 2}, 2},
		{Endpoint{QueueWait: 0.5, PrefillSlack: 0.5, QueueSlack: 0.5}, 1.5}, // below 1: trusted
	} {
		e := tc.e
		e.PrefillSpeed = 10000
		if got := PessimisticTTFT(r, &e); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%+v: %g, want %g", tc.e, got, tc.want)
		}
	}
}

// TestPessimisticRejectionFallsBack: a request the policy sends where only
// the pessimistic TTFT misses (an endpoint whose predictor grew unsure) is
// admitted where its pessimistic TTFT fits, not rejected; where none
// fits, or where even the prediction misses, it is rejected.
func TestPessimisticRejectionFallsBack(t *testing.T) {
	sc := Scheduler{Policy: mustNew(t, "cache-only", Options{}), EarlyReject: true}
	r := &Request{PromptTokens: 12000, PromptBlocks: 187, SLO: SLO{TTFT: 2}}
	// a holds most of the prompt (cache-only's choice): 0.2 s queue +
	// 0.2 s compute predicted, but unsure (×6: 2.4 s); b computes it all
	// (1.2 s) and is trusted.
	unsure := Endpoint{CachedTokens: 10000, QueueWait: 0.2, PrefillSlack: 6, QueueSlack: 6}
	for _, tc := range []struct {
		name  string
		b     Endpoint
		admit bool
		to    int
	}{
		{"a surer endpoint fits", Endpoint{}, true, 1},
		{"none fits", Endpoint{QueueWait: 1}, false, 0},
	} {
		s := snapOf(unsure, tc.b)
		d := sc.Decide(r, s)
		if d.Admit != tc.admit || d.Prefill != tc.to {
			t.Errorf("%s: %+v", tc.name, d)
		}
		if d.Admit && (d.PredictedTTFT != 1.2 || d.CachedTokens != 0 || d.Reason != "") {
			t.Errorf("%s: the decision describes the wrong endpoint: %+v", tc.name, d)
		}
	}
	// Even the prediction misses on a: rejected, no fallback.
	s := snapOf(Endpoint{CachedTokens: 10000, QueueWait: 1.9}, Endpoint{})
	if d := sc.Decide(r, s); d.Admit {
		t.Errorf("predicted 2.1 s on the chosen endpoint was admitted elsewhere: %+v", d)
	}
}

// TestStepSlackRejects: admission adds the endpoint's step slack (the
// delay the steps it shares bring its first token) to the pessimistic
// TTFT: 1.2 s of queue and 0.6 s of compute fit a 2 s SLO with 0.15 s of
// step slack, not with 0.25 s, for every policy.
func TestStepSlackRejects(t *testing.T) {
	for _, name := range []string{"kvgate", "cache-only", "predicted-ttft"} {
		sc := Scheduler{Policy: mustNew(t, name, Options{}), EarlyReject: true}
		for _, tc := range []struct {
			slack float64
			admit bool
		}{{0, true}, {0.15, true}, {0.25, false}} {
			s := snapOf(Endpoint{QueueWait: 1.2, StepSlack: tc.slack})
			d := sc.Decide(&Request{PromptTokens: 6000, PromptBlocks: 94, SLO: SLO{TTFT: 2}}, s)
			if d.Admit != tc.admit {
				t.Errorf("%s, step slack %v: admitted %v, want %v (%s)", name, tc.slack, d.Admit, tc.admit, d.Reason)
			}
		}
	}
}

// TestPrefillOnlyWithoutDecoder: in a fleet whose roles are changing, a
// prefill-only endpoint with no decode-only endpoint to hand its requests
// to is passed over for one that serves them alone, however much better
// it looks (it holds the whole prompt); with a decoder it is chosen.
func TestPrefillOnlyWithoutDecoder(t *testing.T) {
	for _, name := range []string{"kvgate", "cache-only", "llmd-token-aware"} {
		s := snapOf(Endpoint{Role: fleet.RolePrefill, CachedTokens: 6400}, Endpoint{Role: fleet.RoleBoth, QueueWait: 0.5})
		d := (&Scheduler{Policy: mustNew(t, name, Options{}), EarlyReject: true}).Decide(req(6400), s)
		if !d.Admit || d.Prefill != 1 || d.Decode != -1 {
			t.Errorf("%s without a decoder: admit %v prefill %d decode %d (%s), want the endpoint that serves alone", name, d.Admit, d.Prefill, d.Decode, d.Reason)
		}
		s = snapOf(Endpoint{Role: fleet.RolePrefill, CachedTokens: 6400}, Endpoint{Role: fleet.RoleBoth, QueueWait: 0.5},
			Endpoint{Role: fleet.RoleDecode, KVFreeTokens: 1 << 20})
		d = (&Scheduler{Policy: mustNew(t, name, Options{}), EarlyReject: true}).Decide(req(6400), s)
		if !d.Admit || d.Prefill != 0 || d.Decode != 2 {
			t.Errorf("%s with a decoder: admit %v prefill %d decode %d (%s), want 0 then 2", name, d.Admit, d.Prefill, d.Decode, d.Reason)
		}
	}
}
