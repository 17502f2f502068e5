package sched

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

func TestKVGateChoices(t *testing.T) {
	tests := []struct {
		name string
		snap *Snapshot
		want int
	}{
		// Idle fleet: λ = 0, the lowest predicted TTFT wins.
		{"idle fleet: lowest predicted TTFT", snapOf(Endpoint{CachedTokens: 3200}, Endpoint{CachedTokens: 6400}), 1},
		// Light load (mean queue 0.05 s → λ = 0.2): a: 0.1 + 1.2·0.32 = 0.484;
		// b: 0 + 1.2·0.576 = 0.69. Affinity wins although b is idle.
		{"light load keeps affinity while cheap", snapOf(Endpoint{CachedTokens: 3200, QueueWait: 0.1}, Endpoint{CachedTokens: 640}), 0},
		// Same TTFT ordering as predicted-ttft when compute is equal.
		{"equal compute: shorter queue", snapOf(Endpoint{CachedTokens: 640, QueueWait: 0.4}, Endpoint{CachedTokens: 640, QueueWait: 0.2}), 1},
		// Loaded fleet (mean queue 1.0 s → λ = 4): a: 1.5 + 5·0.0 = 1.5;
		// b: 0.5 + 5·0.32 = 2.1. predicted-ttft would take b (0.82 < 1.5).
		{"loaded fleet pays for compute", snapOf(Endpoint{CachedTokens: 6400, QueueWait: 1.5}, Endpoint{CachedTokens: 3200, QueueWait: 0.5}), 0},
		// The cached endpoint misses the SLO (2.1 s): only b fits.
		{"infeasible affinity is dropped", snapOf(Endpoint{CachedTokens: 6400, QueueWait: 2.1}, Endpoint{CachedTokens: 3200, QueueWait: 0.5}), 1},
		// Nothing fits: the request is lost anyway; it goes down the
		// longest queue, sparing the short one for requests that can
		// still make it.
		{"nothing fits: longest queue", snapOf(Endpoint{CachedTokens: 0, QueueWait: 2.5}, Endpoint{CachedTokens: 6400, QueueWait: 5}, Endpoint{QueueWait: 2.1}), 1},
		{"nothing fits, equal queues: least compute", snapOf(Endpoint{CachedTokens: 0, QueueWait: 5}, Endpoint{CachedTokens: 3200, QueueWait: 5}), 1},
		{"decode endpoints are not candidates", snapOf(Endpoint{Role: fleet.RoleDecode, CachedTokens: 6400}, Endpoint{QueueWait: 0.3}), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, "kvgate", Options{})
			if got := pick(p, req(6400), tt.snap); got != tt.want {
				t.Errorf("picked %d, want %d", got, tt.want)
			}
		})
	}
	// The loaded-fleet case really differs from predicted-ttft.
	if got := mustNew(t, "predicted-ttft", Options{}).Pick(req(6400), tests[3].snap); got != 1 {
		t.Fatalf("predicted-ttft picked %d; the test no longer separates the policies", got)
	}
}

// benchFleet is 64 endpoints with random queues and prefix matches.
func benchFleet(n int) (*Request, *Snapshot) {
	rng := rand.New(rand.NewPCG(1, 1))
	eps := make([]Endpoint, n)
	for i := range eps {
		eps[i] = Endpoint{Name: fmt.Sprint(i), PrefillSpeed: 20000, CachedTokens: 64 * rng.IntN(100),
			QueueWait: rng.Float64(), InflightUncached: rng.IntN(40000), InflightRequests: rng.IntN(50)}
	}
	return &Request{PromptTokens: 6400, PromptBlocks: 100, SLO: SLO{TTFT: 2}}, &Snapshot{BlockSize: 64, Endpoints: eps}
}

