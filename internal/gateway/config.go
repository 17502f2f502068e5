package gateway

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/kvgate/kvgate/internal/engineauth"
	"github.com/kvgate/kvgate/internal/replicasync"
	"github.com/kvgate/kvgate/internal/yamlstrict"

	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/tokens"
)

// Config is everything the gateway needs; `kvgate serve` fills it from
// flags or from a YAML file (docs/serve.md documents every field).
type Config struct {
	Listen string `yaml:"listen"`
	Admin  string `yaml:"admin"`

	Endpoints  []fleet.Endpoint `yaml:"endpoints"`
	Tokenizers []string         `yaml:"tokenizers"` // tokens.ParseSpec form

	Policy string `yaml:"policy"`
	// Predictor is how the gateway predicts prefill time and decode TPOT:
	// "learned" (default: learned online from observed first tokens and
	// stream TPOTs, starting from the configured speeds) or "analytic"
	// (configured prefill speeds; the observed mean TPOT per endpoint).
	Predictor   string `yaml:"predictor"`
	EarlyReject *bool  `yaml:"early_reject"`
	// Displace, with early rejection: a request rejected for the load
	// takes the place of a queued request that has not started its
	// prefill and would compute more (sched.Scheduler.DisplaceFor):
	// policy (the policies meant to: kvgate; the default), on or off.
	Displace string  `yaml:"displace"`
	SLOTTFT  float64 `yaml:"slo_ttft,omitempty"` // seconds; the default class's TTFT target
	SLOTPOT  float64 `yaml:"slo_tpot,omitempty"` // seconds; the default class's TPOT target
	// Classes are SLO classes chosen per request by the ClassHeader
	// header; without one a request gets DefaultClass.
	Classes      []Class `yaml:"classes"`
	DefaultClass string  `yaml:"default_class"`
	ClassHeader  string  `yaml:"class_header"`
	// FairnessHeader names a request's tenant (default llm-d's
	// X-Gateway-Inference-Fairness-Id; requests without it are one
	// tenant). With early rejection, when a tenant's request is rejected
	// for the load, tenants with more in flight are admitted for a second
	// only while they leave the room it lacked (fair.go); without it, the
	// hold queue serves tenants in turn (sched.fairTags). NoFairness
	// turns both off.
	FairnessHeader string `yaml:"fairness_header"`
	NoFairness     bool   `yaml:"no_fairness"`

	// BlockSize is the router's block size in tokens.
	BlockSize int `yaml:"block_size"`
	// PrefillSpeed is the prompt tokens per second assumed for endpoints
	// that do not declare their own.
	PrefillSpeed float64 `yaml:"prefill_speed"`
	// EngineStepTokens is the engines' chunked-prefill step budget
	// (vLLM's --max-num-batched-tokens; kvgate engine's
	// --max-num-batched-tokens): the router then tells when a request's
	// first chunk would share the step that ends an endpoint's queue and
	// push a first token due in it past its SLO (docs/policies.md). nil:
	// DefaultEngineStepTokens; 0: unknown, not considered.
	EngineStepTokens *int `yaml:"engine_step_tokens"`
	// LocalPrefillTokens: in a P/D fleet, a request whose uncached part on
	// the chosen decode endpoint is at most this many tokens is served by
	// that endpoint alone (conditional disaggregation); 0 disables.
	LocalPrefillTokens int `yaml:"local_prefill_tokens"`

	// BindEvents, when set, binds a ZMQ SUB that engines dial (central
	// mode).
	BindEvents string `yaml:"bind_events"`
	// BindEventsRanks binds that many SUBs in central mode, at
	// BindEvents' port + 0 … BindEventsRanks-1, for data-parallel engines
	// (dp_size) whose rank R dials the port + R (default 1).
	BindEventsRanks int `yaml:"bind_events_ranks"`

	// HTTP protects the client-facing server: timeouts, connection
	// limit, body cap (HTTP.MaxBodyBytes, default 32 MiB) and how many
	// large bodies are processed at once.
	HTTP            httpserve.Config `yaml:"http"`
	UpstreamTimeout time.Duration    `yaml:"upstream_timeout"` // whole request; 0: none
	ConnectTimeout  time.Duration    `yaml:"connect_timeout"`
	// ShutdownGrace bounds the drain at SIGTERM or SIGINT: no new
	// connection is accepted, and the requests in flight (streams
	// included) have this long to finish while the gateway keeps
	// routing, syncing and hearing KV events for them (default 30 s;
	// set it below the pod's terminationGracePeriodSeconds).
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// StreamIdleTimeout bounds the silence of an engine's answer once its
	// first bytes came (idle.go): longer, the attempt is broken (its
	// stream migrated with MigrationLimit); 0, the default: none.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// MigrationLimit is how many times a stream whose engine failed after
	// it began is continued on another engine (Dynamo's migration_limit;
	// migrate.go); 0, the default, never.
	MigrationLimit int `yaml:"migration_limit"`
	// NoStreamUpstream sends a chat or completion request the client did
	// not stream to its engine as the client sent it. By default the
	// engine is asked to stream it and the gateway answers whole
	// (whole.go), so that its first token and TPOT are observed.
	NoStreamUpstream bool `yaml:"no_stream_upstream"`
	// Health configures the active checks, passive ejection and /metrics
	// scraping of every endpoint (internal/health; kvgate serve runs it).
	Health health.Config `yaml:"health"`
	// EngineAPIKey, when set, is sent as "Authorization: Bearer KEY" on
	// every request to an engine (its clients' requests too: vLLM's and
	// SGLang's --api-key); kvgate serve also reads it from
	// KVGATE_ENGINE_API_KEY. GET /admin/config does not show it.
	EngineAPIKey string `yaml:"engine_api_key"`
	// NoHealthChecks turns the prober's active checks off: every
	// endpoint is taken as healthy (but for passive ejection, which stays)
	// and no engine metrics are read.
	NoHealthChecks bool `yaml:"no_health_checks"`
	// MaxInflight bounds requests being proxied at once; beyond it the
	// gateway answers 429 at once.
	MaxInflight int `yaml:"max_inflight"`
	// LogPrompts logs request bodies at debug level (off by default).
	LogPrompts bool `yaml:"log_prompts"`
	// NoLoRASlots turns the LoRA batch places off (lora.go,
	// keepLoRASlots). Several replicas in front of one fleet each count
	// only their own requests in flight unless Sync shares them
	// (docs/serve.md, "LoRA adapters").
	NoLoRASlots bool `yaml:"no_lora_slots"`
	// Hold configures the hold queue (without early rejection): requests
	// that fit nowhere wait at the gateway (docs/policies.md).
	Hold HoldConfig `yaml:"hold"`
	// Sync shares the in-flight load with the other gateway replicas in
	// front of the same fleet (internal/replicasync; docs/serve.md,
	// "Several gateway replicas").
	Sync replicasync.Config `yaml:"sync"`
}

