package sim

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/predict"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

func heteroConfig(truth *Truth, predictor string) Config {
	return Config{Prefill: 8, Model: perfmodel.Default(), CacheTokens: 3000 * 64, SLO: sched.SLO{TTFT: 2},
		Truth: truth, Predictor: predictor}
}

func heteroRun(t *testing.T, cfg Config, rate float64, seed uint64) Result {
	t.Helper()
	tr, err := workload.Chat(workload.ChatConfig{Systems: 20, Sessions: 400, SystemTokens: 2048, TurnTokens: 300,
		OutputTokens: 500, Rate: rate, Duration: 120, BlockSize: 64, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := sched.New("kvgate", sched.Options{Seed: seed + 1})
	res, err := Run(context.Background(), cfg, tr, &sched.Scheduler{Policy: pol, EarlyReject: true})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestHeldRequestsErrorFromRelease: without early rejection kvgate holds
// at the router what fits nowhere (12 % of the requests here), and a held
// request's prediction is made at its release: its TTFT error is counted
// from there, not from its arrival, which made the learned predictor's
// error p90 read 75 % and its drift recovery never on seed 0.
func TestHeldRequestsErrorFromRelease(t *testing.T) {
	tr, err := workload.Chat(workload.ChatConfig{Systems: 20, Sessions: 400, SystemTokens: 2048, TurnTokens: 300,
		OutputTokens: 500, Rate: 70, Duration: 120, BlockSize: 64, Seed: 0})
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := sched.New("kvgate", sched.Options{Seed: 1})
	res, err := Run(context.Background(), heteroConfig(Heterogeneous(8, 20000, 2.5, 0.05, 60, 0.5, 0), "learned"), tr, &sched.Scheduler{Policy: pol, Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held %.3f, TTFT error p50 %.3f p90 %.3f, drift recovery %v s", res.Held, res.TTFTMdAPE, res.TTFTAPEP90, *res.DriftRecovery)
	if res.Held < 0.05 {
		t.Fatalf("held %.3f of the requests: the test needs held requests", res.Held)
	}
	if res.TTFTAPEP90 >= 0.25 {
		t.Errorf("TTFT error p90 %.3f, want < 0.25", res.TTFTAPEP90)
	}
	if r := *res.DriftRecovery; r < 0 || r > 60 {
		t.Errorf("error recovery after the drift %g s, want within 60", r)
	}
}

// TestHeterogeneousAcceptance is issue 11's acceptance on the documented
// heterogeneous fleet (4 instances at 25 000 tokens/s, 4 at 10 000, all
// configured at 20 000, non-linear costs, 5% jitter, 2 ms measurement
// noise, instance 0 at half speed from 60 s) at 70 req/s, over three
// seeds: the learned predictor's TTFT error after warm-up (median < 10%,
// p90 < 25%), the kvgate policy's attainment with it within a point of
// the same policy given the true timing, the analytic model with the
// configured speeds clearly worse, and the drift caught within a minute.
func TestHeterogeneousAcceptance(t *testing.T) {
	attain := map[string]float64{}
	const seeds = 3
	for seed := range uint64(seeds) {
		for _, p := range Predictors {
			res := heteroRun(t, heteroConfig(Heterogeneous(8, 20000, 2.5, 0.05, 60, 0.5, seed), p), 70, seed)
			t.Logf("seed %d %-8s attainment %.4f TTFT error p50 %.3f p90 %.3f drift recovery %v s stale routing %v s",
				seed, p, res.Attainment, res.TTFTMdAPE, res.TTFTAPEP90, *res.DriftRecovery, *res.StaleRouting)
			attain[p] += res.Attainment / seeds
			if res.Predictor != p {
				t.Errorf("result predictor %q, want %q", res.Predictor, p)
			}
			if p != "learned" {
				continue
			}
			if res.TTFTMdAPE >= 0.10 || res.TTFTAPEP90 >= 0.25 {
				t.Errorf("seed %d: learned TTFT error p50 %.3f p90 %.3f, want < 0.10 and < 0.25", seed, res.TTFTMdAPE, res.TTFTAPEP90)
			}
			if r := *res.DriftRecovery; r < 0 || r > 60 {
				t.Errorf("seed %d: error recovery after the drift %g s, want within 60", seed, r)
			}
			if s := *res.StaleRouting; s > 60 {
				t.Errorf("seed %d: routed on stale beliefs %g s after the drift, want within 60", seed, s)
			}
		}
	}
	t.Logf("mean attainment %v", attain)
	if attain["learned"] < attain["true"]-0.01 {
		t.Errorf("learned attainment %.4f more than a point below the true timing's %.4f", attain["learned"], attain["true"])
	}
	if attain["analytic"] > attain["learned"]-0.05 {
		t.Errorf("analytic with the wrong speeds %.4f, not clearly below learned %.4f: the scenario does not test the predictor",
			attain["analytic"], attain["learned"])
	}
}

// TestGatewayLearningRuleOnHiddenSpeeds runs the gateway's learning rule
// for batching engines (busy windows, BatchingEngines) on the
// heterogeneous fleet at 70 req/s with early rejection: its TTFT error
// and the kvgate policy's attainment stay close to learning from every
// first token, which the simulator's FIFO engines make exact. (The rule it
// replaced, lone prefills only, gave 67–75 % attainment with a median error
// of 9–21 % and never recovered from the drift: endpoints learned too fast
// stopped running alone.)
func TestGatewayLearningRuleOnHiddenSpeeds(t *testing.T) {
	for seed := range uint64(2) {
		cfg := heteroConfig(Heterogeneous(8, 20000, 2.5, 0.05, 60, 0.5, seed), "learned")
		exact := heteroRun(t, cfg, 70, seed)
		cfg.BatchingEngines = true
		win := heteroRun(t, cfg, 70, seed)
		t.Logf("seed %d: first tokens %.4f (error p50 %.3f), windows %.4f (error p50 %.3f p90 %.3f, recovery %v s)",
			seed, exact.Attainment, exact.TTFTMdAPE, win.Attainment, win.TTFTMdAPE, win.TTFTAPEP90, *win.DriftRecovery)
		if win.TTFTMdAPE >= 0.06 || win.TTFTAPEP90 >= 0.2 {
			t.Errorf("seed %d: windows' TTFT error p50 %.3f p90 %.3f, want < 0.06 and < 0.2", seed, win.TTFTMdAPE, win.TTFTAPEP90)
		}
		if win.Attainment < exact.Attainment-0.03 {
			t.Errorf("seed %d: windows' attainment %.4f, more than 3 points below first tokens' %.4f", seed, win.Attainment, exact.Attainment)
		}
		if r := *win.DriftRecovery; r < 0 || r > 60 {
			t.Errorf("seed %d: windows' recovery after the drift %g s, want within 60", seed, r)
		}
	}
	if _, err := Run(context.Background(), Config{Prefill: 1, Model: perfmodel.Default(), BatchingEngines: true},
		&workload.Trace{BlockSize: 64}, &sched.Scheduler{}); err == nil || !strings.Contains(err.Error(), "truth") {
		t.Errorf("BatchingEngines without a truth: %v", err)
	}
}

// TestTruthRuns: a fleet whose truth is the configured model (same
// speed, linear, no noise) runs as without a truth, whatever the
// predictor; bad truths and predictors are errors.
func TestTruthRuns(t *testing.T) {
	exact := &Truth{Speeds: make([]float64, 8), Knees: make([]float64, 8), Overheads: make([]float64, 8)}
	for i := range exact.Speeds {
		exact.Speeds[i] = 20000
	}
	base := heteroRun(t, heteroConfig(nil, ""), 40, 1)
	for _, p := range []string{"analytic", "true"} {
		res := heteroRun(t, heteroConfig(exact, p), 40, 1)
		if res.Attainment != base.Attainment || res.HitRate != base.HitRate || res.TTFTMdAPE > 1e-9 {
			t.Errorf("%s on the exact truth: attainment %v hit %v error %v; without truth %v %v",
				p, res.Attainment, res.HitRate, res.TTFTMdAPE, base.Attainment, base.HitRate)
		}
	}
	tr, _ := workload.Chat(workload.ChatConfig{Systems: 2, Sessions: 4, SystemTokens: 128, TurnTokens: 64,
		OutputTokens: 8, Rate: 5, Duration: 2, BlockSize: 64, Seed: 1})
	pol, _ := sched.New("kvgate", sched.Options{})
	bad := []struct {
		cfg  Config
		want string
	}{
		{heteroConfig(nil, "learned"), "needs a fleet truth"},
		{heteroConfig(exact, "psychic"), "unknown predictor"},
		{heteroConfig(&Truth{Speeds: []float64{1}}, ""), "for each of the 8"},
		{heteroConfig(Heterogeneous(8, 20000, 2.5, 3, 0, 1, 0), ""), "noise"},
		{heteroConfig(Heterogeneous(8, 20000, 2.5, 0, 10, 0.001, 0), ""), "drift"},
		{heteroConfig(Heterogeneous(8, 0, 2.5, 0, 0, 1, 0), ""), "speed must be"},
		{heteroConfig(Chunked(8, 20000, -1), ""), "step tokens must be"},
		{heteroConfig(Chunked(8, 20000, MaxStepTokens+1), ""), "step tokens must be"},
		{withDecode(heteroConfig(Chunked(8, 20000, 8192), "")), "aggregated"},
	}
	for _, b := range bad {
		if _, err := Run(context.Background(), b.cfg, tr, &sched.Scheduler{Policy: pol}); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("config %+v: error %v, want %q", b.cfg.Truth, err, b.want)
		}
	}
}

// withDecode gives cfg two decode instances.
func withDecode(cfg Config) Config {
	cfg.Decode, cfg.DecodeKVTokens = 2, 1_000_000
	return cfg
}

// TestHeterogeneousDecodeTPOT: with decode instances of hidden unequal
// speeds (two 1.25× faster than configured, two 2× slower), the learned
// TPOT's error after warm-up is a fraction of the analytic model's, and
// the oracle that knows each instance's factor is as good. The oracle is
// no floor: it predicts from the batch at admission, not from how the
// batch will change while the stream runs, which the learned model,
// trained on what streams showed, can absorb (with early readings,
// load.Fleet.TPOTProbe, its median error is 1.3 % against the oracle's
// 1.6 % on this seed).
func TestHeterogeneousDecodeTPOT(t *testing.T) {
	errs := map[string][2]float64{}
	for _, p := range Predictors {
		truth := Heterogeneous(8, 20000, 2.5, 0.05, 60, 0.5, 0)
		truth.DecodeFactors = HeterogeneousDecode(4, 2.5)
		cfg := heteroConfig(truth, p)
		cfg.Decode, cfg.DecodeKVTokens = 4, 1_000_000
		res := heteroRun(t, cfg, 40, 0)
		t.Logf("%-8s TPOT error p50 %.3f p90 %.3f, TPOT p50 %.4f p99 %.4f, attainment %.4f",
			p, res.TPOTMdAPE, res.TPOTAPEP90, res.TPOTP50, res.TPOTP99, res.Attainment)
		errs[p] = [2]float64{res.TPOTMdAPE, res.TPOTAPEP90}
	}
	a, l, o := errs["analytic"], errs["learned"], errs["true"]
	if a[0] < 0.15 {
		t.Fatalf("analytic TPOT error %.3f: the hidden decode speeds do not show", a[0])
	}
	if l[0] > 0.1 || l[1] > 0.25 || l[0] > a[0]/2 {
		t.Errorf("learned TPOT error p50 %.3f p90 %.3f, want < 0.10, < 0.25 and under half the analytic %.3f", l[0], l[1], a[0])
	}
	if o[0] > a[0]/4 || o[0] > l[0]+0.02 {
		t.Errorf("the oracle's TPOT error %.3f: want under a quarter of the analytic %.3f and within 2 points of the learned %.3f", o[0], a[0], l[0])
	}
	bad := heteroConfig(Heterogeneous(8, 20000, 2.5, 0, 0, 1, 0), "")
	bad.Decode, bad.DecodeKVTokens, bad.Truth.DecodeFactors = 2, 1000, []float64{1}
	tr, _ := workload.Chat(workload.ChatConfig{Systems: 2, Sessions: 4, SystemTokens: 128, TurnTokens: 64,
		OutputTokens: 8, Rate: 5, Duration: 2, BlockSize: 64, Seed: 1})
	pol, _ := sched.New("kvgate", sched.Options{})
	if _, err := Run(context.Background(), bad, tr, &sched.Scheduler{Policy: pol}); err == nil || !strings.Contains(err.Error(), "decode factors") {
		t.Errorf("one decode factor for two instances: error %v", err)
	}
}

// TestTPOTProbeFindsSlowDecodeEarly: with a TPOT SLO that binds (30 ms)
// on the heterogeneous decode fleet, the learned predictor admits by a
// TPOT that knows the two slow decode instances a second into their
// first streams (load.Fleet.TPOTProbe), not at their ends tens of
// seconds later: its attainment is within a point of the oracle's (it
// was six points behind: every stream sent to a slow instance before
// the first ones ended missed its TPOT).
func TestTPOTProbeFindsSlowDecodeEarly(t *testing.T) {
	att := map[string]float64{}
	for _, p := range []string{"learned", "true"} {
		truth := Heterogeneous(8, 20000, 2.5, 0.05, 60, 0.5, 0)
		truth.DecodeFactors = HeterogeneousDecode(4, 2.5)
		cfg := heteroConfig(truth, p)
		cfg.Decode, cfg.DecodeKVTokens = 4, 1_000_000
		cfg.SLO.TPOT = 0.03
		res := heteroRun(t, cfg, 40, 0)
		t.Logf("%-8s attainment %.4f rejected %.4f TPOT p99 %.4f", p, res.Attainment, res.Rejected, res.TPOTP99)
		att[p] = res.Attainment
	}
	if att["learned"] < att["true"]-0.01 {
		t.Errorf("learned attainment %.4f, more than a point below the oracle's %.4f", att["learned"], att["true"])
	}
}

// TestUnprovenDecodeIsNotRejectedBy: two decode instances, one 0.8× and
// one 3× the configured step, and a 15 ms TPOT target that only the fast
// one meets. Until each has streams of its own, both are predicted by
// the pool, the mean of the two, above the target; rejecting by it sent
// nothing anywhere, so neither was ever observed again and 99 % of the
// requests were rejected for good. TPOT admission does not reject by an
// unproven endpoint's TPOT (sched.Endpoint.DecodeUnproven), and an
// unproven endpoint takes no more streams at once than it still needs.
func TestUnprovenDecodeIsNotRejectedBy(t *testing.T) {
	truth := Heterogeneous(8, 20000, 2.5, 0.05, 60, 0.5, 0)
	truth.DecodeFactors = HeterogeneousDecode(2, 3.75)
	cfg := heteroConfig(truth, "learned")
	cfg.Decode, cfg.DecodeKVTokens = 2, 1_000_000
	cfg.SLO.TPOT = 0.015
	res := heteroRun(t, cfg, 10, 0)
	if res.Attainment < 0.9 || res.Rejected > 0.05 {
		t.Errorf("attainment %.4f with %.4f rejected: want at least 0.9 and at most 0.05", res.Attainment, res.Rejected)
	}
}

// TestStaleDecodeIsProbedAgain: two of four decode instances run at 3.2×
// the configured step for the first 20 s and at 0.8× after, like the
// others; with a 20 ms TPOT target they are learned slow at first and
// then sent nothing. Without a new stream their model never learned they
// recovered (79.2 % attained, as if they never had); a decode endpoint
// sent no stream for load.TPOTStaleAfter is unproven again and tried
// before a request is rejected.
func TestStaleDecodeIsProbedAgain(t *testing.T) {
	truth := Heterogeneous(8, 20000, 2.5, 0.05, 60, 0.5, 0)
	truth.DecodeFactors = HeterogeneousDecode(4, 4)
	truth.DecodeFactorsThen, truth.DecodeChangeAt = []float64{0.8, 0.8, 0.8, 0.8}, 20
	cfg := heteroConfig(truth, "learned")
	cfg.Decode, cfg.DecodeKVTokens = 4, 1_000_000
	cfg.SLO.TPOT = 0.02
	res := heteroRun(t, cfg, 40, 0)
	if res.Attainment < 0.9 {
		t.Errorf("attainment %.4f with %.4f rejected: want at least 0.9 once the recovered instances are tried again", res.Attainment, res.Rejected)
	}
	// At 60 req/s the two fast instances alone cannot carry the load: the
	// recovered ones are wanted as soon as one stream shows them fast
	// (load.ReprobeStreams; with one stream per TPOTStaleAfter, 69.7 %).
	if r60 := heteroRun(t, cfg, 60, 0); r60.Attainment < 0.78 {
		t.Errorf("60 req/s: attainment %.4f, want at least 0.78 once a recovered instance's first reading has it explored", r60.Attainment)
	}
	// The oracle knows the change too: it predicts the factor in force.
	cfg.Predictor = "true"
	if or := heteroRun(t, cfg, 40, 0); or.Attainment < res.Attainment-0.02 || or.TPOTAPEP90 > 0.25 {
		t.Errorf("the oracle attains %.4f (TPOT error p90 %.3f) against the learned %.4f: want within 2 points, error p90 under 0.25", or.Attainment, or.TPOTAPEP90, res.Attainment)
	}
	bad := []*Truth{
		{DecodeFactorsThen: []float64{1, 1, 1, 1}, DecodeChangeAt: 20},
		{DecodeFactors: []float64{1, 1, 1, 1}, DecodeFactorsThen: []float64{1, 1}, DecodeChangeAt: 20},
		{DecodeFactors: []float64{1, 1, 1, 1}, DecodeFactorsThen: []float64{1, 1, 1, 1}},
		{DecodeFactors: []float64{1, 1, 1, 1}, DecodeFactorsThen: []float64{1, 1, 1, 0}, DecodeChangeAt: 20},
	}
	for i, b := range bad {
		tr := Heterogeneous(8, 20000, 2.5, 0, 0, 1, 0)
		tr.DecodeFactors, tr.DecodeFactorsThen, tr.DecodeChangeAt = b.DecodeFactors, b.DecodeFactorsThen, b.DecodeChangeAt
		if err := tr.validate(8, 4); err == nil {
			t.Errorf("bad decode change %d accepted: %+v", i, b)
		}
	}
}

// TestStepsLearnAsTheGateway: engines that prefill in steps, observed
// through busy windows, are predicted as kvgate serve predicts them
// (predict.LiveOptions: no quadratic term, pooled alike endpoints), and
// FIFO engines or exact observations keep the unconstrained fit.
func TestStepsLearnAsTheGateway(t *testing.T) {
	// Long prompts only, whose time grows faster than linearly: the free
	// fit learns a quadratic term, the gateway's has none.
	obs := make([]predict.Observation, 60)
	for i := range obs {
		u := 4000 + 500*(i%12)
		k := float64(u) / 1000
		sec := 0.05*k + 0.004*k*k
		obs[i] = predict.Observation{X: predict.Features{Uncached: u}, Compute: sec, Predicted: sec}
	}
	probe := predict.Features{Uncached: 20000}
	learnt := func(p predict.Predictor) float64 {
		m := p.Model("e0", 20000)
		for _, o := range obs {
			m.Observe(o)
		}
		return m.Prefill(probe).Seconds
	}
	want := func(o predict.Options) float64 {
		p, err := predict.NewLearned(o)
		if err != nil {
			t.Fatal(err)
		}
		return learnt(p)
	}
	live, free := want(predict.LiveOptions()), want(predict.Options{})
	if math.Abs(live-free) < 0.01*free {
		t.Fatalf("the two fits predict alike (%.4f s, %.4f s): the test cannot tell them apart", live, free)
	}
	for _, c := range []struct {
		steps   int
		windows bool
		want    float64
	}{{8192, true, live}, {8192, false, free}, {0, true, free}} {
		tr := newTruthRun(&Truth{Speeds: []float64{20000}, StepTokens: c.steps}, 1, 1)
		p, err := tr.predictor("learned", []string{"e0"}, new(float64), c.windows)
		if err != nil {
			t.Fatal(err)
		}
		if got := learnt(p); got != c.want {
			t.Errorf("steps %d, windows %v: predicts %.4f s, want %.4f s (live %.4f, free %.4f)", c.steps, c.windows, got, c.want, live, free)
		}
	}
}
