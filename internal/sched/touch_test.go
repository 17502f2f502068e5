package sched

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// touchFleet is two endpoints, a and b, each holding 10 000 tokens (a
// turnover of 10 s at 1 000 tokens/s each), that cache per held request
// (by name) the tokens in cached[name][endpoint], and records touches.
type touchFleet struct {
	snap    Snapshot
	cached  map[string][2]int
	touched []string // name@endpoint:tokens
}

func (f *touchFleet) SnapshotFor(h *Held, _ float64, s *Snapshot) {
	*s = f.snap
	s.Endpoints = append([]Endpoint(nil), f.snap.Endpoints...)
	c := f.cached[h.Value.(string)]
	for i := range s.Endpoints {
		s.Endpoints[i].CachedTokens = c[i]
	}
}

func (f *touchFleet) Dispatch(*Held, Decision) {}

func (f *touchFleet) Touch(h *Held, i, tokens int) {
	f.touched = append(f.touched, fmt.Sprintf("%s@%s:%d", h.Value, f.snap.Endpoints[i].Name, tokens))
}

// TestTouchHeld: a touch pass touches, once the oldest held request has
// waited longer than the fleet's turnover, each held request's longest
// cached prefix (one token more) where it is cached, in the order the
// hold serves them, within half of each endpoint's cache; again only
// after half a turnover; never with early rejection, without the hold, or
// when turned off.
func TestTouchHeld(t *testing.T) {
	type held struct {
		name    string
		prio    int
		arrival float64
		prompt  int
		cached  [2]int // on a, b
	}
	x := held{"x", 0, 0, 3000, [2]int{2000, 0}}
	y := held{"y", 0, 1, 3000, [2]int{0, 2992}}
	z := held{"z", 0, 2, 3000, [2]int{400, 1000}}
	cold := held{"cold", 0, 0.5, 3000, [2]int{0, 0}}
	part := held{"part", 0, 0.7, 3000, [2]int{15, 0}} // less than a block
	whole := held{"whole", 0, 1.5, 2000, [2]int{2000, 0}}
	big := held{"big", 0, 3, 8000, [2]int{4000, 0}}
	tests := []struct {
		name   string
		held   []held
		now    float64
		mutate func(sc *Scheduler)
		want   []string
	}{
		{"within the turnover: none", []held{x, y, z}, 10, nil, nil},
		{"past it: each where most is cached", []held{x, y, z}, 10.5, nil, []string{"x@a:2001", "y@b:2993", "z@b:1001"}},
		{"nothing cached, or less than a block: none", []held{cold, part, x}, 10.5, nil, []string{"x@a:2001"}},
		{"a whole prompt cached: the prompt", []held{whole}, 12, nil, []string{"whole@a:2000"}},
		// a holds 10 000: half is 5 000; x's 2 000 fit, big's 4 000 then
		// do not, z's goes to b.
		{"within half of each cache", []held{x, big, z}, 10.5, nil, []string{"x@a:2001", "z@b:1001"}},
		{"the serving order: priority first", []held{x, {"urgent", 1, 0.2, 8000, [2]int{4000, 0}}}, 10.5, nil, []string{"urgent@a:4001"}},
		{"early rejection: none", []held{x}, 10.5, func(sc *Scheduler) { sc.EarlyReject = true }, nil},
		{"no hold: none", []held{x}, 10.5, func(sc *Scheduler) { sc.Hold = false }, nil},
		{"not turned on: none", []held{x}, 10.5, func(sc *Scheduler) { sc.HoldTouch = false }, nil},
	}
	pol, _ := New("kvgate", Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := &Scheduler{Policy: pol, Hold: true, HoldTouch: true, DefaultSLO: SLO{TTFT: 2}}
			if tt.mutate != nil {
				tt.mutate(sc)
			}
			f, q := newTouchFleet(t, tt.now)
			for _, h := range tt.held {
				f.cached[h.name] = h.cached
				pushHeld(t, q, h.name, h.prio, h.arrival, h.prompt)
			}
			var s Snapshot
			n := sc.TouchHeld(q, tt.now, f, &s)
			if !slices.Equal(f.touched, tt.want) || n != len(tt.want) {
				t.Fatalf("touched %v (%d), want %v", f.touched, n, tt.want)
			}
		})
	}
}

