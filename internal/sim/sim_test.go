package sim

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

// baselineConfig is the baseline chapter's routing fleet: 8 prefill
// instances, 3 000 blocks of 64 tokens each, a 2 s TTFT SLO.
func baselineConfig() Config {
	return Config{Prefill: 8, Model: perfmodel.Default(), CacheTokens: 3000 * 64, SLO: sched.SLO{TTFT: 2}}
}

func chat(t testing.TB, rate float64, seed uint64) *workload.Trace {
	t.Helper()
	c := workload.BaselineChat(rate)
	c.Seed = seed
	tr, err := workload.Chat(c)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func runPolicy(t testing.TB, cfg Config, tr *workload.Trace, policy string, reject bool) Result {
	t.Helper()
	p, err := sched.New(policy, sched.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return runScheduler(t, cfg, tr, &sched.Scheduler{Policy: p, EarlyReject: reject, Hold: sched.HoldsLost(p)})
}

func runScheduler(t testing.TB, cfg Config, tr *workload.Trace, sc *sched.Scheduler) Result {
	t.Helper()
	r, err := Run(context.Background(), cfg, tr, sc)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestLRU(t *testing.T) {
	c := newLRU(3)
	for _, k := range []uint64{1, 2, 3} {
		if _, ev := c.touch(k); ev {
			t.Fatal("no eviction below capacity")
		}
	}
	c.touch(1) // order now 1,3,2 (most recent first)
	if k, ev := c.touch(4); !ev || k != 2 {
		t.Fatalf("want 2 evicted, got %d %v", k, ev)
	}
	if k, ev := c.touch(5); !ev || k != 3 {
		t.Fatalf("want 3 evicted, got %d %v", k, ev)
	}
	if !c.has(1) || !c.has(4) || !c.has(5) || c.has(2) || c.len() != 3 {
		t.Fatal("wrong contents")
	}
	// A removed block's slot is the next one filled: no eviction until
	// the cache is full again.
	if !c.remove(4) || c.remove(4) || c.has(4) || c.len() != 2 {
		t.Fatal("remove")
	}
	if _, ev := c.touch(6); ev || !c.has(6) || !c.has(1) || !c.has(5) || c.len() != 3 {
		t.Fatal("a freed slot was not reused")
	}
	if k, ev := c.touch(7); !ev || k != 1 {
		t.Fatalf("want 1 evicted, got %d %v", k, ev)
	}
	zero := newLRU(0)
	if _, ev := zero.touch(1); ev || zero.has(1) {
		t.Fatal("a zero-capacity cache holds nothing")
	}
}

// TestFleetCacheMaskMatchesWalk checks the holder-mask walk against the
// per-instance walk used for fleets over 64 instances.
func TestFleetCacheMaskMatchesWalk(t *testing.T) {
	for _, order := range []Eviction{EvictTailFirst, EvictHeadFirst} {
		t.Run(order.String(), func(t *testing.T) { maskMatchesWalk(t, order) })
	}
}

func maskMatchesWalk(t *testing.T, order Eviction) {
	rng := rand.New(rand.NewPCG(1, 2))
	masked := newFleetCache(5, 20, order)
	walked := newFleetCache(5, 20, order)
	walked.holders = nil
	chains := make([][]uint64, 6)
	for i := range chains {
		for j := range 12 {
			chains[i] = append(chains[i], uint64(i*100+j+1))
		}
	}
	a, b := make([]int, 5), make([]int, 5)
	for step := range 2000 {
		ch := chains[rng.IntN(len(chains))]
		keys := ch[:1+rng.IntN(len(ch))]
		masked.match(keys, a)
		walked.match(keys, b)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("step %d instance %d: mask %d walk %d", step, i, a[i], b[i])
			}
		}
		inst := rng.IntN(5)
		masked.insert(inst, keys)
		walked.insert(inst, keys)
		if rng.IntN(4) == 0 { // a displaced request's blocks taken out
			gone := keys[rng.IntN(len(keys)):]
			masked.remove(inst, gone)
			walked.remove(inst, gone)
		}
	}
}

// TestEvictionOrder: a cache that must give up two blocks of a request
// keeps its prefix when it evicts tail first (vLLM frees a request's
// blocks in reverse; SGLang evicts leaves), and loses the whole prefix
// with the chapter's order (its first block was the least recent).
func TestEvictionOrder(t *testing.T) {
	a := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	b := []uint64{101, 102, 103, 104}
	for _, tc := range []struct {
		order        Eviction
		matchA, kept int
	}{
		{EvictTailFirst, 6, 6},
		{EvictHeadFirst, 0, 6},
	} {
		f := newFleetCache(1, 10, tc.order)
		f.insert(0, a)
		f.insert(0, b)
		m := []int{0}
		f.match(a, m)
		kept := 0
		for _, k := range a {
			if f.inst[0].has(k) {
				kept++
			}
		}
		if m[0] != tc.matchA || kept != tc.kept {
			t.Errorf("%s: prefix of A matched %d blocks (want %d), %d of its blocks kept (want %d)", tc.order, m[0], tc.matchA, kept, tc.kept)
		}
		f.match(b, m)
		if m[0] != len(b) {
			t.Errorf("%s: B matched %d blocks, want %d", tc.order, m[0], len(b))
		}
	}
	for _, s := range []string{"tail-first", "head-first"} {
		if e, err := ParseEviction(s); err != nil || e.String() != s {
			t.Errorf("ParseEviction(%q) = %v, %v", s, e, err)
		}
	}
	if _, err := ParseEviction("lru"); err == nil || !strings.Contains(err.Error(), "tail-first, head-first") {
		t.Errorf("ParseEviction(lru): %v", err)
	}
}

func TestDeterministic(t *testing.T) {
	tr := chat(t, 70, 3)
	for _, p := range []string{"random", "llmd-token-aware", "kvgate"} {
		a, b := runPolicy(t, baselineConfig(), tr, p, true), runPolicy(t, baselineConfig(), tr, p, true)
		if a != b {
			t.Errorf("%s: two runs differ:\n%+v\n%+v", p, a, b)
		}
	}
}

// TestBaselineReproduction checks the baseline chapter's table: hit rate
// and attainment within 3 points for the chapter's own policies. cache-only
// at 70 req/s moves between 85 % and 92 % with the random stream in the
// chapter's own program, so it is held to that band widened by 3 points.
func TestBaselineReproduction(t *testing.T) {
	type want struct {
		rate            float64
		policy          string
		reject          bool
		hit, attain, lo float64
	}
	baseline := []want{
		{40, "random", false, 0.535, 0.995, 0},
		{40, "least-queue", false, 0.533, 1.0, 0},
		{40, "cache-only", false, 0.909, 1.0, 0},
		{40, "predicted-ttft", false, 0.844, 1.0, 0},
		{70, "random", false, 0.389, 0.440, 0},
		{70, "least-queue", false, 0.391, 0.471, 0},
		{70, "cache-only", false, 0.817, 0.853, 0.92},
		{70, "predicted-ttft", false, 0.758, 0.864, 0},
		{70, "predicted-ttft", true, 0.786, 0.979, 0},
	}
	traces := map[float64]*workload.Trace{40: chat(t, 40, 0), 70: chat(t, 70, 0)}
	for _, w := range baseline {
		r := runPolicy(t, baselineConfig(), traces[w.rate], w.policy, w.reject)
		if math.Abs(r.HitRate-w.hit) > 0.03 {
			t.Errorf("%v %s reject=%v: hit %.3f, baseline %.3f", w.rate, w.policy, w.reject, r.HitRate, w.hit)
		}
		lo, hi := w.attain-0.03, w.attain+0.03
		if w.lo > 0 {
			hi = w.lo + 0.03
		}
		if r.Attainment < lo || r.Attainment > hi {
			t.Errorf("%v %s reject=%v: attainment %.3f outside [%.3f, %.3f]", w.rate, w.policy, w.reject, r.Attainment, lo, hi)
		}
	}
}

// TestAnchorsMatchReference holds the anchors' policies to the reference
// results (shared/reference-results.md) within 4 points of attainment.
// The reference's SGLang router sends low-match requests to the least
// loaded worker: sglang-least-load here (sglang-cache-aware, SGLang's own
// rule, sends them to the smallest tree).
func TestAnchorsMatchReference(t *testing.T) {
	traces := map[float64]*workload.Trace{40: chat(t, 40, 0), 70: chat(t, 70, 0)}
	refs := []struct {
		rate   float64
		policy string
		reject bool
		attain float64
	}{
		{40, "sglang-least-load", false, 0.953},
		{70, "sglang-least-load", false, 0.869},
		{70, "sglang-least-load", true, 0.972},
		{40, "llmd-token-aware", false, 1.0},
		{70, "llmd-token-aware", false, 0.900},
		{70, "llmd-token-aware", true, 0.986},
	}
	for _, ref := range refs {
		r := runPolicy(t, baselineConfig(), traces[ref.rate], ref.policy, ref.reject)
		if math.Abs(r.Attainment-ref.attain) > 0.04 {
			t.Errorf("%v %s reject=%v: attainment %.3f, reference %.3f", ref.rate, ref.policy, ref.reject, r.Attainment, ref.attain)
		}
	}
}

func TestDecodePoolTiming(t *testing.T) {
	m := perfmodel.Default()
	tr := &workload.Trace{Name: "one", BlockSize: 64, Duration: 1, Requests: []workload.Request{
		{Arrival: 0, PromptTokens: 2000, OutputTokens: 11, Keys: make([]uint64, 31)},
	}}
	for i := range tr.Requests[0].Keys {
		tr.Requests[0].Keys[i] = uint64(i + 1)
	}
	cfg := Config{Prefill: 1, Decode: 1, Model: m, CacheTokens: 64000, DecodeKVTokens: 100000, SLO: sched.SLO{TTFT: 2, TPOT: 0.05}}
	r := runPolicy(t, cfg, tr, "least-queue", true)
	prefill := m.PrefillTime(2000) + m.TransferTime(2000)
	first := m.DecodeStepTime(1, 2000)
	if math.Abs(r.TTFTP50-(prefill+first)) > 1e-9 {
		t.Errorf("TTFT %v, want %v", r.TTFTP50, prefill+first)
	}
	// Ten more steps, context growing by one token per step.
	var rest float64
	for k := 1; k <= 10; k++ {
		rest += m.DecodeStepTime(1, 2000+k)
	}
	if math.Abs(r.TPOTP50-rest/10) > 1e-9 {
		t.Errorf("TPOT %v, want %v", r.TPOTP50, rest/10)
	}
	if r.Attainment != 1 {
		t.Errorf("attainment %v", r.Attainment)
	}
}

// TestDecodeSaturation: a decode pool too small for the load misses TPOT
// or waits for KV, and a larger pool fixes it.
func TestDecodeSaturation(t *testing.T) {
	c := workload.BaselineChat(20)
	c.Duration = 30
	tr, err := workload.Chat(c)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Prefill: 4, Decode: 1, Model: perfmodel.Default(), CacheTokens: 3000 * 64, DecodeKVTokens: 400_000,
		SLO: sched.SLO{TTFT: 2, TPOT: 0.03}}
	small := runPolicy(t, cfg, tr, "predicted-ttft", false)
	cfg.Decode = 6
	big := runPolicy(t, cfg, tr, "predicted-ttft", false)
	if !(small.Attainment < 0.5 && big.Attainment > 0.95) {
		t.Errorf("1 decode instance: %.3f (TPOT p50 %.4f); 6: %.3f (TPOT p50 %.4f)", small.Attainment, small.TPOTP50, big.Attainment, big.TPOTP50)
	}
	if small.TPOTP50 <= big.TPOTP50 {
		t.Errorf("TPOT must grow with batch: %v vs %v", small.TPOTP50, big.TPOTP50)
	}
}

