package sched

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

func TestHoldQueueOrder(t *testing.T) {
	q := NewHoldQueue(10)
	mk := func(prio int, arrival, until float64) *Held {
		h := &Held{Req: Request{Priority: prio, Arrival: arrival}, Until: until, Compute: 1}
		if err := q.Push(h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	old := mk(0, 1, 50)
	urgent := mk(2, 5, 60)
	young := mk(0, 3, 10)
	if q.Len() != 3 || q.Compute() != 3 || q.NextDeadline() != 10 {
		t.Fatalf("len %d compute %v deadline %v", q.Len(), q.Compute(), q.NextDeadline())
	}
	// Before any deadline: priority, then age.
	if h, overdue := q.peek(5); h != urgent || overdue {
		t.Fatalf("peek(5) = %+v %v, want the priority-2 request", h.Req, overdue)
	}
	// A passed deadline wins over priority.
	if h, overdue := q.peek(10); h != young || !overdue {
		t.Fatalf("peek(10) = %+v %v, want the overdue request", h.Req, overdue)
	}
	if !q.Remove(urgent) || q.Remove(urgent) {
		t.Fatal("Remove: want true once, then false")
	}
	if h, _ := q.peek(5); h != old {
		t.Fatalf("after removing the urgent one, want the oldest, got %+v", h.Req)
	}
	q.Remove(old)
	q.Remove(young)
	if q.Len() != 0 || q.Compute() != 0 || !math.IsInf(q.NextDeadline(), 1) {
		t.Fatalf("empty queue: len %d compute %v deadline %v", q.Len(), q.Compute(), q.NextDeadline())
	}
	if h, _ := q.peek(100); h != nil {
		t.Fatal("peek on an empty queue")
	}
}

func TestHoldQueueCapAndBadInput(t *testing.T) {
	q := NewHoldQueue(1)
	if err := q.Push(&Held{Until: 1}); err != nil {
		t.Fatal(err)
	}
	if err := q.Push(&Held{Until: 2}); !errors.Is(err, ErrHoldFull) {
		t.Fatalf("push past the cap: %v, want ErrHoldFull", err)
	}
	if err := NewHoldQueue(4).Push(&Held{Until: math.NaN()}); err == nil {
		t.Fatal("NaN deadline accepted")
	}
	if err := NewHoldQueue(4).Push(nil); err == nil {
		t.Fatal("nil accepted")
	}
}

// holdFleet is a fixed snapshot; Dispatch records and makes the endpoint
// busy, as routing would.
type holdFleet struct {
	snap Snapshot
	got  []Decision
	who  []*Held
}

func (f *holdFleet) SnapshotFor(_ *Held, _ float64, s *Snapshot) {
	*s = f.snap
	s.Endpoints = append([]Endpoint(nil), f.snap.Endpoints...)
}

func (f *holdFleet) Dispatch(h *Held, d Decision) {
	f.got = append(f.got, d)
	f.who = append(f.who, h)
	if d.Admit {
		f.snap.Endpoints[d.Prefill].QueueWait += 10
	}
}

// TestHoldServesOnMostlyIdleFleet: with early rejection, a request that
// misses its SLO even alone is served only while at least half the
// fleet's prefilling endpoints are idle (decode endpoints do not count),
// however long the fleet has been quiet.
func TestHoldServesOnMostlyIdleFleet(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, EarlyReject: true, DefaultSLO: SLO{TTFT: 2}}
	f := &holdFleet{snap: Snapshot{Now: 100}}
	for i := range 6 {
		f.snap.Endpoints = append(f.snap.Endpoints, Endpoint{Name: string(rune('a' + i)), Role: fleet.RolePrefill, PrefillSpeed: 1000, QueueWait: 1})
	}
	for range 4 {
		f.snap.Endpoints = append(f.snap.Endpoints, Endpoint{Name: "decode", Role: fleet.RoleDecode, KVFreeTokens: 1 << 20})
	}
	q := NewHoldQueue(4)
	if err := q.Push(&Held{Req: Request{Arrival: 100, PromptTokens: 5000}, Until: 102}); err != nil {
		t.Fatal(err)
	}
	var s Snapshot
	for idle, want := range []int{0, 0, 0, 1} {
		for i := range idle {
			f.snap.Endpoints[i].QueueWait = 0
		}
		if n := sc.ReleaseHeld(q, 100, f, &s); n != want {
			t.Fatalf("%d of 6 prefill endpoints idle: released %d, want %d", idle, n, want)
		}
	}
	if len(f.got) != 1 || !f.got[0].Admit || f.got[0].Prefill > 2 {
		t.Fatalf("served %+v, want on one of the three idle prefill endpoints", f.got)
	}
}

// TestHoldServesOnAFleetOfOne: a model with one prefilling endpoint (a
// decode endpoint beside it does not count) serves a request that misses
// its SLO even alone while that endpoint is idle; it has no other to
// keep for arrivals. Two prefilling endpoints still need both idle.
func TestHoldServesOnAFleetOfOne(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, EarlyReject: true, DefaultSLO: SLO{TTFT: 2}}
	for _, tc := range []struct {
		prefill, idle, want int
	}{{1, 0, 0}, {1, 1, 1}, {2, 1, 0}, {2, 2, 1}} {
		f := &holdFleet{snap: Snapshot{Now: 100}}
		for i := range tc.prefill {
			e := Endpoint{Name: string(rune('a' + i)), Role: fleet.RolePrefill, PrefillSpeed: 1000, QueueWait: 1}
			if i < tc.idle {
				e.QueueWait = 0
			}
			f.snap.Endpoints = append(f.snap.Endpoints, e)
		}
		f.snap.Endpoints = append(f.snap.Endpoints, Endpoint{Name: "decode", Role: fleet.RoleDecode, KVFreeTokens: 1 << 20})
		q := NewHoldQueue(4)
		if err := q.Push(&Held{Req: Request{Arrival: 100, PromptTokens: 5000}, Until: 102}); err != nil {
			t.Fatal(err)
		}
		var s Snapshot
		if n := sc.ReleaseHeld(q, 100, f, &s); n != tc.want {
			t.Errorf("%d of %d prefill endpoints idle: released %d, want %d", tc.idle, tc.prefill, n, tc.want)
		}
	}
}

