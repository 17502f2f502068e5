package planner

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fakeFleet is an actuator whose switches take delay seconds of its clock.
type fakeFleet struct {
	now      float64
	delay    float64
	inst     []Instance
	ready    []float64
	switches int
}

func newFakeFleet(p, d int, delay float64) *fakeFleet {
	f := &fakeFleet{delay: delay}
	for i := 0; i < p+d; i++ {
		r := fleet.RoleDecode
		if i < p {
			r = fleet.RolePrefill
		}
		f.inst = append(f.inst, Instance{Name: fmt.Sprintf("e%02d", i), Role: r})
		f.ready = append(f.ready, 0)
	}
	return f
}

func (f *fakeFleet) Instances(context.Context) ([]Instance, error) {
	for i := range f.inst {
		if f.inst[i].Switching && f.ready[i] <= f.now {
			f.inst[i].Role, f.inst[i].Switching, f.inst[i].Target = f.inst[i].Target, false, 0
		}
	}
	return append([]Instance(nil), f.inst...), nil
}

func (f *fakeFleet) Switch(_ context.Context, name string, to fleet.Role) error {
	for i := range f.inst {
		if f.inst[i].Name == name {
			if f.inst[i].Switching || f.inst[i].Role == to {
				return fmt.Errorf("%s cannot switch", name)
			}
			f.inst[i].Switching, f.inst[i].Target = true, to
			f.ready[i] = f.now + f.delay
			f.switches++
			return nil
		}
	}
	return fmt.Errorf("no %s", name)
}

func (f *fakeFleet) split() (p, d int) {
	p, d, _ = counts(f.inst)
	return p, d
}

// shapeSource observes a load shape that changes with time, with
// multiplicative noise on the rate of each window.
type shapeSource struct {
	shape func(t float64) Shape
	noise float64
	rng   *rand.Rand
}

func (s *shapeSource) Observe(_ context.Context, now, window, _ float64) (Observation, error) {
	sh := s.shape(now)
	rate := sh.Rate * (1 + s.noise*(2*s.rng.Float64()-1))
	n := int(rate * window)
	prompt := int64(float64(n) * sh.ISL)
	return Observation{Now: now, Window: window, Requests: n, PromptTokens: prompt,
		CachedTokens: int64(float64(prompt) * sh.Hit), OutputTokens: int64(float64(n) * sh.OSL),
		Finished: n, MeanTTFT: 0.5, MeanTPOT: 0.03}, nil
}