func TestConfigErrors(t *testing.T) {
	tr := chat(t, 5, 0)
	p, _ := sched.New("random", sched.Options{})
	for _, c := range []Config{{}, {Prefill: 1, Decode: 1, Model: perfmodel.Default()}, {Prefill: 1}} {
		if _, err := Run(context.Background(), c, tr, &sched.Scheduler{Policy: p}); err == nil {
			t.Errorf("config %+v: want an error", c)
		}
	}
}

func BenchmarkBaselineScenario70(b *testing.B) {
	tr := chat(b, 70, 0)
	for _, pol := range []string{"predicted-ttft", "llmd-token-aware", "kvgate"} {
		b.Run(pol, func(b *testing.B) {
			p, _ := sched.New(pol, sched.Options{Seed: 1})
			sc := &sched.Scheduler{Policy: p, EarlyReject: true}
			for b.Loop() {
				if _, err := Run(context.Background(), baselineConfig(), tr, sc); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(tr.Requests))*float64(b.N)/b.Elapsed().Seconds(), "sim-req/s")
		})
	}
}

// TestKVGateLeads pins issue 3's acceptance on the baseline scenario
// (seed-routing, seed 0): at 70 req/s with early rejection ≥ 99.0 %
// attainment with ≤ 1.0 % rejected; without rejection above every other
// policy; at 40 req/s a p99 TTFT no worse than the best other policy.
// TestKVGateLeads holds kvgate to the seed scenario's bars (issue 9):
// at 70 req/s with early rejection at least 99 % attained with at most 1 %
// rejected, and at 40 req/s a TTFT p99 no worse than any other policy's,
// on seeds 0-4; at 70 req/s without rejection (seed 0) the best
// attainment. Before new conversations were placed with bounded loads the
// 40 req/s p99 on seed 1 was 0.117 s against SGLang's 0.062 s.
func TestKVGateLeads(t *testing.T) {
	for seed := range uint64(5) {
		tr40, tr70 := chat(t, 40, seed), chat(t, 70, seed)
		kv := runPolicy(t, baselineConfig(), tr70, "kvgate", true)
		if kv.Attainment < 0.99 || kv.Rejected > 0.01 {
			t.Errorf("seed %d, kvgate with early rejection: attainment %.4f, rejected %.4f", seed, kv.Attainment, kv.Rejected)
		}
		kv40 := runPolicy(t, baselineConfig(), tr40, "kvgate", false)
		var kvNo Result
		if seed == 0 {
			kvNo = runPolicy(t, baselineConfig(), tr70, "kvgate", false)
		}
		for _, p := range sched.Names() {
			if p == "kvgate" {
				continue
			}
			if o := runPolicy(t, baselineConfig(), tr40, p, false); o.TTFTP99 < kv40.TTFTP99 {
				t.Errorf("seed %d, 40 req/s: %s p99 %.4f below kvgate's %.4f", seed, p, o.TTFTP99, kv40.TTFTP99)
			}
			if seed != 0 {
				continue
			}
			if o := runPolicy(t, baselineConfig(), tr70, p, false); o.Attainment >= kvNo.Attainment {
				t.Errorf("70 req/s: %s attains %.3f, kvgate %.3f", p, o.Attainment, kvNo.Attainment)
			}
		}
	}
}

