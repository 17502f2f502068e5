package load

import (
	"math"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/sched"
)

type fixedCache []int

func (c fixedCache) CachedBlocks(_ []uint64, matched []int) { copy(matched, c) }

func snap(f *Fleet, now float64, prompt int, pc PrefixCache) (*sched.Snapshot, []*Endpoint) {
	s := &sched.Snapshot{BlockSize: 16}
	eps := f.Snapshot(now, prompt, nil, pc, nil, s)
	return s, eps
}

func TestQueueAccounting(t *testing.T) {
	f := New([]Info{{Name: "a", PrefillSpeed: 1000}, {Name: "b", PrefillSpeed: 1000}}, true)
	s, eps := snap(f, 0, 100, fixedCache{2, 0})
	if s.Endpoints[0].CachedTokens != 32 || s.Endpoints[1].CachedTokens != 0 {
		t.Fatalf("cached tokens %d %d", s.Endpoints[0].CachedTokens, s.Endpoints[1].CachedTokens)
	}
	a := eps[0]
	f1 := f.Route(a, 0, Work{Uncached: 1000, UncachedBlocks: 62, Keys: []uint64{1, 2, 3}, PrefillSeconds: 1})
	f2 := f.Route(a, 0.5, Work{Uncached: 500, UncachedBlocks: 31, Keys: []uint64{1, 2, 4}, PrefillSeconds: 0.5})
	s, _ = snap(f, 0.5, 100, nil)
	e := s.Endpoints[0]
	want := sched.Endpoint{Name: "a", PrefillSpeed: 1000, QueueWait: 1.0, FreeAt: 1.5, InflightUncached: 1500,
		InflightRequests: 2, ActivePrefillBlocks: 93, ActiveDecodeBlocks: 4, LastPicked: 0.5}
	if e != want {
		t.Fatalf("after two routes:\n got %+v\nwant %+v", e, want)
	}
	// The first prefill ends 0.2 s late: the second moves with it.
	f.PrefillDone(f1, 1.2)
	s, _ = snap(f, 1.2, 100, nil)
	if e := s.Endpoints[0]; e.QueueWait != 0.5 || e.InflightUncached != 500 || e.InflightRequests != 2 || e.ActivePrefillBlocks != 31 {
		t.Fatalf("after the first prefill: %+v", e)
	}
	if got := f.PredictedPrefillEnd(f2); got != 1.7 {
		t.Fatalf("second prefill predicted at %v, want 1.7", got)
	}
	f.Finish(f1, 2)
	f.Finish(f1, 2) // twice: no effect
	f.Finish(f2, 1.6)
	s, _ = snap(f, 3, 100, nil)
	if e := s.Endpoints[0]; e.QueueWait != 0 || e.FreeAt != 1.6 || e.InflightRequests != 0 || e.InflightUncached != 0 || e.ActiveDecodeBlocks != 0 {
		t.Fatalf("after both finish: %+v", e)
	}
}

func TestDisaggregatedFlight(t *testing.T) {
	f := New([]Info{{Name: "p", Role: fleet.RolePrefill, PrefillSpeed: 1000}, {Name: "d", Role: fleet.RoleDecode}}, false)
	_, eps := snap(f, 0, 10, nil)
	fl := f.Route(eps[0], 0, Work{Uncached: 10, Cached: 90, PrefillSeconds: 0.01})
	f.Decode(fl, eps[1])
	s, _ := snap(f, 0, 10, nil)
	if s.Endpoints[0].InflightRequests != 1 || s.Endpoints[1].DecodeStreams != 1 || s.Endpoints[1].InflightRequests != 1 {
		t.Fatalf("routed: %+v", s.Endpoints)
	}
	// Its 100 prompt tokens of KV arrive at the decode endpoint when the
	// prefill ends: reserved until then.
	if s.Endpoints[1].InboundKVTokens != 100 || s.Endpoints[0].InboundKVTokens != 0 {
		t.Fatalf("inbound KV while prefilling: %+v", s.Endpoints)
	}
	f.PrefillDone(fl, 0.01)
	s, _ = snap(f, 0.01, 10, nil)
	if s.Endpoints[0].InflightRequests != 0 || s.Endpoints[1].DecodeStreams != 1 || s.Endpoints[1].InboundKVTokens != 0 {
		t.Fatalf("prefilled: %+v", s.Endpoints)
	}
	// A flight that ends before its prefill (its client left) releases
	// its reservation too.
	gone := f.Route(eps[0], 1, Work{Uncached: 50})
	f.Decode(gone, eps[1])
	f.Finish(gone, 1.001)
	if s, _ = snap(f, 1.001, 10, nil); s.Endpoints[1].InboundKVTokens != 0 {
		t.Fatalf("after a flight gone before its prefill: %+v", s.Endpoints[1])
	}
	f.Finish(fl, 1)
	s, _ = snap(f, 1, 10, nil)
	if s.Endpoints[1].DecodeStreams != 0 || s.Endpoints[1].InflightRequests != 0 {
		t.Fatalf("finished: %+v", s.Endpoints)
	}
}

