package sim

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

func heteroRun(t *testing.T, predictor string, rate float64, truth *Truth, reject bool) Result {
	t.Helper()
	tr, err := workload.Chat(workload.ChatConfig{Systems: 20, Sessions: 400, SystemTokens: 2048, TurnTokens: 300,
		OutputTokens: 500, Rate: rate, Duration: 120, BlockSize: 64, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Prefill: 8, Model: perfmodel.Default(), CacheTokens: 3000 * 64, SLO: sched.SLO{TTFT: 2},
		Truth: truth, Predictor: predictor}
	pol, _ := sched.New("kvgate", sched.Options{Seed: 2})
	res, err := Run(context.Background(), cfg, tr, &sched.Scheduler{Policy: pol, EarlyReject: reject})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestHeterogeneousExplore(t *testing.T) {
	for _, rate := range []float64{40, 55, 70} {
		for _, p := range Predictors {
			for _, rj := range []bool{false, true} {
				res := heteroRun(t, p, rate, Heterogeneous(8, 20000, 2.5, 0.05, 60, 0.5, 1), rj)
				t.Logf("rate %g %-8s reject %v attain %.4f rej %.3f mdape %.3f p90 %.3f rec %.0f stale %.1f p50 %.2f p99 %.2f",
					rate, p, rj, res.Attainment, res.Rejected, res.TTFTMdAPE, res.TTFTAPEP90, res.DriftRecovery, res.StaleRouting, res.TTFTP50, res.TTFTP99)
			}
		}
	}
}
