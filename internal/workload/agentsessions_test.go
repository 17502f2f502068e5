package workload

import (
	"slices"
	"strings"
	"testing"
)

// TestAgentSessionsGrow: each session starts from one of the shared system
// prompts, every later step re-sends the previous prompt (its keys a
// prefix of the next step's) plus new tokens, and a session ends only when
// its next step would outgrow the window, so sessions grow to near it.
func TestAgentSessionsGrow(t *testing.T) {
	c := AgentSessions(20)
	c.Seed = 3
	tr, err := AgentSession(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Validate(); err != nil {
		t.Fatal(err)
	}
	sysBlocks := c.SystemTokens / c.BlockSize
	systems := map[uint64]int{} // a system prompt's first key → sessions started on it
	last := map[int]Request{}   // session → its latest step
	final := map[int]int{}      // ended session → its last prompt
	for i, r := range tr.Requests {
		if r.PromptTokens > c.ContextTokens || len(r.Keys) != r.PromptTokens/c.BlockSize {
			t.Fatalf("request %d: %d tokens, %d keys (window %d)", i, r.PromptTokens, len(r.Keys), c.ContextTokens)
		}
		prev, ok := last[r.Session]
		switch {
		case !ok:
			if n := r.PromptTokens - c.SystemTokens; n < c.TurnTokens/2 || n >= c.TurnTokens*3/2 {
				t.Fatalf("request %d opens session %d with %d tokens of its own", i, r.Session, n)
			}
			systems[r.Keys[0]]++
		case !slices.Equal(prev.Keys, r.Keys[:len(prev.Keys)]):
			t.Fatalf("request %d: session %d's step does not extend its previous prompt", i, r.Session)
		case r.PromptTokens-prev.PromptTokens < c.TurnTokens/2 || r.PromptTokens-prev.PromptTokens >= c.TurnTokens*3/2:
			t.Fatalf("request %d: session %d grew by %d tokens", i, r.Session, r.PromptTokens-prev.PromptTokens)
		}
		last[r.Session] = r
	}
	for s, r := range last {
		final[s] = r.PromptTokens
	}
	if len(systems) != c.Systems {
		t.Errorf("sessions start on %d system prompts, want %d", len(systems), c.Systems)
	}
	// Sessions of the same system prompt share its blocks.
	shared := 0
	for _, r := range last {
		for _, o := range last {
			if r.Session != o.Session && r.Keys[0] == o.Keys[0] && slices.Equal(r.Keys[:sysBlocks], o.Keys[:sysBlocks]) && r.Keys[sysBlocks] != o.Keys[sysBlocks] {
				shared++
			}
		}
	}
	if shared == 0 {
		t.Error("no two sessions share a system prompt's blocks (or they share their own too)")
	}
	// At most one session a slot is still open at the end; every other
	// ended within 1.5 steps of the window.
	ended, near := len(final)-c.Sessions, 0
	for _, n := range final {
		if n > c.ContextTokens-c.TurnTokens*3/2 {
			near++
		}
	}
	if ended <= 0 || near < ended {
		t.Errorf("%d sessions ended near the window, want at least %d", near, ended)
	}
	t.Logf("%d requests, %d sessions (%d ended), on %d system prompts", len(tr.Requests), len(final), ended, len(systems))
}

func TestAgentSessionsDeterministic(t *testing.T) {
	gen := func(seed uint64) *Trace {
		c := AgentSessions(10)
		c.Duration, c.Seed = 60, seed
		tr, err := AgentSession(c)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	a, b, other := gen(5), gen(5), gen(6)
	if len(a.Requests) != len(b.Requests) || a.Seed != 5 || a.Name != "agent-sessions" {
		t.Fatalf("same seed: %d and %d requests, seed %d, name %q", len(a.Requests), len(b.Requests), a.Seed, a.Name)
	}
	for i := range a.Requests {
		ra, rb := a.Requests[i], b.Requests[i]
		if ra.Arrival != rb.Arrival || ra.PromptTokens != rb.PromptTokens || ra.OutputTokens != rb.OutputTokens || !slices.Equal(ra.Keys, rb.Keys) {
			t.Fatalf("request %d differs for the same seed", i)
		}
	}
	if len(other.Requests) == len(a.Requests) && other.Requests[0].Arrival == a.Requests[0].Arrival {
		t.Error("seeds 5 and 6 give the same workload")
	}
}

func TestAgentSessionsRanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*AgentSessionConfig)
		want string
	}{
		{"no sessions", func(c *AgentSessionConfig) { c.Sessions = 0 }, "sessions"},
		{"no systems", func(c *AgentSessionConfig) { c.Systems = 0 }, "systems"},
		{"window too small", func(c *AgentSessionConfig) { c.ContextTokens = c.SystemTokens + c.TurnTokens }, "do not fit --context-tokens"},
		{"zero rate", func(c *AgentSessionConfig) { c.Rate = 0 }, "rate"},
		{"too many blocks", func(c *AgentSessionConfig) { c.Rate, c.Duration = 1e5, 86400 }, "more than"},
	} {
		c := AgentSessions(20)
		tc.edit(&c)
		_, err := AgentSession(c)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "agent-sessions workload") {
			t.Errorf("%s: %v, want an agent-sessions error naming %q", tc.name, err, tc.want)
		}
	}
}