func TestExpireRetiresPredictedPrefills(t *testing.T) {
	f := New([]Info{{Name: "a", PrefillSpeed: 1000}}, false)
	_, eps := snap(f, 0, 0, nil)
	f.Route(eps[0], 0, Work{Uncached: 100, PrefillSeconds: 1})
	f.Route(eps[0], 0, Work{Uncached: 100, PrefillSeconds: 1})
	f.Expire(1.5)
	s, _ := snap(f, 1.5, 0, nil)
	if e := s.Endpoints[0]; e.InflightRequests != 1 || e.QueueWait != 0.5 || e.InflightUncached != 100 {
		t.Fatalf("%+v", e)
	}
	f.Expire(2)
	s, _ = snap(f, 2, 0, nil)
	if e := s.Endpoints[0]; e.InflightRequests != 0 || e.FreeAt != 2 {
		t.Fatalf("%+v", e)
	}
}

func TestSetKeepsStateAndDropsRemoved(t *testing.T) {
	f := New([]Info{{Name: "a"}, {Name: "b"}}, false)
	_, eps := snap(f, 0, 0, nil)
	fl := f.Route(eps[1], 0, Work{Uncached: 5, PrefillSeconds: 1})
	f.Set([]Info{{Name: "b", PrefillSpeed: 7}, {Name: "c"}})
	s, eps2 := snap(f, 0, 0, nil)
	if len(s.Endpoints) != 2 || s.Endpoints[0].Name != "b" || s.Endpoints[0].InflightRequests != 1 || s.Endpoints[0].PrefillSpeed != 7 {
		t.Fatalf("%+v", s.Endpoints)
	}
	if eps2[0] != eps[1] {
		t.Fatal("b must keep its tracker")
	}
	f.Finish(fl, 1)
	// A flight on a removed endpoint finishes without touching the fleet.
	fl2 := f.Route(eps[0], 0, Work{Uncached: 5, PrefillSeconds: 1})
	f.Set([]Info{{Name: "c"}})
	f.Finish(fl2, 2)
	if f.Len() != 1 {
		t.Fatal(f.Len())
	}
}

// TestConcurrentUse runs routes, completions and snapshots from many
// goroutines (go test -race) and checks that nothing leaks.
func TestConcurrentUse(t *testing.T) {
	f := New([]Info{{Name: "a", PrefillSpeed: 1000}, {Name: "b", PrefillSpeed: 1000}}, true)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s sched.Snapshot
			for i := range 500 {
				eps := f.Snapshot(float64(i), 100, nil, nil, nil, &s)
				fl := f.Route(eps[(g+i)%2], float64(i), Work{Uncached: 10, UncachedBlocks: 1, Keys: []uint64{uint64(i % 7)}, PrefillSeconds: 0.01})
				if i%3 == 0 {
					f.PrefillDone(fl, float64(i)+0.01)
				}
				f.Finish(fl, float64(i)+0.02)
			}
		}()
	}
	wg.Wait()
	var s sched.Snapshot
	f.Snapshot(1e6, 0, nil, nil, nil, &s)
	for _, e := range s.Endpoints {
		if e.InflightRequests != 0 || e.InflightUncached != 0 || e.ActivePrefillBlocks != 0 || e.ActiveDecodeBlocks != 0 || e.QueueWait != 0 {
			t.Fatalf("leak: %+v", e)
		}
	}
}

