package sim

import (
	"testing"

	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// TestTouchesKeepHeldPrefixes: on the long-prompt workload at 1.5× the
// fleet's capacity (seed 0), without early rejection, requests wait at the
// router for longer than the caches take to turn over. Touching their
// cached prefixes keeps more of them cached until they are served: more
// of the prompt tokens hit and more requests make their SLO than with
// touches off, on the simulator's engines and on engines that prefill in
// steps (the touches run there as one-token requests). With early
// rejection nothing waits that long and nothing is touched.
func TestTouchesKeepHeldPrefixes(t *testing.T) {
	tr, pol := overloadedLongPrompts(t)
	steps := baselineConfig()
	steps.Truth = Chunked(steps.Prefill, steps.Model.PrefillTokensPerSec, 8192)
	for name, cfg := range map[string]Config{"whole prompts": baselineConfig(), "steps": steps} {
		t.Run(name, func(t *testing.T) {
			on := runScheduler(t, cfg, tr, &sched.Scheduler{Policy: pol, Hold: true, HoldTouch: true})
			off := runScheduler(t, cfg, tr, &sched.Scheduler{Policy: pol, Hold: true})
			t.Logf("touches %.3f per request: hit %.3f attained %.4f p99 %.1f s; off: hit %.3f attained %.4f p99 %.1f s",
				on.Touches, on.HitRate, on.Attainment, on.TTFTP99, off.HitRate, off.Attainment, off.TTFTP99)
			if on.Touches == 0 || off.Touches != 0 {
				t.Fatalf("touches per request %.3f on, %.3f off", on.Touches, off.Touches)
			}
			if on.TouchTokens != 1 {
				t.Errorf("a touch computed %.1f tokens on average; the router knows the caches exactly: want 1", on.TouchTokens)
			}
			if on.HitRate <= off.HitRate || on.Attainment <= off.Attainment || on.Unserved != 0 {
				t.Errorf("with touches hit %.3f attained %.4f unserved %.4f; without hit %.3f attained %.4f",
					on.HitRate, on.Attainment, on.Unserved, off.HitRate, off.Attainment)
			}
		})
	}
	if er := runScheduler(t, baselineConfig(), tr, &sched.Scheduler{Policy: pol, Hold: true, HoldTouch: true, EarlyReject: true}); er.Touches != 0 {
		t.Errorf("with early rejection %.3f touches per request, want none", er.Touches)
	}
}

// TestTouchesComputeWhatWasEvicted: when the router hears of blocks as
// a gateway does (at prefill, its own routing counted cached for two
// minutes), it touches prefixes the instance has already evicted in
// part, and each such touch computes what is missing, as an engine
// would: more than one token per touch on average.
func TestTouchesComputeWhatWasEvicted(t *testing.T) {
	tr, pol := overloadedLongPrompts(t)
	cfg := baselineConfig()
	cfg.EventsAtPrefill, cfg.ApproxTTL = true, 120
	r := runScheduler(t, cfg, tr, &sched.Scheduler{Policy: pol, Hold: true, HoldTouch: true})
	t.Logf("touches %.3f per request, %.0f tokens computed each", r.Touches, r.TouchTokens)
	if r.Touches == 0 || !(r.TouchTokens > 1) {
		t.Fatalf("touches %.3f per request computing %.1f tokens each: want touches that recompute evicted blocks", r.Touches, r.TouchTokens)
	}
}

// TestTouchRefreshesItsPrefix: a touch makes its prefix the most recently
// used on its instance. One instance caches 4 blocks: A's two, then B's
// two; A's prefix is touched; C's two blocks then evict B's, not A's.
// Untouched, they evict A's.
func TestTouchRefreshesItsPrefix(t *testing.T) {
	tr := &workload.Trace{Name: "touch", BlockSize: 16, Requests: []workload.Request{
		{PromptTokens: 40, OutputTokens: 1, Keys: []uint64{11, 12}, Session: -1},
		{PromptTokens: 40, OutputTokens: 1, Keys: []uint64{21, 22}, Session: -1},
		{PromptTokens: 40, OutputTokens: 1, Keys: []uint64{31, 32}, Session: -1},
	}}
	pol, err := sched.New("kvgate", sched.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, touched := range []bool{true, false} {
		cfg := baselineConfig()
		cfg.Prefill, cfg.CacheTokens = 1, 4*16
		r, err := newRun(cfg, tr, &sched.Scheduler{Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		r.cache.insert(0, tr.Requests[0].Keys)
		r.cache.insert(0, tr.Requests[1].Keys)
		if touched {
			r.snapshot(0)
			r.Touch(&sched.Held{Req: sched.Request{PromptTokens: 40}, Value: 0}, 0, 33)
		}
		r.cache.insert(0, tr.Requests[2].Keys)
		a, b := r.cache.inst[0].has(11) && r.cache.inst[0].has(12), r.cache.inst[0].has(21) || r.cache.inst[0].has(22)
		if touched && (!a || b) || !touched && (a || !b) {
			t.Errorf("touched %v: A cached %v, B cached %v", touched, a, b)
		}
	}
}

// overloadedLongPrompts is the long-prompt workload at 1.5× the baseline
// fleet's capacity (25.5 req/s, seed 0) and kvgate's policy.
func overloadedLongPrompts(t *testing.T) (*workload.Trace, sched.Policy) {
	t.Helper()
	tr, err := workload.LongPrompt(workload.LongPrompts(25.5))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := sched.New("kvgate", sched.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return tr, pol
}