// sim runs a loop over the fake fleet for the given seconds and returns
// every decision.
func simulate(t *testing.T, cfg Config, f *fakeFleet, src Source, seconds float64) []Decision {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLoop(LoopConfig{Planner: p, Source: src, Actuator: f, Clock: func() float64 { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	var ds []Decision
	iv := p.Config().Interval
	for f.now = iv; f.now <= seconds; f.now += iv {
		d, err := l.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	return ds
}

func switchesOf(ds []Decision) []Decision {
	var out []Decision
	for _, d := range ds {
		if d.Action == ActionSwitch {
			out = append(out, d)
		}
	}
	return out
}

// TestNoisySteadyLoadCausesNoSwitches: each of the seed's phases, steady,
// with ±10 % noise on every 30-second window's rate, for two hours, from
// the split the planner picks for its mean load: no switch.
func TestNoisySteadyLoadCausesNoSwitches(t *testing.T) {
	for _, ph := range SeedPhases() {
		shape := func(float64) Shape { return ph.Shape }
		p, err := New(Config{Total: 24, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		c := p.cfg.Capacity.Estimate(ph.Shape)
		hb := 1 + p.cfg.Band
		start := p.formulaBest(ph.PrefillLoad()*hb, ph.DecodeLoad()*hb, 1, 23, 12, 24, c)
		for seed := uint64(0); seed < 10; seed++ {
			f := newFakeFleet(start, 24-start, 40)
			src := &shapeSource{shape: shape, noise: 0.1, rng: rand.New(rand.NewPCG(seed, 1))}
			ds := simulate(t, Config{Total: 24}, f, src, 7200)
			if sw := switchesOf(ds); len(sw) != 0 {
				t.Errorf("%s from %dP, seed %d: %d switches, first: %s", ph.Name, start, seed, len(sw), sw[0].Reason)
			}
		}
	}
}

// TestNoisyLoadNearTheEdgeDoesNotFlap: a load whose best split sits on a
// boundary (the long-document phase, where no split carries all of it)
// moves at most once, and never back and forth.
func TestNoisyLoadNearTheEdgeDoesNotFlap(t *testing.T) {
	docs := func(float64) Shape { return SeedPhases()[1].Shape }
	for seed := uint64(0); seed < 4; seed++ {
		f := newFakeFleet(20, 4, 40)
		src := &shapeSource{shape: docs, noise: 0.1, rng: rand.New(rand.NewPCG(seed, 2))}
		sw := switchesOf(simulate(t, Config{Total: 24}, f, src, 7200))
		if len(sw) > 1 {
			for _, d := range sw {
				t.Logf("%.0fs %s", d.At, d.Reason)
			}
			t.Errorf("seed %d: %d switches on a steady load", seed, len(sw))
		}
	}
}

// TestStepChangeBoundedSwitches: chat, then at once long documents, then
// agents. Each step is followed by a bounded number of changes, all in the
// step's direction, ending at the split the formula sizes for the new
// phase; every switch says why.
func TestStepChangeBoundedSwitches(t *testing.T) {
	phases := SeedPhases()
	shape := func(t float64) Shape {
		switch {
		case t < 1800:
			return phases[0].Shape
		case t < 3600:
			return phases[1].Shape
		}
		return phases[2].Shape
	}
	f := newFakeFleet(5, 19, 40)
	src := &shapeSource{shape: shape, noise: 0.05, rng: rand.New(rand.NewPCG(9, 9))}
	ds := simulate(t, Config{Total: 24}, f, src, 5400)
	type span struct{ from, to float64 }
	for i, s := range []span{{0, 1800}, {1800, 3600}, {3600, 5401}} {
		var in []Decision
		for _, d := range switchesOf(ds) {
			if d.At >= s.from && d.At < s.to {
				in = append(in, d)
			}
		}
		limit := 3
		if i == 0 {
			limit = 0
		}
		if len(in) > limit {
			t.Errorf("phase %d: %d changes, want at most %d", i, len(in), limit)
		}
		for j, d := range in {
			up := len(d.ToPrefill) > 0
			if j > 0 && up != (len(in[0].ToPrefill) > 0) {
				t.Errorf("phase %d: change %d reverses the direction", i, j)
			}
			if !strings.Contains(d.Reason, "→") || !strings.Contains(d.Reason, "tok/s") || !strings.Contains(d.Reason, "drain + warm-up") {
				t.Errorf("unexplained switch: %q", d.Reason)
			}
		}
	}
	// The end state: agents need decode (2–3 prefill instances).
	if p, d := f.split(); p > 3 || p+d != 24 {
		t.Errorf("final split %dP%dD", p, d)
	}
	// In the middle of long documents: 19 or 20 prefill instances.
	var mid Decision
	for _, d := range ds {
		if d.At <= 3500 {
			mid = d
		}
	}
	if mid.Prefill < 19 || mid.Prefill > 20 {
		for _, d := range switchesOf(ds) {
			t.Logf("%.0fs %s", d.At, d.Reason)
		}
		t.Errorf("long documents served by %dP%dD", mid.Prefill, mid.Decode)
	}
}

// TestOneChangeInFlightAndCooldown: while instances switch the planner
// waits; after a change it starts no other within the cool-down.
func TestOneChangeInFlightAndCooldown(t *testing.T) {
	phases := SeedPhases()
	shape := func(t float64) Shape {
		if t < 300 {
			return phases[0].Shape
		}
		return phases[1].Shape
	}
	f := newFakeFleet(5, 19, 50)
	src := &shapeSource{shape: shape, rng: rand.New(rand.NewPCG(1, 1))}
	ds := simulate(t, Config{Total: 24, Cooldown: 120}, f, src, 1500)
	last := math.Inf(-1)
	inFlightUntil := math.Inf(-1)
	for _, d := range ds {
		if d.At < inFlightUntil && d.Action != ActionWait {
			t.Errorf("%.0fs: %s while a change is in flight", d.At, d.Action)
		}
		if d.Action == ActionWait && d.Switching == 0 && !strings.Contains(d.Reason, "observing") {
			t.Errorf("%.0fs: waits with nothing in flight: %s", d.At, d.Reason)
		}
		if d.Action != ActionSwitch {
			continue
		}
		if d.At-last < 120 {
			t.Errorf("%.0fs: change %.0fs after the previous one (cool-down 120s)", d.At, d.At-last)
		}
		last = d.At
		inFlightUntil = d.At + 50
	}
	if len(switchesOf(ds)) < 2 {
		t.Fatalf("want several changes to check spacing, got %d", len(switchesOf(ds)))
	}
}

// TestAbsorbCheck: the side giving up instances must carry its current
// load with what remains (at most AbsorbMax utilised), unless the misses
// that creates on it are fewer than those it saves on the other side.
func TestAbsorbCheck(t *testing.T) {
	p, err := New(Config{Total: 10, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	c := Capacity{Prefill: 100, Decode: 100}
	// 5P5D; prefill carries 400 now, decode is forecast at 520 (104 %:
	// 45 % of requests would miss). Giving one leaves prefill at 100 %
	// (over the 90 % limit, 5 % misses) and saves the 45 %.
	if ok, _ := p.absorbs(400, 300, 400, 520, 5, 5, -1, 1, c, math.NaN()); !ok {
		t.Error("moving one: refused")
	}
	// Giving three leaves prefill at 200 %: 52 % misses for 45 % saved.
	if ok, msg := p.absorbs(400, 300, 400, 520, 5, 5, -1, 3, c, math.NaN()); ok || !strings.Contains(msg, "absorb limit") {
		t.Errorf("moving three: %v %q", ok, msg)
	}
	// A lightly loaded side gives freely.
	if ok, _ := p.absorbs(100, 300, 100, 520, 5, 5, -1, 3, c, math.NaN()); !ok {
		t.Error("an idle side refused to give")
	}
	// Decode giving to prefill: decode at 70 % keeps 4 at 88 % (fine);
	// giving 2 leaves 3 at 117 % (every request misses its TPOT) to save
	// a prefill side at 120 % (21 % misses).
	if ok, _ := p.absorbs(600, 350, 600, 350, 5, 5, 1, 1, c, math.NaN()); !ok {
		t.Error("decode giving one: refused")
	}
	if ok, _ := p.absorbs(600, 350, 600, 350, 5, 5, 1, 2, c, math.NaN()); ok {
		t.Error("decode giving two: accepted")
	}
	// Decode at 80 % giving one: 100 % left (25 % of requests would miss
	// their TPOT) to bring prefill from 120 % to 100 % (21 % → 5 %
	// misses): refused by the formula, accepted when the simulator
	// measured a larger gain.
	if ok, _ := p.absorbs(600, 400, 600, 400, 5, 5, 1, 1, c, math.NaN()); ok {
		t.Error("decode at 80 % giving one: accepted")
	}
	if ok, _ := p.absorbs(600, 400, 600, 400, 5, 5, 1, 1, c, 0.3); !ok {
		t.Error("decode at 80 % giving one for a simulated gain of 30 points: refused")
	}
}

// firstDecision feeds the planner the same observation every 30 s until it
// does something other than wait.
func firstDecision(t *testing.T, p *Planner, f *fakeFleet, o Observation) Decision {
	t.Helper()
	inst, _ := f.Instances(context.Background())
	for now := 30.0; now < 600; now += 30 {
		o.Now = now
		if d := p.Decide(context.Background(), &o, inst); d.Action != ActionWait {
			return d
		}
	}
	t.Fatal("the planner only waited")
	return Decision{}
}

// TestSwitchCostAccounting: a switch whose drain and warm-up outlast the
// horizon over which its gain is expected is not made.
func TestSwitchCostAccounting(t *testing.T) {
	c := Capacity{Prefill: 100, Decode: 100}
	// Prefill at 5 × 100 × 1.05: 5 % over; decode (200) has room.
	o := Observation{Window: 30, Requests: 300, PromptTokens: 525 * 30, OutputTokens: 200 * 30, Finished: 300, MeanTTFT: 1, MeanTPOT: 0.02}
	run := func(horizon float64) Decision {
		p, err := New(Config{Total: 10, Capacity: StaticCapacity(c), Confirm: 1, Horizon: horizon, Warmup: 60, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		return firstDecision(t, p, newFakeFleet(5, 5, 10), o)
	}
	if d := run(600); d.Action != ActionSwitch || len(d.ToPrefill) == 0 || d.SwitchSeconds < 60 {
		t.Errorf("long horizon: %s %s", d.Action, d.Reason)
	}
	if d := run(50); d.Action != ActionHold || !strings.Contains(d.Reason, "would not pay off") {
		t.Errorf("short horizon: %s %s", d.Action, d.Reason)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Total: 1}, "total"},
		{Config{Total: 3, MinPrefill: 2, MinDecode: 2}, "exceeds total"},
		{Config{PrefillUtil: 2}, "prefill-util"},
		{Config{Margin: math.NaN()}, "margin"},
		{Config{Cooldown: -1}, "cooldown"},
		{Config{Interval: math.Inf(1)}, "interval"},
		{Config{WhatIf: &WhatIf{Policy: "nope"}}, "unknown policy"},
		{Config{WhatIf: &WhatIf{Policy: "kvgate", Spread: -1}}, "spread"},
	} {
		if _, err := New(tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: want error with %q, got %v", tc.c, tc.want, err)
		}
	}
}

func TestHoltFollowsARampAndNeverAnticipatesAFall(t *testing.T) {
	f := newForecaster(0.5, 0.3)
	for i := 0; i <= 20; i++ {
		t0 := float64(30 * i)
		f.observe(t0, 1000+10*t0, 5000-5*t0)
	}
	if slope := f.p.trend; math.Abs(slope-10) > 0.5 {
		t.Errorf("rising trend %v, want about 10/s", slope)
	}
	p, d := f.at(60, 1)
	if p < 1000+10*600 || p > 1000+10*680 {
		t.Errorf("rising load forecast %v", p)
	}
	if d < f.d.level {
		t.Errorf("a falling load is forecast below its level: %v < %v", d, f.d.level)
	}
	if !f.steady(60, 10) || f.steady(60, 0.01) {
		t.Error("steady(): wrong on a ramp")
	}
}

func TestModelCapacity(t *testing.T) {
	day := DefaultDay()
	m := day.Capacity()
	ph := SeedPhases()
	chat, docs, agents := m.Estimate(ph[0].Shape), m.Estimate(ph[1].Shape), m.Estimate(ph[2].Shape)
	for _, c := range []Capacity{chat, docs, agents} {
		if c.Prefill != 20000 || c.Decode < 2400 || c.Decode > 3400 {
			t.Errorf("capacity %+v: want about the seed's 20000 / 3000", c)
		}
	}
	if !(chat.Decode > agents.Decode && agents.Decode > docs.Decode) {
		t.Errorf("longer contexts must decode slower: %v %v %v", chat.Decode, agents.Decode, docs.Decode)
	}
	// A KV capacity of ten sequences bounds the batch.
	m.KVTokens = 10 * 2500
	if c := m.Estimate(ph[0].Shape); c.Decode > 10/m.Model.DecodeStepTime(10, 10*2250)+1e-9 {
		t.Errorf("KV bound ignored: %v", c.Decode)
	}
}

func TestLearnedCapacity(t *testing.T) {
	l := newLearned()
	o := &Observation{Requests: 1000, TPOTMiss: 200}
	for range 3 {
		l.update(o, 0.5, 0.8, 0.95, 0.95) // decode misses at 80 %: overestimated
	}
	if l.decode >= 1 || l.prefill != 1 {
		t.Errorf("after decode misses: %+v", l)
	}
	o = &Observation{Requests: 1000}
	for range 50 {
		l.update(o, 1.3, 0.5, 0.95, 0.95) // prefill meets its SLO at 130 %: underestimated
	}
	if l.prefill != maxLearn {
		t.Errorf("prefill multiplier %v, want capped at %v", l.prefill, maxLearn)
	}
}

func TestCandidatesAndSimulatedPick(t *testing.T) {
	if got := candidateSplits(10, 3, 1, 23, 2); fmt.Sprint(got) != "[3 8 9 10 11 12]" {
		t.Errorf("candidates %v", got)
	}
	if got := candidateSplits(1, 1, 1, 23, 0); fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("candidates at the edge %v", got)
	}
	cands := []Candidate{{Prefill: 3, Attainment: 0.5}, {Prefill: 5, Attainment: 0.99}, {Prefill: 6, Attainment: 0.991}, {Prefill: 7, Attainment: 0.9}}
	best, gain := pickSimulated(cands, 3, 5)
	if best != 5 {
		t.Errorf("a tie within %.3f goes to the formula's split: got %d", simTie, best)
	}
	if g := gain(6); math.Abs(g-0.491) > 1e-9 || !math.IsInf(gain(4), -1) {
		t.Errorf("gains %v %v", g, gain(4))
	}
}

// TestEveryDecisionLogged: a switch is logged at info, and every hold
// and wait at debug with its reason (kvgate plan -v shows them all), one
// log line for each decision.
func TestEveryDecisionLogged(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ph := SeedPhases()[0]
	src := &shapeSource{shape: func(float64) Shape { return ph.Shape }, rng: rand.New(rand.NewPCG(1, 1))}
	ds := simulate(t, Config{Total: 24, Logger: log}, newFakeFleet(20, 4, 40), src, 1200)
	counts := map[string]int{}
	for _, d := range ds {
		counts[d.Action]++
	}
	lines := strings.Count(buf.String(), "\n")
	if counts[ActionSwitch] == 0 || counts[ActionHold] == 0 || counts[ActionWait] == 0 || lines != len(ds) {
		t.Fatalf("%d decisions %v, %d log lines:\n%s", len(ds), counts, lines, buf.String())
	}
	for _, a := range []string{ActionSwitch, ActionHold, ActionWait} {
		if n := strings.Count(buf.String(), `msg="planner: `+a+`"`); n != counts[a] {
			t.Errorf("%d %s decisions, %d logged", counts[a], a, n)
		}
	}
}