// TestConversationsDecay: an endpoint counts the conversations opened on
// it, each weighing exp(−age / ConversationMemory); other requests do not
// count.
func TestConversationsDecay(t *testing.T) {
	f := New([]Info{{Name: "a", PrefillSpeed: 1000}, {Name: "b", PrefillSpeed: 1000}}, false)
	_, eps := snap(f, 0, 100, nil)
	f.Route(eps[0], 0, Work{Uncached: 10, OpensConversation: true})
	f.Route(eps[0], 0, Work{Uncached: 10, OpensConversation: true})
	f.Route(eps[0], 5, Work{Uncached: 10}) // a later turn
	f.Route(eps[1], 5, Work{Uncached: 10})
	s, _ := snap(f, 5, 100, nil)
	want := 2 * math.Exp(-5/ConversationMemory)
	if got := s.Endpoints[0].Conversations; math.Abs(got-want) > 1e-12 {
		t.Fatalf("a: %v conversations, want %v", got, want)
	}
	if got := s.Endpoints[1].Conversations; got != 0 {
		t.Fatalf("b: %v conversations, want 0 (no request opened one)", got)
	}
	f.Route(eps[0], ConversationMemory, Work{Uncached: 10, OpensConversation: true})
	s, _ = snap(f, ConversationMemory, 100, nil)
	if got, want := s.Endpoints[0].Conversations, 1+2/math.E; math.Abs(got-want) > 1e-12 {
		t.Fatalf("a after one memory: %v, want %v", got, want)
	}
	// A clock that steps back (the gateway's wall clock) neither grows
	// nor loses the count.
	s, _ = snap(f, 1, 100, nil)
	if got, want := s.Endpoints[0].Conversations, 1+2/math.E; math.Abs(got-want) > 1e-12 {
		t.Fatalf("a read before its last opening: %v, want %v", got, want)
	}
}

// TestMeanPrefill: the snapshot carries the exponential average of the
// routed requests' predicted prefill seconds (the first sets it; each
// next moves it 1/MeanPrefillRequests of the way); a NaN, infinite or
// negative prediction does not count.
func TestMeanPrefill(t *testing.T) {
	f := New([]Info{{Name: "a", PrefillSpeed: 1000}}, false)
	if s, _ := snap(f, 0, 100, nil); s.MeanPrefill != 0 {
		t.Fatalf("before any route: %v, want 0 (unknown)", s.MeanPrefill)
	}
	_, eps := snap(f, 0, 100, nil)
	f.Route(eps[0], 0, Work{Uncached: 1000, PrefillSeconds: 1})
	f.Route(eps[0], 0, Work{Uncached: 3000, PrefillSeconds: 3})
	f.Route(eps[0], 0, Work{Uncached: 1, Cached: 3000, PrefillSeconds: 0.001, Touch: true}) // not a prefill's
	for _, bad := range []float64{math.NaN(), math.Inf(1), -1} {
		f.notePrefill(bad)
	}
	want := 1 + (3-1)/float64(MeanPrefillRequests)
	if s, _ := snap(f, 0, 100, nil); math.Abs(s.MeanPrefill-want) > 1e-12 {
		t.Fatalf("mean prefill %v, want %v", s.MeanPrefill, want)
	}
}