// TestHoldWithEarlyRejection: with early rejection, only a request that
// misses its SLO even on an idle endpoint is held (one that misses for the
// load is rejected, and counts as a rejection for the load); it is served
// on an idle endpoint once the fleet has been quiet for HoldQuiet SLOs and
// another endpoint stays idle, and rejected at arrival + HoldMin SLOs.
func TestHoldWithEarlyRejection(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, EarlyReject: true, DefaultSLO: SLO{TTFT: 2}, HoldQuiet: 10}
	busy := Snapshot{Now: 100, Endpoints: []Endpoint{
		{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 3},
		{Name: "b", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 3},
		{Name: "c", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 3},
	}}
	small := Request{Arrival: 100, PromptTokens: 1000} // 1 s alone
	long := Request{Arrival: 100, PromptTokens: 5000}  // 5 s alone
	d := sc.Decide(&small, &busy)
	if d.Admit || d.Hold || !RejectedForLoad(&small, &busy, &d) {
		t.Fatalf("a request that misses for the load: %+v, want rejected for the load", d)
	}
	d = sc.Decide(&long, &busy)
	if d.Admit || !d.Hold || d.HoldUntil != 102 || RejectedForLoad(&long, &busy, &d) {
		t.Fatalf("a request that misses alone: %+v, want held until 102 (arrival + 1 SLO)", d)
	}
	// Its reason gives the numbers it was judged by (it gave none).
	if want := "TTFT even on an idle endpoint 5.000s (pessimistic; predicted 5.000s) misses SLO 2.000s"; !strings.Contains(d.Reason, want) {
		t.Errorf("reason %q, want it to say %q", d.Reason, want)
	}
	// A prefix cached somewhere that makes it fit alone: not held.
	busy.Endpoints[2].CachedTokens = 4000
	if d := sc.Decide(&long, &busy); d.Hold || !RejectedForLoad(&long, &busy, &d) {
		t.Fatalf("fits alone on the cached endpoint: %+v, want rejected for the load", d)
	}
	// Without the hold it is rejected, and not for the load.
	sc.Hold = false
	busy.Endpoints[2].CachedTokens = 0
	if d := sc.Decide(&long, &busy); d.Admit || d.Hold || RejectedForLoad(&long, &busy, &d) {
		t.Fatalf("without the hold: %+v, want rejected, not for the load", d)
	}
	sc.Hold = true

	f := &holdFleet{snap: Snapshot{Now: 100, Endpoints: []Endpoint{
		{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 3},
		{Name: "b", Role: fleet.RoleBoth, PrefillSpeed: 1000},
		{Name: "c", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 1},
	}}}
	q := NewHoldQueue(8)
	h := &Held{Req: long, Until: 102}
	if err := q.Push(h); err != nil {
		t.Fatal(err)
	}
	var s Snapshot
	if n := sc.ReleaseHeld(q, 100, f, &s); n != 0 {
		t.Fatalf("one idle endpoint: released %d, want it kept for what arrives", n)
	}
	f.snap.Endpoints[2].QueueWait = 0
	q.NoteLoadRejection(95, false) // 5 s ago: under 10 SLOs
	if n := sc.ReleaseHeld(q, 100, f, &s); n != 0 {
		t.Fatalf("a rejection for the load 5 s ago: released %d", n)
	}
	q.NoteLoadRejection(70, false) // older than the last one: ignored
	if n := sc.ReleaseHeld(q, 101, f, &s); n != 0 {
		t.Fatalf("an older rejection moved the quiet window: released %d", n)
	}
	sc.HoldQuiet = 1 // 2 s: quiet since 95
	if n := sc.ReleaseHeld(q, 101, f, &s); n != 1 || !f.got[0].Admit || f.got[0].Prefill == 0 {
		t.Fatalf("quiet fleet, two idle endpoints: n=%d %+v, want served on an idle one", n, f.got)
	}
	// Overdue with no slack: rejected, with a reason.
	h2 := &Held{Req: long, Until: 102}
	if err := q.Push(h2); err != nil {
		t.Fatal(err)
	}
	q.NoteLoadRejection(101.5, false)
	if n := sc.ReleaseHeld(q, 102, f, &s); n != 1 || f.who[1] != h2 || f.got[1].Admit || f.got[1].Reason == "" {
		t.Fatalf("overdue: n=%d %+v, want a rejection", n, f.got)
	}
	if q.Len() != 0 {
		t.Fatalf("%d still held", q.Len())
	}
}

