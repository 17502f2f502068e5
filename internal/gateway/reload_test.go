package gateway

import (
	"reflect"
	"slices"
	"strings"
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
			c.Displace = HoldOff // a scheduler setting, applied with it (it was named, and applied anyway)
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
		if tc.name == "applied" && (g.sched.Load().Displace || g.running.Load().Displace != HoldOff) {
			t.Errorf("displace off not applied (scheduler %v, running %q)", g.sched.Load().Displace, g.running.Load().Displace)
		}
	}
}

// TestConfigDumpLoads: GET /admin/config is a file a start takes again
// (it showed slo_ttft beside classes, which a start refuses: walkthrough,
// 2026-12-04), with the classes running; a class name with a control
// character is refused.
func TestConfigDumpLoads(t *testing.T) {
	_, _, eps := twoAggregated(t)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"classes", Config{Endpoints: eps, NoHealthChecks: true, DefaultClass: "b",
			Classes: []Class{{Name: "a", Priority: 2, TTFT: 0.5}, {Name: "b", TTFT: 4}}}},
		{"slo_ttft", Config{Endpoints: eps, NoHealthChecks: true, SLOTTFT: 3}},
		{"defaults", Config{Endpoints: eps, NoHealthChecks: true}},
	} {
		g, _, admin := startGateway(t, tc.cfg, Options{})
		dump := get(t, admin+"/admin/config")
		c, err := ParseConfig([]byte(dump))
		if err == nil {
			err = c.CheckClassTargets()
		}
		if err == nil {
			c.Defaults()
			err = c.Validate()
		}
		if err != nil {
			t.Errorf("%s: the dump does not load: %v\n%s", tc.name, err, dump)
			continue
		}
		if run := g.running.Load(); !reflect.DeepEqual(c.Classes, run.Classes) || c.DefaultClass != run.DefaultClass {
			t.Errorf("%s: the dump's classes %+v (%s), running %+v (%s)", tc.name, c.Classes, c.DefaultClass, run.Classes, run.DefaultClass)
		}
		// The hold's defaults are shown as they run, not as the zeros
		// that ask for them (walkthrough, 2026-12-05).
		if h := c.Hold; h.Min != 1 || h.Backlog != 1 || h.Slack != 0.5 || h.Quiet != 30 || h.Max != 10*time.Minute || c.ShutdownGrace != 30*time.Second {
			t.Errorf("%s: the dump's hold %+v, shutdown grace %v: want the defaults", tc.name, h, c.ShutdownGrace)
		}
	}
	bad := Config{Endpoints: eps, NoHealthChecks: true, DefaultClass: "a\x01b", Classes: []Class{{Name: "a\x01b", TTFT: 1}}}
	bad.Defaults()
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "control characters") {
		t.Errorf("a class name with a control character: %v", err)
	}
}
