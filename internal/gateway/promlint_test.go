package gateway

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// TestMetricsLint: the gateway's and the engine emulator's /metrics pass
// Prometheus' own linter (promlint, the rules promtool check metrics
// applies: names, units, counters' _total, help texts).
func TestMetricsLint(t *testing.T) {
	_, _, eps := twoAggregated(t)
	_, url, admin := startGateway(t, Config{Endpoints: eps}, Options{})
	for range 3 {
		post(t, url+"/v1/completions", completion(prefix("lint"), true, 3), nil)
	}
	lint(t, "gateway", get(t, admin+"/metrics"), "kvgate_requests_total", "kvgate_ttft_seconds")
	// The emulator names its metrics as vLLM does, "vllm:" and all,
	// which the linter's rule against colons (recording rules' mark)
	// flags: every other rule holds.
	lint(t, "engine", get(t, eps[0].URL+"/metrics"), "vllm:num_requests_running")
}

// lint fails t for every problem promlint finds in the exposition m, and
// when m lacks one of the metrics named.
func lint(t *testing.T, what, m string, names ...string) {
	t.Helper()
	for _, n := range names {
		if !strings.Contains(m, n) {
			t.Fatalf("%s: no %s in /metrics:\n%.2000s", what, n, m)
		}
	}
	problems, err := promlint.New(strings.NewReader(m)).Lint()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for _, p := range problems {
		if what == "engine" && p.Text == "metric names should not contain ':'" {
			continue
		}
		t.Errorf("%s: %s: %s", what, p.Metric, p.Text)
	}
}