// TestDecodeForecastReservesInbound: a request routed to a decode
// instance whose prefill has not ended holds no KV there yet, but will:
// the forecast counts it (before, it promised that room to the next
// request, which then waited for KV), and stops counting it once it
// joined (its KV is then in use).
func TestDecodeForecastReservesInbound(t *testing.T) {
	m := perfmodel.Default()
	p := newDecodePool(1, 10000, m, 2)
	p.join(1.0, 0, 0, 6000, 100) // its prefill ends at 1 s
	free, tpot := p.forecast(0, 0, 0.5, 100)
	if free != 10000-6100 {
		t.Fatalf("routed, still prefilling: free %d, want %d", free, 10000-6100)
	}
	if want := m.DecodeStepTime(2, 6100); math.Abs(tpot-want) > 1e-12 {
		t.Fatalf("the inbound stream joins the batch: tpot %v want %v", tpot, want)
	}
	p.advance(1.0)
	if free, _ := p.forecast(0, 1.0, 1.0, 100); free != 10000-6100 {
		t.Fatalf("joined: free %d, want %d (counted once)", free, 10000-6100)
	}
}

func TestDecodeForecastFreesFinishingStreams(t *testing.T) {
	m := perfmodel.Default()
	p := newDecodePool(1, 10000, m, 2)
	p.join(0, 0, 0, 4000, 3) // needs 4003 tokens, finishes after 3 steps
	p.advance(0)             // joins and starts its first step
	step := m.DecodeStepTime(1, 4000)
	if free, _ := p.forecast(0, 0, 0.5*step, 100); free != 10000-4003 {
		t.Fatalf("half a step ahead nothing finishes: free %d", free)
	}
	free, tpot := p.forecast(0, 0, 3.5*step, 100)
	if free != 10000 {
		t.Fatalf("after 3 steps the stream is done: free %d", free)
	}
	if want := m.DecodeStepTime(1, 100); math.Abs(tpot-want) > 1e-12 {
		t.Fatalf("alone again: tpot %v want %v", tpot, want)
	}
	// A stream waiting for room joins in the forecast once room frees.
	p.join(0, 0, 1, 7000, 10)
	p.advance(0)
	if free, _ := p.forecast(0, 0, 3.5*step, 100); free != 10000-7010 {
		t.Fatalf("the waiting stream takes the freed room: free %d", free)
	}
}