// HoldConfig is the hold queue's configuration (sched.Scheduler.Hold).
type HoldConfig struct {
	// Mode: "policy" (default: the policies meant to hold, kvgate's),
	// "on" (every policy) or "off". Without early rejection it holds
	// requests that fit nowhere; with it, those that miss their SLO even
	// on an idle endpoint.
	Mode string `yaml:"mode"`
	// Min (SLOs), Backlog (× the fleet's backlog) and Max bound a held
	// request's deadline; Slack (SLOs) is when an endpoint has room for
	// an early release; Quiet (SLOs), with early rejection, is how long
	// no request must have been rejected for the load before a held one
	// is served on an idle endpoint (sched.Scheduler.HoldQuiet: earlier
	// while such investments come back). 0: sched's defaults.
	Min     float64       `yaml:"min_slos"`
	Backlog float64       `yaml:"backlog"`
	Max     time.Duration `yaml:"max"`
	Slack   float64       `yaml:"slack_slos"`
	Quiet   float64       `yaml:"quiet_slos"`
	// Touch, without early rejection: keep held requests' cached
	// prefixes warm with one-token requests (sched.Scheduler.TouchHeld;
	// experimental, off by default: docs/policies.md).
	Touch bool `yaml:"touch"`
	// TouchPriority is the vLLM priority touches are sent with (lower is
	// served earlier; 0: none sent). An engine run with
	// --scheduling-policy priority then serves a touch before the
	// requests queued ahead of it, so it refreshes its prefix before
	// they evict it; an engine without priority scheduling refuses any
	// priority but 0.
	TouchPriority int `yaml:"touch_priority"`
	// MaxRequests caps the requests held per model (default 4096);
	// beyond it a request that fits nowhere gets 429.
	MaxRequests int `yaml:"max_requests"`
}