// BenchmarkDecision64 compares kvgate's decision cost with llm-d's
// token-aware policy (the baseline) over 64 endpoints.
func BenchmarkDecision64(b *testing.B) {
	r, s := benchFleet(64)
	for _, name := range []string{"llmd-token-aware", "kvgate", "predicted-ttft", "sglang-cache-aware", "dynamo-kv"} {
		b.Run(name, func(b *testing.B) {
			sc := Scheduler{Policy: mustNew(&testing.T{}, name, Options{}), EarlyReject: true}
			for b.Loop() {
				sc.Decide(r, s)
			}
		})
	}
	// A request that opens a conversation: kvgate sums the endpoints'
	// conversations and passes over those at the limit, on an idle fleet
	// (ε = ε₀) and on the loaded one (λ = 2: ε = 3 ε₀).
	opening := *r
	opening.OpensConversation = true
	loaded := &Snapshot{BlockSize: s.BlockSize, Endpoints: append([]Endpoint(nil), s.Endpoints...)}
	idle := &Snapshot{BlockSize: s.BlockSize, Endpoints: append([]Endpoint(nil), s.Endpoints...)}
	for i := range idle.Endpoints {
		loaded.Endpoints[i].Conversations = float64(i % 7)
		idle.Endpoints[i].QueueWait, idle.Endpoints[i].Conversations = 0, float64(i%7)
	}
	// One whose prefix can be copied (CanCopy): on the idle fleet the
	// choice without the limit is made too (PickCopy).
	copying := opening
	copying.CanCopy = true
	for _, c := range []struct {
		name string
		req  *Request
		snap *Snapshot
	}{{"kvgate-opening-idle", &opening, idle}, {"kvgate-opening-loaded", &opening, loaded},
		{"kvgate-opening-idle-copy", &copying, idle}, {"kvgate-opening-loaded-copy", &copying, loaded}} {
		b.Run(c.name, func(b *testing.B) {
			sc := Scheduler{Policy: mustNew(&testing.T{}, "kvgate", Options{}), EarlyReject: true}
			for b.Loop() {
				sc.Decide(c.req, c.snap)
			}
		})
	}
	// Under pressure: the spare compute takes one more pass (the least
	// compute over the endpoints).
	pressed := *s
	pressed.SinceLoadRejection, pressed.MeanPrefill = 1, 0.2
	b.Run("kvgate-pressure", func(b *testing.B) {
		sc := Scheduler{Policy: mustNew(&testing.T{}, "kvgate", Options{}), EarlyReject: true}
		for b.Loop() {
			sc.Decide(r, &pressed)
		}
	})
}

// TestKVGateTieSmallerCache: of endpoints that cost the same, kvgate takes
// the one holding the smaller prefix cache (a new conversation evicts
// least there), then the one idle longest.
func TestKVGateTieSmallerCache(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	s := &Snapshot{Now: 10, Endpoints: []Endpoint{
		{Name: "full", PrefillSpeed: 1000, HeldTokens: 90000, FreeAt: 1},
		{Name: "small", PrefillSpeed: 1000, HeldTokens: 20000, FreeAt: 5},
		{Name: "busy", PrefillSpeed: 1000, HeldTokens: 0, QueueWait: 0.5, FreeAt: 10.5},
	}}
	req := &Request{PromptTokens: 500, SLO: SLO{TTFT: 2}}
	if p := pol.Pick(req, s); p != 1 {
		t.Fatalf("picked %s, want the idle endpoint with the smaller cache", s.Endpoints[p].Name)
	}
	s.Endpoints[1].HeldTokens = 90000
	if p := pol.Pick(req, s); p != 0 {
		t.Fatalf("picked %s, want the endpoint idle longest among equal caches", s.Endpoints[p].Name)
	}
}

// TestKVGateUnderPressure: a fleet that rejected a request for the load
// within KVGatePressure SLOs is compute-bound: among the endpoints that
// fit, the one that computes least wins, however much latency another
// would save. a: 1.4 s queued, 6 000 of 6 400 tokens cached (1.44 s);
// b: idle, 3 200 cached (0.32 s). The mean queue (0.7 s, λ = 2.8) picks b.
func TestKVGateUnderPressure(t *testing.T) {
	p := mustNew(t, "kvgate", Options{})
	s := snapOf(Endpoint{CachedTokens: 6000, QueueWait: 1.4}, Endpoint{CachedTokens: 3200})
	for _, tc := range []struct {
		since float64
		want  int
	}{{0, 1}, {120, 1}, {59, 0}, {1e-9, 0}} {
		s.SinceLoadRejection = tc.since
		if got := pick(p, req(6400), s); got != tc.want {
			t.Errorf("last rejection for the load %v s ago (0: never): picked %d, want %d", tc.since, got, tc.want)
		}
	}
	// Endpoints that miss the SLO still do not compete.
	s.Endpoints[0].QueueWait = 1.99
	if got := pick(p, req(6400), s); got != 1 {
		t.Errorf("under pressure, the cached endpoint missing its SLO was picked")
	}
	// KVGatePressure sets the window (in SLOs).
	s.Endpoints[0].QueueWait, s.SinceLoadRejection = 1.4, 59
	if got := pick(mustNew(t, "kvgate", Options{KVGatePressure: 10}), req(6400), s); got != 1 {
		t.Errorf("59 s after a rejection with a 20 s window: picked %d, want 1", got)
	}
}

