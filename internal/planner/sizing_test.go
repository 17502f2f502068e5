package planner

import (
	"math"
	"strings"
	"testing"
)

// TestSeedTable is the seed's ratio table: what each phase needs of 24
// instances, and how loaded a fixed 12P12D is in it (the seed prints
// 4P17D, 20P3D, 2P17D; 33 %/139 %, 160 %/25 %, 12 %/139 %).
func TestSeedTable(t *testing.T) {
	got := SizePhases(SeedPhases(), SeedCapacity(), 24, 12, 12)
	want := []PhaseSizing{
		{Name: "chat", Prefill: 4, Decode: 17, Fits: true, FixedPrefillLoad: 80000.0 / 240000, FixedDecodeLoad: 50000.0 / 36000},
		{Name: "long-documents", Prefill: 20, Decode: 3, Fits: true, FixedPrefillLoad: 384000.0 / 240000, FixedDecodeLoad: 9000.0 / 36000},
		{Name: "agents", Prefill: 2, Decode: 17, Fits: true, FixedPrefillLoad: 30000.0 / 240000, FixedDecodeLoad: 50000.0 / 36000},
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows", len(got))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Name != w.Name || g.Prefill != w.Prefill || g.Decode != w.Decode || g.Fits != w.Fits {
			t.Errorf("%s: got %dP%dD fits=%v, want %dP%dD fits=%v", w.Name, g.Prefill, g.Decode, g.Fits, w.Prefill, w.Decode, w.Fits)
		}
		if math.Abs(g.FixedPrefillLoad-w.FixedPrefillLoad) > 1e-12 || math.Abs(g.FixedDecodeLoad-w.FixedDecodeLoad) > 1e-12 {
			t.Errorf("%s: fixed loads %v/%v, want %v/%v", w.Name, g.FixedPrefillLoad, g.FixedDecodeLoad, w.FixedPrefillLoad, w.FixedDecodeLoad)
		}
	}
	// With 22 instances chat (4 + 17 = 21) still fits, long documents
	// (23) do not.
	small := SizePhases(SeedPhases(), SeedCapacity(), 22, 11, 11)
	if !small[0].Fits || small[1].Fits {
		t.Errorf("fits at 22: %+v", small)
	}
	// A phase without traffic needs the planner's minimum, 1P1D (it
	// read 0P0D; walkthrough, 2026-12-04).
	idle := SizePhases([]Phase{{Name: "night", Shape: Shape{Rate: 0, ISL: 1000, OSL: 100}}}, SeedCapacity(), 24, 12, 12)
	if idle[0].Prefill != 1 || idle[0].Decode != 1 || !idle[0].Fits {
		t.Errorf("no traffic: %+v, want 1P1D", idle[0])
	}
}

// TestLoadsAreThePythonValues: the agents phase's prefill load is
// 25 × 6000 × (1 − 0.8) evaluated left to right in float64 — just under
// 30 000 — so it needs 2 instances (⌈1.4999…⌉), as in the seed.
func TestLoadsAreThePythonValues(t *testing.T) {
	ph := SeedPhases()[2].Shape
	hit := 0.8 // a variable: Go would compute a constant expression exactly
	if got, want := ph.PrefillLoad(), 150000*(1-hit); got != want || got >= 30000 {
		t.Fatalf("prefill load %v, want %v (< 30000)", got, want)
	}
}

func TestNeedAndUtilisationEdges(t *testing.T) {
	c := SeedCapacity()
	if p, d := Need(0, 0, c); p != 0 || d != 0 {
		t.Errorf("no load needs nothing: %d %d", p, d)
	}
	if p, d := Need(1e300, math.NaN(), c); p != math.MaxInt32 || d != 0 {
		t.Errorf("huge and NaN loads: %d %d", p, d)
	}
	if p, _ := Need(20000, 0, c); p != 1 {
		t.Errorf("exactly one instance's worth: %d", p)
	}
	if p, _ := Need(20000.0001, 0, c); p != 2 {
		t.Errorf("a little over one instance: %d", p)
	}
	up, ud := Utilisation(10, 0, 0, 0, c)
	if !math.IsInf(up, 1) || ud != 0 {
		t.Errorf("load on no instance: %v %v", up, ud)
	}
}

