package gateway

import (
	"slices"
	"testing"
	"time"
)

// TestReloadNamesWhatItDoesNotApply: a reload applies endpoints, classes,
// early rejection and the hold's parameters; every other field that
// changed is named as needing a restart, never ignored in silence (the
// request-time settings were: local_prefill_tokens, migration_limit,
// upstream_timeout, no_stream_upstream, fairness_header, ...).
func TestReloadNamesWhatItDoesNotApply(t *testing.T) {
	_, _, eps := twoAggregated(t)
	base := Config{Endpoints: eps, NoHealthChecks: true}
	g, _, _ := startGateway(t, base, Options{})
	no := false
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   []string
	}{
		{"nothing", func(*Config) {}, nil},
		{"applied", func(c *Config) {
			c.Endpoints = c.Endpoints[:1]
			c.EarlyReject = &no
			c.SLOTTFT, c.Classes = 3, []Class{{Name: "batch", TTFT: 30}}
			c.Hold.Slack = 0.25
		}, nil},
		{"request-time settings", func(c *Config) {
			c.LocalPrefillTokens, c.MigrationLimit, c.UpstreamTimeout = 100, 1, time.Second
			c.NoStreamUpstream, c.FairnessHeader, c.NoFairness, c.LogPrompts, c.NoLoRASlots = true, "X-Tenant", true, true, true
			c.ConnectTimeout, c.NoHealthChecks = 9*time.Second, false
			c.Health.Interval = 7 * time.Second
		}, []string{"local_prefill_tokens", "upstream_timeout", "connect_timeout", "migration_limit", "no_stream_upstream", "health",
			"no_health_checks", "fairness_header", "no_fairness", "log_prompts", "no_lora_slots"}},
		{"the hold's two", func(c *Config) { c.Hold.MaxRequests, c.Hold.TouchPriority = 7, -1 }, []string{"hold.max_requests", "hold.touch_priority"}},
		{"addresses and policy", func(c *Config) { c.Listen, c.Policy = "127.0.0.1:1", "cache-only" }, []string{"listen", "policy"}},
	} {
		next := base
		next.Endpoints = append(eps[:0:0], eps...)
		tc.change(&next)
		got, err := g.Reload(next)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		slices.Sort(got)
		want := slices.Clone(tc.want)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: needs a restart %v, want %v", tc.name, got, want)
		}
	}
}
