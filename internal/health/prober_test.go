package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
)

// fakeClock moves only when a test says so.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	tickers []*fakeTicker
}

type fakeTicker struct {
	c       chan time.Time
	d       time.Duration
	next    time.Time
	stopped bool
	clk     *fakeClock
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTicker(d time.Duration) Ticker {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTicker{c: make(chan time.Time, 1), d: d, next: c.now.Add(d), clk: c}
	c.tickers = append(c.tickers, t)
	return t
}

// Advance moves time and fires the tickers that are due (a full channel
// drops the tick, as time.Ticker does).
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.tickers {
		for !t.stopped && !t.next.After(c.now) {
			select {
			case t.c <- c.now:
			default:
			}
			t.next = t.next.Add(t.d)
		}
	}
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }
func (t *fakeTicker) Stop() {
	t.clk.mu.Lock()
	t.stopped = true
	t.clk.mu.Unlock()
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// engineServer serves /health (status from the flag) and /metrics.
type engineServer struct {
	*httptest.Server
	down       atomic.Bool
	metricsBad atomic.Bool
	hang       chan struct{} // non-nil: /health waits for it or the client
	healthHits atomic.Int64
	// models is the /v1/models answer ("": 404).
	models atomic.Pointer[string]
}

func newEngineServer(t *testing.T) *engineServer {
	t.Helper()
	metrics, err := os.ReadFile("../enginemetrics/testdata/emulator.txt")
	if err != nil {
		t.Fatal(err)
	}
	s := &engineServer{}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		s.healthHits.Add(1)
		if s.hang != nil {
			select {
			case <-s.hang:
			case <-r.Context().Done():
			}
			return
		}
		if s.down.Load() {
			http.Error(w, "engine dead", http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, _ *http.Request) {
		if m := s.models.Load(); m != nil && *m != "" {
			w.Write([]byte(*m))
			return
		}
		http.NotFound(w, nil)
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		if s.metricsBad.Load() {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		w.Write(metrics)
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func ep(name, url string) fleet.Endpoint {
	return fleet.Endpoint{Name: name, URL: url, Model: "meta-llama/Llama-3.1-8B-Instruct"}
}

// waitFor polls cond; the deadline only guards against a hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func probes(p *Prober, name string) uint64 {
	s, _ := p.State(name)
	return s.Probes
}

// step fires one tick and waits for the probe it causes (and its scrape,
// when the endpoint is healthy).
func step(t *testing.T, p *Prober, clk *fakeClock, name string) State {
	t.Helper()
	n := probes(p, name)
	clk.Advance(p.cfg.Interval)
	waitFor(t, fmt.Sprintf("probe %d of %s", n+1, name), func() bool { return probes(p, name) > n })
	s, _ := p.State(name)
	return s
}

func newTestProber(t *testing.T, cfg Config) *Prober {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestHysteresis(t *testing.T) {
	srv := newEngineServer(t)
	clk := newFakeClock()
	p := newTestProber(t, Config{Clock: clk, FailAfter: 2, RecoverAfter: 2, Interval: time.Second})
	p.Set([]fleet.Endpoint{ep("a", srv.URL)})
	waitFor(t, "first probe", func() bool { return probes(p, "a") == 1 })
	waitFor(t, "first scrape", func() bool { _, ok := p.Metrics("a"); return ok })
	if !p.Available("a") {
		t.Fatal("healthy endpoint not available")
	}

	type want struct {
		healthy     bool
		fails, succ int
	}
	srv.down.Store(true)
	for i, w := range []want{{true, 1, 0}, {false, 2, 0}, {false, 3, 0}} {
		s := step(t, p, clk, "a")
		if s.Healthy != w.healthy || s.ConsecutiveFailures != w.fails || s.Available != w.healthy {
			t.Fatalf("down, probe %d: %+v, want %+v", i, s, w)
		}
		if !strings.Contains(s.LastError, "503") {
			t.Fatalf("last error %q", s.LastError)
		}
	}
	srv.down.Store(false)
	for i, w := range []want{{false, 0, 1}, {true, 0, 2}} {
		s := step(t, p, clk, "a")
		if s.Healthy != w.healthy || s.ConsecutiveSuccesses != w.succ || p.Available("a") != w.healthy {
			t.Fatalf("up, probe %d: %+v, want %+v", i, s, w)
		}
	}
}

func TestMetricsKeptWhenScrapeFails(t *testing.T) {
	srv := newEngineServer(t)
	clk := newFakeClock()
	p := newTestProber(t, Config{Clock: clk, Interval: time.Second})
	p.Set([]fleet.Endpoint{ep("a", srv.URL)})
	waitFor(t, "first scrape", func() bool { _, ok := p.Metrics("a"); return ok })
	m, _ := p.Metrics("a")
	if m.BlockSize != 16 || m.Time != clk.Now() {
		t.Fatalf("metrics %+v", m)
	}
	srv.metricsBad.Store(true)
	scraped := m.Time
	n := probes(p, "a")
	clk.Advance(time.Second)
	waitFor(t, "scrape error", func() bool { s, _ := p.State("a"); return s.Probes > n && s.MetricsError != "" })
	s, _ := p.State("a")
	if !s.Healthy || s.Metrics == nil || s.Metrics.Time != scraped || s.MetricsAge != time.Second || !strings.Contains(s.MetricsError, "500") {
		t.Fatalf("after a failed scrape: %+v", s)
	}
	srv.metricsBad.Store(false)
	n = probes(p, "a")
	clk.Advance(time.Second)
	waitFor(t, "scrape recovery", func() bool { s, _ := p.State("a"); return s.Probes > n && s.MetricsError == "" })
	if s, _ := p.State("a"); s.MetricsAge != 0 {
		t.Fatalf("fresh scrape has age %v", s.MetricsAge)
	}
}

func TestTimeout(t *testing.T) {
	srv := newEngineServer(t)
	srv.hang = make(chan struct{})
	defer close(srv.hang)
	p := newTestProber(t, Config{Clock: newFakeClock(), Timeout: 30 * time.Millisecond, FailAfter: 1})
	p.Set([]fleet.Endpoint{ep("a", srv.URL)})
	waitFor(t, "timed-out probe", func() bool { return probes(p, "a") == 1 })
	s, _ := p.State("a")
	if s.Healthy || s.Available || !strings.Contains(s.LastError, "deadline") {
		t.Fatalf("%+v", s)
	}
}

func TestPassiveEjection(t *testing.T) {
	srv := newEngineServer(t)
	clk := newFakeClock()
	p := newTestProber(t, Config{Clock: clk, EjectAfter: 2, EjectBase: time.Second, EjectMax: 4 * time.Second})
	p.Set([]fleet.Endpoint{ep("a", srv.URL), ep("b", srv.URL), ep("c", srv.URL), ep("d", srv.URL)})
	boom := errors.New("connection refused")
	fail := func(name string, n int) {
		for range n {
			p.ReportFailure(name, boom)
		}
	}
	// ejectFor fails a twice and checks the cool-down, then lets it end.
	ejectFor := func(want time.Duration) {
		t.Helper()
		fail("a", 1)
		if !p.Available("a") {
			t.Fatal("ejected after one failure")
		}
		fail("a", 1)
		s, _ := p.State("a")
		if s.Available || s.EjectedUntil != clk.Now().Add(want) {
			t.Fatalf("want ejection for %v: %+v (now %v)", want, s, clk.Now())
		}
		fail("a", 5) // in-flight requests failing while ejected change nothing
		clk.Advance(want - time.Millisecond)
		if p.Available("a") {
			t.Fatal("back before the cool-down ended")
		}
		clk.Advance(time.Millisecond)
		if !p.Available("a") {
			t.Fatal("not back after the cool-down")
		}
	}
	for _, d := range []time.Duration{1, 2, 4, 4} {
		ejectFor(d * time.Second)
	}
	// Staying in for EjectMax forgives the run, which the state shows
	// then (it showed the run's count until the next ejection).
	if s, _ := p.State("a"); s.Ejections != 4 {
		t.Fatalf("in the run: %d ejections, want 4", s.Ejections)
	}
	clk.Advance(4*time.Second - time.Millisecond)
	if s, _ := p.State("a"); s.Ejections != 4 {
		t.Fatalf("before eject_max in: %d ejections, want 4", s.Ejections)
	}
	clk.Advance(time.Millisecond)
	if s, _ := p.State("a"); s.Ejections != 0 {
		t.Fatalf("eject_max in: %d ejections, want 0", s.Ejections)
	}
	ejectFor(time.Second)

	// A success ends a failure run.
	fail("b", 1)
	p.ReportSuccess("b")
	fail("b", 1)
	if !p.Available("b") {
		t.Fatal("b ejected although a success came between its failures")
	}
	// At most half the fleet is ejected at once.
	fail("b", 1)
	fail("c", 2)
	if p.Available("b") || p.Available("c") {
		t.Fatal("b and c should be ejected")
	}
	fail("d", 2)
	if !p.Available("d") {
		t.Fatal("d ejected: more than 50% of the fleet out")
	}
	// Unknown names are ignored.
	p.ReportFailure("nope", nil)
	p.ReportSuccess("nope")
	if p.Available("nope") {
		t.Fatal("unknown endpoint available")
	}
}

func TestEjectionDisabled(t *testing.T) {
	srv := newEngineServer(t)
	p := newTestProber(t, Config{Clock: newFakeClock(), EjectAfter: -1})
	p.Set([]fleet.Endpoint{ep("a", srv.URL), ep("b", srv.URL)})
	for range 10 {
		p.ReportFailure("a", nil)
	}
	if !p.Available("a") {
		t.Fatal("ejected with ejection disabled")
	}
}

func TestSetChurn(t *testing.T) {
	srv := newEngineServer(t)
	hung := newEngineServer(t)
	hung.hang = make(chan struct{})
	defer close(hung.hang)
	clk := newFakeClock()
	p, err := New(Config{Clock: clk, Timeout: 10 * time.Minute, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	p.Set([]fleet.Endpoint{ep("a", srv.URL), ep("b", srv.URL), ep("h", hung.URL), {Name: "nourl", Model: "m"}})
	if got := p.running.Load(); got != 3 {
		t.Fatalf("%d probe goroutines, want 3 (none without a URL)", got)
	}
	if s, _ := p.State("nourl"); s.Available || s.LastError == "" {
		t.Fatalf("endpoint without URL: %+v", s)
	}
	waitFor(t, "hung probe in flight", func() bool { return hung.healthHits.Load() == 1 })
	waitFor(t, "probe of a", func() bool { return probes(p, "a") == 1 })

	// Removing an endpoint whose probe hangs returns (the probe is
	// cancelled) and records nothing against it; a keeps its state; an
	// endpoint whose URL changes starts over.
	p.ReportFailure("a", nil)
	other := newEngineServer(t)
	p.Set([]fleet.Endpoint{ep("a", srv.URL), ep("b", other.URL), ep("c", srv.URL)})
	if got := p.running.Load(); got != 3 {
		t.Fatalf("%d probe goroutines after churn, want 3", got)
	}
	if _, ok := p.State("h"); ok {
		t.Fatal("removed endpoint still has a state")
	}
	if s, _ := p.State("a"); s.PassiveFailures != 1 || s.Probes != 1 {
		t.Fatalf("kept endpoint lost its state: %+v", s)
	}
	waitFor(t, "probe of b at its new URL", func() bool { return other.healthHits.Load() == 1 })
	if got := len(p.States()); got != 3 {
		t.Fatalf("%d states", got)
	}
	// Many rounds of churn leak nothing.
	for i := range 50 {
		var eps []fleet.Endpoint
		for j := range i % 7 {
			eps = append(eps, ep(fmt.Sprintf("e%d", j), srv.URL))
		}
		p.Set(eps)
		if got := p.running.Load(); got != int64(len(eps)) {
			t.Fatalf("round %d: %d probe goroutines for %d endpoints", i, got, len(eps))
		}
	}
	p.Close()
	if got := p.running.Load(); got != 0 {
		t.Fatalf("%d probe goroutines after Close", got)
	}
	p.Set([]fleet.Endpoint{ep("late", srv.URL)})
	if p.running.Load() != 0 || len(p.States()) != 0 {
		t.Fatal("Set after Close started probes")
	}
	p.Close() // twice is fine
}

// TestFlappingRealClock runs on the wall clock against an engine that goes
// down and comes back, until the prober has followed both transitions.
func TestFlappingRealClock(t *testing.T) {
	srv := newEngineServer(t)
	p := newTestProber(t, Config{Interval: 10 * time.Millisecond, Timeout: 5 * time.Second, FailAfter: 2, RecoverAfter: 1})
	p.Set([]fleet.Endpoint{ep("a", srv.URL), ep("b", srv.URL)})
	waitFor(t, "a scraped", func() bool { _, ok := p.Metrics("a"); return ok })
	for round := range 3 {
		srv.down.Store(true)
		waitFor(t, fmt.Sprintf("round %d: out", round), func() bool { return !p.Available("a") && !p.Available("b") })
		srv.down.Store(false)
		waitFor(t, fmt.Sprintf("round %d: back", round), func() bool { return p.Available("a") && p.Available("b") })
	}
	p.Close()
	if p.running.Load() != 0 {
		t.Fatal("goroutines left")
	}
}

func TestStateJSON(t *testing.T) {
	srv := newEngineServer(t)
	clk := newFakeClock()
	p := newTestProber(t, Config{Clock: clk})
	p.Set([]fleet.Endpoint{ep("a", srv.URL)})
	waitFor(t, "scrape", func() bool { _, ok := p.Metrics("a"); return ok })
	clk.Advance(1500 * time.Millisecond)
	b, err := json.Marshal(p.States())
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0]["available"] != true || got[0]["metrics_age_s"] != 1.5 {
		t.Fatalf("%s", b)
	}
	if m, _ := got[0]["metrics"].(map[string]any); m["block_size"] != 16.0 {
		t.Fatalf("%s", b)
	}
	if _, ok := got[0]["ejected_until"]; ok {
		t.Fatalf("zero time written: %s", b)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{Interval: time.Microsecond}, "interval"},
		{Config{Timeout: -1}, "timeout"},
		{Config{FailAfter: 1001}, "fail_after"},
		{Config{RecoverAfter: -2}, "recover_after"},
		{Config{EjectBase: time.Minute, EjectMax: time.Second}, "eject_max"},
		{Config{EjectAfter: 2e6}, "eject_after"},
		{Config{MaxEjectedPercent: 101}, "max_ejected_percent"},
		{Config{HealthPath: "health"}, "health_path"},
	} {
		if _, err := New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: error %v, want %q", tt.cfg, err, tt.want)
		}
	}
	p, err := New(Config{EjectBase: 10 * time.Minute})
	if err != nil || p.cfg.EjectMax != 10*time.Minute || p.cfg.Interval != DefaultInterval {
		t.Fatalf("defaults: %+v %v", p.cfg, err)
	}
}

// TestAdaptersListed: every modelsEvery probes the engine's /v1/models is
// read, and its model's LoRA adapters (entries whose parent is the model)
// kept; a failed listing keeps the last one, and NoModels reads none.
func TestAdaptersListed(t *testing.T) {
	srv := newEngineServer(t)
	model := ep("a", srv.URL).Model
	list := func(ids ...string) {
		body := `{"object":"list","data":[{"id":"` + model + `","parent":null},{"id":"other-base-lora","parent":"another/model"},{"id":"","parent":"` + model + `"}`
		for _, id := range ids {
			body += `,{"id":"` + id + `","parent":"` + model + `"}`
		}
		body += "]}"
		srv.models.Store(&body)
	}
	list("sql", "chat", "sql")
	clk := newFakeClock()
	p := newTestProber(t, Config{Clock: clk, Interval: time.Second})
	p.Set([]fleet.Endpoint{ep("a", srv.URL)})
	waitFor(t, "the first listing", func() bool { _, ok := p.Adapters("a"); return ok })
	if got, _ := p.Adapters("a"); !slices.Equal(got, []string{"sql", "chat"}) {
		t.Fatalf("adapters %q", got)
	}
	list("sql") // chat unloaded
	for range modelsEvery {
		step(t, p, clk, "a")
	}
	waitFor(t, "the next listing", func() bool { got, _ := p.Adapters("a"); return slices.Equal(got, []string{"sql"}) })
	empty := ""
	srv.models.Store(&empty) // 404 now
	for range modelsEvery {
		step(t, p, clk, "a")
	}
	waitFor(t, "a failed listing", func() bool { s, _ := p.State("a"); return s.ModelsError != "" })
	if s, _ := p.State("a"); !slices.Equal(s.Adapters, []string{"sql"}) || !strings.Contains(s.ModelsError, "404") {
		t.Fatalf("after a failed listing: %q %q", s.Adapters, s.ModelsError)
	}
	off := newTestProber(t, Config{Clock: newFakeClock(), Interval: time.Second, NoModels: true})
	off.Set([]fleet.Endpoint{ep("b", srv.URL)})
	waitFor(t, "a probe", func() bool { return probes(off, "b") > 0 })
	if _, ok := off.Adapters("b"); ok {
		t.Fatal("NoModels listed adapters")
	}
	if l, err := parseModels([]byte(`{"data":`), model); err == nil || l.adapters != nil {
		t.Fatalf("a cut answer: %v %v", l, err)
	}
	// An engine serving another model (a --served-model-name that is
	// not the endpoint's model): every request of the model gets its
	// 404, so the listing says so (it said nothing).
	if l, err := parseModels([]byte(`{"data":[{"id":"other","parent":null}]}`), model); err != nil ||
		!strings.Contains(l.missing, `"other", not model "`+model+`"`) {
		t.Fatalf("another model: %v %q", err, l.missing)
	}
	if l, err := parseModels([]byte(`{"data":[]}`), model); err != nil || l.missing != "" {
		t.Fatalf("an empty list: %v %q", err, l.missing)
	}
	if l, _ := parseModels([]byte(`{"data":[{"id":"`+model+`","parent":null},{"id":"sql","root":"/adapters/sql","parent":"`+model+`"},{"id":"chat","parent":"`+model+`"}]}`), model); l.roots["sql"] != "/adapters/sql" || len(l.roots) != 1 {
		t.Fatalf("adapter roots %v", l.roots)
	}
}

// TestMetricsOfASecondServedName: vLLM labels every metric with the first
// of its served names (--served-model-name a b) and lists each name as a
// base model of one root; an endpoint declared under the second name lost
// its running, waiting and KV usage without a word (walkthrough,
// 2026-12-04). The scrape reads the first name's series.
func TestMetricsOfASecondServedName(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"a","root":"/models/x","parent":null},{"id":"b","root":"/models/x","parent":null}]}`)
		case "/metrics":
			io.WriteString(w, "vllm:num_requests_running{model_name=\"a\",engine=\"0\"} 3\n"+
				"vllm:num_requests_waiting{model_name=\"a\",engine=\"0\"} 7\n"+
				"vllm:kv_cache_usage_perc{model_name=\"a\",engine=\"0\"} 0.9\n"+
				"vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n")
		default:
			w.WriteHeader(http.StatusOK)
		}
	}))
	defer srv.Close()
	p := newTestProber(t, Config{Clock: newFakeClock(), Interval: time.Second})
	p.Set([]fleet.Endpoint{{Name: "eb", URL: srv.URL, Model: "b"}})
	waitFor(t, "first scrape", func() bool { _, ok := p.Metrics("eb"); return ok })
	m, _ := p.Metrics("eb")
	if m.Running != 3 || m.Waiting != 7 || m.KVUsage != 0.9 || m.NumGPUBlocks != 1000 {
		t.Errorf("an endpoint of the second served name: %+v, want running 3, waiting 7, usage 0.9", m)
	}
}