func TestDecideHoldsWhatFitsNowhere(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, DefaultSLO: SLO{TTFT: 2}, HoldBacklog: 1}
	snap := Snapshot{Now: 100, Endpoints: []Endpoint{
		{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 3},
		{Name: "b", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 5},
	}, HeldCompute: 6}
	fits := Request{Arrival: 100, PromptTokens: 100}
	if d := sc.Decide(&Request{Arrival: 100, PromptTokens: 100, SLO: SLO{TTFT: 4}}, &snap); !d.Admit || d.Hold {
		t.Fatalf("a request that fits was not admitted: %+v", d)
	}
	d := sc.Decide(&fits, &snap)
	if d.Admit || !d.Hold {
		t.Fatalf("a request that fits nowhere: %+v, want held", d)
	}
	// Backlog: mean queue wait 4 s + 6 s held over 2 endpoints = 7 s.
	if d.HoldUntil != 107 || d.HoldCompute != 0.1 {
		t.Fatalf("deadline %v compute %v, want 107 and 0.1", d.HoldUntil, d.HoldCompute)
	}
	// With early rejection, it is rejected instead.
	sc.EarlyReject = true
	if d := sc.Decide(&fits, &snap); d.Admit || d.Hold {
		t.Fatalf("with early rejection: %+v, want rejected", d)
	}
	// The deadline is at least HoldMin SLOs and at most HoldMax.
	sc.EarlyReject = false
	snap.HeldCompute, snap.Endpoints[0].QueueWait, snap.Endpoints[1].QueueWait = 0, 2.5, 2.5
	if d := sc.Decide(&fits, &snap); d.HoldUntil != 102.5 {
		t.Fatalf("deadline %v, want arrival + mean wait", d.HoldUntil)
	}
	sc.HoldBacklog = 2
	if d := sc.Decide(&fits, &snap); d.HoldUntil != 105 {
		t.Fatalf("deadline %v, want arrival + 2 × mean wait", d.HoldUntil)
	}
	sc.HoldMin = 3
	if d := sc.Decide(&fits, &snap); d.HoldUntil != 106 {
		t.Fatalf("deadline %v, want arrival + 3 SLOs", d.HoldUntil)
	}
	sc.HoldMax = 1
	if d := sc.Decide(&fits, &snap); d.HoldUntil != 101 {
		t.Fatalf("deadline %v, want arrival + HoldMax", d.HoldUntil)
	}
}

func TestReleaseHeld(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, DefaultSLO: SLO{TTFT: 2}}
	f := &holdFleet{snap: Snapshot{Now: 10, Endpoints: []Endpoint{
		{Name: "busy", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 4, CachedTokens: 900},
		{Name: "idle", Role: fleet.RoleBoth, PrefillSpeed: 1000},
	}}}
	q := NewHoldQueue(8)
	a := &Held{Req: Request{Arrival: 1, PromptTokens: 1000}, Until: 30}
	b := &Held{Req: Request{Arrival: 2, PromptTokens: 1000}, Until: 12}
	for _, h := range []*Held{a, b} {
		if err := q.Push(h); err != nil {
			t.Fatal(err)
		}
	}
	var s Snapshot
	// One endpoint is idle: the oldest request takes it; then no slack.
	if n := sc.ReleaseHeld(q, 10, f, &s); n != 1 || f.who[0] != a || f.got[0].Prefill != 1 || !f.got[0].Admit {
		t.Fatalf("slack release: n=%d %+v", n, f.got)
	}
	if n := sc.ReleaseHeld(q, 11, f, &s); n != 0 {
		t.Fatalf("no slack, nothing overdue: released %d", n)
	}
	// Past its deadline, b goes where it is served soonest: the busy
	// endpoint holding 900 of its tokens (4 + 0.1 s) beats the one now
	// 10 s deep.
	if n := sc.ReleaseHeld(q, 12, f, &s); n != 1 || f.who[1] != b || f.got[1].Prefill != 0 {
		t.Fatalf("deadline release: n=%d %+v", n, f.got)
	}
	if q.Len() != 0 {
		t.Fatalf("%d still held", q.Len())
	}
}

func TestReleaseHeldDisaggregated(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, DefaultSLO: SLO{TTFT: 2}}
	f := &holdFleet{snap: Snapshot{Now: 10, Endpoints: []Endpoint{
		{Name: "p", Role: fleet.RolePrefill, PrefillSpeed: 1000},
		{Name: "d", Role: fleet.RoleDecode, KVFreeTokens: 1 << 20},
	}}}
	q := NewHoldQueue(8)
	if err := q.Push(&Held{Req: Request{Arrival: 1, PromptTokens: 500}, Until: 100}); err != nil {
		t.Fatal(err)
	}
	var s Snapshot
	if n := sc.ReleaseHeld(q, 10, f, &s); n != 1 || f.got[0].Prefill != 0 || f.got[0].Decode != 1 {
		t.Fatalf("P/D release: n=%d %+v", n, f.got)
	}
}