// TestKVGatePricesFleetCompute: λ values a request's compute at the
// fleet's mean speed, so a learned speed's noise is not multiplied by λ.
// A new conversation cached nowhere (12 000 tokens): a is believed 1 %
// faster (as two learned speeds differ) but has 1.2 s queued, b 0.1 s.
// Priced at their own speeds, λ = 1000 under pressure made a's 6 ms less
// compute outweigh its 1.1 s more queue; at the fleet's speed the compute
// ties and the TTFT decides, under pressure, at the mean-queue price and
// for an overdue request alike. An endpoint truly faster still wins by
// its TTFT (c, twice as fast, same queue as b).
func TestKVGatePricesFleetCompute(t *testing.T) {
	p := mustNew(t, "kvgate", Options{})
	for _, since := range []float64{0, 1} {
		s := snapOf(Endpoint{PrefillSpeed: 20200, QueueWait: 1.2}, Endpoint{PrefillSpeed: 20000, QueueWait: 0.1})
		s.SinceLoadRejection = since
		if got := pick(p, req(12000), s); got != 1 {
			t.Errorf("last rejection for the load %v s ago: picked %d, want the short queue 1", since, got)
		}
		if got := p.(OverduePicker).PickOverdue(req(12000), s); got != 1 {
			t.Errorf("overdue, last rejection for the load %v s ago: picked %d, want 1", since, got)
		}
		s.Endpoints = append(s.Endpoints, Endpoint{Name: "c", PrefillSpeed: 40000, QueueWait: 0.1})
		if got := pick(p, req(12000), s); got != 2 {
			t.Errorf("last rejection for the load %v s ago: picked %d, want the faster endpoint 2", since, got)
		}
	}
}

// TestKVGateSparesTheQueuedTail: an endpoint whose queue ends in a
// chunked-prefill step with room (TailRoom) is passed over when the
// request's first chunk there would push a first token that step brings
// past its SLO (TailSlack), while another endpoint fits. a holds 6 000 of
// the 6 400 tokens (0.04 s of compute, 0.3 s queued), b nothing (0.64 s,
// idle); a's tail step has 4 000 tokens free, so the request's 400
// uncached tokens would delay it 0.04 s.
func TestKVGateSparesTheQueuedTail(t *testing.T) {
	p := mustNew(t, "kvgate", Options{})
	for _, tc := range []struct {
		room  int
		slack float64
		want  int
	}{
		{0, 0, 0},       // no step to share: the holder
		{4000, 0.5, 0},  // the tail can take the delay
		{4000, 0.01, 1}, // it cannot: the idle endpoint
		{200, 0.015, 1}, // a 200-token chunk still costs 0.02 s
		{100, 0.015, 0}, // a 100-token one 0.01 s
	} {
		s := snapOf(Endpoint{CachedTokens: 6000, QueueWait: 0.3, TailRoom: tc.room, TailSlack: tc.slack}, Endpoint{})
		if got := pick(p, req(6400), s); got != tc.want {
			t.Errorf("tail room %d slack %v: picked %d, want %d", tc.room, tc.slack, got, tc.want)
		}
	}
	// With nothing else fitting it is one request for the other, and the
	// new one is served where it fits (a rejected turn of a conversation
	// comes back with more to compute), under pressure too.
	for _, since := range []float64{0, 1} {
		s := snapOf(Endpoint{CachedTokens: 6000, QueueWait: 0.3, TailRoom: 4000, TailSlack: 0.01}, Endpoint{QueueWait: 1.9})
		s.SinceLoadRejection = since
		if d := (&Scheduler{Policy: p, EarlyReject: true}).Decide(req(6400), s); !d.Admit || d.Prefill != 0 {
			t.Errorf("no other endpoint fits (last rejection for the load %v s ago): admit %v on %d, want the holder", since, d.Admit, d.Prefill)
		}
	}
}