// withDefaults is h with the scheduler's defaults in place of the
// zeros that ask for them (what runs: GET /admin/config).
func (h HoldConfig) withDefaults() HoldConfig {
	or := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	or(&h.Min, sched.DefaultHoldMin)
	or(&h.Backlog, sched.DefaultHoldBacklog)
	or(&h.Slack, sched.DefaultHoldSlack)
	or(&h.Quiet, sched.DefaultHoldQuiet)
	if h.Max == 0 {
		h.Max = time.Duration(sched.DefaultHoldMax * float64(time.Second))
	}
	return h
}

// Hold modes.
const (
	HoldPolicy = "policy"
	HoldOn     = "on"
	HoldOff    = "off"
)

// scheduler builds the scheduler the config asks for.
func (c *Config) scheduler(pol sched.Policy) *sched.Scheduler {
	h := c.Hold
	mode, _ := sched.ParseHoldMode(h.Mode) // checked by Validate
	displace, _ := sched.ParseHoldMode(c.Displace)
	sc := sched.HoldSettings{Mode: mode, Min: h.Min, Backlog: h.Backlog, Max: h.Max.Seconds(), Slack: h.Slack, Quiet: h.Quiet,
		Touch: h.Touch, Displace: displace}.
		Scheduler(pol, *c.EarlyReject)
	sc.Explain = true
	return sc
}

// Class is an SLO class.
type Class struct {
	Name string `yaml:"name"`
	// Priority: higher is more important. While a class is being
	// rejected for the load, every class of lower priority is rejected
	// too, so no lower class is admitted while a higher one is turned
	// away (classes of equal priority are not shed).
	Priority int `yaml:"priority"`
	// TTFT is the base TTFT target in seconds (0: none, never rejected
	// for TTFT); TTFTPerKToken adds seconds per 1 000 prompt tokens, so a
	// long prompt is not held to a short prompt's target.
	TTFT          float64 `yaml:"ttft"`
	TTFTPerKToken float64 `yaml:"ttft_per_1k_tokens"`
	TPOT          float64 `yaml:"tpot"`
}

// Limits are the ranges of a Config's numbers; Validate enforces them and
// kvgate serve registers its flags with them.
type Limits struct {
	SLO                flagrange.Range[float64]
	PrefillSpeed       flagrange.Range[float64]
	BlockSize          flagrange.Range[int]
	MaxBodyBytes       flagrange.Range[int64]
	MaxInflight        flagrange.Range[int]
	LocalPrefillTokens flagrange.Range[int]
	EngineStepTokens   flagrange.Range[int]
	UpstreamTimeout    flagrange.Range[time.Duration]
	ShutdownGrace      flagrange.Range[time.Duration]
	ConnectTimeout     flagrange.Range[time.Duration]
	StreamIdleTimeout  flagrange.Range[time.Duration]
	// SLOTTFT is slo_ttft's range: 0 is the default target, 2 s (a
	// class's ttft: 0 is no target; SLO is slo_tpot's).
	SLOTTFT           flagrange.Range[float64]
	MigrationLimit    flagrange.Range[int]
	HoldMin           flagrange.Range[float64]
	HoldBacklog       flagrange.Range[float64]
	HoldMax           flagrange.Range[time.Duration]
	HoldSlack         flagrange.Range[float64]
	HoldQuiet         flagrange.Range[float64]
	HoldRequests      flagrange.Range[int]
	HoldTouchPriority flagrange.Range[int]
	BindEventsRanks   flagrange.Range[int]
}