func TestReleaseHeldSlackOnACachedEndpoint(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, DefaultSLO: SLO{TTFT: 2}}
	// The previous turn just went to "warm": 0.5 s queued, and it will
	// hold 9 000 of this request's 10 000 tokens. 0.5 + 0.1 s is within
	// half the SLO: released there at once, not held for an idle queue
	// where it would compute all 10 000 tokens.
	f := &holdFleet{snap: Snapshot{Now: 10, Endpoints: []Endpoint{
		{Name: "warm", Role: fleet.RoleBoth, PrefillSpeed: 10000, QueueWait: 0.5, CachedTokens: 9000},
		{Name: "cold", Role: fleet.RoleBoth, PrefillSpeed: 10000, QueueWait: 3},
	}}}
	q := NewHoldQueue(8)
	if err := q.Push(&Held{Req: Request{Arrival: 9, PromptTokens: 10000}, Until: 50}); err != nil {
		t.Fatal(err)
	}
	var s Snapshot
	if n := sc.ReleaseHeld(q, 10, f, &s); n != 1 || f.got[0].Prefill != 0 {
		t.Fatalf("n=%d %+v, want a release onto the warm endpoint", n, f.got)
	}
	// With a tighter slack it stays held.
	sc.HoldSlack = 0.2
	f.snap.Endpoints[0].QueueWait = 0.5
	if err := q.Push(&Held{Req: Request{Arrival: 9, PromptTokens: 10000}, Until: 50}); err != nil {
		t.Fatal(err)
	}
	if n := sc.ReleaseHeld(q, 10, f, &s); n != 0 {
		t.Fatalf("released %d with slack 0.2 SLOs", n)
	}
}

// TestOverdueReleaseKeepsToCacheUnderLoad: an overdue held request goes,
// for kvgate, where q + (1 + λ)·compute is lowest: with the fleet's queues
// long (λ high) that is the endpoint holding its prefix even behind a
// longer queue; another policy sends it where it is served soonest.
func TestOverdueReleaseKeepsToCacheUnderLoad(t *testing.T) {
	snap := Snapshot{Now: 10, Endpoints: []Endpoint{
		{Name: "warm", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 2.5, CachedTokens: 1800},
		{Name: "cold", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 0.5},
	}}
	// Soonest: cold (0.5 + 2 s against 2.5 + 0.2 s). Priced at λ = 8 ×
	// 1.5 s / 2 s = 6: warm (2.5 + 7 × 0.2) against cold (0.5 + 7 × 2).
	req := Request{Arrival: 1, PromptTokens: 2000}
	for _, tc := range []struct {
		policy string
		want   int
	}{{"kvgate", 0}, {"cache-only", 1}} {
		pol, _ := New(tc.policy, Options{})
		sc := &Scheduler{Policy: pol, Hold: true, DefaultSLO: SLO{TTFT: 2}}
		f := &holdFleet{snap: snap}
		f.snap.Endpoints = append([]Endpoint(nil), snap.Endpoints...)
		q := NewHoldQueue(4)
		if err := q.Push(&Held{Req: req, Until: 5}); err != nil {
			t.Fatal(err)
		}
		var s Snapshot
		if n := sc.ReleaseHeld(q, 10, f, &s); n != 1 || f.got[0].Prefill != tc.want {
			t.Fatalf("%s: n=%d %+v, want endpoint %d", tc.policy, n, f.got, tc.want)
		}
	}
}

// staticFleet hands out one snapshot (what it costs to build one is the
// caller's, as for Decide) and dispatches nothing.
type staticFleet struct{ snap *Snapshot }

func (f staticFleet) SnapshotFor(_ *Held, _ float64, s *Snapshot) { *s = *f.snap }
func (staticFleet) Dispatch(*Held, Decision)                      {}

// BenchmarkDecisionHold64 is kvgate's decision cost with the hold queue
// over 64 endpoints, against llm-d's token-aware policy in the same run:
// a request that fits (the hold check; with early rejection, the check
// for a request that misses even alone), and a whole hold cycle for one
// that fits nowhere (Decide, Push, a release pass onto an idle endpoint).
func BenchmarkDecisionHold64(b *testing.B) {
	r, s := benchFleet(64)
	b.Run("llmd-token-aware", func(b *testing.B) {
		sc := Scheduler{Policy: mustNew(&testing.T{}, "llmd-token-aware", Options{}), EarlyReject: true}
		for b.Loop() {
			sc.Decide(r, s)
		}
	})
	b.Run("kvgate-hold/fits", func(b *testing.B) {
		sc := Scheduler{Policy: mustNew(&testing.T{}, "kvgate", Options{}), Hold: true}
		for b.Loop() {
			sc.Decide(r, s)
		}
	})
	b.Run("kvgate-hold-reject/fits", func(b *testing.B) {
		sc := Scheduler{Policy: mustNew(&testing.T{}, "kvgate", Options{}), Hold: true, EarlyReject: true}
		for b.Loop() {
			sc.Decide(r, s)
		}
	})
	b.Run("kvgate-hold/held-cycle", func(b *testing.B) {
		sc := Scheduler{Policy: mustNew(&testing.T{}, "kvgate", Options{}), Hold: true}
		busy := *s
		busy.Endpoints = append([]Endpoint(nil), s.Endpoints...)
		for i := range busy.Endpoints {
			busy.Endpoints[i].QueueWait += 3 // fits nowhere
		}
		idle := *s
		idle.Endpoints = append([]Endpoint(nil), busy.Endpoints...)
		idle.Endpoints[7].QueueWait = 0
		q := NewHoldQueue(16)
		var scratch Snapshot
		h := &Held{}
		for b.Loop() {
			d := sc.Decide(r, &busy)
			*h = Held{Req: *r, Until: d.HoldUntil, Compute: d.HoldCompute}
			if err := q.Push(h); err != nil {
				b.Fatal(err)
			}
			if sc.ReleaseHeld(q, 0, staticFleet{&idle}, &scratch) != 1 {
				b.Fatal("not released")
			}
		}
	})
}

