// Package health decides which endpoints the gateway may route to. Active
// checks: a Prober GETs each endpoint's /health every Interval and scrapes
// its /metrics (internal/enginemetrics); FailAfter consecutive failures
// take an endpoint out, RecoverAfter consecutive successes bring it back.
// Passive checks: the proxy reports connect errors and 5xx responses
// (ReportFailure) and successes (ReportSuccess); EjectAfter consecutive
// failures eject an endpoint for a cool-down that doubles with each
// ejection that follows soon after the previous one, up to EjectMax.
//
// The endpoint set follows discovery at run time (Set): probes start for
// new endpoints and stop, goroutine and all, for removed ones. A new
// endpoint counts as healthy until its probes say otherwise.
package health

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/enginemetrics"
	"github.com/kvgate/kvgate/internal/fleet"
)

// State is what the Prober knows of one endpoint (GET /admin/endpoints).
type State struct {
	Endpoint fleet.Endpoint `json:"endpoint"`
	// Available: Healthy and not ejected; the gateway routes only here.
	Available bool `json:"available"`
	// Healthy is the active checks' verdict, with hysteresis.
	Healthy              bool      `json:"healthy"`
	Probes               uint64    `json:"probes"`
	LastProbe            time.Time `json:"last_probe,omitzero"`
	ConsecutiveFailures  int       `json:"consecutive_failures"`
	ConsecutiveSuccesses int       `json:"consecutive_successes"`
	LastError            string    `json:"last_error,omitempty"`
	LastErrorAt          time.Time `json:"last_error_at,omitzero"`
	// PassiveFailures counts the proxy's consecutive failure reports.
	PassiveFailures int `json:"passive_failures"`
	// Ejections is the number of ejections in the current run (it drives
	// the cool-down; a run ends once the endpoint has stayed in for
	// EjectMax since its last ejection ended); EjectedUntil is when the
	// last one ends.
	Ejections    int       `json:"ejections"`
	EjectedUntil time.Time `json:"ejected_until,omitzero"`
	// Metrics is the last successful scrape (nil: none yet), MetricsAge
	// its age when State was called, MetricsError the last scrape error
	// (cleared by a success).
	Metrics           *enginemetrics.Metrics `json:"metrics,omitempty"`
	MetricsAge        time.Duration          `json:"-"`
	MetricsAgeSeconds float64                `json:"metrics_age_s,omitempty"`
	MetricsError      string                 `json:"metrics_error,omitempty"`
	// Adapters are the LoRA adapters of its model its engine's /v1/models
	// listed last; ModelsError the last listing's error.
	Adapters    []string `json:"adapters,omitempty"`
	ModelsError string   `json:"models_error,omitempty"`
}

// target is one probed endpoint.
type target struct {
	cancel context.CancelFunc // nil when not probed (no URL)
	done   chan struct{}

	mu           sync.Mutex
	ep           fleet.Endpoint
	healthy      bool
	probes       uint64
	lastProbe    time.Time
	fails, succs int
	lastErr      string
	lastErrAt    time.Time
	passive      int
	ejections    int
	ejectedUntil time.Time
	metrics      enginemetrics.Metrics
	hasMetrics   bool
	metricsErr   string
	// adapters are the LoRA adapters of the endpoint's model its engine
	// listed last (models.go).
	adapters    []string
	roots       map[string]string // the adapters' roots listed (parseModels)
	hasAdapters bool
	modelsErr   string
	warnedAuth  bool // the engine's 401 to the listing was told (models.go)
	// maxModelLen is the model's max_model_len it listed last (0: none).
	maxModelLen int
	// metricsModel: the name the engine's metrics carry for the model,
	// when another (modelList.metricsModel).
	metricsModel string
}

// Prober runs the checks. Its methods are safe for concurrent use.
type Prober struct {
	cfg Config

	mu      sync.RWMutex
	targets map[string]*target
	closed  bool

	ejectMu sync.Mutex // serialises ejection decisions (MaxEjectedPercent)
	wg      sync.WaitGroup
	running atomic.Int64 // probe goroutines alive
}

// New returns a Prober with no endpoints; call Set, and Close when done.
func New(cfg Config) (*Prober, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Prober{cfg: cfg, targets: map[string]*target{}}, nil
}

// Set makes eps the probed set: new endpoints start probing at once,
// removed ones stop (their goroutines end before Set returns), and an
// endpoint whose URL changed starts again with a fresh state. Duplicate
// names after the first are ignored. Set after Close does nothing.
func (p *Prober) Set(eps []fleet.Endpoint) {
	var stopped []*target
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	next := make(map[string]*target, len(eps))
	for _, ep := range eps {
		if _, dup := next[ep.Name]; dup {
			p.cfg.Logger.Warn("health: duplicate endpoint name ignored", "endpoint", ep.Name)
			continue
		}
		t := p.targets[ep.Name]
		if t != nil && t.endpoint().URL == ep.URL {
			t.mu.Lock()
			t.ep = ep
			t.mu.Unlock()
		} else {
			if t != nil {
				stopped = append(stopped, t)
			}
			t = p.start(ep)
		}
		next[ep.Name] = t
	}
	for name, t := range p.targets {
		if next[name] != t {
			stopped = append(stopped, t)
		}
	}
	p.targets = next
	p.mu.Unlock()
	stopAll(stopped)
}