// TestLateHeadHoldsTheQueue: a queue whose head runs past its predicted
// end without a first token is predicted to empty as late again as the
// head already is plus the compute behind it, and is set right by the
// head's first token.
func TestLateHeadHoldsTheQueue(t *testing.T) {
	cases := []struct {
		name      string
		now       float64
		wantWait  float64 // queue wait at now, head A and B behind
		wantA     float64 // A's predicted end at now
		firstA    float64 // A's first token
		wantAfter float64 // queue wait at firstA
	}{
		// A (1 000 tokens, 900 counted cached: 0.1 s at 1 000 tokens/s)
		// and B (0.5 s) routed at 0: due 0.1 and 0.6.
		{name: "on time", now: 0.05, wantWait: 0.55, wantA: 0.1, firstA: 0.1, wantAfter: 0.5},
		{name: "late by 0.2", now: 0.3, wantWait: 0.2 + 0.5, wantA: 0.5, firstA: 0.35, wantAfter: 0.5},
		{name: "late by 1.4", now: 1.5, wantWait: 1.4 + 0.5, wantA: 2.9, firstA: 1.6, wantAfter: 0.5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := New([]Info{{Name: "a", PrefillSpeed: 1000}}, false)
			_, eps := snap(f, 0, 100, nil)
			a := f.Route(eps[0], 0, Work{Uncached: 100, Cached: 900, PrefillSeconds: 0.1})
			f.Route(eps[0], 0, Work{Uncached: 500, PrefillSeconds: 0.5})
			s, _ := snap(f, tc.now, 100, nil)
			if got := s.Endpoints[0].QueueWait; math.Abs(got-tc.wantWait) > 1e-9 {
				t.Errorf("queue wait at %v: %v, want %v", tc.now, got, tc.wantWait)
			}
			if got := f.PredictedPrefillEnd(a); math.Abs(got-tc.wantA) > 1e-9 {
				t.Errorf("A predicted to end at %v, want %v", got, tc.wantA)
			}
			if got := f.NextIdle(tc.now); math.Abs(got-(tc.now+tc.wantWait)) > 1e-9 {
				t.Errorf("next idle %v, want %v", got, tc.now+tc.wantWait)
			}
			f.FirstToken(a, tc.firstA)
			s, _ = snap(f, tc.firstA, 100, nil)
			if got := s.Endpoints[0].QueueWait; math.Abs(got-tc.wantAfter) > 1e-9 {
				t.Errorf("queue wait after A's first token at %v: %v, want %v", tc.firstA, got, tc.wantAfter)
			}
			// A request routed behind it queues behind B.
			c := f.Route(eps[0], tc.firstA, Work{Uncached: 100, PrefillSeconds: 0.1})
			if got, want := f.PredictedPrefillEnd(c), tc.firstA+tc.wantAfter+0.1; math.Abs(got-want) > 1e-9 {
				t.Errorf("C predicted to end at %v, want %v", got, want)
			}
		})
	}
}

// TestLateHeadOnSteps: on an engine that prefills in steps, a first token
// up to one step's compute past its prediction is the step's join, not a
// late head (the queue behind has started): the queue moves later only
// past that.
func TestLateHeadOnSteps(t *testing.T) {
	f := New([]Info{{Name: "a", PrefillSpeed: 1000, StepTokens: 200}}, false) // a step: 0.2 s
	_, eps := snap(f, 0, 100, nil)
	f.Route(eps[0], 0, Work{Uncached: 100, Cached: 900, PrefillSeconds: 0.1})
	f.Route(eps[0], 0, Work{Uncached: 500, PrefillSeconds: 0.5})
	for _, tc := range []struct{ now, wait float64 }{
		{0.25, 0.35},     // 0.15 s past its due time, within a step: as predicted
		{0.4, 0.1 + 0.5}, // 0.1 s past a step: ends 0.1 s from now, then B
	} {
		s, _ := snap(f, tc.now, 100, nil)
		if got := s.Endpoints[0].QueueWait; math.Abs(got-tc.wait) > 1e-9 {
			t.Errorf("queue wait at %v: %v, want %v", tc.now, got, tc.wait)
		}
	}
}

// TestLateHeadPredictedAnewWhenPassed: a late head's new predicted end
// stands until it passes; then it is predicted anew from its overrun so
// far, and the queue behind moves each time.
func TestLateHeadPredictedAnewWhenPassed(t *testing.T) {
	f := New([]Info{{Name: "a", PrefillSpeed: 1000}}, false)
	_, eps := snap(f, 0, 100, nil)
	a := f.Route(eps[0], 0, Work{Uncached: 100, Cached: 1900, PrefillSeconds: 0.1})
	f.Route(eps[0], 0, Work{Uncached: 500, PrefillSeconds: 0.5})
	for _, tc := range []struct{ now, end float64 }{
		{0.05, 0.1}, // on time
		{0.3, 0.5},  // late by 0.2: as late again
		{0.4, 0.5},  // that prediction stands
		{0.6, 1.1},  // passed: late by 0.5, as late again
		{1.0, 1.1},  // stands
		{1.5, 2.9},  // passed: late by 1.4
	} {
		s, _ := snap(f, tc.now, 100, nil)
		if got := f.PredictedPrefillEnd(a); math.Abs(got-tc.end) > 1e-9 {
			t.Errorf("at %v A predicted to end at %v, want %v", tc.now, got, tc.end)
		}
		if got, want := s.Endpoints[0].QueueWait, tc.end+0.5-tc.now; math.Abs(got-want) > 1e-9 {
			t.Errorf("at %v queue wait %v, want %v", tc.now, got, want)
		}
	}
}