// oneSlackFleet has one endpoint with slack until a request is
// dispatched, so that a release pass releases one request.
type oneSlackFleet struct {
	snap  *Snapshot
	idle  int
	taken bool
}

func (f *oneSlackFleet) SnapshotFor(_ *Held, _ float64, s *Snapshot) {
	*s = *f.snap
	if f.taken {
		s.Endpoints = append(s.Endpoints[:0:0], f.snap.Endpoints...)
		s.Endpoints[f.idle].QueueWait = 3
	}
}
func (f *oneSlackFleet) Dispatch(*Held, Decision) { f.taken = true }

// BenchmarkReleaseHeldBacklog is one release pass over 64 endpoints with
// 200 requests held: in order (the head has waited less than the cache
// turnover), and with the held requests' caches at risk, when the pass
// weighs the cacheFirstCandidates oldest (a snapshot and a pick each).
func BenchmarkReleaseHeldBacklog(b *testing.B) {
	r, s := benchFleet(64)
	fl := *s
	fl.Endpoints = append([]Endpoint(nil), s.Endpoints...)
	for i := range fl.Endpoints {
		fl.Endpoints[i].QueueWait += 3
		fl.Endpoints[i].HeldTokens = 20000 // turnover: 1 s
	}
	fl.Endpoints[7].QueueWait = 0
	for _, bc := range []struct {
		name string
		now  float64
	}{{"in-order", 0.5}, {"caches-at-risk", 1000}} {
		b.Run(bc.name, func(b *testing.B) {
			sc := Scheduler{Policy: mustNew(&testing.T{}, "kvgate", Options{}), Hold: true}
			q := NewHoldQueue(256)
			for i := range 200 {
				if err := q.Push(&Held{Req: *r, Until: 1e9}); err != nil {
					b.Fatalf("held %d: %v", i, err)
				}
			}
			f := &oneSlackFleet{snap: &fl, idle: 7}
			var scratch Snapshot
			for b.Loop() {
				f.taken = false
				if err := q.Push(&Held{Req: *r, Until: 1e9}); err != nil {
					b.Fatal(err)
				}
				if sc.ReleaseHeld(q, bc.now, f, &scratch) != 1 {
					b.Fatal("not one released")
				}
			}
		})
	}
}

// TestRejectedForPrefill: a rejection for the load on the prefill side
// (the queue pushed the TTFT over the SLO) counts for the quiet window and
// the pressure price; one on the decode side (no KV room) is for the load
// but not for prefill compute; one that misses alone is neither.
func TestRejectedForPrefill(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, EarlyReject: true, DefaultSLO: SLO{TTFT: 2}}
	pd := func(queue float64, kvFree int) *Snapshot {
		return &Snapshot{Now: 10, Endpoints: []Endpoint{
			{Name: "p", Role: fleet.RolePrefill, PrefillSpeed: 1000, QueueWait: queue},
			{Name: "d", Role: fleet.RoleDecode, KVFreeTokens: kvFree},
		}}
	}
	for _, tc := range []struct {
		name          string
		prompt        int
		snap          *Snapshot
		load, prefill bool
	}{
		{"queue pushes the TTFT over", 1000, pd(1.5, 1<<20), true, true},
		{"no KV room to decode", 1000, pd(0, 10), true, false},
		{"misses alone", 5000, pd(0, 1<<20), false, false},
		{"admitted", 1000, pd(0, 1<<20), false, false},
	} {
		r := Request{Arrival: 10, PromptTokens: tc.prompt, OutputTokens: 10}
		d := sc.Decide(&r, tc.snap)
		if got := RejectedForLoad(&r, tc.snap, &d); got != tc.load {
			t.Errorf("%s: RejectedForLoad %v, want %v (%+v)", tc.name, got, tc.load, d)
		}
		if got := RejectedForPrefill(&r, tc.snap, &d); got != tc.prefill {
			t.Errorf("%s: RejectedForPrefill %v, want %v (%+v)", tc.name, got, tc.prefill, d)
		}
	}
}

func TestHoldSettingsScheduler(t *testing.T) {
	kv, err := New("kvgate", Options{})
	if err != nil {
		t.Fatal(err)
	}
	co, err := New("cache-only", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode HoldMode
		pol  Policy
		want bool
	}{
		{HoldByPolicy, kv, true}, {HoldByPolicy, co, false},
		{HoldAlways, kv, true}, {HoldAlways, co, true},
		{HoldNever, kv, false}, {HoldNever, co, false},
	} {
		h := HoldSettings{Mode: tc.mode, Min: 2, Backlog: 3, Max: 4, Slack: 0.25, Quiet: 6}
		sc := h.Scheduler(tc.pol, true)
		if sc.Hold != tc.want || sc.Policy != tc.pol || !sc.EarlyReject {
			t.Errorf("mode %d, %s: Hold %v, EarlyReject %v, want Hold %v", tc.mode, tc.pol.Name(), sc.Hold, sc.EarlyReject, tc.want)
		}
		if sc.HoldMin != 2 || sc.HoldBacklog != 3 || sc.HoldMax != 4 || sc.HoldSlack != 0.25 || sc.HoldQuiet != 6 {
			t.Errorf("mode %d: parameters not carried: %+v", tc.mode, sc)
		}
	}
}

