package health

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/engineauth"
	"github.com/kvgate/kvgate/internal/enginemetrics"
)

// Defaults of Config (see docs/discovery.md).
const (
	DefaultInterval          = 2 * time.Second
	DefaultTimeout           = time.Second
	DefaultFailAfter         = 2
	DefaultRecoverAfter      = 1
	DefaultHealthPath        = "/health"
	DefaultEjectAfter        = 3
	DefaultEjectBase         = 5 * time.Second
	DefaultEjectMax          = 2 * time.Minute
	DefaultMaxEjectedPercent = 50
)

// Config configures a Prober. Zero values take the defaults above.
type Config struct {
	// Interval between the probes of one endpoint, in [10ms, 1h].
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds each request of a probe (/health, /v1/models, then
	// /metrics), in
	// [1ms, 10m].
	Timeout time.Duration `yaml:"timeout"`
	// FailAfter consecutive failed probes take an endpoint out;
	// RecoverAfter consecutive successful ones bring it back. Both in
	// [1, 1000].
	FailAfter    int `yaml:"fail_after"`
	RecoverAfter int `yaml:"recover_after"`
	// HealthPath is what a probe GETs; any 2xx is healthy.
	HealthPath string `yaml:"health_path"`
	// NoMetrics turns the /metrics scrape off.
	NoMetrics bool `yaml:"no_metrics"`
	// NoModels turns off listing the engine's LoRA adapters (GET
	// /v1/models every fifth probe), which the gateway serves besides the
	// ones endpoints declare.
	NoModels bool `yaml:"no_models"`
	// Scraper reads /metrics; nil: one with Timeout and Client.
	Scraper *enginemetrics.Scraper `yaml:"-"`
	// Client makes the health requests; nil: a client of its own.
	Client *http.Client `yaml:"-"`

	// Passive ejection, from the proxy's ReportFailure: EjectAfter
	// consecutive failures (in [1, 1e6]; negative: never eject) eject an
	// endpoint for EjectBase, doubled for each ejection that follows within
	// EjectMax of the previous one ending, capped at EjectMax.
	EjectAfter int           `yaml:"eject_after"`
	EjectBase  time.Duration `yaml:"eject_base"` // in [1ms, 24h]
	EjectMax   time.Duration `yaml:"eject_max"`  // in [EjectBase, 24h]
	// MaxEjectedPercent bounds the share of endpoints ejected at once, in
	// [1, 100]: an ejection that would pass it is not made (a fleet-wide
	// failure is more likely the gateway's or the network's).
	MaxEjectedPercent int `yaml:"max_ejected_percent"`

	// APIKey, when set, authenticates the probes ("Authorization:
	// Bearer KEY"): an engine run with --api-key refuses /v1/models
	// without it.
	APIKey string `yaml:"-"`
	// NoProbes turns the active checks off (no /health, /v1/models or
	// /metrics requests: every endpoint is healthy) and keeps passive
	// ejection: kvgate serve's --no-health-checks.
	NoProbes bool `yaml:"-"`

	// Clock is the time source; nil: SystemClock.
	Clock Clock `yaml:"-"`
	// Logger; nil: slog.Default().
	Logger *slog.Logger `yaml:"-"`
}

// withDefaults fills zero fields and checks ranges.
// WithDefaults is c with its zero fields set to their defaults (c itself
// if it does not validate).
func (c Config) WithDefaults() Config {
	if d, err := c.withDefaults(); err == nil {
		d.Logger = nil
		return d
	}
	return c
}

// Check reports what New would refuse in c.
func (c Config) Check() error {
	_, err := c.withDefaults()
	return err
}

func (c Config) withDefaults() (Config, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	def(&c.Interval, DefaultInterval)
	def(&c.Timeout, DefaultTimeout)
	def(&c.EjectBase, DefaultEjectBase)
	def(&c.EjectMax, max(DefaultEjectMax, c.EjectBase))
	defInt(&c.FailAfter, DefaultFailAfter)
	defInt(&c.RecoverAfter, DefaultRecoverAfter)
	defInt(&c.EjectAfter, DefaultEjectAfter)
	defInt(&c.MaxEjectedPercent, DefaultMaxEjectedPercent)
	if c.HealthPath == "" {
		c.HealthPath = DefaultHealthPath
	}
	durs := []struct {
		name      string
		v, lo, hi time.Duration
	}{
		{"interval", c.Interval, 10 * time.Millisecond, time.Hour},
		{"timeout", c.Timeout, time.Millisecond, 10 * time.Minute},
		{"eject_base", c.EjectBase, time.Millisecond, 24 * time.Hour},
		{"eject_max", c.EjectMax, c.EjectBase, 24 * time.Hour},
	}
	for _, d := range durs {
		if d.v < d.lo || d.v > d.hi {
			return c, fmt.Errorf("health: %s %v out of range [%v, %v]", d.name, d.v, d.lo, d.hi)
		}
	}
	ints := []struct {
		name      string
		v, lo, hi int
	}{
		{"fail_after", c.FailAfter, 1, 1000},
		{"recover_after", c.RecoverAfter, 1, 1000},
		{"max_ejected_percent", c.MaxEjectedPercent, 1, 100},
	}
	for _, n := range ints {
		if n.v < n.lo || n.v > n.hi {
			return c, fmt.Errorf("health: %s %d out of range [%d, %d]", n.name, n.v, n.lo, n.hi)
		}
	}
	if c.EjectAfter > 1e6 {
		return c, fmt.Errorf("health: eject_after %d out of range [1, 1000000] (negative: never)", c.EjectAfter)
	}
	if c.HealthPath[0] != '/' {
		return c, fmt.Errorf("health: health_path %q must start with /", c.HealthPath)
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: engineauth.Transport(nil, c.APIKey)}
	}
	if c.Scraper == nil {
		c.Scraper = &enginemetrics.Scraper{Client: c.Client, Timeout: c.Timeout}
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}