// ConfigLimits returns the ranges Validate enforces.
func ConfigLimits() Limits {
	return Limits{
		SLO:                flagrange.Range[float64]{Min: 0.001, Max: 3600, Unit: "seconds", Zero: "none"},
		SLOTTFT:            flagrange.Range[float64]{Min: 0.001, Max: 3600, Unit: "seconds", Zero: "the default, 2 s"},
		PrefillSpeed:       flagrange.Range[float64]{Min: 1, Max: fleet.MaxPrefillSpeed, Unit: "tokens/s"},
		BlockSize:          flagrange.Range[int]{Min: 1, Max: 4096, Unit: "tokens"},
		MaxBodyBytes:       flagrange.Range[int64]{Min: 1024, Max: 1 << 30, Unit: "bytes"},
		MaxInflight:        flagrange.Range[int]{Min: 1, Max: 1 << 20, Unit: "requests"},
		LocalPrefillTokens: flagrange.Range[int]{Min: 1, Max: 1 << 24, Unit: "tokens", Zero: "always disaggregate"},
		EngineStepTokens:   flagrange.Range[int]{Min: 1, Max: 1 << 24, Unit: "tokens", Zero: "unknown"},
		UpstreamTimeout:    flagrange.Range[time.Duration]{Min: time.Millisecond, Max: 24 * time.Hour, Zero: "none"},
		ConnectTimeout:     flagrange.Range[time.Duration]{Min: time.Millisecond, Max: time.Hour},
		ShutdownGrace:      flagrange.Range[time.Duration]{Min: time.Millisecond, Max: time.Hour},
		StreamIdleTimeout:  flagrange.Range[time.Duration]{Min: time.Millisecond, Max: 24 * time.Hour, Zero: "none"},
		MigrationLimit:     flagrange.Range[int]{Min: 1, Max: maxMigrations, Unit: "migrations", Zero: "never"},
		HoldMin:            flagrange.Range[float64]{Min: 0.01, Max: 1000, Unit: "SLOs", Zero: "default"},
		HoldBacklog:        flagrange.Range[float64]{Min: 0.01, Max: 1000, Zero: "default"},
		HoldMax:            flagrange.Range[time.Duration]{Min: time.Millisecond, Max: time.Hour, Zero: "default"},
		HoldSlack:          flagrange.Range[float64]{Min: 0.001, Max: 1, Unit: "SLOs", Zero: "default"},
		HoldQuiet:          flagrange.Range[float64]{Min: 0.001, Max: 100000, Unit: "SLOs", Zero: "default"},
		HoldRequests:       flagrange.Range[int]{Min: 1, Max: 1 << 20, Unit: "requests"},
		HoldTouchPriority:  flagrange.Range[int]{Min: math.MinInt32, Max: math.MaxInt32, Zero: "none sent"},
		BindEventsRanks:    flagrange.Range[int]{Min: 1, Max: fleet.MaxDPSize, Unit: "ports"},
	}
}

// DefaultEngineStepTokens is engine_step_tokens when the config does not
// say: vLLM's default --max-num-batched-tokens for an OpenAI API server,
// and kvgate engine's.
const DefaultEngineStepTokens = 8192

// engineStepTokens is EngineStepTokens, 0 when unset.
func (c *Config) engineStepTokens() int {
	if c.EngineStepTokens == nil {
		return 0
	}
	return *c.EngineStepTokens
}

const (
	defaultBodyBytes = 32 << 20
	// A gateway holds one connection per stream: more than an engine's
	// admin API.
	defaultMaxConns = 8192
)

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8000"
	}
	if c.Admin == "" {
		c.Admin = "127.0.0.1:8090"
	}
	if c.Policy == "" {
		c.Policy = "kvgate"
	}
	if c.Predictor == "" {
		c.Predictor = PredictorLearned
	}
	if c.EarlyReject == nil {
		on := true
		c.EarlyReject = &on
	}
	if c.SLOTTFT == 0 {
		c.SLOTTFT = 2
	}
	if c.BlockSize == 0 {
		c.BlockSize = tokens.DefaultBlockSize
	}
	if c.PrefillSpeed == 0 {
		c.PrefillSpeed = 20000
	}
	if c.EngineStepTokens == nil {
		n := DefaultEngineStepTokens
		c.EngineStepTokens = &n
	}
	if c.HTTP.MaxBodyBytes == 0 {
		c.HTTP.MaxBodyBytes = defaultBodyBytes
	}
	if c.HTTP.MaxConns == 0 {
		c.HTTP.MaxConns = defaultMaxConns
	}
	c.HTTP = c.HTTP.WithDefaults()
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 2 * time.Second
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 30 * time.Second
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = 10000
	}
	if c.BindEventsRanks == 0 {
		c.BindEventsRanks = 1
	}
	if c.Hold.Mode == "" {
		c.Hold.Mode = HoldPolicy
	}
	if c.Displace == "" {
		c.Displace = HoldPolicy
	}
	if c.Hold.MaxRequests == 0 {
		c.Hold.MaxRequests = 4096
	}
	if c.ClassHeader == "" {
		c.ClassHeader = "X-Kvgate-Class"
	}
	if c.FairnessHeader == "" {
		c.FairnessHeader = DefaultFairnessHeader
	}
	if len(c.Classes) == 0 {
		c.Classes = []Class{{Name: "standard", Priority: 1, TTFT: c.SLOTTFT, TPOT: c.SLOTPOT}}
	}
	if c.DefaultClass == "" {
		c.DefaultClass = c.Classes[0].Name
		for _, cl := range c.Classes {
			if cl.Name == "standard" {
				c.DefaultClass = cl.Name
			}
		}
	}
}