func TestParseHoldMode(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want HoldMode
		ok   bool
	}{
		{"policy", HoldByPolicy, true},
		{"on", HoldAlways, true},
		{"all", HoldAlways, true},
		{"off", HoldNever, true},
		{"", 0, false},
		{"On", 0, false},
		{"yes", 0, false},
	} {
		got, err := ParseHoldMode(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("%q: %v %v", tt.in, got, err)
		}
	}
}

// TestLoadRejectionsKinds: a rejection for the load is remembered by
// kind, short of compute (no prefilling endpoint idle) or misplaced (one
// idle), each in its own Snapshot field; the hold's quiet window counts
// both; an older note moves neither.
func TestLoadRejectionsKinds(t *testing.T) {
	var l LoadRejections
	s := Snapshot{Now: 100}
	l.Fill(&s)
	if s.SinceLoadRejection != 0 || s.SinceIdleRejection != 0 || !math.IsInf(l.quietFor(100), 1) {
		t.Fatalf("none noted: %+v, quiet %v", s, l.quietFor(100))
	}
	l.Note(90, true)
	l.Fill(&s)
	if s.SinceLoadRejection != 0 || s.SinceIdleRejection != 10 || l.quietFor(100) != 10 {
		t.Fatalf("one with an endpoint idle 10 s ago: %v %v, quiet %v", s.SinceLoadRejection, s.SinceIdleRejection, l.quietFor(100))
	}
	l.Note(95, false)
	l.Note(80, true) // older than the last idle one: ignored
	l.Fill(&s)
	if s.SinceLoadRejection != 5 || s.SinceIdleRejection != 10 || l.quietFor(100) != 5 {
		t.Fatalf("then one short 5 s ago: %v %v, quiet %v", s.SinceLoadRejection, s.SinceIdleRejection, l.quietFor(100))
	}
	s.Now = 95
	l.Fill(&s)
	if s.SinceLoadRejection != 1e-9 {
		t.Fatalf("at the rejection's own time: %v, want 1 ns", s.SinceLoadRejection)
	}

	busy := Endpoint{Role: fleet.RoleBoth, QueueWait: 0.3}
	for _, tc := range []struct {
		eps  []Endpoint
		idle bool
	}{
		{[]Endpoint{busy, busy}, false},
		{[]Endpoint{busy, {Role: fleet.RoleDecode}}, false},
		{[]Endpoint{busy, {Role: fleet.RolePrefill}}, true},
		{[]Endpoint{{Role: fleet.RoleBoth}}, true},
		{nil, false},
	} {
		if got := AnyPrefillIdle(&Snapshot{Endpoints: tc.eps}); got != tc.idle {
			t.Errorf("%+v: AnyPrefillIdle %v, want %v", tc.eps, got, tc.idle)
		}
	}
}

