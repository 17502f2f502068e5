package load

import (
	"math"
	"testing"
)

// TestQueueTailStep: with a step budget (Info.StepTokens 8 192, 20 000
// tokens/s) the snapshot tells the step that ends an endpoint's queue:
// the tokens it has free and how long the first tokens it brings may
// slip. A (12 000 tokens, routed at 0, due 0.65 s) ends in a step of
// 3 808 tokens from 0.4096 s; B (2 000 tokens, at 0.1 s) fits in that
// step whole, which then also brings B's first token; C (10 000 tokens)
// ends in a step of its own.
func TestQueueTailStep(t *testing.T) {
	type want struct {
		room  int
		slack float64
	}
	for _, tc := range []struct {
		name  string
		steps int
		route []Work // routed at 0, 0.1, 0.2, …
		at    float64
		want  want
	}{
		{"one prompt", 8192, []Work{{Uncached: 12000, PrefillSeconds: 0.6, Deadline: 0.65}}, 0.1, want{4384, 0.05}},
		{"its last step has begun", 8192, []Work{{Uncached: 12000, PrefillSeconds: 0.6, Deadline: 0.65}}, 0.5, want{}},
		{"no deadline", 8192, []Work{{Uncached: 12000, PrefillSeconds: 0.6}}, 0.1, want{}},
		{"already late", 8192, []Work{{Uncached: 12000, PrefillSeconds: 0.6, Deadline: 0.55}}, 0.1, want{}},
		{"no step budget", 0, []Work{{Uncached: 12000, PrefillSeconds: 0.6, Deadline: 0.65}}, 0.1, want{}},
		{"a whole prompt joins", 8192, []Work{{Uncached: 12000, PrefillSeconds: 0.6, Deadline: 0.75},
			{Uncached: 2000, PrefillSeconds: 0.1, Deadline: 2}}, 0.2, want{2384, 0.05}},
		{"the joiner made the first late", 8192, []Work{{Uncached: 12000, PrefillSeconds: 0.6, Deadline: 0.65},
			{Uncached: 2000, PrefillSeconds: 0.1, Deadline: 2}}, 0.2, want{2384, 1.3}},
		{"a step of its own", 8192, []Work{{Uncached: 12000, PrefillSeconds: 0.6, Deadline: 0.75},
			{Uncached: 2000, PrefillSeconds: 0.1, Deadline: 2}, {Uncached: 10000, PrefillSeconds: 0.5, Deadline: 1.5}}, 0.3, want{576, 0.3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New([]Info{{Name: "a", PrefillSpeed: 20000, StepTokens: tc.steps}}, false)
			_, eps := snap(f, 0, 100, nil)
			for k, w := range tc.route {
				f.Route(eps[0], 0.1*float64(k), w)
			}
			s, _ := snap(f, tc.at, 100, nil)
			e := s.Endpoints[0]
			if e.TailRoom != tc.want.room || math.Abs(e.TailSlack-tc.want.slack) > 1e-9 {
				t.Errorf("tail room %d slack %v, want %d %v", e.TailRoom, e.TailSlack, tc.want.room, tc.want.slack)
			}
		})
	}
}

// TestQueueTailStepEnds: the tail's step is forgotten once its request's
// prefill ended (the queue is idle), and moves with a head that ended
// late.
func TestQueueTailStepEnds(t *testing.T) {
	f := New([]Info{{Name: "a", PrefillSpeed: 20000, StepTokens: 8192}}, false)
	_, eps := snap(f, 0, 100, nil)
	head := f.Route(eps[0], 0, Work{Uncached: 2000, PrefillSeconds: 0.1, Deadline: 5})
	tail := f.Route(eps[0], 0.05, Work{Uncached: 12000, PrefillSeconds: 0.6, Deadline: 0.9})
	// The head's only step began at 0, before the tail arrived, so the
	// tail starts steps of its own at 0.1 and ends at 0.7 in a step of
	// 3 808 tokens from 0.5096 s.
	f.PrefillDone(head, 0.3) // 0.2 s late: the tail moves to 0.9
	s, _ := snap(f, 0.55, 100, nil)
	if e := s.Endpoints[0]; e.TailRoom != 4384 || math.Abs(e.TailSlack) > 1e-9 {
		t.Errorf("after a late head: tail room %d slack %v, want 4384 0", e.TailRoom, e.TailSlack)
	}
	f.PrefillDone(tail, 0.9)
	s, _ = snap(f, 0.95, 100, nil)
	if e := s.Endpoints[0]; e.TailRoom != 0 {
		t.Errorf("idle endpoint: tail room %d", e.TailRoom)
	}
}

// TestQueueTailStepAfterItBegan: a prompt routed after the queue's last
// step began cannot join it (the engine schedules a step's requests when
// it begins) and starts steps of its own at the queue's end: A (12 000
// tokens at 0) ends in a step of 3 808 tokens from 0.4096 s; B (10 000
// tokens) routed at 0.5 starts at 0.6 and ends in a step of 1 808 tokens
// (6 384 free) from 1.0096 s, due 1.2 with its first token at 1.1.
// Routed at 0.3 instead, B joins A's last step (4 384 tokens of its first
// chunk there) and ends in a step of 5 616 tokens (2 576 free).
func TestQueueTailStepAfterItBegan(t *testing.T) {
	for _, tc := range []struct {
		at        float64
		room      int
		lastStart float64
	}{{0.5, 6384, 1.0096}, {0.3, 2576, 0.8192}} {
		f := New([]Info{{Name: "a", PrefillSpeed: 20000, StepTokens: 8192}}, false)
		_, eps := snap(f, 0, 100, nil)
		f.Route(eps[0], 0, Work{Uncached: 12000, PrefillSeconds: 0.6, Deadline: 0.65})
		b := f.Route(eps[0], tc.at, Work{Uncached: 10000, PrefillSeconds: 0.5, Deadline: 1.2})
		if math.Abs(b.lastStart-tc.lastStart) > 1e-9 {
			t.Errorf("routed at %v: its last step begins at %v, want %v", tc.at, b.lastStart, tc.lastStart)
		}
		s, _ := snap(f, 0.55, 100, nil)
		if e := s.Endpoints[0]; e.TailRoom != tc.room || math.Abs(e.TailSlack-0.1) > 1e-9 {
			t.Errorf("routed at %v: tail room %d slack %v, want %d 0.1", tc.at, e.TailRoom, e.TailSlack, tc.room)
		}
	}
}
