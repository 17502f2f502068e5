package main

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// TestSimLongPromptsLoads: --loads runs each seed's workload at multiples
// of the capacity measured on it, and reports both.
func TestSimLongPromptsLoads(t *testing.T) {
	doc := simJSON(t, "--workload", "long-prompts", "--loads", "0.5,2", "--duration", "20", "--policies", "cache-only",
		"--early-reject", "off", "--seeds", "2")
	if len(doc.Runs) != 4 {
		t.Fatalf("%d runs, want 2 loads × 2 seeds", len(doc.Runs))
	}
	for i, r := range doc.Runs {
		load, capacity, rate := r["load"].(float64), r["capacity"].(float64), r["rate"].(float64)
		if want := []float64{0.5, 2}[i%2]; load != want {
			t.Errorf("run %d: load %v, want %v", i, load, want)
		}
		// The default fleet's capacity on long prompts: about 17 req/s.
		if capacity < 10 || capacity > 30 || math.Abs(rate-load*capacity) > 0.01 {
			t.Errorf("run %d: rate %v, load %v, capacity %v", i, rate, load, capacity)
		}
	}
	if doc.Runs[0]["attainment"].(float64) <= doc.Runs[1]["attainment"].(float64) {
		t.Errorf("attainment at half the capacity %v, at twice %v", doc.Runs[0]["attainment"], doc.Runs[1]["attainment"])
	}
}

func TestSimLoadsBadInput(t *testing.T) {
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"--loads", "1", "--rates", "10"}, "give --rates or --loads, not both"},
		{[]string{"--loads", "0"}, "--loads must be in [0.01, 100] × capacity, got 0"},
		{[]string{"--loads", "x"}, "--loads: bad number"},
		{[]string{"--loads", "1", "--trace", "t.jsonl"}, "--loads needs a generated workload"},
		{[]string{"--workload", "long-prompts", "--prompt-sigma", "9"}, "--prompt-sigma must be in [0, 4]"},
		{[]string{"--workload", "long-prompts", "--turns", "0"}, "--turns must be in [1, 10000]"},
		{[]string{"--workload", "long-prompts", "--rates", "1000", "--duration", "86400"}, "long-prompts workload"},
	}
	for _, tt := range tests {
		base := []string{"sim", "--duration", "2"}
		if slices.Contains(tt.args, "--trace") {
			base = base[:1] // a trace reads no --duration
		}
		_, errOut, code := runCmd(t, append(base, tt.args...)...)
		if code == 0 || !strings.Contains(errOut, tt.msg) {
			t.Errorf("%v: exit %d, stderr %q; want an error mentioning %q", tt.args, code, errOut, tt.msg)
		}
	}
}