// TestTouchHeldAgainAfterHalfTurnover: a held request is touched again
// only once half the turnover (5 s here) has passed since its last touch;
// one found with nothing cached is looked at again only then too; one
// held later is touched at the next pass, the others not again before
// their time.
func TestTouchHeldAgainAfterHalfTurnover(t *testing.T) {
	pol, _ := New("kvgate", Options{})
	sc := &Scheduler{Policy: pol, Hold: true, HoldTouch: true, DefaultSLO: SLO{TTFT: 2}}
	f, q := newTouchFleet(t, 11)
	f.cached["x"] = [2]int{2000, 0}
	pushHeld(t, q, "x", 0, 0, 3000)
	pushHeld(t, q, "cold", 0, 1, 3000)
	var s Snapshot
	for _, step := range []struct {
		now  float64
		want int
	}{{11, 1}, {11.1, 0}, {12, 1}, {15.9, 0}, {16, 2}, {17, 1}, {21, 2}} {
		f.snap.Now = step.now
		switch step.now {
		case 12:
			f.cached["late"] = [2]int{0, 300}
			pushHeld(t, q, "late", 0, 11.5, 3000)
		case 15.9:
			f.cached["cold"] = [2]int{0, 500} // looked at again at 16, not before
		}
		if n := sc.TouchHeld(q, step.now, f, &s); n != step.want {
			t.Fatalf("at %v: %d touches, want %d (so far %v)", step.now, n, step.want, f.touched)
		}
	}
	if want := []string{"x@a:2001", "late@b:301", "x@a:2001", "cold@b:501", "late@b:301", "x@a:2001", "cold@b:501"}; !slices.Equal(f.touched, want) {
		t.Fatalf("touched %v, want %v", f.touched, want)
	}
}

func newTouchFleet(t *testing.T, now float64) (*touchFleet, *HoldQueue) {
	t.Helper()
	f := &touchFleet{cached: map[string][2]int{}, snap: Snapshot{Now: now, BlockSize: 16, Endpoints: []Endpoint{
		{Name: "a", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 5, HeldTokens: 10000},
		{Name: "b", Role: fleet.RoleBoth, PrefillSpeed: 1000, QueueWait: 5, HeldTokens: 10000},
	}}}
	return f, NewHoldQueue(16)
}

func pushHeld(t *testing.T, q *HoldQueue, name string, prio int, arrival float64, prompt int) {
	t.Helper()
	r := Request{Priority: prio, Arrival: arrival, PromptTokens: prompt, SLO: SLO{TTFT: 2}}
	if err := q.Push(&Held{Req: r, Until: 1000, Value: name}); err != nil {
		t.Fatal(err)
	}
}

// countFleet is a Toucher over one snapshot that only counts touches.
type countFleet struct {
	snap *Snapshot
	n    int
}

func (f *countFleet) SnapshotFor(_ *Held, _ float64, s *Snapshot) { *s = *f.snap }
func (f *countFleet) Dispatch(*Held, Decision)                    {}
func (f *countFleet) Touch(*Held, int, int)                       { f.n++ }

// BenchmarkTouchHeld is one touch pass over 64 endpoints with 300
// requests held and their caches at risk: with every one of the
// TouchCandidates oldest due (a snapshot each), and with none due (the
// pass right after).
func BenchmarkTouchHeld(b *testing.B) {
	_, s := benchFleet(64)
	fl := *s
	fl.Endpoints = append([]Endpoint(nil), s.Endpoints...)
	for i := range fl.Endpoints {
		fl.Endpoints[i].Role = fleet.RoleBoth
		fl.Endpoints[i].HeldTokens = 1 << 20 // turnover: 52 s
	}
	fl.Now = 1000
	for _, due := range []bool{true, false} {
		b.Run(map[bool]string{true: "all-due", false: "none-due"}[due], func(b *testing.B) {
			sc := Scheduler{Policy: mustNew(&testing.T{}, "kvgate", Options{}), Hold: true, HoldTouch: true}
			q := NewHoldQueue(512)
			var held []*Held
			for i := range 300 {
				h := &Held{Req: Request{Arrival: float64(i), PromptTokens: 6400, SLO: SLO{TTFT: 2}}, Until: 1e9}
				if err := q.Push(h); err != nil {
					b.Fatal(err)
				}
				held = append(held, h)
			}
			f := &countFleet{snap: &fl}
			var scratch Snapshot
			sc.TouchHeld(q, 1000, f, &scratch)
			if f.n == 0 {
				b.Fatal("nothing touched")
			}
			for b.Loop() {
				if due {
					for _, h := range held {
						h.touch = touchState{}
					}
				}
				sc.TouchHeld(q, 1000, f, &scratch)
			}
		})
	}
}