func TestHoldQueueOldest(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	q := NewHoldQueue(1000)
	var held []*Held
	for range 300 {
		h := &Held{Req: Request{Priority: rng.IntN(3), Arrival: float64(rng.IntN(50))}, Until: 1e9}
		if err := q.Push(h); err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	for _, h := range held {
		if rng.IntN(4) == 0 {
			q.Remove(h)
		}
	}
	var want []*Held
	for _, h := range held {
		if h.prio >= 0 {
			want = append(want, h)
		}
	}
	slices.SortFunc(want, func(a, b *Held) int {
		switch {
		case q.byPrio.less(a, b):
			return -1
		case q.byPrio.less(b, a):
			return 1
		}
		return 0
	})
	for _, k := range []int{0, 1, 2, 7, 64, len(want), len(want) + 10} {
		got := q.oldest(k, nil)
		if n := min(k, len(want)); !slices.Equal(got, want[:n]) {
			t.Fatalf("oldest(%d): %d requests, not the first %d by priority then arrival", k, len(got), n)
		}
	}
	if got := NewHoldQueue(4).oldest(5, nil); len(got) != 0 {
		t.Fatalf("oldest on an empty queue: %d", len(got))
	}
}

// cacheFleet is one prefill endpoint whose cache holds, of each held
// request (by its Value, a name), the tokens cached says; Dispatch
// records and makes the endpoint busy, as routing would.
type cacheFleet struct {
	snap   Snapshot
	cached map[string]int
	who    []string
}

func (f *cacheFleet) SnapshotFor(h *Held, _ float64, s *Snapshot) {
	*s = f.snap
	s.Endpoints = append([]Endpoint(nil), f.snap.Endpoints...)
	s.Endpoints[0].CachedTokens = f.cached[h.Value.(string)]
}

func (f *cacheFleet) Dispatch(h *Held, d Decision) {
	f.who = append(f.who, h.Value.(string))
	if d.Admit {
		f.snap.Endpoints[d.Prefill].QueueWait += 10
	}
}

// TestReleaseHeldCacheFirst: while the oldest held request has waited
// less than the fleet's cache turnover (held tokens over speed: 5 s here)
// the hold releases in order; once it has waited longer, the one of the
// oldest of its priority with the most tokens cached where it would go
// (ties to the older), and a head with no slack no longer blocks the rest.
func TestReleaseHeldCacheFirst(t *testing.T) {
	type held struct {
		name    string
		prio    int
		arrival float64
		prompt  int
		cached  int
		until   float64 // its deadline (0: 100, far off)
	}
	cold := held{"cold", 0, 0, 3000, 0, 0}
	warm := held{"warm", 0, 1, 3200, 3000, 0}
	lukewarm := held{"lukewarm", 0, 2, 3200, 1000, 0}
	tests := []struct {
		name      string
		held      []held
		queueWait float64 // the endpoint's
		heldToks  int     // its cache's size
		now       float64
		want      []string // released, in order
	}{
		{"within the turnover: in order", []held{cold, warm, lukewarm}, 0, 5000, 5, []string{"cold"}},
		{"past it: the most cached first", []held{cold, warm, lukewarm}, 0, 5000, 6, []string{"warm"}},
		{"ties to the older", []held{cold, {"warm2", 0, 3, 3200, 3000, 0}, warm}, 0, 5000, 6, []string{"warm"}},
		{"only the head's priority", []held{{"urgent", 1, 0.5, 3000, 0, 0}, cold, warm}, 0, 5000, 6, []string{"urgent"}},
		{"no cache size known: in order", []held{cold, warm}, 0, 0, 6, []string{"cold"}},
		// 0.5 s queued, SLO 2 s, slack ½: only a prompt computed within
		// 0.5 s has slack. In order, the cold head blocks the warm one.
		{"a head without slack blocks, in order", []held{cold, warm}, 0.5, 5000, 5, nil},
		{"past the turnover it does not", []held{cold, warm}, 0.5, 5000, 6, []string{"warm"}},
		// Age still wins: an overdue request goes first, cached or not.
		{"the overdue first", []held{{"overdue", 0, 0.5, 3000, 0, 6}, cold, warm}, 0, 5000, 6, []string{"overdue"}},
	}
	pol, _ := New("kvgate", Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := &Scheduler{Policy: pol, Hold: true, DefaultSLO: SLO{TTFT: 2}}
			f := &cacheFleet{cached: map[string]int{}, snap: Snapshot{Now: tt.now, Endpoints: []Endpoint{
				{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: tt.queueWait, HeldTokens: tt.heldToks}}}}
			q := NewHoldQueue(8)
			for _, h := range tt.held {
				f.cached[h.name] = h.cached
				r := Request{Priority: h.prio, Arrival: h.arrival, PromptTokens: h.prompt, SLO: SLO{TTFT: 2}}
				until := h.until
				if until == 0 {
					until = 100
				}
				if err := q.Push(&Held{Req: r, Until: until, Value: h.name}); err != nil {
					t.Fatal(err)
				}
			}
			var s Snapshot
			sc.ReleaseHeld(q, tt.now, f, &s)
			if !slices.Equal(f.who, tt.want) {
				t.Fatalf("released %v, want %v", f.who, tt.want)
			}
		})
	}
}