// stopAll cancels probes and waits for their goroutines.
func stopAll(ts []*target) {
	for _, t := range ts {
		if t.cancel != nil {
			t.cancel()
		}
	}
	for _, t := range ts {
		if t.done != nil {
			<-t.done
		}
	}
}

// start creates a target and its probe goroutine (none without a URL:
// nothing to probe, and nothing to route to).
func (p *Prober) start(ep fleet.Endpoint) *target {
	t := &target{ep: ep, healthy: true}
	if ep.URL == "" {
		t.healthy, t.lastErr = false, "no url to probe"
		return t
	}
	if p.cfg.NoProbes {
		return t // healthy, and ejected only by failures
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel, t.done = cancel, make(chan struct{})
	p.wg.Add(1)
	p.running.Add(1)
	go p.loop(ctx, t)
	return t
}

func (p *Prober) loop(ctx context.Context, t *target) {
	defer func() {
		p.running.Add(-1)
		close(t.done)
		p.wg.Done()
	}()
	tk := p.cfg.Clock.NewTicker(p.cfg.Interval)
	defer tk.Stop()
	for {
		p.probe(ctx, t)
		select {
		case <-ctx.Done():
			return
		case <-tk.C():
		}
	}
}

// Close stops every probe and waits for them.
func (p *Prober) Close() {
	p.mu.Lock()
	p.closed = true
	ts := make([]*target, 0, len(p.targets))
	for _, t := range p.targets {
		ts = append(ts, t)
	}
	p.targets = map[string]*target{}
	p.mu.Unlock()
	stopAll(ts)
	p.wg.Wait()
}

func (t *target) endpoint() fleet.Endpoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ep
}

// probe checks /health and, when healthy, lists the engine's adapters
// (every modelsEvery probes) and scrapes /metrics.
func (p *Prober) probe(ctx context.Context, t *target) {
	ep := t.endpoint()
	err := p.checkHealth(ctx, ep.URL)
	if ctx.Err() != nil {
		return // stopped mid-probe: not the endpoint's fault
	}
	p.record(t, err)
	if err != nil {
		return
	}
	p.probeModels(ctx, t, ep)
	if p.cfg.NoMetrics {
		return
	}
	rank := -1
	if ep.Ranked() {
		rank = ep.DPRank
	}
	t.mu.Lock()
	model := cmp.Or(t.metricsModel, ep.Model)
	t.mu.Unlock()
	m, merr := p.cfg.Scraper.ScrapeRank(ctx, ep.URL, model, rank)
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if merr != nil {
		t.metricsErr = merr.Error()
		return
	}
	m.Time = p.cfg.Clock.Now()
	t.metrics, t.hasMetrics, t.metricsErr = m, true, ""
}

func (p *Prober) checkHealth(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+p.cfg.HealthPath, nil)
	if err != nil {
		return err
	}
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	// Drain a little so the connection can be reused.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s: status %s", p.cfg.HealthPath, resp.Status)
	}
	return nil
}

// record applies one probe result with hysteresis.
func (p *Prober) record(t *target, err error) {
	now := p.cfg.Clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.probes++
	t.lastProbe = now
	if err != nil {
		t.fails++
		t.succs = 0
		t.lastErr, t.lastErrAt = err.Error(), now
		if t.healthy && t.fails >= p.cfg.FailAfter {
			t.healthy = false
			p.cfg.Logger.Warn("health: endpoint out", "endpoint", t.ep.Name, "failures", t.fails, "err", err)
		}
		return
	}
	t.succs++
	t.fails = 0
	if !t.healthy && t.succs >= p.cfg.RecoverAfter {
		t.healthy = true
		p.cfg.Logger.Info("health: endpoint back", "endpoint", t.ep.Name, "successes", t.succs)
	}
}

func (p *Prober) target(name string) *target {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.targets[name]
}

// Available reports whether the gateway may route to name: known, healthy
// and not ejected.
func (p *Prober) Available(name string) bool {
	t := p.target(name)
	if t == nil {
		return false
	}
	now := p.cfg.Clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.available(now)
}

func (t *target) available(now time.Time) bool {
	return t.healthy && !now.Before(t.ejectedUntil)
}

