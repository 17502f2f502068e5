package workload

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// promptStats returns the median and p99 prompt (sorted[n/2],
// sorted[int(0.99n)]) and the share of prompts over limit tokens.
func promptStats(tr *Trace, limit int) (p50, p99 int, over float64) {
	ps := make([]int, len(tr.Requests))
	n := 0
	for i, r := range tr.Requests {
		ps[i] = r.PromptTokens
		if r.PromptTokens > limit {
			n++
		}
	}
	slices.Sort(ps)
	return ps[len(ps)/2], ps[int(0.99*float64(len(ps)))], float64(n) / float64(len(ps))
}

// TestLongPromptDistribution: over seeds, the defaults give a median prompt
// of about 12 000 tokens, a p99 of about 66 000 and about 8 % of prompts
// longer than 40 000 (what one default instance prefills within 2 s).
func TestLongPromptDistribution(t *testing.T) {
	for seed := range uint64(3) {
		c := LongPrompts(30)
		c.Duration = 3000
		c.Seed = seed
		tr, err := LongPrompt(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Validate(); err != nil {
			t.Fatal(err)
		}
		p50, p99, over := promptStats(tr, 40000)
		t.Logf("seed %d: %d requests, median %d, p99 %d, over 40k %.2f%%", seed, len(tr.Requests), p50, p99, 100*over)
		if math.Abs(float64(p50)/12000-1) > 0.1 || math.Abs(float64(p99)/66000-1) > 0.1 || math.Abs(over-0.08) > 0.015 {
			t.Errorf("seed %d: median %d, p99 %d, %.3f over 40k; want 12 000, 66 000, 0.08 within 10 %%, 10 %%, 1.5 points", seed, p50, p99, over)
		}
	}
}

func TestLongPromptDeterministic(t *testing.T) {
	gen := func(seed uint64) *Trace {
		c := LongPrompts(20)
		c.Duration, c.Seed = 30, seed
		tr, err := LongPrompt(c)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	a, b, other := gen(5), gen(5), gen(6)
	if len(a.Requests) != len(b.Requests) || a.Seed != 5 {
		t.Fatalf("same seed: %d and %d requests, seed %d", len(a.Requests), len(b.Requests), a.Seed)
	}
	for i := range a.Requests {
		x, y := a.Requests[i], b.Requests[i]
		if x.Arrival != y.Arrival || x.PromptTokens != y.PromptTokens || x.OutputTokens != y.OutputTokens ||
			x.Session != y.Session || !slices.Equal(x.Keys, y.Keys) {
			t.Fatalf("same seed, request %d differs: %+v vs %+v", i, x, y)
		}
	}
	same := len(a.Requests) == len(other.Requests)
	for i := 0; same && i < len(a.Requests); i++ {
		same = a.Requests[i].PromptTokens == other.Requests[i].PromptTokens
	}
	if same {
		t.Error("seeds 5 and 6 gave the same prompts")
	}
}

// TestLongPromptConversationsComeBack: a conversation's next turn re-sends
// its previous prompt (the same leading block keys) plus TurnTokens ×
// [0.5, 1.5) new tokens; a new conversation's keys are its own; no prompt
// exceeds the context window; about 1/Turns of the requests start a
// conversation.
func TestLongPromptConversationsComeBack(t *testing.T) {
	c := LongPrompts(20)
	c.Duration = 300
	tr, err := LongPrompt(c)
	if err != nil {
		t.Fatal(err)
	}
	last := map[int]Request{}
	owner := map[uint64]int{}
	firsts := 0
	for i, r := range tr.Requests {
		if r.PromptTokens > c.ContextTokens || len(r.Keys) != r.PromptTokens/c.BlockSize {
			t.Fatalf("request %d: %d tokens, %d keys (window %d)", i, r.PromptTokens, len(r.Keys), c.ContextTokens)
		}
		p, back := last[r.Session]
		switch {
		case !back:
			firsts++
			for _, k := range r.Keys {
				if o, ok := owner[k]; ok && o != r.Session {
					t.Fatalf("request %d: a new conversation shares a block of conversation %d", i, o)
				}
			}
		case r.PromptTokens < p.PromptTokens+c.TurnTokens/2 || r.PromptTokens >= p.PromptTokens+3*c.TurnTokens/2:
			t.Fatalf("request %d: conversation %d grew from %d to %d tokens", i, r.Session, p.PromptTokens, r.PromptTokens)
		case !slices.Equal(r.Keys[:len(p.Keys)], p.Keys):
			t.Fatalf("request %d: turn does not re-send conversation %d's prompt", i, r.Session)
		}
		for _, k := range r.Keys {
			owner[k] = r.Session
		}
		last[r.Session] = r
	}
	// Conversations end with probability 1/Turns after each turn and when
	// they outgrow the window: a bit more than a quarter start one.
	if share := float64(firsts) / float64(len(tr.Requests)); share < 0.25 || share > 0.32 {
		t.Errorf("%.3f of requests start a conversation, want about 1/%g", share, c.Turns)
	}
}

// TestLongPromptFirstPrompts: with one turn per conversation every request
// is a first prompt: with sigma 0 all are the median; otherwise the
// quantiles are the lognormal's conditioned on fitting the window (drawn
// below it, not clipped to it).
func TestLongPromptFirstPrompts(t *testing.T) {
	tests := []struct {
		name           string
		median, window int
		sigma          float64
		p50, p99       [2]int // ranges
	}{
		{"sigma 0", 5000, 76000, 0, [2]int{5000, 5000}, [2]int{5000, 5000}},
		// F(3000) = Φ(ln 0.3) = 0.114 for median 10 000, sigma 1: the
		// median is 10 000·e^Φ⁻¹(0.057) = 2 060, the p99
		// 10 000·e^Φ⁻¹(0.113) = 2 980.
		{"window below the median", 10000, 3000, 1, [2]int{1950, 2150}, [2]int{2930, 3000}},
		// Lognormal(median 10 000, sigma 1) conditioned on <= 10^6
		// (quantile 0.99999): p99 = 10 000·e^2.326 = 102 400.
		{"lognormal", 10000, 1_000_000, 1, [2]int{9500, 10500}, [2]int{92000, 113000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := LongPrompts(100)
			c.Duration, c.Turns, c.PromptMedian, c.ContextTokens, c.PromptSigma = 200, 1, tt.median, tt.window, tt.sigma
			tr, err := LongPrompt(c)
			if err != nil {
				t.Fatal(err)
			}
			p50, p99, _ := promptStats(tr, 0)
			if p50 < tt.p50[0] || p50 > tt.p50[1] || p99 < tt.p99[0] || p99 > tt.p99[1] {
				t.Errorf("median %d, p99 %d; want in %v and %v", p50, p99, tt.p50, tt.p99)
			}
		})
	}
}

func TestLongPromptRanges(t *testing.T) {
	tests := []struct {
		mutate func(*LongPromptConfig)
		msg    string
	}{
		{func(c *LongPromptConfig) { c.Rate = math.NaN() }, "long-prompts workload: rate"},
		{func(c *LongPromptConfig) { c.Duration = 0 }, "duration"},
		{func(c *LongPromptConfig) { c.Sessions = 0 }, "sessions must be in [1, 1048576]"},
		{func(c *LongPromptConfig) { c.PromptMedian = 0 }, "prompt-median must be in [1, 16777216] tokens"},
		{func(c *LongPromptConfig) { c.PromptSigma = 5 }, "prompt-sigma must be in [0, 4]"},
		{func(c *LongPromptConfig) { c.ContextTokens = MaxPromptTokens + 1 }, "context-tokens"},
		{func(c *LongPromptConfig) { c.Turns = 0.5 }, "turns must be in [1, 10000]"},
		{func(c *LongPromptConfig) { c.TurnTokens = 0 }, "turn-tokens"},
		{func(c *LongPromptConfig) { c.OutputTokens = -1 }, "output-tokens"},
		{func(c *LongPromptConfig) { c.BlockSize = 0 }, "block-size"},
		{func(c *LongPromptConfig) { c.Rate, c.Duration = 1e6, 86400 }, "expected requests, more than the 10000000"},
		{func(c *LongPromptConfig) { c.Rate, c.Duration, c.BlockSize = 1000, 3000, 16 }, "prompt blocks to hold"},
	}
	for _, tt := range tests {
		c := LongPrompts(10)
		tt.mutate(&c)
		if _, err := LongPrompt(c); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("got %v, want %q", err, tt.msg)
		}
	}
}