func finiteIn(name string, v, lo, hi float64) error {
	if math.IsNaN(v) || v < lo || v > hi {
		return fmt.Errorf("%s must be in [%g, %g], got %v", name, lo, hi, v)
	}
	return nil
}

// checkListen checks a HOST:PORT to listen on (a start binds it; a
// reload must refuse what a start would).
func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%q: port %q is not a number in [0, 65535]", addr, port)
	}
	if host != "" && net.ParseIP(host) == nil && strings.ContainsAny(host, " /\\") {
		return fmt.Errorf("%q: %q is not a host", addr, host)
	}
	return nil
}

// headerName reports whether s is an HTTP header name (RFC 9110's token).
func headerName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}

// CheckClassTargets refuses slo_ttft or slo_tpot given beside classes,
// before Defaults: they are the one class's targets when there are no
// classes, and with classes they were ignored in silence (a walkthrough
// set --slo-ttft 0.001 and its requests were held to 2 s).
func (c *Config) CheckClassTargets() error {
	if len(c.Classes) > 0 && (c.SLOTTFT != 0 || c.SLOTPOT != 0) {
		return errors.New("slo_ttft and slo_tpot (--slo-ttft, --slo-tpot) are the targets when there are no classes; with classes:, give each class its own ttft and tpot")
	}
	return nil
}

// Validate checks every field; errors name the field (and its flag).
func (c *Config) Validate() error {
	l := ConfigLimits()
	errs := []error{
		l.SLOTTFT.Check("slo_ttft (--slo-ttft)", c.SLOTTFT),
		l.SLO.Check("slo_tpot (--slo-tpot)", c.SLOTPOT),
		l.PrefillSpeed.Check("prefill_speed (--prefill-speed)", c.PrefillSpeed),
		l.BlockSize.Check("block_size (--block-size)", c.BlockSize),
		l.MaxBodyBytes.Check("http.max_body_bytes (--max-body-bytes)", c.HTTP.MaxBodyBytes),
		l.MaxInflight.Check("max_inflight (--max-inflight)", c.MaxInflight),
		l.LocalPrefillTokens.Check("local_prefill_tokens (--local-prefill-tokens)", c.LocalPrefillTokens),
		l.EngineStepTokens.Check("engine_step_tokens (--engine-step-tokens)", c.engineStepTokens()),
		l.UpstreamTimeout.Check("upstream_timeout (--upstream-timeout)", c.UpstreamTimeout),
		l.ConnectTimeout.Check("connect_timeout (--connect-timeout)", c.ConnectTimeout),
		l.ShutdownGrace.Check("shutdown_grace (--shutdown-grace)", c.ShutdownGrace),
		l.StreamIdleTimeout.Check("stream_idle_timeout (--stream-idle-timeout)", c.StreamIdleTimeout),
		l.MigrationLimit.Check("migration_limit (--migration-limit)", c.MigrationLimit),
		l.HoldMin.Check("hold.min_slos", c.Hold.Min),
		l.HoldBacklog.Check("hold.backlog", c.Hold.Backlog),
		l.HoldMax.Check("hold.max", c.Hold.Max),
		l.HoldSlack.Check("hold.slack_slos", c.Hold.Slack),
		l.HoldQuiet.Check("hold.quiet_slos", c.Hold.Quiet),
		l.HoldRequests.Check("hold.max_requests", c.Hold.MaxRequests),
		l.HoldTouchPriority.Check("hold.touch_priority", c.Hold.TouchPriority),
		l.BindEventsRanks.Check("bind_events_ranks (--bind-events-ranks)", c.BindEventsRanks),
	}
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range []struct{ field, name string }{{"class_header", c.ClassHeader}, {"fairness_header (--fairness-header)", c.FairnessHeader}} {
		if !headerName(h.name) {
			add(fmt.Errorf("%s: %q is not a header name (letters, digits and !#$%%&'*+-.^_`|~)", h.field, h.name))
		}
	}
	if _, err := sched.New(c.Policy, sched.Options{}); err != nil {
		add(fmt.Errorf("policy: %w", err))
	}
	add(c.Sync.Validate())
	if c.EngineAPIKey != "" {
		if err := engineauth.Check(c.EngineAPIKey); err != nil {
			add(fmt.Errorf("engine_api_key (%s): %w", engineauth.EnvVar, err))
		}
	}
	if _, err := sched.ParseHoldMode(c.Hold.Mode); err != nil {
		add(fmt.Errorf("hold.mode (--hold) %w", err))
	}
	if _, err := sched.ParseHoldMode(c.Displace); err != nil {
		add(fmt.Errorf("displace (--displace) %w", err))
	}
	if _, err := newPredictor(c.Predictor); err != nil {
		add(fmt.Errorf("predictor (--predictor): %w", err))
	}
	if err := c.HTTP.Validate(); err != nil {
		add(fmt.Errorf("http: %w", err))
	}
	eps, err := fleet.Validate(c.Endpoints)
	if err == nil {
		err = fleet.CheckCentralMode(c.BindEvents, c.BindEventsRanks, eps)
	}
	if err != nil {
		add(err)
	} else {
		c.Endpoints = eps
	}
	for i, s := range c.Tokenizers {
		sp, err := tokens.ParseSpec(s)
		if err == nil {
			err = tokens.CheckSpec(sp, true) // the gateway's models ask their engines
		}
		if err != nil {
			add(fmt.Errorf("tokenizers[%d]: %w", i, err))
		}
	}
	for _, a := range []struct{ field, addr string }{{"listen (--listen)", c.Listen}, {"admin (--admin)", c.Admin}} {
		if err := checkListen(a.addr); err != nil {
			add(fmt.Errorf("%s: %w", a.field, err))
		}
	}
	if b := c.BindEvents; b != "" {
		if err := checkListen(strings.TrimPrefix(b, "tcp://")); err != nil || !strings.HasPrefix(b, "tcp://") {
			add(fmt.Errorf("bind_events (--bind-events): %q is not tcp://HOST:PORT", b))
		}
	}
	if err := c.Health.Check(); err != nil {
		add(fmt.Errorf("health: %w", err))
	}
	add(c.validateClasses())
	return errors.Join(errs...)
}

