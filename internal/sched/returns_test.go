package sched

import (
	"fmt"
	"math"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestReturns: an investment comes back when a later request extends its
// prompt (more blocks, the same key at its last one), not when the same
// prompt is sent again; it is lost past its horizon; outcomes fade over
// ReturnsMemory; the pending ones are capped.
func TestReturns(t *testing.T) {
	var r Returns
	if got := r.Rate(0); got != 0.5 {
		t.Fatalf("no outcome: rate %v, want ½", got)
	}
	r.Invest(0, []uint64{11, 12, 13}, 10)
	r.Invest(0, nil, 10)                       // nothing to recognise it by
	r.Invest(0, []uint64{21, 22}, 0)           // no horizon
	r.Invest(math.NaN(), []uint64{1}, 10)      // no clock
	r.NoteArrival(1, []uint64{11, 12, 13})     // a retry: the same prompt
	r.NoteArrival(2, []uint64{11, 12, 99, 14}) // another branch at block 3
	if got := r.Rate(2); got != 0.5 {
		t.Fatalf("nothing settled yet: rate %v, want ½", got)
	}
	r.NoteArrival(3, []uint64{11, 12, 13, 14}) // its next turn
	if got := r.Rate(3); math.Abs(got-2.0/3) > 1e-9 {
		t.Fatalf("one came back: rate %v, want ⅔", got)
	}
	r.Invest(3, []uint64{31, 32}, 10)
	r.NoteArrival(12, []uint64{5}) // within the horizon: still pending
	r.NoteArrival(14, []uint64{5}) // past it: lost
	if got, want := r.Rate(14), (1*math.Exp(-11/ReturnsMemory)+1)/(1*math.Exp(-11/ReturnsMemory)+1+2); math.Abs(got-want) > 1e-9 {
		t.Fatalf("one came back, one lost: rate %v, want %v", got, want)
	}
	// After many memories both fade: back to the prior.
	if got := r.Rate(14 + 50*ReturnsMemory); math.Abs(got-0.5) > 1e-6 {
		t.Fatalf("after 50 memories: rate %v, want ½", got)
	}
	var c Returns
	for i := range maxPendingInvestments + 3 {
		c.Invest(0, []uint64{uint64(i) + 1}, 100)
	}
	if len(c.pending) != maxPendingInvestments || c.lost != 3 {
		t.Fatalf("pending %d lost %v, want %d and 3", len(c.pending), c.lost, maxPendingInvestments)
	}
}

// TestLends: with early rejection a request that misses its SLO alone by
// 0.5 s (SLO 2 s, quiet window 60 s) is lent the compute once the window
// has passed while at least a quarter of such requests came back, and
// before it, while most came back, once a quarter of the window has
// passed (0.5 s of overshoot per quarter SLO); never right after a
// rejection.
func TestLends(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, EarlyReject: true, DefaultSLO: SLO{TTFT: 2}}
	s := &Snapshot{Endpoints: []Endpoint{
		{Role: fleet.RolePrefill, PrefillSpeed: 1000},
		{Role: fleet.RolePrefill, PrefillSpeed: 100},
		{Role: fleet.RoleDecode},
	}}
	req := &Request{PromptTokens: 2500, SLO: SLO{TTFT: 2}} // 2.5 s alone at best
	inf := math.Inf(1)
	for _, c := range []struct {
		quiet, returns float64
		want           bool
	}{
		{inf, 0.5, true},
		{inf, 0.25, true},
		{inf, 0.24, false},
		{60, 0.3, true},
		{59, 0.5, false}, // not most: only the full window
		{59, 0.51, true},
		{15, 0.51, true}, // a quarter of the window: 0.5 s
		{14.9, 0.9, false},
		{0, 0.9, false},
	} {
		if got := sc.lends(req, s, lending{quiet: c.quiet, returns: c.returns}); got != c.want {
			t.Errorf("quiet %v s, returns %v: lends %v, want %v", c.quiet, c.returns, got, c.want)
		}
	}
}

// TestHoldStopsInvestingWhenNothingComesBack: on a quiet, idle fleet the
// hold serves late what misses alone, and records it; when nothing
// extends those prompts within the quiet window it stops (once fewer than
// a quarter came back: the held request is rejected at its deadline), and
// tries again once the verdict has faded.
func TestHoldStopsInvestingWhenNothingComesBack(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, EarlyReject: true, DefaultSLO: SLO{TTFT: 2}}
	f := &holdFleet{}
	for i := range 4 {
		f.snap.Endpoints = append(f.snap.Endpoints, Endpoint{Name: string(rune('a' + i)), Role: fleet.RoleBoth, PrefillSpeed: 1000})
	}
	q := NewHoldQueue(8)
	var s Snapshot
	// serve holds a 5 s prompt at now on an idle fleet and reports
	// whether it was served late (else it is rejected at its deadline).
	serve := func(now float64, key uint64) bool {
		for i := range f.snap.Endpoints {
			f.snap.Endpoints[i].QueueWait = 0
		}
		f.snap.Now = now
		if err := q.Push(&Held{Req: Request{Arrival: now, PromptTokens: 5000}, Until: now + 2, Keys: []uint64{key}}); err != nil {
			t.Fatal(err)
		}
		if sc.ReleaseHeld(q, now, f, &s) == 1 {
			return f.got[len(f.got)-1].Admit
		}
		f.snap.Now = now + 2
		if n := sc.ReleaseHeld(q, now+2, f, &s); n != 1 || f.got[len(f.got)-1].Admit {
			t.Fatalf("at its deadline: released %d (%+v), want rejected", n, f.got)
		}
		return false
	}
	now := 0.0
	for k := range 3 {
		if !serve(now, uint64(k+1)) {
			t.Fatalf("investment %d not served", k+1)
		}
		now += 61 // nothing extends it within the window
		q.NoteArrival(now, []uint64{999})
	}
	if serve(now, 4) {
		t.Fatal("served after three lost ((0 + 1) / (3 + 2) < ¼)")
	}
	if !serve(now+3*ReturnsMemory, 5) {
		t.Fatal("not served once the verdict faded")
	}
}

// BenchmarkNoteArrival is the per-request cost the hold's returns add
// (HoldQueue.NoteArrival): with no investment pending (the common case),
// and with 16 pending, none of which the arrival settles.
func BenchmarkNoteArrival(b *testing.B) {
	keys := make([]uint64, 1000) // a 64 000-token prompt in 64-token blocks
	for i := range keys {
		keys[i] = uint64(i)*0x9E3779B97F4A7C15 + 1
	}
	for _, pending := range []int{0, 16} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			var r Returns
			for i := range pending {
				r.Invest(0, []uint64{uint64(i) + 7, uint64(i) + 8}, 1e9)
			}
			for b.Loop() {
				r.NoteArrival(1, keys)
			}
		})
	}
}