// TestWakeOnSlack: the fleet signals prefill ends that free an endpoint
// sooner than predicted (a router holding requests looks for slack then),
// and only those.
func TestWakeOnSlack(t *testing.T) {
	type end struct {
		flight int // index of the flight routed below
		at     float64
		finish bool // Finish (client gone) rather than FirstToken
	}
	// Three prefills of 1 s each routed at 0 on one endpoint: predicted
	// to end at 1, 2 and 3.
	cases := []struct {
		name string
		end  end
		want bool
	}{
		{"head on time", end{0, 1, false}, false},
		{"head late", end{0, 1.3, false}, false},
		{"head early", end{0, 0.7, false}, true},
		{"head abandoned early", end{0, 0.2, true}, true},
		{"behind the head, client gone", end{1, 0.5, true}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := New([]Info{{Name: "a", PrefillSpeed: 1000}}, false)
			wake := make(chan struct{}, 1)
			f.WakeOnSlack(wake)
			_, eps := snap(f, 0, 1000, nil)
			var fls []*Flight
			for range 3 {
				fls = append(fls, f.Route(eps[0], 0, Work{Uncached: 1000, PrefillSeconds: 1}))
			}
			if len(wake) != 0 {
				t.Fatal("routing signalled slack")
			}
			if c.end.finish {
				f.Finish(fls[c.end.flight], c.end.at)
			} else {
				f.FirstToken(fls[c.end.flight], c.end.at)
			}
			if got := len(wake) == 1; got != c.want {
				t.Fatalf("signalled %v, want %v", got, c.want)
			}
		})
	}
	t.Run("queue runs empty late", func(t *testing.T) {
		f := New([]Info{{Name: "a", PrefillSpeed: 1000}}, false)
		wake := make(chan struct{}, 1)
		f.WakeOnSlack(wake)
		_, eps := snap(f, 0, 1000, nil)
		fl := f.Route(eps[0], 0, Work{Uncached: 1000, PrefillSeconds: 1})
		f.FirstToken(fl, 1.5)
		if len(wake) != 1 {
			t.Fatal("an endpoint that went idle was not signalled")
		}
		// A full channel does not block the fleet; a nil one is silent.
		fl = f.Route(eps[0], 2, Work{Uncached: 1000, PrefillSeconds: 1})
		f.FirstToken(fl, 2.5)
		f.WakeOnSlack(nil)
		<-wake
		fl = f.Route(eps[0], 3, Work{Uncached: 1000, PrefillSeconds: 1})
		f.FirstToken(fl, 3.5)
		if len(wake) != 0 {
			t.Fatal("signalled after WakeOnSlack(nil)")
		}
	})
}

// TestCachedPrefix: whole cached blocks, but never the prompt's last
// token, which vLLM and SGLang always compute: a prompt of whole blocks,
// all cached, recomputes its last block.
func TestCachedPrefix(t *testing.T) {
	for _, c := range []struct{ blocks, bs, prompt, want int }{
		{10, 16, 161, 160}, {10, 16, 160, 144}, {9, 16, 160, 144}, {3, 16, 160, 48},
		{0, 16, 5, 0}, {1, 16, 16, 0}, {1, 16, 17, 16}, {3, 16, 0, 0}, {-2, 16, 100, 0},
		{1 << 62, 16, 100, 96}, {5, 0, 100, 0}, {5, 1, 3, 2},
	} {
		if got := CachedPrefix(c.blocks, c.bs, c.prompt); got != c.want {
			t.Errorf("CachedPrefix(%d, %d, %d) = %d, want %d", c.blocks, c.bs, c.prompt, got, c.want)
		}
	}
}