// TestReleaseHeldCacheFirstBounded: only the cacheFirstCandidates oldest
// are weighed; a warm request behind them waits its turn.
func TestReleaseHeldCacheFirstBounded(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, DefaultSLO: SLO{TTFT: 2}}
	f := &cacheFleet{cached: map[string]int{}, snap: Snapshot{Now: 100, Endpoints: []Endpoint{
		{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 1000, HeldTokens: 5000}}}}
	q := NewHoldQueue(cacheFirstCandidates + 2)
	push := func(name string, arrival float64, cached int) {
		f.cached[name] = cached
		if err := q.Push(&Held{Req: Request{Arrival: arrival, PromptTokens: 3200}, Until: 1000, Value: name}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range cacheFirstCandidates {
		push(fmt.Sprint("cold", i), float64(i), 0)
	}
	push("warm", cacheFirstCandidates, 3000)
	var s Snapshot
	sc.ReleaseHeld(q, 100, f, &s)
	if !slices.Equal(f.who, []string{"cold0"}) {
		t.Fatalf("released %v, want the head: the warm request is not among the %d oldest", f.who, cacheFirstCandidates)
	}
}

func TestTurnover(t *testing.T) {
	tests := []struct {
		name string
		eps  []Endpoint
		want float64
	}{
		{"held tokens over summed speed", []Endpoint{
			{Role: fleet.RoleBoth, PrefillSpeed: 1000, HeldTokens: 3000},
			{Role: fleet.RolePrefill, PrefillSpeed: 3000, HeldTokens: 5000}}, 2},
		{"decode endpoints do not count", []Endpoint{
			{Role: fleet.RolePrefill, PrefillSpeed: 1000, HeldTokens: 1000},
			{Role: fleet.RoleDecode, PrefillSpeed: 1000, HeldTokens: 9000}}, 1},
		{"no speed known", []Endpoint{{Role: fleet.RoleBoth, HeldTokens: 1000}}, 0},
		{"no endpoints", nil, 0},
	}
	for _, tt := range tests {
		if got := turnover(&Snapshot{Endpoints: tt.eps}); got != tt.want {
			t.Errorf("%s: turnover %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestHoldFairTenants: within a priority, held requests are served by
// tenant in turn, by compute (fairTags): a tenant that floods the hold
// queues behind its own requests; without tenants the order is arrival,
// as it always was; a higher priority still goes first; the tenants
// tracked are bounded.
func TestHoldFairTenants(t *testing.T) {
	order := func(q *HoldQueue) string {
		var ids []string
		for _, h := range q.oldest(100, nil) {
			ids = append(ids, h.Req.ID)
		}
		return strings.Join(ids, " ")
	}
	push := func(q *HoldQueue, id, tenant string, arrival float64, prio int, compute float64) *Held {
		h := &Held{Req: Request{ID: id, Arrival: arrival, Priority: prio}, Until: 1e9, Compute: compute, Tenant: tenant}
		if err := q.Push(h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	q := NewHoldQueue(100)
	for i := range 5 {
		push(q, fmt.Sprintf("a%d", i), "", float64(i), 0, 1)
	}
	if got := order(q); got != "a0 a1 a2 a3 a4" {
		t.Fatalf("without tenants: %s, want arrival order", got)
	}
	q = NewHoldQueue(100)
	for i := range 5 {
		push(q, fmt.Sprintf("a%d", i), "flood", float64(i), 0, 1)
	}
	push(q, "b5", "light", 5, 0, 1)
	push(q, "b6", "light", 6, 0, 1)
	push(q, "c7", "", 7, 0, 2) // no header: a tenant of its own, twice the compute
	push(q, "c8", "", 8, 0, 1)
	push(q, "p9", "flood", 9, 1, 1) // a higher priority
	if got, want := order(q), "p9 a0 b5 c7 a1 b6 a2 c8 a3 a4"; got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
	// Served, the clock moves on: a newcomer starts at its priority's
	// clock, not at 0; a higher priority's requests move only theirs.
	for _, h := range q.oldest(3, nil) { // p9 (priority 1), a0, b5 (tags 0)
		q.Remove(h)
		q.served(h)
	}
	push(q, "d10", "late", 10, 0, 1)
	if got, want := order(q), "c7 d10 a1 b6 a2 c8 a3 a4"; got != want {
		t.Fatalf("after three served: %s, want %s", got, want)
	}
	var f fairTags
	for i := range maxFairTenants + 100 {
		f.start(fmt.Sprint("t", i), i%3, 1)
	}
	n := 0
	for _, b := range f.bands {
		n += len(b.ends)
	}
	if n > maxFairTenants+3 || f.tenants != n {
		t.Fatalf("%d tenants tracked (counted %d), want at most %d and the shared turns", n, f.tenants, maxFairTenants)
	}
}

// TestDecideKeepsLostRequestsWarm: without early rejection, a request
// that fits its SLO nowhere but holds at least half its prompt cached
// somewhere, and whose whole prompt would miss the SLO even on an idle
// endpoint, is served at once where it is cached (its TTFT least among
// such endpoints) instead of held: held, its cache is evicted and its
// conversation's later turns miss too. A request whose whole prompt fits
// the SLO, or one cached less than half, is held as before; with early
// rejection nothing changes.
func TestDecideKeepsLostRequestsWarm(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, DefaultSLO: SLO{TTFT: 2}}
	snap := Snapshot{Now: 100, Endpoints: []Endpoint{
		{Name: "cold", Role: fleet.RoleBoth, PrefillSpeed: 20000, QueueWait: 0.5},
		{Name: "warm-busy", Role: fleet.RoleBoth, PrefillSpeed: 20000, QueueWait: 6, CachedTokens: 50000},
		{Name: "warm", Role: fleet.RoleBoth, PrefillSpeed: 20000, QueueWait: 2.5, CachedTokens: 40000},
	}}
	long := Request{Arrival: 100, PromptTokens: 60000} // 3 s whole: misses alone
	d := sc.Decide(&long, &snap)
	if !d.Admit || d.Hold || d.Prefill != 2 {
		t.Fatalf("a lost request cached on two endpoints: %+v, want served at once on warm (index 2)", d)
	}
	// Cached less than half everywhere: held.
	less := snap
	less.Endpoints = append([]Endpoint(nil), snap.Endpoints...)
	less.Endpoints[1].CachedTokens, less.Endpoints[2].CachedTokens = 20000, 29000
	if d := sc.Decide(&long, &less); !d.Hold {
		t.Errorf("cached less than half: %+v, want held", d)
	}
	// A prompt that fits the SLO whole (1.5 s) is held: its cache is cheap
	// to lose.
	short := Request{Arrival: 100, PromptTokens: 30000}
	shortSnap := snap
	shortSnap.Endpoints = append([]Endpoint(nil), snap.Endpoints...)
	shortSnap.Endpoints[0].QueueWait = 3
	shortSnap.Endpoints[2].CachedTokens = 20000
	if d := sc.Decide(&short, &shortSnap); !d.Hold {
		t.Errorf("a short lost request: %+v, want held", d)
	}
	sc.EarlyReject = true
	if d := sc.Decide(&long, &snap); d.Admit {
		t.Errorf("with early rejection: %+v, want not admitted", d)
	}
}
