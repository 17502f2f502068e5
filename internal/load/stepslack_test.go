package load

import (
	"math"
	"testing"
)

// TestStepSlack: the fleet learns how much later than predicted the first
// tokens of requests routed near their deadline come, on engines that
// prefill in steps, and a request that would queue meets it in the
// snapshot. Each round routes a 2 000-token head and, behind it, a
// request of 4 000 tokens predicted to end at 0.3 s (or that request
// alone, 6 000 tokens) whose deadline is slack seconds after that, then
// reports its first token late seconds after the prediction.
func TestStepSlack(t *testing.T) {
	const step = 8192.0 / 20000 // one full step's compute
	for _, tc := range []struct {
		name        string
		steps       int
		slack, late float64
		idleEdge    bool // the edge request routed to an idle endpoint
		want        float64
	}{
		{"late at the edge", 8192, 0.1, 0.3, false, 0.3},
		{"on time at the edge", 8192, 0.1, 0, false, 0},
		{"early at the edge", 8192, 0.1, -0.05, false, 0},
		{"late, far from the deadline", 8192, 1, 0.3, false, 0},
		{"late, not queued", 8192, 0.1, 0.3, true, 0},
		{"no step budget", 0, 0.1, 0.3, false, 0},
		{"later than a step can make it", 8192, 0.1, 2, false, step},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New([]Info{{Name: "a", PrefillSpeed: 20000, StepTokens: tc.steps}}, false)
			f.slackHalfLife = math.Inf(1) // the learning alone (rounds 10 s apart); aging below
			_, eps := snap(f, 0, 100, nil)
			e := eps[0]
			for k := range 400 {
				at := 10 * float64(k)
				w := Work{Uncached: 6000, PrefillSeconds: 0.3, Deadline: at + 0.3 + tc.slack}
				if !tc.idleEdge {
					head := f.Route(e, at, Work{Uncached: 2000, PrefillSeconds: 0.1, Deadline: at + 5})
					f.FirstToken(head, at+0.1)
					w.Uncached, w.PrefillSeconds = 4000, 0.2
				}
				f.FirstToken(f.Route(e, at, w), at+0.3+tc.late)
			}
			if got := f.StepSlack(); math.Abs(got-tc.want) > step/64 {
				t.Errorf("step slack %.4f s, want %.4f", got, tc.want)
			}
			s, _ := snap(f, 5000, 100, nil)
			if got := s.Endpoints[0].StepSlack; got != 0 {
				t.Errorf("an idle endpoint has step slack %v", got)
			}
			f.Route(e, 5000, Work{Uncached: 2000, PrefillSeconds: 0.1})
			s, _ = snap(f, 5000, 100, nil)
			if got := s.Endpoints[0].StepSlack; got != f.StepSlack() {
				t.Errorf("with a queue, step slack %v, want the fleet's %v", got, f.StepSlack())
			}
		})
	}
}

// TestStepSlackAges: while the fleet hears no first token for longer than
// a step's compute (idle), the step slack halves every StepSlackHalfLife
// seconds, in the snapshot, the
// metric and the next learning step; a load that ended leaves none (it
// stayed as the last load left it, and a walkthrough's idle fleet turned
// away 2 to 4 of each burst of 16 it could serve).
func TestStepSlackAges(t *testing.T) {
	const step = 8192.0 / 20000
	f := New([]Info{{Name: "a", PrefillSpeed: 20000, StepTokens: 8192}}, false)
	_, eps := snap(f, 0, 100, nil)
	e := eps[0]
	var last float64
	for k := range 200 { // 0.1 s late at the edge, every 0.5 s: the slack learns 0.1 s
		at := 0.5 * float64(k)
		head := f.Route(e, at, Work{Uncached: 2000, PrefillSeconds: 0.1, Deadline: at + 5})
		f.FirstToken(head, at+0.1)
		f.FirstToken(f.Route(e, at, Work{Uncached: 4000, PrefillSeconds: 0.2, Deadline: at + 0.4}), at+0.4)
		last = at + 0.4
	}
	learned := f.StepSlack()
	if math.Abs(learned-0.1) > step/64 {
		t.Fatalf("learned %.3f s under load, want 0.1 (no aging while first tokens come within a step)", learned)
	}
	for _, c := range []struct{ idle, want float64 }{{0, learned}, {step, learned}, {step + StepSlackHalfLife, learned / 2}, {step + 3*StepSlackHalfLife, learned / 8}} {
		if got := f.StepSlackAt(last + c.idle); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("after %.2f s idle: %.4f s, want %.4f", c.idle, got, c.want)
		}
	}
	now := last + step + 3*StepSlackHalfLife
	f.Route(e, now, Work{Uncached: 2000, PrefillSeconds: 0.1}) // a queue, so the snapshot carries the slack
	if s, _ := snap(f, now, 100, nil); math.Abs(s.Endpoints[0].StepSlack-learned/8) > 1e-9 {
		t.Errorf("the snapshot after 30 s idle: %.4f s, want %.4f", s.Endpoints[0].StepSlack, learned/8)
	}
}
