package main

import (
	"encoding/json"
	"strings"
	"testing"
)

type simDoc struct {
	Runs []map[string]any `json:"runs"`
}

// simJSON runs kvgate sim with args and --format json and decodes its
// output.
func simJSON(t *testing.T, args ...string) simDoc {
	t.Helper()
	out, errOut, code := runCmd(t, append(append([]string{"sim"}, args...), "--format", "json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc simDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	return doc
}

// TestSimHeterogeneousJSON: the heterogeneous scenario runs the kvgate
// policy once per predictor, and each run carries the predictor, its TTFT
// error and the drift measures.
func TestSimHeterogeneousJSON(t *testing.T) {
	doc := simJSON(t, "--scenario", "heterogeneous", "--rates", "30", "--duration", "20", "--early-reject", "on")
	if len(doc.Runs) != 3 {
		t.Fatalf("%d runs, want one per predictor", len(doc.Runs))
	}
	for i, want := range []string{"analytic", "learned", "true"} {
		r := doc.Runs[i]
		if r["predictor"] != want || r["policy"] != "kvgate" {
			t.Errorf("run %d: predictor %v policy %v, want %s and kvgate", i, r["predictor"], r["policy"], want)
		}
		for _, k := range []string{"ttft_mdape", "ttft_ape_p90", "drift_recovery_s", "stale_routing_s", "attainment"} {
			if _, ok := r[k]; !ok {
				t.Errorf("run %d lacks %q: %v", i, k, r)
			}
		}
	}
	if a, l := doc.Runs[0]["ttft_mdape"].(float64), doc.Runs[1]["ttft_mdape"].(float64); !(l < a) {
		t.Errorf("learned error %v not below analytic %v on a fleet configured with wrong speeds", l, a)
	}
	dec := simJSON(t, "--scenario", "heterogeneous", "--rates", "30", "--duration", "40", "--early-reject", "on", "--decode-instances", "2")
	for i, r := range dec.Runs {
		if _, ok := r["tpot_mdape"]; !ok {
			t.Errorf("run %d with decode instances lacks tpot_mdape: %v", i, r)
		}
	}
	table, errOut, code := runCmd(t, "sim", "--scenario", "heterogeneous", "--rates", "30", "--duration", "10",
		"--early-reject", "off", "--predictors", "learned")
	if code != 0 || !strings.Contains(table, "kvgate (learned)") || !strings.Contains(table, "TTFT err p50") {
		t.Errorf("table: exit %d %s\n%s", code, errOut, table)
	}
	for _, flags := range [][]string{{"--predictors", "learned"}, {"--observe", "windows"}, {"--noise", "0.1"}} {
		_, errOut, code := runCmd(t, append([]string{"sim", "--duration", "2"}, flags...)...)
		if code == 0 || !strings.Contains(errOut, "only with --scenario heterogeneous") {
			t.Errorf("%v without the scenario: exit %d %q, want an error", flags, code, errOut)
		}
	}
	for _, bad := range [][]string{{"--predictors", "psychic"}, {"--spread", "0.5"}, {"--trace", "t.jsonl"}, {"--observe", "gossip"}} {
		_, errOut, code := runCmd(t, append([]string{"sim", "--scenario", "heterogeneous", "--duration", "2"}, bad...)...)
		if code == 0 || errOut == "" {
			t.Errorf("%v: exit %d, want an error", bad, code)
		}
	}
}
