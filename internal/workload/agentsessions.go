package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// AgentSessionConfig is the agent-session workload: coding-agent sessions
// whose context grows step by step until it nears the model's window, as a
// coding agent's does over a task (the walkthrough of 2026-12-04 saw
// sessions grow from 8 500 to 72 000 tokens in 14 steps). Unlike the agents
// workload (contexts restarting near 10 000 tokens), a few such sessions
// fill an instance's prefix cache: where they live decides whether their
// next steps find their history.
//
// Sessions slots; each Poisson arrival (Rate, Duration) picks a slot at
// random. An empty slot starts a session: one of Systems shared system
// prompts (an agent's instructions and tool definitions, SystemTokens
// long) followed by TurnTokens × U[0.5, 1.5) of its own (the task). An
// occupied slot sends the session's next step: the previous prompt plus
// TurnTokens × U[0.5, 1.5) new tokens (the previous answer and the tool's
// output). A step that would outgrow ContextTokens ends the session (that
// arrival starts a new one in the slot). Outputs are OutputTokens × U[0.5,
// 1.5).
type AgentSessionConfig struct {
	Rate          float64
	Duration      float64
	Sessions      int
	Systems       int
	SystemTokens  int
	TurnTokens    int
	ContextTokens int
	OutputTokens  int
	BlockSize     int
	Seed          uint64
}

// AgentSessions returns the agent-session workload's defaults at the given
// rate: 24 sessions sharing 4 system prompts of 12 000 tokens, growing by
// about 2 500 tokens a step to a 100 000-token window, so a session lives
// for about 35 steps and holds about 56 000 tokens on average: three
// sessions fill most of a default instance's cache (3 000 blocks of 64
// tokens).
func AgentSessions(rate float64) AgentSessionConfig {
	return AgentSessionConfig{Rate: rate, Duration: 120, Sessions: 24, Systems: 4, SystemTokens: 12000,
		TurnTokens: 2500, ContextTokens: 100000, OutputTokens: 300, BlockSize: 64}
}

// Validate checks the parameters against ParamLimits and the expected size
// of the workload against the caps.
func (c AgentSessionConfig) Validate() error {
	l := ParamLimits()
	if err := errors.Join(
		l.Rate.Check("rate", c.Rate),
		l.Duration.Check("duration", c.Duration),
		l.Sessions.Check("sessions", c.Sessions),
		l.Systems.Check("systems", c.Systems),
		l.SystemTokens.Check("system-tokens", c.SystemTokens),
		l.TurnTokens.Check("turn-tokens", c.TurnTokens),
		l.ContextTokens.Check("context-tokens", c.ContextTokens),
		l.OutputTokens.Check("output-tokens", c.OutputTokens),
		l.BlockSize.Check("block-size", c.BlockSize),
	); err != nil {
		return fmt.Errorf("agent-sessions workload: %w", err)
	}
	if c.SystemTokens+c.TurnTokens*3/2 > c.ContextTokens {
		return fmt.Errorf("agent-sessions workload: --system-tokens %d and a first step of up to 1.5 × --turn-tokens %d do not fit --context-tokens %d",
			c.SystemTokens, c.TurnTokens, c.ContextTokens)
	}
	req := expectedRequests(c.Rate, c.Duration)
	// The system prompts' blocks, and per request its new blocks (a
	// session's first request copies its system prompt's keys); a
	// session's arrays add up to at most four times its final length
	// (grow). No tokens are drawn: blocks get fresh keys.
	bs := float64(c.BlockSize)
	keys := float64(c.Systems)*float64(c.SystemTokens)/bs + 4*req*((float64(c.SystemTokens)+1.5*float64(c.TurnTokens))/bs+1)
	return checkBudget("agent-sessions", req, keys, 0)
}

// AgentSession generates the agent-session workload.
func AgentSession(c AgentSessionConfig) (*Trace, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xa6e5))
	systems := make([][]uint64, c.Systems)
	for i := range systems {
		systems[i] = uniqueKeys(nil, rng, c.SystemTokens/c.BlockSize)
	}
	type session struct {
		id     int // -1: the slot is free
		keys   []uint64
		tokens int
	}
	slots := make([]session, c.Sessions)
	for i := range slots {
		slots[i].id = -1
	}
	started := 0
	tr := &Trace{Name: "agent-sessions", BlockSize: c.BlockSize, Duration: c.Duration, Seed: c.Seed}
	for t := rng.ExpFloat64() / c.Rate; t < c.Duration; t += rng.ExpFloat64() / c.Rate {
		s := &slots[rng.IntN(c.Sessions)]
		step := jitter(rng, c.TurnTokens)
		if s.id >= 0 && s.tokens+step > c.ContextTokens {
			s.id = -1
		}
		if s.id < 0 {
			sys := systems[rng.IntN(c.Systems)]
			s.id, s.tokens = started, c.SystemTokens
			s.keys = append(make([]uint64, 0, 2*len(sys)+2), sys...)
			started++
		}
		s.tokens += step
		n := s.tokens/c.BlockSize - len(s.keys)
		s.keys = uniqueKeys(grow(s.keys, n), rng, n)
		tr.Requests = append(tr.Requests, Request{Arrival: t, PromptTokens: s.tokens, OutputTokens: jitter(rng, c.OutputTokens),
			Keys: s.keys[:len(s.keys):len(s.keys)], Session: s.id})
	}
	return tr, nil
}
