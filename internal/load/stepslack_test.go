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
