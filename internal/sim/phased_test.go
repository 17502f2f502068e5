package sim

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/workload"
)

func docsTrace(t testing.TB, rate, duration float64, isl, osl int, hit float64, seed uint64) *workload.Trace {
	t.Helper()
	tr, err := workload.Docs(workload.ShapeConfig{Rate: rate, Duration: duration, ISL: isl, OSL: osl, Hit: hit, BlockSize: 64, Prefixes: 4, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func scheduler(t testing.TB, policy string) *sched.Scheduler {
	t.Helper()
	p, err := sched.New(policy, sched.Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return &sched.Scheduler{Policy: p, EarlyReject: true}
}

func phasedConfig(n, prefill int) PhasedConfig {
	return PhasedConfig{Instances: n, Prefill: prefill, Model: perfmodel.Default(), CacheTokens: 1 << 18,
		DecodeKVTokens: 1 << 20, SLO: sched.SLO{TTFT: 2, TPOT: 0.05}, Warmup: 5}
}

// TestPhasedWithoutSwitchesMatchesRun: with no controller a phased run is
// the plain simulator's disaggregated run, request for request.
func TestPhasedWithoutSwitchesMatchesRun(t *testing.T) {
	tr := docsTrace(t, 40, 60, 3000, 200, 0.5, 3)
	for _, policy := range []string{"kvgate", "predicted-ttft", "least-queue"} {
		pc := phasedConfig(8, 3)
		got, err := RunPhased(context.Background(), pc, tr, scheduler(t, policy), nil)
		if err != nil {
			t.Fatal(err)
		}
		want, err := Run(context.Background(), Config{Prefill: 3, Decode: 5, Model: pc.Model, CacheTokens: pc.CacheTokens,
			DecodeKVTokens: pc.DecodeKVTokens, SLO: pc.SLO}, tr, scheduler(t, policy))
		if err != nil {
			t.Fatal(err)
		}
		if got.Result != want {
			t.Errorf("%s: phased %+v\nplain %+v", policy, got.Result, want)
		}
	}
}

// scripted switches instances at given times.
type scripted struct {
	at   []float64
	id   []int
	to   []fleet.Role
	seen []InstanceState
	errs []error
}

func (s *scripted) Tick(_ context.Context, l *Live) error {
	for i := range s.at {
		if s.at[i] >= 0 && l.Now() >= s.at[i] {
			s.errs = append(s.errs, l.Switch(s.id[i], s.to[i]))
			s.at[i] = -1
		}
	}
	s.seen = l.Instances()
	return nil
}

// TestRoleSwitchDrainsWarmsAndServes moves a decode instance to prefill
// and a prefill instance to decode: each leaves routing at once, drains
// (a decode instance only when its streams and the requests on their way
// to it are done), warms up, then serves its new role.
func TestRoleSwitchDrainsWarmsAndServes(t *testing.T) {
	tr := docsTrace(t, 20, 120, 2000, 400, 0.5, 5)
	pc := phasedConfig(6, 2)
	pc.Interval = 1
	pc.Warmup = 7
	ctl := &scripted{at: []float64{30, 60}, id: []int{5, 0}, to: []fleet.Role{fleet.RolePrefill, fleet.RoleDecode}}
	res, err := RunPhased(context.Background(), pc, tr, scheduler(t, "kvgate"), ctl)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ctl.errs {
		if e != nil {
			t.Fatal(e)
		}
	}
	if len(res.Switches) != 2 {
		t.Fatalf("switches: %+v", res.Switches)
	}
	dec, pre := res.Switches[0], res.Switches[1]
	if dec.Instance != 5 || dec.From != fleet.RoleDecode || dec.To != fleet.RolePrefill || dec.Start != 30 {
		t.Fatalf("first switch %+v", dec)
	}
	// 400-token outputs at ~10 ms a step: the streams it holds take a few
	// seconds to finish.
	if dec.Drained <= dec.Start || dec.Drained > dec.Start+30 {
		t.Errorf("decode drain %+v: want a few seconds", dec)
	}
	if math.Abs(dec.Ready-(dec.Drained+7)) > 1e-9 || math.Abs(pre.Ready-(pre.Drained+7)) > 1e-9 {
		t.Errorf("warm-up of 7 s not respected: %+v %+v", dec, pre)
	}
	if pre.Drained < pre.Start || pre.Drained > pre.Start+5 {
		t.Errorf("a prefill instance drains its queue (short): %+v", pre)
	}
	roles := map[int]fleet.Role{}
	for _, s := range ctl.seen {
		roles[s.ID] = s.Role
		if s.State != StateServing {
			t.Errorf("instance %d still %s at the end", s.ID, s.State)
		}
	}
	if roles[5] != fleet.RolePrefill || roles[0] != fleet.RoleDecode {
		t.Errorf("final roles %v", roles)
	}
	if res.Unserved != 0 {
		t.Errorf("a switch lost requests: unserved %v", res.Unserved)
	}
}

// TestSwitchRules: the last instance of a role cannot leave it, an
// instance cannot switch twice at once, only prefill and decode.
func TestSwitchRules(t *testing.T) {
	tr := docsTrace(t, 5, 20, 1000, 50, 0.3, 1)
	pc := phasedConfig(3, 1)
	pc.Interval = 5
	var errs []string
	ctl := controllerFunc(func(l *Live) {
		if l.Now() != 5 {
			return
		}
		for _, e := range []error{
			l.Switch(0, fleet.RoleDecode),  // the only prefill instance
			l.Switch(1, fleet.RoleBoth),    // not a disaggregated role
			l.Switch(7, fleet.RolePrefill), // no such instance
			l.Switch(1, fleet.RolePrefill), // fine
			l.Switch(1, fleet.RolePrefill), // already switching
			l.Switch(2, fleet.RolePrefill), // the last serving decode instance
			l.Switch(2, fleet.RoleDecode),  // already decode: no-op
		} {
			if e != nil {
				errs = append(errs, e.Error())
			} else {
				errs = append(errs, "")
			}
		}
	})
	if _, err := RunPhased(context.Background(), pc, tr, scheduler(t, "kvgate"), ctl); err != nil {
		t.Fatal(err)
	}
	want := []string{"last serving prefill", "cannot switch to both", "no instance 7", "", "already switching", "last serving decode", ""}
	if len(errs) != len(want) {
		t.Fatalf("errors %q", errs)
	}
	for i := range want {
		if (want[i] == "") != (errs[i] == "") || !strings.Contains(errs[i], want[i]) {
			t.Errorf("case %d: got %q, want %q", i, errs[i], want[i])
		}
	}
}

type controllerFunc func(l *Live)

func (f controllerFunc) Tick(_ context.Context, l *Live) error { f(l); return nil }

// TestWindowAndTrace checks what a controller observes against the trace.
func TestWindowAndTrace(t *testing.T) {
	tr := docsTrace(t, 30, 60, 1500, 100, 0.4, 2)
	pc := phasedConfig(4, 2)
	pc.Interval = 30
	var w WindowStats
	var recent *workload.Trace
	ctl := controllerFunc(func(l *Live) {
		if l.Now() == 60-30 {
			w = l.Window(10, 30)
			recent = l.Trace(10, 30)
		}
	})
	if _, err := RunPhased(context.Background(), pc, tr, scheduler(t, "kvgate"), ctl); err != nil {
		t.Fatal(err)
	}
	n, prompt, out := 0, int64(0), int64(0)
	for _, q := range tr.Requests {
		if q.Arrival >= 10 && q.Arrival < 30 {
			n++
			prompt += int64(q.PromptTokens)
			out += int64(q.OutputTokens)
		}
	}
	if w.Arrivals != n || w.PromptTokens != prompt || w.OutputTokens != out || n == 0 {
		t.Fatalf("window %+v, want %d requests, %d prompt, %d output tokens", w, n, prompt, out)
	}
	if w.CachedTokens <= 0 || w.CachedTokens >= prompt {
		t.Errorf("cached tokens %d of %d", w.CachedTokens, prompt)
	}
	if w.Finished == 0 || w.TTFTSum <= 0 || w.TPOTSum <= 0 {
		t.Errorf("no finished requests measured: %+v", w)
	}
	if len(recent.Requests) != n || recent.Requests[0].Arrival < 0 || recent.Requests[n-1].Arrival >= 20 || recent.Duration != 20 {
		t.Errorf("recent trace: %d requests over %v", len(recent.Requests), recent.Duration)
	}
}

func TestPhasedConfigErrors(t *testing.T) {
	tr := docsTrace(t, 5, 5, 1000, 50, 0.3, 1)
	for _, tc := range []struct {
		mut  func(*PhasedConfig)
		want string
	}{
		{func(c *PhasedConfig) { c.Instances = 1 }, "2 to"},
		{func(c *PhasedConfig) { c.Prefill = 0 }, "at least one prefill"},
		{func(c *PhasedConfig) { c.Prefill = c.Instances }, "at least one prefill and one decode"},
		{func(c *PhasedConfig) { c.Warmup = math.NaN() }, "warm-up"},
		{func(c *PhasedConfig) { c.Interval = -1 }, "interval"},
		{func(c *PhasedConfig) { c.DecodeKVTokens = 0 }, "KV capacity"},
		{func(c *PhasedConfig) { c.Segments = []Segment{{Name: "x", From: 1, To: math.Inf(1)}} }, "segment"},
	} {
		pc := phasedConfig(4, 2)
		tc.mut(&pc)
		if _, err := RunPhased(context.Background(), pc, tr, scheduler(t, "kvgate"), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want error with %q, got %v", tc.want, err)
		}
	}
}

// TestResetCacheForgetsInstance: an instance leaving prefill loses its
// prefix cache; the others keep theirs.
func TestResetCacheForgetsInstance(t *testing.T) {
	f := newFleetCache(3, 10, EvictTailFirst)
	keys := []uint64{1, 2, 3}
	f.insert(0, keys)
	f.insert(1, keys)
	f.resetCache(0)
	m := make([]int, 3)
	f.match(keys, m)
	if m[0] != 0 || m[1] != 3 || m[2] != 0 {
		t.Fatalf("matched %v", m)
	}
	if f.inst[0].len() != 0 || f.inst[0].cap != 10 {
		t.Fatalf("reset cache: len %d cap %d", f.inst[0].len(), f.inst[0].cap)
	}
}
