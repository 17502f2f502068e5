package workload

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvgate/kvgate/internal/tokens"
)

// ChatConfig is the seed chapter's multi-turn chat: Systems system prompts of
// SystemTokens tokens, Sessions conversations each starting from a random
// system prompt, every turn appending TurnTokens tokens to a random
// conversation, Poisson arrivals at Rate for Duration seconds.
type ChatConfig struct {
	Systems      int
	Sessions     int
	SystemTokens int
	TurnTokens   int
	OutputTokens int
	Rate         float64
	Duration     float64
	BlockSize    int
	Seed         uint64
}

// SeedChat returns the seed chapter's parameters at the given rate.
func SeedChat(rate float64) ChatConfig {
	return ChatConfig{Systems: 20, Sessions: 400, SystemTokens: 2048, TurnTokens: 300, OutputTokens: 500,
		Rate: rate, Duration: 120, BlockSize: 64}
}

func (c ChatConfig) validate() error {
	if c.Systems <= 0 || c.Sessions <= 0 || c.SystemTokens < 0 || c.TurnTokens <= 0 || c.OutputTokens < 0 {
		return fmt.Errorf("chat workload: systems, sessions and turn tokens must be > 0 (got %d, %d, %d)", c.Systems, c.Sessions, c.TurnTokens)
	}
	if !(c.Rate > 0) || !(c.Duration > 0) || c.BlockSize <= 0 {
		return fmt.Errorf("chat workload: rate, duration and block size must be > 0")
	}
	return nil
}

// Chat generates the multi-turn chat workload. Token ids are random in
// [0, 10^6) as in the seed's program; keys are computed incrementally per
// conversation.
func Chat(c ChatConfig) (*Trace, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xc4a7))
	h := tokens.NewHasher(c.BlockSize)
	randTokens := func(n int) []uint32 {
		t := make([]uint32, n)
		for i := range t {
			t[i] = uint32(rng.IntN(1_000_000))
		}
		return t
	}
	type conv struct {
		toks []uint32
		keys []uint64
	}
	systems := make([]conv, c.Systems)
	for i := range systems {
		systems[i].toks = randTokens(c.SystemTokens)
		systems[i].keys = h.Keys(systems[i].toks, nil)
	}
	convs := make([]conv, c.Sessions)
	for i := range convs {
		s := systems[rng.IntN(c.Systems)]
		convs[i] = conv{toks: s.toks[:len(s.toks):len(s.toks)], keys: s.keys[:len(s.keys):len(s.keys)]}
	}
	tr := &Trace{Name: "chat", BlockSize: c.BlockSize, Duration: c.Duration}
	t := 0.0
	for t < c.Duration {
		t += rng.ExpFloat64() / c.Rate
		ci := rng.IntN(c.Sessions)
		cv := &convs[ci]
		cv.toks = append(cv.toks, randTokens(c.TurnTokens)...)
		done := len(cv.keys)
		parent := tokens.RootKey
		if done > 0 {
			parent = cv.keys[done-1]
		}
		cv.keys = h.AppendKeys(cv.keys, parent, cv.toks[done*c.BlockSize:], nil)
		tr.Requests = append(tr.Requests, Request{Arrival: t, PromptTokens: len(cv.toks), OutputTokens: c.OutputTokens,
			Keys: cv.keys[:len(cv.keys):len(cv.keys)], Session: ci})
	}
	return tr, nil
}