// TestDecodeProbe: a stream longer than load.TPOTProbeTokens + 1 tokens
// reports its TPOT so far at its token that many past its first, once,
// before its end; a shorter stream reports only its end.
func TestDecodeProbe(t *testing.T) {
	m := perfmodel.Default()
	const n = load.TPOTProbeTokens
	p := newDecodePool(1, 1000000, m, 3)
	type report struct {
		r        int
		at, tpot float64
		finished bool
	}
	var got []report
	p.onProbe = func(r int, at, tpot float64) { got = append(got, report{r, at, tpot, false}) }
	p.onFinish = func(r int, at, tpot float64) { got = append(got, report{r, at, tpot, true}) }
	p.join(0, 0, 0, 1000, n+2) // probed at its token n past its first, then one more
	p.join(0, 0, 1, 1000, n+1) // ends at that token: no probe
	if err := p.drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	step := m.DecodeStepTime(2, 2000)
	if len(got) != 3 || got[0].r != 0 || got[0].finished {
		t.Fatalf("reports %+v: want the probe of stream 0 first, then both ends", got)
	}
	if pr := got[0]; math.Abs(pr.at-p.first[0]-float64(n)*pr.tpot) > 1e-9 || pr.at >= p.finish[0] {
		t.Errorf("probe at %v with TPOT %v: want %d tokens past the first (at %v), before the end (%v)", pr.at, pr.tpot, n, p.first[0], p.finish[0])
	}
	if pr := got[0]; pr.tpot < step || pr.tpot > 2*step {
		t.Errorf("probe TPOT %v: want about a step of two streams (%v)", pr.tpot, step)
	}
	for _, rp := range got[1:] {
		if !rp.finished {
			t.Errorf("a second probe: %+v", rp)
		}
	}
}