// TestEndedBeforePrefillLeavesQueue: a request that ends before its
// prefill (its client gone, an engine error) takes out of its endpoint's
// queue the compute it was predicted to still need, whether it was the
// head or queued behind it; an observed first token out of order moves
// nothing (the engine did compute it).
func TestEndedBeforePrefillLeavesQueue(t *testing.T) {
	// Three prefills of 1 s each routed at 0 on one endpoint: predicted
	// to end at 1, 2 and 3; each case ends one of them at 0.5.
	cases := []struct {
		name     string
		flight   int
		finish   bool // Finish (client gone) rather than FirstToken
		wait     float64
		lastEnds float64 // the third's predicted end (the second's when the third ended)
	}{
		{"head, client gone", 0, true, 2, 2.5}, // it ran 0.5 s: the rest starts at once
		{"behind the head, client gone", 1, true, 1.5, 2},
		{"last, client gone", 2, true, 1.5, 2},
		{"behind the head, first token", 1, false, 2.5, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := New([]Info{{Name: "a", PrefillSpeed: 1000}}, false)
			_, eps := snap(f, 0, 1000, nil)
			var fls []*Flight
			for range 3 {
				fls = append(fls, f.Route(eps[0], 0, Work{Uncached: 1000, PrefillSeconds: 1}))
			}
			if c.finish {
				f.Finish(fls[c.flight], 0.5)
			} else {
				f.FirstToken(fls[c.flight], 0.5)
			}
			s, _ := snap(f, 0.5, 1000, nil)
			if got := s.Endpoints[0].QueueWait; math.Abs(got-c.wait) > 1e-9 {
				t.Errorf("queue wait %v, want %v", got, c.wait)
			}
			last := fls[2]
			if c.flight == 2 {
				last = fls[1]
			}
			if got := f.PredictedPrefillEnd(last); math.Abs(got-c.lastEnds) > 1e-9 {
				t.Errorf("last prefill predicted to end at %v, want %v", got, c.lastEnds)
			}
			// Ending it again moves nothing.
			f.Finish(fls[c.flight], 0.6)
			if s, _ := snap(f, 0.5, 1000, nil); math.Abs(s.Endpoints[0].QueueWait-c.wait) > 1e-9 {
				t.Errorf("a second Finish moved the queue: wait %v", s.Endpoints[0].QueueWait)
			}
		})
	}
}

// TestQueued: a flight behind its endpoint's head is queued from its
// predicted start (a step earlier on an endpoint that prefills in steps:
// its first chunk may share the step ahead) for its compute; the head,
// and a flight whose prefill ended, are not.
func TestQueued(t *testing.T) {
	for _, c := range []struct {
		steps int
		start float64
	}{{0, 1}, {500, 0.5}} {
		f := New([]Info{{Name: "a", PrefillSpeed: 1000, StepTokens: c.steps}}, false)
		_, eps := snap(f, 0, 1000, nil)
		var fls []*Flight
		for range 3 {
			fls = append(fls, f.Route(eps[0], 0, Work{Uncached: 1000, PrefillSeconds: 1}))
		}
		if _, _, ok := f.Queued(fls[0]); ok {
			t.Errorf("steps %d: the head is queued", c.steps)
		}
		if start, compute, ok := f.Queued(fls[1]); !ok || math.Abs(start-c.start) > 1e-9 || compute != 1 {
			t.Errorf("steps %d: second flight %v %v %v, want start %v, compute 1", c.steps, start, compute, ok, c.start)
		}
		f.FirstToken(fls[2], 0.5)
		if _, _, ok := f.Queued(fls[2]); ok {
			t.Errorf("steps %d: a flight whose prefill ended is queued", c.steps)
		}
	}
	// A step far longer than the prompts (8 192 tokens at 1 000 tokens/s):
	// a prompt routed while the one ahead waits to start shares its step
	// (started with it); one routed after that step began starts when the
	// prompt ahead ends. A whole step was taken off every start, and every
	// queued request counted as started (a walkthrough: nothing was ever
	// displaced on a slow engine).
	f := New([]Info{{Name: "a", PrefillSpeed: 1000, StepTokens: 8192}}, false)
	_, eps := snap(f, 0, 1000, nil)
	head := f.Route(eps[0], 0, Work{Uncached: 1000, PrefillSeconds: 1})
	late := f.Route(eps[0], 0.5, Work{Uncached: 1000, PrefillSeconds: 1})
	if start, _, ok := f.Queued(late); !ok || math.Abs(start-1) > 1e-9 {
		t.Errorf("routed after the step ahead began: start %v (%v), want 1", start, ok)
	}
	f.FirstToken(head, 1)
	f.FirstToken(late, 2)
	_, eps = snap(f, 3, 1000, nil)
	f.Route(eps[0], 3, Work{Uncached: 1000, PrefillSeconds: 1})
	joins := f.Route(eps[0], 3, Work{Uncached: 1000, PrefillSeconds: 1})
	if start, _, ok := f.Queued(joins); !ok || math.Abs(start-3) > 1e-9 {
		t.Errorf("routed before the step ahead began: start %v (%v), want 3 (the step's)", start, ok)
	}
}
