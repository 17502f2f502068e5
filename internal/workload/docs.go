package workload

import (
	"errors"
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

// Validate checks the parameters against ParamLimits and the expected size
// of the workload against the caps; name is "long-documents" or "agents"
// (which also needs Sessions).
func (c ShapeConfig) Validate(name string) error {
	l := ParamLimits()
	var sessions error
	if name == "agents" {
		sessions = l.Sessions.Check("sessions", c.Sessions)
	}
	if err := errors.Join(
		sessions,
		l.Rate.Check("rate", c.Rate),
		l.Duration.Check("duration", c.Duration),
		l.ISL.Check("isl", c.ISL),
		l.OutputTokens.Check("osl", c.OSL),
		l.Hit.Check("hit", c.Hit),
		l.BlockSize.Check("block-size", c.BlockSize),
		l.Prefixes.Check("prefixes", c.Prefixes),
	); err != nil {
		return fmt.Errorf("%s workload: %w", name, err)
	}
	req := expectedRequests(c.Rate, c.Duration)
	perReq := float64(c.ISL) / float64(c.BlockSize)
	// Long documents: the shared prefixes and each request's own blocks.
	// Agents: each session's context (allocated for 2×ISL) and the new
	// blocks of each step, about three times its share of ISL counting
	// restarts; bounded here by 3×ISL.
	keys := float64(c.Prefixes)*perReq + req*(perReq+1)
	if name == "agents" {
		keys = float64(c.Prefixes+2*c.Sessions)*perReq + req*(3*perReq+1)
	}
	return checkBudget(name, req, keys, 0)
}

// LongDocs returns the baseline chapter's evening phase: 30 req/s of 16 000-token
// documents with 300-token summaries and 20 % reusable prefix.
func LongDocs() ShapeConfig {
	return ShapeConfig{Rate: 30, Duration: 120, ISL: 16000, OSL: 300, Hit: 0.2, BlockSize: 64, Prefixes: 8}
}

// Agents returns the baseline chapter's night phase: 25 req/s of coding-agent steps
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
	if err := c.Validate("long-documents"); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xd0c5))
	prefixBlocks := int(c.Hit*float64(c.ISL)) / c.BlockSize
	prefixes := make([][]uint64, c.Prefixes)
	for i := range prefixes {
		prefixes[i] = uniqueKeys(nil, rng, prefixBlocks)
	}
	tr := &Trace{Name: "long-documents", BlockSize: c.BlockSize, Duration: c.Duration, Seed: c.Seed}
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
	if err := c.Validate("agents"); err != nil {
		return nil, err
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
	tr := &Trace{Name: "agents", BlockSize: c.BlockSize, Duration: c.Duration, Seed: c.Seed}
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