// TestKVGateSpreadsAfterIdleRejection: a rejection for the load while an
// endpoint stood idle (Snapshot.SinceIdleRejection) says the compute was
// there but the request's prefix was cached only on busy endpoints: for
// KVGatePressure SLOs kvgate prices compute at nothing and a request goes
// where its TTFT is lowest, which copies its prefix to the idle endpoint.
// a: 0.7 s queued, 6 000 of 10 000 tokens cached (TTFT 1.1 s); b: idle,
// nothing cached (1.0 s). The mean queue (λ = 1.4) and the pressure price
// both keep the request on a; a rejection with no endpoint idle outranks
// one with an endpoint idle. Through Scheduler.Decide with a decode-only
// endpoint too, whose candidates view must carry the field.
func TestKVGateSpreadsAfterIdleRejection(t *testing.T) {
	p := mustNew(t, "kvgate", Options{})
	for _, tc := range []struct {
		name        string
		idle, short float64 // seconds since each kind of rejection; 0: none
		want        int
	}{
		{"no rejection", 0, 0, 0},
		{"an idle-endpoint rejection 10 s ago", 10, 0, 1},
		{"one 61 s ago, past the 60 s window", 61, 0, 0},
		{"a short-of-compute one 10 s ago", 0, 10, 0},
		{"both", 5, 10, 0},
	} {
		for _, decode := range []bool{false, true} {
			s := snapOf(Endpoint{CachedTokens: 6000, QueueWait: 0.7}, Endpoint{})
			if decode {
				s.Endpoints = append(s.Endpoints, Endpoint{Name: "d", Role: fleet.RoleDecode, KVFreeTokens: 1 << 30})
			}
			s.SinceIdleRejection, s.SinceLoadRejection, s.MeanPrefill = tc.idle, tc.short, 0.5
			if got := pick(p, req(10000), s); got != tc.want {
				t.Errorf("%s (decode endpoint %v): picked %d, want %d", tc.name, decode, got, tc.want)
			}
		}
	}
}

// TestKVGateConversationBalance: a new conversation goes past the holder
// of its shared prefix once that holder would hold more than ⌈(1 + ε) ×
// the mean⌉ conversations (ε = 0.25 × (1 + λ)), and only then, only for a
// new conversation, only onto an endpoint that fits, and never when nothing of
// the prompt is cached there.
func TestKVGateConversationBalance(t *testing.T) {
	const prompt = 2368 // a 2 048-token system prompt and a 320-token turn
	tests := []struct {
		name    string
		eps     []Endpoint
		opens   bool
		balance float64
		want    int
	}{
		{"continuing turn keeps to its holder", hot(), false, 0, 0},
		{"new conversation passes over the full holder", hot(), true, 0, 1},
		{"balancing off", hot(), true, -1, 0},
		{"holder within the limit keeps it", func() []Endpoint {
			e := hot()
			e[0].Conversations = 2
			return e
		}(), true, 0, 0},
		{"a fleet with queues still balances", queued(hot(), 0.01), true, 0, 1}, // λ = 8 · 0.01 / 2 = 0.04: limit ⌈1.26 · 3⌉ = 4
		{"a busier fleet tolerates more", queued(hot(), 1.1), true, 0, 0},       // λ = 4.4: ε = 1.35, limit ⌈2.35 · 3⌉ = 8
		{"no other endpoint fits: the holder", func() []Endpoint {
			e := hot()
			e[1].QueueWait, e[2].QueueWait = 1.9, 1.95
			return e
		}(), true, 0, 0},
		{"an endpoint holding nothing of the prompt is not passed over", []Endpoint{
			{Conversations: 6, FreeAt: -2}, {Conversations: 1, FreeAt: -1}, {Conversations: 1}}, true, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, "kvgate", Options{KVGateBalance: tt.balance})
			if tt.balance == 0 {
				// Under pressure (a rejection for the load a second ago,
				// λ = pressurePrice) no holder is passed over.
				r := req(prompt)
				r.OpensConversation = tt.opens
				s := snapOf(tt.eps...)
				s.SinceLoadRejection = 1
				if got := pick(p, r, s); got != 0 {
					t.Errorf("under pressure picked %d, want the holder", got)
				}
			}
			r := req(prompt)
			r.OpensConversation = tt.opens
			s := snapOf(tt.eps...)
			if got := pick(p, r, s); got != tt.want {
				t.Errorf("picked %d, want %d", got, tt.want)
			}
			// Costs says the same: the pick is the cheapest finite cost.
			costs := p.(CostReporter).Costs(r, s, nil)
			best := 0
			for i, c := range costs {
				if c < costs[best] {
					best = i
				}
			}
			if best != tt.want {
				t.Errorf("costs %v point at %d, want %d", costs, best, tt.want)
			}
		})
	}
}