func (c *Config) validateClasses() error {
	seen := map[string]bool{}
	for i, cl := range c.Classes {
		if cl.Name == "" || len(cl.Name) > 64 || strings.ContainsAny(cl.Name, " ,") || strings.ContainsFunc(cl.Name, unicode.IsControl) {
			// A control character cannot be sent in a header (Go's server
			// answers 400), and went into the metrics' class label.
			return fmt.Errorf("classes[%d].name %q must be 1-64 characters without spaces, commas or control characters", i, cl.Name)
		}
		if seen[cl.Name] {
			return fmt.Errorf("classes[%d].name %q is used twice", i, cl.Name)
		}
		seen[cl.Name] = true
		if cl.Priority < -1000 || cl.Priority > 1000 {
			return fmt.Errorf("classes[%d].priority must be in [-1000, 1000], got %d", i, cl.Priority)
		}
		for _, f := range []struct {
			n string
			v float64
		}{{"ttft", cl.TTFT}, {"ttft_per_1k_tokens", cl.TTFTPerKToken}, {"tpot", cl.TPOT}} {
			if err := finiteIn(fmt.Sprintf("classes[%d].%s", i, f.n), f.v, 0, 3600); err != nil {
				return err
			}
		}
	}
	if !seen[c.DefaultClass] {
		return fmt.Errorf("default_class %q is not one of the classes", c.DefaultClass)
	}
	return nil
}

// slo returns the class's SLO for a prompt of n tokens.
func (cl *Class) slo(n int) sched.SLO {
	s := sched.SLO{TTFT: cl.TTFT, TPOT: cl.TPOT}
	if s.TTFT > 0 && cl.TTFTPerKToken > 0 {
		s.TTFT += cl.TTFTPerKToken * float64(n) / 1000
	}
	return s
}

// ParseConfig parses a YAML config (docs/serve.md); unknown fields are
// errors. It does not fill defaults or validate: New and Reload do.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	if len(data) > maxConfigBytes {
		return c, fmt.Errorf("config is %d bytes; at most %d", len(data), maxConfigBytes)
	}
	if err := yamlstrict.Decode(data, &c); err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	return c, nil
}

const maxConfigBytes = 4 << 20
