package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/sim"
)

// TestDrawShape: shapes are a function of their seed, within the
// documented ranges, and every workload kind comes up.
func TestDrawShape(t *testing.T) {
	kinds := map[string]int{}
	for seed := range uint64(400) {
		s := drawShape(seed)
		if s != drawShape(seed) {
			t.Fatalf("seed %d: two draws differ", seed)
		}
		kinds[s.Workload]++
		if s.Instances < 4 || s.Instances > 32 || s.CacheBlocks < 500 || s.CacheBlocks > 15000 ||
			s.SLOTTFT < 1 || s.SLOTTFT > 5 || s.Load < 0.3 || s.Load > 3 || s.OutputTokens < 100 || s.OutputTokens > 3000 {
			t.Errorf("seed %d: out of range: %+v", seed, s)
		}
		g := s.generator(64, 2000)
		if err := g.validate(10); err != nil {
			t.Errorf("seed %d: %v", seed, err)
		}
	}
	for _, k := range sweepKinds() {
		if kinds[k] < 60 {
			t.Errorf("%s drawn %d times in 400", k, kinds[k])
		}
	}
	if drawShape(1) == drawShape(2) {
		t.Error("seeds 1 and 2 drew the same shape")
	}
}

// TestShapeCap: a shape's trace holds at most the cap.
func TestShapeCap(t *testing.T) {
	s := drawShape(0)
	tr, err := s.generator(64, 500).gen(1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 500 || tr.Duration <= 0 || tr.Duration > 0.6 {
		t.Errorf("%d requests over %v s, want 500 over about 0.5 s", len(tr.Requests), tr.Duration)
	}
}

func TestRankPolicies(t *testing.T) {
	r := func(policy string, reject bool, attain, p99 float64) sim.Result {
		return sim.Result{Policy: policy, EarlyReject: reject, Attainment: attain, TTFTP99: p99}
	}
	shapes := [][]sim.Result{
		{r("a", false, 0.9, 1), r("b", false, 0.8, 2), r("c", false, 0.9, 4), r("a", true, 0.95, 1), r("b", true, 0.99, 1), r("c", true, 0.5, 2)},
		{r("a", false, 0.5, 10), r("b", false, 0.7, 5), r("c", false, 0.6, 20), r("a", true, 0.9, 0), r("b", true, 0.9, 0), r("c", true, 0.9, 0)},
	}
	got := rankPolicies(shapes)
	want := []rankRow{
		// Without rejection: a ranks 1.5 (tied first) then 3; b 3 then
		// 1; c 1.5 then 2. p99 ratios: a 1, 2; b 2, 1; c 4, 4.
		{false, "b", 0.75, 2, 1, 1.5},
		{false, "a", 0.7, 2.25, 1, 1.5},
		{false, "c", 0.75, 1.75, 1, 4},
	}
	// Sorted by mean rank: c (1.75), b (2), a (2.25).
	want[0], want[1], want[2] = want[2], want[0], want[1]
	// With rejection: every p99 on shape 2 is 0, so only shape 1's ratios
	// count; all three tie there (rank 2 each, all win).
	want = append(want,
		rankRow{true, "b", 0.945, 1.5, 2, 1},
		rankRow{true, "a", 0.925, 2, 1, 1},
		rankRow{true, "c", 0.7, 2.5, 1, 2},
	)
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestSimSweepSmall: a small sweep prints each shape with its runs and a
// ranking, the same for the same seed; its JSON carries shapes and
// ranking.
func TestSimSweepSmall(t *testing.T) {
	run := func(format string) string {
		var f simFlags
		newSimFlagSet(&f, &bytes.Buffer{})
		f.seeds, f.seed, f.format = 2, 5, format
		var out bytes.Buffer
		if err := runSweep(context.Background(), &f, sim.EvictTailFirst, []string{"least-queue", "cache-only"}, []bool{false, true}, &out, 1500); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	a, b := run("table"), run("table")
	if a != b {
		t.Fatal("two sweeps of the same seeds differ")
	}
	if strings.Count(a, "shape ") != 2 || !strings.Contains(a, "ranking over 2 shapes") || !strings.Contains(a, "mean p99 ratio") {
		t.Fatalf("table:\n%s", a)
	}
	var doc sweepOutput
	if err := json.Unmarshal([]byte(run("json")), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Shapes) != 2 || len(doc.Ranking) != 4 {
		t.Fatalf("%d shapes, %d ranking rows", len(doc.Shapes), len(doc.Ranking))
	}
	for _, s := range doc.Shapes {
		if len(s.Runs) != 4 || s.Requests > 1500 || s.Capacity <= 0 || math.Abs(s.Rate-s.Load*s.Capacity) > 0.01*s.Rate+0.01 {
			t.Errorf("shape %+v", s.sweepShape)
		}
		for _, r := range s.Runs {
			if r.Seed != s.Seed || r.Requests != s.Requests {
				t.Errorf("shape %d run %+v", s.Index, r)
			}
		}
	}
}

func TestSimSweepBadFlags(t *testing.T) {
	_, errOut, code := runCmd(t, "sim", "--scenario", "sweep", "--instances", "4")
	if code == 0 || !strings.Contains(errOut, "--instances not allowed") {
		t.Errorf("exit %d: %s", code, errOut)
	}
}

// TestSweepShape9Balanced: the sweep's shape 9 (chat on 26 instances, 6
// system prompts of 8 130 tokens, 0.72× load) is the fleet kvgate's
// conversation balance is for: without it (or with it only on an idle
// fleet, as first built) the holders of the system prompts took 25–35
// conversations each while 17 instances held none, their caches overflowed
// and kvgate attained 95.6 % against llm-d's weighted blend's 98.8 %. With
// the bound scaled by 1 + λ it serves every request in time.
func TestSweepShape9Balanced(t *testing.T) {
	att := sweepShapeAttainment(t, 9, 26, "chat", []string{"kvgate", "llmd-weighted-blend"}, false)
	if att["kvgate"] < 0.995 || att["kvgate"] < att["llmd-weighted-blend"] {
		t.Errorf("kvgate attained %.4f, the weighted blend %.4f", att["kvgate"], att["llmd-weighted-blend"])
	}
}

// sweepShapeAttainment runs the sweep's shape of seed (which must have
// the given instances and workload) with policies, with or without early
// rejection, and returns each policy's attainment.
func sweepShapeAttainment(t *testing.T, seed uint64, instances int, workload string, policies []string, reject bool) map[string]float64 {
	t.Helper()
	if testing.Short() {
		t.Skip("a full sweep shape")
	}
	var f simFlags
	newSimFlagSet(&f, &bytes.Buffer{})
	f.seeds, f.seed, f.format = 1, seed, "json"
	var out bytes.Buffer
	if err := runSweep(context.Background(), &f, sim.EvictTailFirst, policies, []bool{reject}, &out, sweepMaxRequests); err != nil {
		t.Fatal(err)
	}
	var doc sweepOutput
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Shapes) != 1 || doc.Shapes[0].Instances != instances || doc.Shapes[0].Workload != workload || len(doc.Shapes[0].Runs) != len(policies) {
		t.Fatalf("not the shape this test is about: %+v", doc.Shapes)
	}
	att := map[string]float64{}
	for _, r := range doc.Shapes[0].Runs {
		att[r.Policy] = r.Attainment
	}
	return att
}

// TestSweepShape1007Spreads: held-out sweep shape 1007 (long documents on
// 21 instances, 8 shared 8 700-token prefixes, a 1.41 s SLO, 0.78× load)
// with early rejection. Documents longer than the SLO's worth of compute
// fit only where their prefix is cached; kept on their prefix's few
// holders, they were rejected while other instances stood idle (kvgate
// 91.11 %, predicted-ttft 93.32 %). Rejections with an instance idle now
// make kvgate route by TTFT, which copies the prefixes (docs/policies.md).
func TestSweepShape1007Spreads(t *testing.T) {
	att := sweepShapeAttainment(t, 1007, 21, "long-documents", []string{"kvgate", "predicted-ttft"}, true)
	if att["kvgate"] < att["predicted-ttft"]-0.005 {
		t.Errorf("kvgate attained %.4f, predicted-ttft %.4f: more than half a point behind", att["kvgate"], att["predicted-ttft"])
	}
}
