package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// LongPromptConfig is the long-prompt workload: conversations whose first
// prompt is heavy-tailed (a share of them longer than one instance can
// prefill within a TTFT SLO) and that come back, each turn re-sending the
// conversation so far plus new tokens, so a later turn finds its prefix in
// the cache of the instance that served the earlier one.
//
// Sessions conversation slots; each Poisson arrival (Rate, Duration) picks
// a slot at random. An empty slot starts a new conversation whose first
// prompt is lognormal with median PromptMedian and sigma PromptSigma,
// truncated to ContextTokens (drawn from the distribution conditioned on
// fitting the window, not clipped to it). An occupied slot sends its
// conversation's next turn: the previous prompt plus TurnTokens × U[0.5,
// 1.5) new tokens (the previous answer and the user's next message). A
// conversation ends after each turn with probability 1/Turns (Turns turns
// on average) and when its next turn would not fit ContextTokens (that
// arrival then starts a new conversation). Outputs are OutputTokens ×
// U[0.5, 1.5).
type LongPromptConfig struct {
	Rate          float64
	Duration      float64
	Sessions      int
	PromptMedian  int
	PromptSigma   float64
	ContextTokens int
	Turns         float64
	TurnTokens    int
	OutputTokens  int
	BlockSize     int
	Seed          uint64
}

// LongPrompts returns the long-prompt workload's defaults at the given
// rate: over all requests the median prompt is about 12 000 tokens, the
// p99 about 66 000 and about 8 % are longer than 40 000 (what one instance
// of 20 000 tokens/s prefills in 2 s); docs/sim.md has the measured
// figures.
func LongPrompts(rate float64) LongPromptConfig {
	return LongPromptConfig{Rate: rate, Duration: 120, Sessions: 128, PromptMedian: 9000, PromptSigma: 1.15,
		ContextTokens: 76000, Turns: 4, TurnTokens: 1000, OutputTokens: 300, BlockSize: 64}
}

// Validate checks the parameters against ParamLimits and the expected size
// of the workload against the caps.
func (c LongPromptConfig) Validate() error {
	l := ParamLimits()
	if err := errors.Join(
		l.Rate.Check("rate", c.Rate),
		l.Duration.Check("duration", c.Duration),
		l.Sessions.Check("sessions", c.Sessions),
		l.PromptMedian.Check("prompt-median", c.PromptMedian),
		l.PromptSigma.Check("prompt-sigma", c.PromptSigma),
		l.ContextTokens.Check("context-tokens", c.ContextTokens),
		l.Turns.Check("turns", c.Turns),
		l.TurnTokens.Check("turn-tokens", c.TurnTokens),
		l.OutputTokens.Check("output-tokens", c.OutputTokens),
		l.BlockSize.Check("block-size", c.BlockSize),
	); err != nil {
		return fmt.Errorf("long-prompts workload: %w", err)
	}
	req := expectedRequests(c.Rate, c.Duration)
	// Every request's new blocks: a first prompt's (at most the window,
	// mean below the untruncated lognormal's) or a turn's; a
	// conversation's arrays add up to at most four times its final
	// length (grow). No tokens are drawn: blocks get fresh keys.
	first := math.Min(float64(c.ContextTokens), float64(c.PromptMedian)*math.Exp(c.PromptSigma*c.PromptSigma/2))
	perReq := (first/c.Turns + 1.5*float64(c.TurnTokens)) / float64(c.BlockSize)
	return checkBudget("long-prompts", req, 4*req*(perReq+1), 0)
}

// LongPrompt generates the long-prompt workload.
func LongPrompt(c LongPromptConfig) (*Trace, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x10e9))
	type conv struct {
		id     int // -1: the slot is free
		keys   []uint64
		tokens int
	}
	slots := make([]conv, c.Sessions)
	for i := range slots {
		slots[i].id = -1
	}
	// The truncated lognormal by inversion: u uniform below the window's
	// quantile F(W), the prompt exp(μ + σ·Φ⁻¹(u)).
	mu := math.Log(float64(c.PromptMedian))
	fw := 1.0
	if c.PromptSigma > 0 {
		fw = 0.5 * math.Erfc(-(math.Log(float64(c.ContextTokens))-mu)/(c.PromptSigma*math.Sqrt2))
	}
	firstPrompt := func() int {
		z := math.Sqrt2 * math.Erfinv(2*rng.Float64()*fw-1)
		x := math.Exp(mu + c.PromptSigma*z) // z may be -Inf: x = 0
		return int(min(max(x, 1), float64(c.ContextTokens)))
	}
	end := 1 / c.Turns
	convs := 0
	tr := &Trace{Name: "long-prompts", BlockSize: c.BlockSize, Duration: c.Duration, Seed: c.Seed}
	for t := rng.ExpFloat64() / c.Rate; t < c.Duration; t += rng.ExpFloat64() / c.Rate {
		s := &slots[rng.IntN(c.Sessions)]
		if s.id >= 0 {
			next := s.tokens + jitter(rng, c.TurnTokens)
			if next > c.ContextTokens {
				s.id = -1
			} else {
				s.tokens = next
			}
		}
		if s.id < 0 {
			s.id, s.tokens, s.keys = convs, firstPrompt(), nil
			convs++
		}
		s.keys = uniqueKeys(grow(s.keys, s.tokens/c.BlockSize-len(s.keys)), rng, s.tokens/c.BlockSize-len(s.keys))
		tr.Requests = append(tr.Requests, Request{Arrival: t, PromptTokens: s.tokens, OutputTokens: jitter(rng, c.OutputTokens),
			Keys: s.keys[:len(s.keys):len(s.keys)], Session: s.id})
		if rng.Float64() < end {
			s.id = -1
		}
	}
	return tr, nil
}