// hot is a fleet whose holder of a 2 048-token system prompt, a, holds 6
// conversations, b and c 1 each (c with a short queue): the mean with a
// new one is 9/3 = 3, the limit ⌈1.25 · 3⌉ = 4 with it, so a (7 with it)
// is over.
func hot() []Endpoint {
	return []Endpoint{{CachedTokens: 2048, Conversations: 6}, {Conversations: 1}, {Conversations: 1, QueueWait: 0.001}}
}

// queued adds wait to every endpoint's queue.
func queued(e []Endpoint, wait float64) []Endpoint {
	for i := range e {
		e[i].QueueWait += wait
	}
	return e
}

// TestKVGateConversationLimitFallsBack: when every endpoint with room for
// a conversation misses the SLO but the holder fits (the fleet is idle:
// the misses are compute, not queue), the holder takes it.
func TestKVGateConversationLimitFallsBack(t *testing.T) {
	p := mustNew(t, "kvgate", Options{})
	r := req(30000) // 3 s on an endpoint holding none of it
	r.OpensConversation = true
	s := snapOf(Endpoint{CachedTokens: 29000, Conversations: 9}, Endpoint{Conversations: 0}, Endpoint{Conversations: 0})
	if got := pick(p, r, s); got != 0 {
		t.Fatalf("picked %d, want the holder (0): nothing else fits", got)
	}
	// The costs that explain the decision say so too: the endpoints that
	// miss the SLO are ruled out.
	if costs := p.(CostReporter).Costs(r, s, nil); !math.IsInf(costs[1], 1) || !math.IsInf(costs[2], 1) || math.IsInf(costs[0], 1) {
		t.Fatalf("costs %v, want the holder's finite and the others +Inf", costs)
	}
}

// TestKVGateConversationLimitOddPrices: a queue wait of +Inf or NaN (an
// endpoint whose speed is unknown, a broken prediction) makes λ, and so
// ε, infinite or NaN; the limit then passes no holder over and kvgate
// still picks an endpoint that fits.
func TestKVGateConversationLimitOddPrices(t *testing.T) {
	p := mustNew(t, "kvgate", Options{})
	for _, wait := range []float64{math.Inf(1), math.NaN()} {
		r := req(2368)
		r.OpensConversation = true
		s := snapOf(Endpoint{CachedTokens: 2048, Conversations: 6}, Endpoint{Conversations: 1}, Endpoint{Conversations: 1, QueueWait: wait})
		if got := pick(p, r, s); got != 0 {
			t.Errorf("queue wait %v: picked %d, want the holder (0)", wait, got)
		}
	}
}

