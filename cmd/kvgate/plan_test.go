package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPlanSeedPhasesTable is the seed's table, line by line.
func TestPlanSeedPhasesTable(t *testing.T) {
	out, errOut, code := runCmd(t, "plan", "--scenario", "seed-phases")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := `fixed 12P12D vs adjusting per phase (24 instances in total):
  chat: needs 4P17D (fits); under the fixed split prefill load 33%; decode load 139% (overloaded)
  long-documents: needs 20P3D (fits); under the fixed split prefill load 160% (overloaded); decode load 25%
  agents: needs 2P17D (fits); under the fixed split prefill load 12%; decode load 139% (overloaded)
`
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
}

// TestPlanSeedPhasesJSON is the JSON shape.
func TestPlanSeedPhasesJSON(t *testing.T) {
	out, errOut, code := runCmd(t, "plan", "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Phases []map[string]any `json:"phases"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"name": "chat", "prefill": 4.0, "decode": 17.0, "fits": true, "fixed_prefill_load": 0.33, "fixed_decode_load": 1.39},
		{"name": "long-documents", "prefill": 20.0, "decode": 3.0, "fits": true, "fixed_prefill_load": 1.6, "fixed_decode_load": 0.25},
		{"name": "agents", "prefill": 2.0, "decode": 17.0, "fits": true, "fixed_prefill_load": 0.12, "fixed_decode_load": 1.39},
	}
	if len(doc.Phases) != len(want) {
		t.Fatalf("phases %v", doc.Phases)
	}
	for i, w := range want {
		if len(doc.Phases[i]) != len(w) {
			t.Errorf("phase %d has fields %v", i, doc.Phases[i])
		}
		for k, v := range w {
			if doc.Phases[i][k] != v {
				t.Errorf("phase %d %s = %v, want %v", i, k, doc.Phases[i][k], v)
			}
		}
	}
}

// TestPlanFlagsAndPhasesFile: every input is a flag or the phases file.
func TestPlanFlagsAndPhasesFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "phases.yaml")
	if err := os.WriteFile(file, []byte("phases:\n  - {name: batch, rate: 10, isl: 8000, osl: 1000, hit: 0.5}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// 10 × 8000 × 0.5 = 40 000 prompt tok/s on 10 000 per instance: 4;
	// 10 000 output tok/s on 2 500: 4. The fixed 2P6D carries 200 % and
	// 67 %.
	out, errOut, code := runCmd(t, "plan", "--phases", file, "--total", "8", "--prefill-capacity", "10000", "--decode-capacity", "2500", "--fixed", "2P6D")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := "fixed 2P6D vs adjusting per phase (8 instances in total):\n  batch: needs 4P4D (fits); under the fixed split prefill load 200% (overloaded); decode load 67%\n"
	if out != want {
		t.Fatalf("got %q", out)
	}
	// Without --fixed the split compared is half of --total each side.
	if out, errOut, code := runCmd(t, "plan", "--total", "16"); code != 0 || !strings.HasPrefix(out, "fixed 8P8D vs adjusting per phase (16 instances in total)") {
		t.Fatalf("--total 16 alone: exit %d: %s %s", code, out, errOut)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--total", "1"}, "--total must be"},
		{[]string{"--policy", "foo", "--what-if"}, "--policy, --what-if: only with --scenario simulated-day"},
		{[]string{"--phases", writeFile(t, dir, "unknown.yaml", "phases:\n  - {name: a, rate: 1, isl: 1, osl: 1, hit: 0, colour: red}\n")}, "colour is not a setting here"},
		{[]string{"--phases", writeFile(t, dir, "empty.yaml", "")}, "phases file is empty"},
		{[]string{"--prefill-capacity", "NaN"}, "--prefill-capacity must be"},
		{[]string{"--decode-capacity", "0"}, "--decode-capacity must be"},
		{[]string{"--fixed", "12:12"}, "want <P>P<D>D"},
		{[]string{"--fixed", "20P20D"}, "more than --total"},
		{[]string{"--fixed", "0P24D"}, "--fixed prefill must be"},
		{[]string{"--scenario", "nope"}, "unknown scenario"},
		{[]string{"--format", "xml"}, "unknown format"},
		{[]string{"--phases", filepath.Join(dir, "missing.yaml")}, "no such file"},
		{[]string{"--scenario", "simulated-day", "--fixed", "10P10D"}, "must use all"},
		{[]string{"--scenario", "simulated-day", "--phase-minutes", "0"}, "--phase-minutes must be"},
		{[]string{"--scenario", "simulated-day", "--policy", "nope"}, "unknown policy"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		_, errOut, code := runCmd(t, append([]string{"plan"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q (want %q)", tc.args, code, errOut, tc.want)
		}
	}
}

// TestPlanSimulatedDaySmall runs a short day end to end through the
// command (table and JSON).
func TestPlanSimulatedDaySmall(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a day")
	}
	args := []string{"plan", "--scenario", "simulated-day", "--total", "8", "--fixed", "4P4D", "--phases", "", "--phase-minutes", "2",
		"--transition-minutes", "1", "--interval", "15"}
	dir := t.TempDir()
	file := filepath.Join(dir, "phases.yaml")
	// The seed's phases at a third of their rates, for 8 instances.
	doc := "phases:\n  - {name: chat, rate: 33, isl: 2000, osl: 500, hit: 0.6}\n  - {name: docs, rate: 10, isl: 16000, osl: 300, hit: 0.2}\n"
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	args[8] = file
	out, errOut, code := runCmd(t, append(args, "--format", "json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Requests int `json:"requests"`
		Runs     []struct {
			Name       string  `json:"name"`
			Attainment float64 `json:"attainment"`
			Phases     []struct {
				Name string `json:"name"`
			} `json:"phases"`
		} `json:"runs"`
		Sweep []any `json:"sweep"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	names := []string{}
	for _, r := range rep.Runs {
		names = append(names, r.Name)
		if len(r.Phases) != 2 || r.Phases[1].Name != "docs" || r.Attainment <= 0 || r.Attainment > 1 {
			t.Errorf("run %+v", r)
		}
	}
	if strings.Join(names, ",") != "fixed 4P4D,best fixed (hindsight),planner,oracle (phases),oracle (foresight)" || len(rep.Sweep) != 7 || rep.Requests == 0 {
		t.Errorf("runs %v, sweep %d, requests %d", names, len(rep.Sweep), rep.Requests)
	}
	out, errOut, code = runCmd(t, args...)
	if code != 0 || !strings.Contains(out, "best fixed (hindsight)") || !strings.Contains(out, "planner switches:") {
		t.Errorf("table: exit %d %s\n%s", code, errOut, out)
	}
}

// writeFile writes a file of text in dir and returns its path.
func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