func TestParsePhases(t *testing.T) {
	yamlDoc := "phases:\n  - {name: chat, rate: 100, isl: 2000, osl: 500, hit: 0.6}\n  - name: night\n    rate: 25\n    isl: 6000\n    osl: 2000\n    hit: 0.8\n    minutes: 30\n"
	jsonDoc := `{"phases":[{"name":"chat","rate":100,"isl":2000,"osl":500,"hit":0.6},{"name":"night","rate":25,"isl":6000,"osl":2000,"hit":0.8,"minutes":30}]}`
	for _, doc := range []string{yamlDoc, jsonDoc} {
		ph, err := ParsePhases(strings.NewReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		if len(ph) != 2 || ph[0] != (Phase{Name: "chat", Shape: Shape{Rate: 100, ISL: 2000, OSL: 500, Hit: 0.6}}) ||
			ph[1].Minutes != 30 || ph[1].OSL != 2000 {
			t.Fatalf("parsed %+v", ph)
		}
	}
	for _, tc := range []struct{ doc, want string }{
		{"", "empty"},
		{"phases: []", "number of phases"},
		{"phases: [{name: a, rate: 1, isl: 1, osl: 1, hit: 0.5, color: red}]", "color"},
		{"phases: [{name: a, rate: 1, isl: 1, osl: 1, hit: 1.5}]", "hit must be"},
		{"phases: [{name: a, rate: .nan, isl: 1, osl: 1, hit: 0}]", "rate must be"},
		{"phases: [{name: a, rate: -1, isl: 1, osl: 1, hit: 0}]", "rate must be"},
		{"phases: [{name: a, rate: 1, isl: 0, osl: 1, hit: 0}]", "isl must be"},
		{"phases: [{name: '', rate: 1, isl: 1, osl: 1, hit: 0}]", "name"},
		{"phases: [{name: a, rate: 1, isl: 1, osl: 1, hit: 0}, {name: a, rate: 1, isl: 1, osl: 1, hit: 0}]", "used twice"},
		{"phases: [{name: a, rate: 1, isl: 1, osl: 1, hit: 0, minutes: 0.01}]", "minutes must be"},
		{"phases: {name: a}", "phases file"},
		// No rate was sized as 0 (0P0D, "fits"); an unknown top-level key
		// named an anonymous Go struct (walkthrough, 2026-12-04).
		{"phases: [{name: a, isl: 1, osl: 1, hit: 0}]", "phases[0]: rate is required"},
		{"phases: [{name: a, rate: 1, isl: 1, hit: 0}]", "phases[0]: osl is required"},
		{"foo: 1", "line 1: foo is not a setting here"},
		{strings.Repeat(" ", 1<<20+1), "larger than"},
	} {
		if _, err := ParsePhases(strings.NewReader(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "planner.") {
			t.Errorf("%.60q: want error with %q, got %v", tc.doc, tc.want, err)
		}
	}
}

// FuzzParsePhases: any input is parsed or refused with an error, and what
// is accepted sizes without overflow or NaN.
func FuzzParsePhases(f *testing.F) {
	f.Add("phases:\n  - {name: chat, rate: 100, isl: 2000, osl: 500, hit: 0.6}\n")
	f.Add(`{"phases":[{"name":"x","rate":1e6,"isl":16777216,"osl":1048576,"hit":0.999,"minutes":1440}]}`)
	f.Add("phases: [{name: a, rate: 0, isl: 1, osl: 1, hit: 0}]")
	f.Add("phases: [&a {name: a}, *a]")
	f.Fuzz(func(t *testing.T, doc string) {
		ph, err := ParsePhases(strings.NewReader(doc))
		if err != nil {
			return
		}
		for _, row := range SizePhases(ph, SeedCapacity(), 24, 12, 12) {
			if row.Prefill < 0 || row.Decode < 0 || math.IsNaN(row.FixedPrefillLoad) || math.IsNaN(row.FixedDecodeLoad) {
				t.Fatalf("row %+v from %q", row, doc)
			}
		}
	})
}