// TestKVGateSpareUnderPressure: while the fleet is compute-bound (a
// rejection for the load a second ago), a request whose cheapest endpoint
// cannot take it in time goes to another only if it computes there at
// most the fleet's mean prefill more; otherwise the scheduler rejects it.
// Its own compute is not held against it, and without pressure it moves.
func TestKVGateSpareUnderPressure(t *testing.T) {
	// 6 000 tokens at 10 000 tok/s: 0.6 s; the holder has 5 000 of them
	// cached (0.1 s there) behind a 1.95 s queue; the other is idle.
	mk := func(since, mean float64) *Snapshot {
		s := snapOf(Endpoint{CachedTokens: 5000, QueueWait: 1.95}, Endpoint{})
		s.SinceLoadRejection, s.MeanPrefill = since, mean
		return s
	}
	tests := []struct {
		name        string
		since, mean float64
		admit       bool
		want        int
	}{
		{"no pressure: moves", 0, 0.2, true, 1},
		{"pressure, the move costs more than a mean prefill: rejected", 1, 0.2, false, -1},
		{"pressure, the move costs less than a mean prefill: moves", 1, 0.6, true, 1},
		{"pressure, mean unknown: moves", 1, 0, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, "kvgate", Options{})
			sc := &Scheduler{Policy: p, EarlyReject: true, Explain: true}
			s := mk(tt.since, tt.mean)
			d := sc.Decide(req(6000), s)
			if d.Admit != tt.admit || (tt.admit && d.Prefill != tt.want) {
				t.Fatalf("decision %+v, want admit %v on %d", d, tt.admit, tt.want)
			}
			if !tt.admit && (d.Prefill != 0 || !RejectedForPrefill(req(6000), s, &d)) {
				t.Errorf("rejected on %d (%s): want on the holder, for the load", d.Prefill, d.Reason)
			}
			// The costs that explain it agree: the move is ruled out.
			if c := d.Costs; !tt.admit && !math.IsInf(c[1], 1) {
				t.Errorf("costs %v: the wasteful move should be +Inf", c)
			}
		})
	}
	// A long prompt cached nowhere competes as any other: its own compute
	// (1.5 s, far above the mean) is not waste.
	s := snapOf(Endpoint{QueueWait: 0.1}, Endpoint{})
	s.SinceLoadRejection, s.MeanPrefill = 1, 0.2
	if d := (&Scheduler{Policy: mustNew(t, "kvgate", Options{}), EarlyReject: true}).Decide(req(15000), s); !d.Admit || d.Prefill != 1 {
		t.Fatalf("long uncached prompt under pressure: %+v, want admitted on the idle endpoint", d)
	}
}

// TestKVGatePickOnePassUnderPressure: under pressure Pick finds the
// winner and the least compute in one pass and checks the spare bound on
// the winner alone; it must pick what the two-pass rule picks (pick with
// the least compute known), ties, misses and wasteful winners included.
func TestKVGatePickOnePassUnderPressure(t *testing.T) {
	p := newKVGate(Options{}.withDefaults())
	rng := rand.New(rand.NewPCG(7, 9))
	for n := range 3000 {
		eps := make([]Endpoint, 1+rng.IntN(8))
		for i := range eps {
			eps[i] = Endpoint{Name: fmt.Sprint(i), Role: fleet.RoleBoth, PrefillSpeed: float64(10000 * (1 + rng.IntN(2))),
				CachedTokens: 640 * rng.IntN(10), QueueWait: 0.5 * float64(rng.IntN(5)), HeldTokens: 1000 * rng.IntN(2),
				LastPicked: float64(rng.IntN(3))}
		}
		s := &Snapshot{BlockSize: 64, Endpoints: eps, SinceLoadRejection: 1, MeanPrefill: 0.1 * float64(1+rng.IntN(5))}
		r := req(640 * (1 + rng.IntN(12)))
		if got, want := p.Pick(r, s), p.pick(r, s, p.pricing(r, s)); got != want {
			t.Fatalf("case %d: one pass picked %d, two passes %d\n%+v", n, got, want, s)
		}
	}
}

