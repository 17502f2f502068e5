package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kvgate/kvgate/internal/tokens"
)

// ChatConfig is the baseline chapter's multi-turn chat: Systems system prompts of
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

// BaselineChat returns the baseline chapter's parameters at the given rate.
func BaselineChat(rate float64) ChatConfig {
	return ChatConfig{Systems: 20, Sessions: 400, SystemTokens: 2048, TurnTokens: 300, OutputTokens: 500,
		Rate: rate, Duration: 120, BlockSize: 64}
}

// Validate checks the parameters against ParamLimits and the expected size
// of the workload against the caps.
func (c ChatConfig) Validate() error {
	l := ParamLimits()
	if err := errors.Join(
		l.Systems.Check("systems", c.Systems),
		l.Sessions.Check("sessions", c.Sessions),
		l.SystemTokens.Check("system-tokens", c.SystemTokens),
		l.TurnTokens.Check("turn-tokens", c.TurnTokens),
		l.OutputTokens.Check("output-tokens", c.OutputTokens),
		l.Rate.Check("rate", c.Rate),
		l.Duration.Check("duration", c.Duration),
		l.BlockSize.Check("block-size", c.BlockSize),
	); err != nil {
		return fmt.Errorf("chat workload: %w", err)
	}
	req := expectedRequests(c.Rate, c.Duration)
	bs := float64(c.BlockSize)
	// Each system prompt's keys, a copy of them in each conversation that
	// gets a turn, and every turn's new blocks.
	keys := float64(c.Systems+min(c.Sessions, int(req)+1))*float64(c.SystemTokens)/bs + req*(float64(c.TurnTokens)/bs+1)
	tokens := float64(c.Systems)*float64(c.SystemTokens) + req*float64(c.TurnTokens)
	return checkBudget("chat", req, keys, tokens)
}

// Chat generates the multi-turn chat workload. Token ids are random in
// [0, 10^6) as in the baseline chapter's program; keys are computed incrementally per
// conversation, which keeps only the tokens of its last partial block. A
// conversation that grows past MaxPromptTokens is an error.
func Chat(c ChatConfig) (*Trace, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xc4a7))
	h := tokens.NewHasher(c.BlockSize)
	randTokens := func(dst []uint32, n int) []uint32 {
		for range n {
			dst = append(dst, uint32(rng.IntN(1_000_000)))
		}
		return dst
	}
	// A conversation is its keys, the tokens after its last full block and
	// its length. Requests share the key array (read-only); the tail and
	// the keys of a system prompt are copied on a conversation's first turn.
	type conv struct {
		keys   []uint64
		tail   []uint32
		tokens int
	}
	systems := make([]conv, c.Systems)
	for i := range systems {
		toks := randTokens(nil, c.SystemTokens)
		keys := h.Keys(toks, nil)
		systems[i] = conv{keys: keys, tail: slices.Clone(toks[len(keys)*c.BlockSize:]), tokens: c.SystemTokens}
	}
	convs := make([]conv, c.Sessions)
	for i := range convs {
		s := systems[rng.IntN(c.Systems)]
		convs[i] = conv{keys: s.keys[:len(s.keys):len(s.keys)], tail: s.tail[:len(s.tail):len(s.tail)], tokens: s.tokens}
	}
	tr := &Trace{Name: "chat", BlockSize: c.BlockSize, Duration: c.Duration, Seed: c.Seed}
	t := 0.0
	for t < c.Duration {
		t += rng.ExpFloat64() / c.Rate
		ci := rng.IntN(c.Sessions)
		cv := &convs[ci]
		cv.tail = randTokens(cv.tail, c.TurnTokens)
		cv.tokens += c.TurnTokens
		if cv.tokens > MaxPromptTokens {
			return nil, fmt.Errorf("chat workload: conversation %d grew past %d tokens at request %d: use more sessions, fewer turn tokens or a shorter duration",
				ci, MaxPromptTokens, len(tr.Requests))
		}
		done := len(cv.keys)
		parent := tokens.RootKey
		if done > 0 {
			parent = cv.keys[done-1]
		}
		cv.keys = h.AppendKeys(grow(cv.keys, len(cv.tail)/c.BlockSize), parent, cv.tail, nil)
		cv.tail = append(cv.tail[:0], cv.tail[(len(cv.keys)-done)*c.BlockSize:]...)
		tr.Requests = append(tr.Requests, Request{Arrival: t, PromptTokens: cv.tokens, OutputTokens: c.OutputTokens,
			Keys: cv.keys[:len(cv.keys):len(cv.keys)], Session: ci})
	}
	return tr, nil
}

// grow makes room for n more keys, at least doubling the capacity when it
// must reallocate: requests keep the arrays they were given, so the arrays
// of one conversation add up to at most twice the last one's capacity, four
// times its final length (append's own growth for large slices, 1.25×,
// would leave about six times).
func grow(keys []uint64, n int) []uint64 {
	if len(keys)+n <= cap(keys) {
		return keys
	}
	out := make([]uint64, len(keys), max(2*cap(keys), len(keys)+n))
	copy(out, keys)
	return out
}