// Metrics returns the last successful scrape of name.
func (p *Prober) Metrics(name string) (enginemetrics.Metrics, bool) {
	t := p.target(name)
	if t == nil {
		return enginemetrics.Metrics{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.metrics, t.hasMetrics
}

// State returns what is known of name.
func (p *Prober) State(name string) (State, bool) {
	t := p.target(name)
	if t == nil {
		return State{}, false
	}
	return t.state(p.cfg.Clock.Now(), p.cfg.EjectMax), true
}

// States returns every endpoint's state, sorted by name.
func (p *Prober) States() []State {
	p.mu.RLock()
	ts := make([]*target, 0, len(p.targets))
	for _, t := range p.targets {
		ts = append(ts, t)
	}
	p.mu.RUnlock()
	now := p.cfg.Clock.Now()
	out := make([]State, len(ts))
	for i, t := range ts {
		out[i] = t.state(now, p.cfg.EjectMax)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Endpoint.Name < out[j].Endpoint.Name })
	return out
}

func (t *target) state(now time.Time, ejectMax time.Duration) State {
	t.mu.Lock()
	defer t.mu.Unlock()
	ejections := t.ejections
	if !t.ejectedUntil.IsZero() && now.Sub(t.ejectedUntil) >= ejectMax {
		// The run is forgiven (eject), though the count is reset only
		// at the next ejection: it stayed 1 for good after one blip.
		ejections = 0
	}
	s := State{
		Endpoint: t.ep, Available: t.available(now), Healthy: t.healthy,
		Probes: t.probes, LastProbe: t.lastProbe,
		ConsecutiveFailures: t.fails, ConsecutiveSuccesses: t.succs,
		LastError: t.lastErr, LastErrorAt: t.lastErrAt,
		PassiveFailures: t.passive, Ejections: ejections, EjectedUntil: t.ejectedUntil,
		MetricsError: t.metricsErr,
		Adapters:     t.adapters, ModelsError: t.modelsErr,
	}
	if t.hasMetrics {
		m := t.metrics
		s.Metrics = &m
		s.MetricsAge = m.Age(now)
		s.MetricsAgeSeconds = s.MetricsAge.Seconds()
	}
	return s
}

// Probing reports whether the prober runs active checks (Config.NoProbes
// off).
func (p *Prober) Probing() bool { return !p.cfg.NoProbes }

// ReportSuccess records a request that name served: its passive failure
// run ends.
func (p *Prober) ReportSuccess(name string) {
	if t := p.target(name); t != nil {
		t.mu.Lock()
		t.passive = 0
		t.mu.Unlock()
	}
}

// errNoReason stands in for a nil error in ReportFailure.
var errNoReason = errors.New("request failed")

// ReportFailure records a request to name that failed in a way the
// endpoint is to blame for (connect error, 5xx). EjectAfter of them in a
// row eject it; failures while it is ejected (requests already in flight)
// do not count.
func (p *Prober) ReportFailure(name string, err error) {
	if p.cfg.EjectAfter < 0 {
		return
	}
	if err == nil {
		err = errNoReason
	}
	t := p.target(name)
	if t == nil {
		return
	}
	now := p.cfg.Clock.Now()
	t.mu.Lock()
	if now.Before(t.ejectedUntil) {
		t.mu.Unlock()
		return
	}
	t.passive++
	t.lastErr, t.lastErrAt = err.Error(), now
	due := t.passive >= p.cfg.EjectAfter
	t.mu.Unlock()
	if due {
		p.eject(t, err)
	}
}

// eject ejects t unless MaxEjectedPercent of the endpoints already are.
func (p *Prober) eject(t *target, cause error) {
	p.ejectMu.Lock()
	defer p.ejectMu.Unlock()
	now := p.cfg.Clock.Now()
	p.mu.RLock()
	total, ejected := len(p.targets), 0
	for _, o := range p.targets {
		o.mu.Lock()
		if now.Before(o.ejectedUntil) {
			ejected++
		}
		o.mu.Unlock()
	}
	p.mu.RUnlock()

	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Before(t.ejectedUntil) || t.passive < p.cfg.EjectAfter {
		return // ejected meanwhile, or a success came in between
	}
	if (ejected+1)*100 > p.cfg.MaxEjectedPercent*total {
		p.cfg.Logger.Warn("health: ejection skipped: too many endpoints ejected",
			"endpoint", t.ep.Name, "ejected", ejected, "endpoints", total, "max_percent", p.cfg.MaxEjectedPercent)
		return
	}
	// A run of ejections is forgiven once the endpoint has stayed in for
	// EjectMax since the last one ended.
	if !t.ejectedUntil.IsZero() && now.Sub(t.ejectedUntil) >= p.cfg.EjectMax {
		t.ejections = 0
	}
	d := p.cfg.EjectBase
	for i := 0; i < t.ejections && d < p.cfg.EjectMax; i++ {
		d *= 2
	}
	d = min(d, p.cfg.EjectMax)
	t.ejections++
	t.ejectedUntil = now.Add(d)
	t.passive = 0
	p.cfg.Logger.Warn("health: endpoint ejected", "endpoint", t.ep.Name, "for", d, "ejections", t.ejections, "err", cause)
}
