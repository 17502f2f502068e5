package engine

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestConfigRanges: every number of a Config has a finite range, checked by
// Validate (so a program embedding the engine is protected, not only the
// command line) with the flag's name and the range in the error.
func TestConfigRanges(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tests := []struct {
		mutate func(*Config)
		msg    string
	}{
		{func(c *Config) { c.NumGPUBlocks = 1 << 62 }, "num-gpu-blocks must be in [1, 4194304] blocks, got 4611686018427387904"},
		{func(c *Config) { c.NumGPUBlocks = 0 }, "num-gpu-blocks"},
		{func(c *Config) { c.TimeScale = 1e-300 }, "time-scale must be in [0.001, 1e+06], got 1e-300"},
		{func(c *Config) { c.TimeScale = math.NaN() }, "time-scale"},
		{func(c *Config) { c.TimeScale = math.Inf(1) }, "time-scale"},
		{func(c *Config) { c.MaxModelLen = 1 << 40 }, "max-model-len must be in [1, 16777216] tokens"},
		{func(c *Config) { c.MaxNumSeqs = 1e9 }, "max-num-seqs"},
		{func(c *Config) { c.MaxNumBatchedTokens = -1 }, "max-num-batched-tokens"},
		{func(c *Config) { c.BlockSize = 1 << 20 }, "block-size"},
		{func(c *Config) { c.StreamInterval = -1 }, "stream-interval must be 0 (1) or in [1, 1048576] tokens"},
		{func(c *Config) { c.KVEventsBufferSteps = 1 << 30 }, "kv-events-buffer-steps"},
		{func(c *Config) { c.Port = 70000 }, "port must be in [0, 65535], got 70000"},
		{func(c *Config) { c.RoleSwitchWarmup = -time.Second }, "role-switch-warmup"},
		{func(c *Config) { c.KVHoldTimeout = 1000 * time.Hour }, "kv-hold-timeout must be in [0s, 24h0m0s]"},
		{func(c *Config) { c.Perf.PrefillTokensPerSec = math.Inf(1) }, "prefill-speed"},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		tt.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("got %v, want %q", err, tt.msg)
		}
		// New reports the same error instead of allocating or panicking.
		if _, nerr := New(c); nerr == nil {
			t.Errorf("New accepted a config Validate rejects (%q)", tt.msg)
		}
	}
}

// TestRealDurationsStayPositive: with the smallest time scale and the
// longest modelled times a valid config allows, wall-clock durations stay
// positive (a time scale of 1e-300 used to overflow them into negative
// durations, and negative TTFTs); past a Duration they saturate.
func TestRealDurationsStayPositive(t *testing.T) {
	c := DefaultConfig()
	l := ConfigLimits()
	c.TimeScale = l.TimeScale.Min
	c.KVHoldTimeout = l.KVHoldTimeout.Max
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if d := c.real(c.KVHoldTimeout.Seconds()); d <= 0 {
		t.Errorf("kv hold timeout of %v at time scale %v is %v", c.KVHoldTimeout, c.TimeScale, d)
	}
	for _, modelled := range []float64{1e30, math.Inf(1)} {
		if d := c.real(modelled); d != math.MaxInt64 {
			t.Errorf("real(%v) = %v, want saturation", modelled, d)
		}
	}
	for _, modelled := range []float64{-1, math.NaN()} {
		if d := c.real(modelled); d != 0 {
			t.Errorf("real(%v) = %v, want 0", modelled, d)
		}
	}
	c.TimeScale = 1e-300 // what Validate rejects, for real() alone
	if d := c.real(0.4); d <= 0 {
		t.Errorf("real(0.4) at time scale 1e-300 = %v", d)
	}
}
