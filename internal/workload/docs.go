package workload

import (
	"fmt"
	"math/rand/v2"
)

// ShapeConfig describes the long-document and agent workloads by the shape
// parameters the planner reasons about: arrival rate, mean input and output
// lengths, and the share of prompt tokens that a warm cache can reuse.
type ShapeConfig struct {
	Rate      float64
	Duration  float64
	ISL       int
	OSL       int
	Hit       float64
	BlockSize int
	Seed      uint64
	// Prefixes is the number of distinct shared prefixes (instruction
	// templates or tool prompts).
	Prefixes int
	// Sessions is the number of concurrent agent sessions (agents only).
	Sessions int
}

func (c ShapeConfig) validate(name string) error {
	if !(c.Rate > 0) || !(c.Duration > 0) || c.ISL <= 0 || c.OSL < 0 || c.BlockSize <= 0 || c.Hit < 0 || c.Hit >= 1 || c.Prefixes <= 0 {
		return fmt.Errorf("%s workload: need rate, duration, isl, block size, prefixes > 0 and 0 <= hit < 1", name)
	}
	return nil
}

// LongDocs returns the evening phase of the seed: 30 req/s of 16 000-token
// documents with 300-token summaries and 20 % reusable prefix.
func LongDocs() ShapeConfig {
	return ShapeConfig{Rate: 30, Duration: 120, ISL: 16000, OSL: 300, Hit: 0.2, BlockSize: 64, Prefixes: 8}
}

// Agents returns the night phase of the seed: 25 req/s of coding-agent steps
// with 6 000-token contexts, 2 000-token outputs and 80 % reuse.
func Agents() ShapeConfig {
	return ShapeConfig{Rate: 25, Duration: 120, ISL: 6000, OSL: 2000, Hit: 0.8, BlockSize: 64, Prefixes: 4, Sessions: 300}
}

// uniqueKeys appends n fresh keys: blocks of content no other request has.
func uniqueKeys(dst []uint64, rng *rand.Rand, n int) []uint64 {
	for range n {
		dst = append(dst, rng.Uint64()|1)
	}
	return dst
}

// jitter returns mean scaled by a uniform factor in [0.5, 1.5).
func jitter(rng *rand.Rand, mean int) int {
	return max(1, int(float64(mean)*(0.5+rng.Float64())))
}

// Docs generates long-document requests: one of Prefixes instruction
// prefixes of Hit×ISL tokens followed by a unique document, the total length
// varying uniformly in ±50 % of ISL.
func Docs(c ShapeConfig) (*Trace, error) {
	if err := c.validate("long-documents"); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xd0c5))
	prefixBlocks := int(c.Hit*float64(c.ISL)) / c.BlockSize
	prefixes := make([][]uint64, c.Prefixes)
	for i := range prefixes {
		prefixes[i] = uniqueKeys(nil, rng, prefixBlocks)
	}
	tr := &Trace{Name: "long-documents", BlockSize: c.BlockSize, Duration: c.Duration}
	for t := rng.ExpFloat64() / c.Rate; t < c.Duration; t += rng.ExpFloat64() / c.Rate {
		p := prefixes[rng.IntN(c.Prefixes)]
		n := max(jitter(rng, c.ISL), len(p)*c.BlockSize+1)
		keys := append(make([]uint64, 0, n/c.BlockSize), p...)
		keys = uniqueKeys(keys, rng, n/c.BlockSize-len(p))
		tr.Requests = append(tr.Requests, Request{Arrival: t, PromptTokens: n, OutputTokens: jitter(rng, c.OSL), Keys: keys, Session: -1})
	}
	return tr, nil
}

// AgentSteps generates coding-agent traffic: Sessions agents, each step
// re-sending its whole context plus new tokens (tool output, the previous
// answer) of (1-Hit)×ISL on average; a context restarts from its tool prompt
// when it grows past 1.6×ISL, so contexts average about ISL.
func AgentSteps(c ShapeConfig) (*Trace, error) {
	if err := c.validate("agents"); err != nil {
		return nil, err
	}
	if c.Sessions <= 0 {
		return nil, fmt.Errorf("agents workload: sessions must be > 0")
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xa9e7))
	newTokens := max(c.BlockSize, int((1-c.Hit)*float64(c.ISL)))
	toolBlocks := max(1, int(0.3*float64(c.ISL))/c.BlockSize)
	tools := make([][]uint64, c.Prefixes)
	for i := range tools {
		tools[i] = uniqueKeys(nil, rng, toolBlocks)
	}
	type session struct {
		keys   []uint64
		tokens int
	}
	restart := func(s *session) {
		tp := tools[rng.IntN(len(tools))]
		s.keys = append(make([]uint64, 0, 2*c.ISL/c.BlockSize), tp...)
		s.tokens = len(tp) * c.BlockSize
	}
	ss := make([]session, c.Sessions)
	for i := range ss {
		restart(&ss[i])
	}
	tr := &Trace{Name: "agents", BlockSize: c.BlockSize, Duration: c.Duration}
	for t := rng.ExpFloat64() / c.Rate; t < c.Duration; t += rng.ExpFloat64() / c.Rate {
		si := rng.IntN(c.Sessions)
		s := &ss[si]
		if s.tokens > 8*c.ISL/5 {
			restart(s)
		}
		s.tokens += jitter(rng, newTokens)
		s.keys = uniqueKeys(s.keys, rng, s.tokens/c.BlockSize-len(s.keys))
		tr.Requests = append(tr.Requests, Request{Arrival: t, PromptTokens: s.tokens, OutputTokens: jitter(rng, c.OSL),
			Keys: s.keys[:len(s.keys):len(s.keys)], Session: si})
	}
	return tr, nil
}