// TestUnservedIsAMiss: requests whose sequence can never fit a decode
// instance are misses with no latency (issue 14 item 8: they used to count
// as met, with a negative TTFT).
func TestUnservedIsAMiss(t *testing.T) {
	tr := chat(t, 10, 0)
	cfg := baselineConfig()
	cfg.Decode, cfg.DecodeKVTokens = 2, 100
	r := runPolicy(t, cfg, tr, "predicted-ttft", false)
	if r.Attainment != 0 || r.Unserved != 1 || r.TTFTP50 < 0 || r.Goodput != 0 {
		t.Fatalf("nothing fits a decode instance: %+v", r)
	}
	// Some fit, some do not: the ones that fit are still served.
	cfg.DecodeKVTokens = 5000
	r = runPolicy(t, cfg, tr, "predicted-ttft", false)
	if r.Unserved <= 0 || r.Unserved >= 1 || r.Attainment <= 0 || r.TTFTP50 <= 0 {
		t.Fatalf("mixed: %+v", r)
	}
	if r.Attainment+r.Unserved > 1+1e-9 {
		t.Fatalf("unserved counted as met: %+v", r)
	}
}

func TestRunStopsWhenCancelled(t *testing.T) {
	tr := chat(t, 70, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p, _ := sched.New("kvgate", sched.Options{})
	if _, err := Run(ctx, baselineConfig(), tr, &sched.Scheduler{Policy: p}); err == nil {
		t.Fatal("a cancelled run must stop with an error")
	}
}

// TestEventLagAndApproximateEntries: a router that hears of cached blocks
// late finds fewer hits than one that knows the caches; its own routing
// decisions as approximate entries win most of them back.
func TestEventLagAndApproximateEntries(t *testing.T) {
	tr := chat(t, 40, 0)
	exact := runPolicy(t, baselineConfig(), tr, "cache-only", false)
	cfg := baselineConfig()
	cfg.EventLag = 30
	late := runPolicy(t, cfg, tr, "cache-only", false)
	cfg.ApproxTTL = 120
	approx := runPolicy(t, cfg, tr, "cache-only", false)
	if !(late.HitRate < exact.HitRate-0.02) {
		t.Errorf("30 s event lag should cost hits: exact %.3f, late %.3f", exact.HitRate, late.HitRate)
	}
	if !(approx.HitRate > late.HitRate+0.01) {
		t.Errorf("approximate entries should win hits back: late %.3f, with approximate %.3f", late.HitRate, approx.HitRate)
	}
	cfg.EventLag = -1
	p, _ := sched.New("random", sched.Options{})
	if _, err := Run(context.Background(), cfg, tr, &sched.Scheduler{Policy: p}); err == nil {
		t.Error("negative lag accepted")
	}
}

// TestHoldDoesNotStarve: on the long-prompt workload at the fleet's
// capacity (17 req/s, seed 0), without early rejection, 8 % of prompts fit
// nowhere. kvgate holds them at the router: it attains more than every
// other policy with a p99 TTFT within 1.5× the lowest of theirs. Its old
// sacrifice lane (kvgate without the hold) starved them: a worst TTFT many
// times longer.
func TestHoldDoesNotStarve(t *testing.T) {
	tr, err := workload.LongPrompt(workload.LongPrompts(17))
	if err != nil {
		t.Fatal(err)
	}
	cfg := baselineConfig()
	kv := runPolicy(t, cfg, tr, "kvgate", false)
	if kv.Held == 0 || kv.Unserved != 0 {
		t.Fatalf("held %.3f unserved %.3f: want some held, all served", kv.Held, kv.Unserved)
	}
	lowP99 := math.Inf(1)
	for _, p := range sched.Names() {
		if p == "kvgate" {
			continue
		}
		o := runPolicy(t, cfg, tr, p, false)
		lowP99 = min(lowP99, o.TTFTP99)
		if o.Attainment >= kv.Attainment {
			t.Errorf("%s attains %.3f, kvgate %.3f", p, o.Attainment, kv.Attainment)
		}
	}
	if kv.TTFTP99 > 1.5*lowP99 {
		t.Errorf("kvgate p99 %.2f s, more than 1.5× the lowest other %.2f s", kv.TTFTP99, lowP99)
	}
	pol, _ := sched.New("kvgate", sched.Options{Seed: 1})
	lane := runScheduler(t, cfg, tr, &sched.Scheduler{Policy: pol})
	if lane.TTFTMax < 3*kv.TTFTMax {
		t.Errorf("without the hold the worst TTFT is %.1f s, with it %.1f s: the sacrifice lane no longer starves?", lane.TTFTMax, kv.TTFTMax)
	}
}

// TestHoldWithRejectionServesLongConversations: on the long-prompt
// workload at a third of the fleet's capacity (6 req/s, seed 0), with
// early rejection, 8 % of prompts miss their SLO even on an idle
// instance. Rejected, every turn of their conversations is rejected
// again (they never reach a cache). Held and served on an idle instance
// of a quiet fleet, they warm the cache and their next turns fit: kvgate
// rejects a fraction of what it rejected without the hold, and attains
// more than every other policy.
func TestHoldWithRejectionServesLongConversations(t *testing.T) {
	tr, err := workload.LongPrompt(workload.LongPrompts(6))
	if err != nil {
		t.Fatal(err)
	}
	cfg := baselineConfig()
	kv := runPolicy(t, cfg, tr, "kvgate", true)
	pol, _ := sched.New("kvgate", sched.Options{Seed: 1})
	noHold := runScheduler(t, cfg, tr, &sched.Scheduler{Policy: pol, EarlyReject: true})
	if kv.Held == 0 || kv.Unserved != 0 {
		t.Fatalf("held %.3f unserved %.3f: want some held, none left", kv.Held, kv.Unserved)
	}
	t.Logf("with the hold: rejected %.4f attained %.4f; without: rejected %.4f attained %.4f", kv.Rejected, kv.Attainment, noHold.Rejected, noHold.Attainment)
	if kv.Rejected > noHold.Rejected/2 || kv.Attainment <= noHold.Attainment {
		t.Errorf("with the hold: rejected %.3f attained %.3f; without: rejected %.3f attained %.3f",
			kv.Rejected, kv.Attainment, noHold.Rejected, noHold.Attainment)
	}
	for _, p := range sched.Names() {
		if p == "kvgate" {
			continue
		}
		if o := runPolicy(t, cfg, tr, p, true); o.Attainment >= kv.Attainment {
			t.Errorf("%s attains %.3f, kvgate %.3f", p, o.Attainment, kv.Attainment)
		}
	}
}