// TestKVGateCopiesAheadOfTheBalance: on an idle fleet a new conversation
// that the balance would move off the full holder of its system prompt
// stays there, and the prompt's cached prefix is copied to the endpoint
// it would have moved to; anywhere else the move is made as before.
func TestKVGateCopiesAheadOfTheBalance(t *testing.T) {
	const prompt = 2368 // a 2 048-token system prompt and a 320-token turn
	// hot: the holder a is over the limit, b (idle) is where the
	// balance moves the conversation.
	tests := []struct {
		name     string
		eps      []Endpoint
		opens    bool
		pressure bool
		want     int
		copyTo   int // -1: no copy
	}{
		{"idle fleet: kept on the holder, the prefix copied", hot(), true, false, 0, 1},
		{"continuing turn: no balance, no copy", hot(), false, false, 0, -1},
		{"holder within the limit: no copy", func() []Endpoint {
			e := hot()
			e[0].Conversations = 2
			return e
		}(), true, false, 0, -1},
		{"holder busy: moved", func() []Endpoint {
			e := hot()
			e[0].QueueWait = 0.01
			return e
		}(), true, false, 1, -1},
		{"endpoint moved to busy: moved", func() []Endpoint {
			e := hot()
			e[1].QueueWait, e[2].QueueWait = 0.001, 0.002
			return e
		}(), true, false, 1, -1},
		{"holder busy, two others idle: moved", func() []Endpoint {
			e := hot()
			e[0].QueueWait, e[2].QueueWait = 0.01, 0
			return e
		}(), true, false, 1, -1},
		{"endpoint moved to busy, two others idle: moved", []Endpoint{
			{CachedTokens: 2048, Conversations: 6}, {Conversations: 1, QueueWait: 0.001},
			{Conversations: 1, QueueWait: 0.002}, {CachedTokens: 1024, Conversations: 6}}, true, false, 1, -1},
		{"holder misses the SLO: moved", func() []Endpoint {
			e := hot()
			e[0].PrefillSpeed = 100 // its 320 uncached tokens take 3.2 s
			return e
		}(), true, false, 1, -1},
		{"under pressure: no balance, no copy", hot(), true, true, 0, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, "kvgate", Options{})
			r := req(prompt)
			r.OpensConversation = tt.opens
			s := snapOf(tt.eps...)
			if tt.pressure {
				s.SinceLoadRejection = 1
			}
			got, to, tokens := p.(CopyPicker).PickCopy(r, s)
			if got != tt.want {
				t.Errorf("picked %d, want %d", got, tt.want)
			}
			switch {
			case tt.copyTo < 0 && tokens != 0:
				t.Errorf("copy of %d tokens to %d, want none", tokens, to)
			case tt.copyTo >= 0 && (to != tt.copyTo || tokens != 2048):
				t.Errorf("copy of %d tokens to %d, want the holder's 2048 to %d", tokens, to, tt.copyTo)
			}
			if tokens == 0 {
				if plain := pick(p, r, s); plain != got {
					t.Errorf("without a copy PickCopy picked %d, Pick %d", got, plain)
				}
			}
		})
	}
}

// TestDecideCopies: the scheduler asks the policy for a copy only when
// the request's prefix can be copied (Request.CanCopy), maps the copy's
// endpoint back through the candidates (a decode-only endpoint is not
// one), and drops the copy with a request it does not admit.
func TestDecideCopies(t *testing.T) {
	p := mustNew(t, "kvgate", Options{})
	snap := func() *Snapshot {
		return snapOf(append([]Endpoint{{Role: fleet.RoleDecode, KVFreeTokens: 1 << 20}}, hot()...)...)
	}
	r := req(2368)
	r.OpensConversation = true
	sc := &Scheduler{Policy: p}
	if d := sc.Decide(r, snap()); d.Prefill != 2 || d.CopyTokens != 0 {
		t.Fatalf("cannot copy: prefill %d, copy %d tokens; want the move to 2 and no copy", d.Prefill, d.CopyTokens)
	}
	r.CanCopy = true
	if d := sc.Decide(r, snap()); !d.Admit || d.Prefill != 1 || d.CopyTo != 2 || d.CopyTokens != 2048 {
		t.Fatalf("can copy: admit %v, prefill %d, copy %d tokens to %d; want 1, and 2048 to 2", d.Admit, d.Prefill, d.CopyTokens, d.CopyTo)
	}
	// A policy without copies: never asked.
	if d := (&Scheduler{Policy: mustNew(t, "cache-only", Options{})}).Decide(r, snap()); d.Prefill != 1 || d.CopyTokens != 0 {
		t.Fatalf("cache-only: prefill %d, copy %d tokens", d.Prefill, d.CopyTokens)
	}
	// Not admitted (the holder's decode side has no room): no copy.
	s := snap()
	for i := 1; i < 4; i++ {
		s.Endpoints[i].Role = fleet.RolePrefill
	}
	s.Endpoints[0].KVFreeTokens = 0
	if d := (&Scheduler{Policy: p, EarlyReject: true}).Decide(r, s); d.Admit || d.CopyTokens != 0 {
		t.Fatalf("rejected: admit %v, copy %d tokens", d.Admit, d.CopyTokens)
	}
}
