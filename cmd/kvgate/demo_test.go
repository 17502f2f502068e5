package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/demo"
)

// TestDemoShortRun runs a short demo (two runs) and checks the JSON shape
// the issue gives, and that the report is written with its plots.
func TestDemoShortRun(t *testing.T) {
	report := filepath.Join(t.TempDir(), "demo.html")
	out, errOut, code := runCmd(t, "demo", "--duration", "5", "--rate", "20", "--time-scale", "5", "--runs", "1,4", "--turn-tokens", "600",
		"--format", "json", "--report", report)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res struct {
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(res.Runs) != 2 || res.Runs[0]["policy"] != "round-robin" || res.Runs[1]["policy"] != "kvgate" {
		t.Fatalf("%s", out)
	}
	for _, r := range res.Runs {
		for _, k := range []string{"policy", "fleet", "requests", "goodput", "attainment", "ttft_p50", "ttft_p99", "tpot_p50", "hit_rate", "rejected"} {
			if _, ok := r[k]; !ok {
				t.Errorf("run lacks %q: %v", k, r)
			}
		}
		// Served, not in time: at 5× real time with 600-token turns the
		// fleet is saturated, and with the machine's other cores busy
		// (go test runs packages side by side) round-robin's attainment
		// can be 0 (its engines 57 % behind their model in one CI run);
		// attainment is the demo's to measure, not this test's.
		if r["requests"].(float64) < 50 || r["ttft_p50"].(float64) <= 0 || r["hit_rate"].(float64) <= 0 {
			t.Errorf("run did not serve: %v", r)
		}
	}
	html, err := os.ReadFile(report)
	if err != nil || strings.Count(string(html), "<svg") < 3 {
		t.Fatalf("report: %v, %d plots", err, strings.Count(string(html), "<svg"))
	}
	// A report in no folder is refused before the run (it was found
	// after it, and the run's table was not printed).
	missing := filepath.Join(t.TempDir(), "none", "demo.html")
	if out, errOut, code := runCmd(t, "demo", "--report", missing); code == 0 || !strings.Contains(errOut, "no folder") || out != "" {
		t.Errorf("--report in no folder: exit %d: %s %s", code, out, errOut)
	}
	if _, errOut, code := runCmd(t, "demo", "--runs", "9"); code == 0 || !strings.Contains(errOut, "--runs") {
		t.Errorf("bad --runs accepted: %s", errOut)
	}
	for _, v := range []string{"0", "2049", "x"} {
		if _, errOut, code := runCmd(t, "demo", "--turn-tokens", v); code == 0 || !strings.Contains(errOut, "turn-tokens") {
			t.Errorf("bad --turn-tokens %s accepted: %s", v, errOut)
		}
	}
}

func TestDemoLagWarning(t *testing.T) {
	run := func(label string, lag float64) demo.Result {
		return demo.Result{Summary: bench.Summary{Label: label}, EngineLag: lag}
	}
	for _, tc := range []struct {
		name    string
		results []demo.Result
		want    []string // empty: no warning
	}{
		{"machine kept up", []demo.Result{run("a", 0.01), run("b", lagTolerance)}, nil},
		{"one run behind", []demo.Result{run("a", 0.01), run("kvgate / P/D 8P2D", 0.17)}, []string{"run 2 (kvgate / P/D 8P2D)", "17 %", "--time-scale 2"}},
	} {
		var b strings.Builder
		lagWarning(&b, 4, tc.results)
		if len(tc.want) == 0 {
			if b.Len() != 0 {
				t.Errorf("%s: %q", tc.name, b.String())
			}
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: %q lacks %q", tc.name, b.String(), w)
			}
		}
	}
}

// TestDemoReplicas: --replicas puts synced gateway replicas in front of
// the fleet; requests spread over them are all served, and the JSON says
// how the run was made.
func TestDemoReplicas(t *testing.T) {
	out, errOut, code := runCmd(t, "demo", "--duration", "5", "--rate", "20", "--time-scale", "5", "--runs", "5",
		"--replicas", "3", "--format", "json", "--report", "")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res struct {
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Runs) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	r := res.Runs[0]
	if r["replicas"] != 3.0 || r["replica_sync"] != true || r["requests"].(float64) < 50 || r["ttft_p50"].(float64) <= 0 {
		t.Fatalf("run %v", r)
	}
	for _, v := range []string{"0", "9"} {
		if _, errOut, code := runCmd(t, "demo", "--replicas", v); code == 0 || !strings.Contains(errOut, "replicas") {
			t.Errorf("bad --replicas %s accepted: %s", v, errOut)
		}
	}
}
