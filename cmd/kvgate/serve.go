package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/internal/discovery"
	"github.com/kvgate/kvgate/internal/engineauth"
	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/health"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/planner"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/tokens"
	"github.com/kvgate/kvgate/internal/yamlstrict"
)

// serveFlags are kvgate serve's flags; any flag given on the command line
// overrides the same field of --config.
type serveFlags struct {
	config, logLevel string
	engines, toks    listFlag
	syncPeers        listFlag
	set              map[string]bool
	disc             discoveryConfig // from flags
	k8s              k8sConfig
	loop             *planner.Loop  // the planner, when configured
	hup              chan os.Signal // SIGHUPs, caught from the start
}

// newServeFlagSet defines serve's flags over f and c; early and
// stepTokens are the config's early_reject and engine_step_tokens.
func newServeFlagSet(f *serveFlags, c *gateway.Config, early *bool, stepTokens *int, stderr io.Writer) (*flag.FlagSet, *flagrange.Flags) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	*early, *stepTokens = true, gateway.DefaultEngineStepTokens
	fs.StringVar(&f.config, "config", "", "YAML config file (docs/serve.md); flags given too override its fields; SIGHUP reloads it")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:8000", "client API address (OpenAI-compatible)")
	fs.StringVar(&c.Admin, "admin", "127.0.0.1:8090", "admin API and /metrics address (keep it private)")
	fs.Var(&f.engines, "engine", "an engine: name=N,url=http://HOST:PORT,model=M,role=both|prefill|decode[,lora=ADAPTER: a LoRA adapter it serves, repeated for each; requests naming it go to the model's endpoints that serve it][,events=tcp://HOST:PORT][,replay=tcp://HOST:PORT][,prefill_speed=TOK_PER_S][,dp_size=RANKS: one endpoint a data-parallel rank, pinned with X-Data-Parallel-Rank][,bootstrap_port=PORT: an SGLang prefill engine's, for SGLang's P/D protocol] (repeatable)")
	fs.Var(&f.toks, "tokenizer", "tokenizer spec as for kvgate kvindex: [model=M,]source=estimate|engine|local[,url=URL][,file=PATH][,template=T][,exact_chat=false][,inline_system=auto|preserve|fold|hoist] (repeatable; source=engine renders chats with the engine's template unless exact_chat=false, and asks the model's other engines when url='s cannot answer or is out; without url= a model's engines; inline_system: where the engines put a Messages request's system messages inside messages, as vLLM's --anthropic-inline-system)")
	fs.StringVar(&c.Policy, "policy", "kvgate", "routing policy: "+strings.Join(sched.Names(), ", "))
	fs.StringVar(&c.Predictor, "predictor", gateway.PredictorLearned, "latency predictor: learned (online, from observed first tokens and TPOTs) or analytic (configured prefill speeds, observed mean TPOT)")
	fs.BoolVar(early, "early-reject", true, "reject (429) requests predicted to miss their SLO before any compute")
	fs.StringVar(&c.Displace, "displace", gateway.HoldPolicy, "with early rejection, a request rejected for the load takes the place of a queued request that has not started its prefill and would compute more: that one's upstream request is aborted and its client gets the 429 (docs/policies.md, \"Displacement\"): policy (the policies meant to: kvgate), on or off")
	fs.StringVar(&c.Hold.Mode, "hold", gateway.HoldPolicy, "hold at the router requests that fit nowhere until an endpoint has slack or their deadline (with early rejection: those that miss their SLO even on an idle endpoint, served on an idle endpoint of a quiet fleet, which they give up to a request that would otherwise be rejected, or rejected at their deadline; docs/policies.md): policy (the policies meant to: kvgate), on or off")
	fs.StringVar(&c.BindEvents, "bind-events", "", "central KV events: bind a SUB here (e.g. tcp://0.0.0.0:5557) for engines that dial")
	fs.StringVar(&c.Sync.Bind, "sync-bind", "", "several gateway replicas: publish this replica's requests in flight on a ZMQ PUB here (e.g. tcp://0.0.0.0:5600) for the other replicas (docs/serve.md, \"Several gateway replicas\")")
	fs.Var(&f.syncPeers, "sync-peer", "several gateway replicas: another replica's --sync-bind address (tcp://HOST:PORT) whose requests in flight this replica counts in its endpoints' load (repeatable)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.LogPrompts, "log-prompts", false, "log request bodies at debug level (prompts are not logged by default)")
	fs.BoolVar(&c.NoLoRASlots, "no-lora-slots", false, "do not keep a LoRA adapter's requests off engines whose batch has no place for it (with several replicas in front of one fleet, sync them instead: --sync-bind, --sync-peer)")
	fs.StringVar(&f.disc.File, "endpoints-file", "", "discovery: YAML file of endpoints (endpoints: [...]) watched for changes")
	fs.StringVar(&f.k8s.Selector, "k8s-selector", "", "discovery: Kubernetes pods matching this label selector (e.g. app=vllm)")
	fs.StringVar(&f.k8s.Namespace, "k8s-namespace", "default", "discovery: Kubernetes namespace of --k8s-selector")
	fs.StringVar(&f.k8s.PortName, "k8s-port-name", "", "discovery: the pods' container port name of the HTTP API (or --k8s-port)")
	fs.StringVar(&f.k8s.Model, "k8s-model", "", "discovery: model of pods without the kvgate.io/model label or annotation")
	fs.StringVar(&f.k8s.Kubeconfig, "kubeconfig", "", "discovery: kubeconfig file (default: in-cluster)")
	fs.BoolVar(&c.NoHealthChecks, "no-health-checks", false, "do not probe the endpoints' /health, /v1/models and /metrics (every endpoint is taken as healthy; one whose requests fail is still ejected for a while)")
	fs.StringVar(&c.FairnessHeader, "fairness-header", gateway.DefaultFairnessHeader, "the header naming a request's tenant: with early rejection, when a tenant's request is rejected for the load, for a second tenants with more prompt tokens in flight are admitted only while they leave the room it lacked; without, held requests are served by tenant in turn (docs/serve.md, \"Tenants\")")
	fs.BoolVar(&c.NoStreamUpstream, "no-stream-upstream", false, "send a chat, completion, Responses or Messages request the client did not stream to its engine as sent; by default the engine streams it and the gateway answers whole, so that its first token and TPOT are observed (docs/serve.md, \"Whole answers from streams\")")
	fs.BoolVar(&c.NoFairness, "no-fairness", false, "treat tenants alike: keep no room for tenants turned away from tenants with more in flight (early rejection), and hold requests in arrival order, not by tenant in turn (without)")
	fl := flagrange.New(fs)
	flagrange.Var(fl, &f.k8s.Port, "k8s-port", flagrange.Range[int]{Min: 1, Max: 65535, Zero: "use --k8s-port-name"}, "discovery: the pods' HTTP port")
	lim := gateway.ConfigLimits()
	c.SLOTTFT, c.BlockSize, c.PrefillSpeed, c.MaxInflight, c.ConnectTimeout, c.BindEventsRanks = 2, tokens.DefaultBlockSize, 20000, 10000, 2*time.Second, 1
	c.ShutdownGrace = 30 * time.Second
	flagrange.Var(fl, &c.SLOTTFT, "slo-ttft", lim.SLOTTFT, "TTFT SLO (seconds) of the one class there is without classes: in --config (with classes:, an error: give each class its ttft)")
	flagrange.Var(fl, &c.SLOTPOT, "slo-tpot", lim.SLO, "TPOT SLO (seconds) of the one class there is without classes: in --config (with classes:, an error: give each class its tpot)")
	flagrange.Var(fl, &c.BlockSize, "block-size", lim.BlockSize, "router block size")
	flagrange.Var(fl, &c.PrefillSpeed, "prefill-speed", lim.PrefillSpeed, "prompt tokens/s assumed for endpoints without prefill_speed")
	flagrange.Var(fl, stepTokens, "engine-step-tokens", lim.EngineStepTokens, "the engines' chunked-prefill step budget (vLLM's --max-num-batched-tokens): the kvgate policy queues a request where its first chunk would share the step ending the queue and push a first token due in it past its SLO only when no other endpoint fits, and admission adds the learned step slack to the pessimistic TTFT of a request that would queue (docs/predictor.md); 0: neither")
	flagrange.Var(fl, &c.LocalPrefillTokens, "local-prefill-tokens", lim.LocalPrefillTokens, "P/D: serve on the decode endpoint alone when at most this many prompt tokens are uncached there")
	flagrange.Var(fl, &c.MaxInflight, "max-inflight", lim.MaxInflight, "requests proxied at once; more get 429")
	flagrange.Var(fl, &c.UpstreamTimeout, "upstream-timeout", lim.UpstreamTimeout, "bound on a whole proxied request, from its first send to an engine: its retry and migrations share it (time held at the router is not counted)")
	flagrange.Var(fl, &c.ConnectTimeout, "connect-timeout", lim.ConnectTimeout, "bound on connecting to an engine")
	flagrange.Var(fl, &c.ShutdownGrace, "shutdown-grace", lim.ShutdownGrace, "at SIGTERM or SIGINT, how long the requests in flight have to finish (no new connection is accepted meanwhile; a second signal cuts them)")
	flagrange.Var(fl, &c.StreamIdleTimeout, "stream-idle-timeout", lim.StreamIdleTimeout, "bound on an engine's silence once its answer's first bytes came: longer, the attempt is broken (continued elsewhere with --migration-limit; an answer assembled whole is sent again) and the engine reported to health")
	flagrange.Var(fl, &c.MigrationLimit, "migration-limit", lim.MigrationLimit, "times a stream whose engine fails after it began is continued on another engine, the text so far sent back as the answer's start (docs/serve.md, \"Migration\")")
	flagrange.Var(fl, &c.BindEventsRanks, "bind-events-ranks", lim.BindEventsRanks, "central KV events: bind this many SUBs, at --bind-events' port + 0 … N-1, for data-parallel engines (dp_size) whose rank R dials the port + R")
	c.HTTP.MaxBodyBytes, c.HTTP.MaxConns = 32<<20, 8192
	body := lim.MaxBodyBytes
	body.Zero = "built-in"
	httpserve.AddFlagsBody(fl, &c.HTTP, body)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvgate serve [flags]\n\nRuns the gateway: an OpenAI-compatible proxy that routes each request to the\nprefill and decode engines predicted to serve it fastest, rejecting early what\ncannot meet its SLO. Endpoints come from --engine flags or --config.\n\nFlags:")
		fs.PrintDefaults()
		fmt.Fprintln(stderr, "\nEnvironment:\n  KVGATE_ENGINE_API_KEY\n    \tthe engines' API key (vLLM's --api-key), sent on every request to them; or engine_api_key in --config (docs/serve.md, \"Engines\")")
	}
	return fs, fl
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f serveFlags
	var c gateway.Config
	var early bool
	var stepTokens int
	fs, fl := newServeFlagSet(&f, &c, &early, &stepTokens, stderr)
	if err := parseFlags(fs, fl, args); err != nil {
		return err
	}
	// SIGHUP is caught from here on, so that one sent while the gateway
	// starts (a reloader firing at pod start) waits for the reload loop
	// instead of killing the process (its default action).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	f.hup = hup
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	c.EarlyReject = &early
	c.EngineStepTokens = &stepTokens
	sc, err := f.load(c)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	srcs, err := sc.Discovery.sources(log)
	if err != nil {
		return err
	}
	// The prober also ejects endpoints whose requests fail (passive
	// ejection), which --no-health-checks keeps: without it every
	// request went to a dead endpoint first, while the metrics called it
	// eligible.
	hc := sc.Health
	hc.Logger, hc.NoProbes, hc.APIKey = log, sc.NoHealthChecks, sc.EngineAPIKey
	prober, err := health.New(hc)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	defer prober.Close()
	rec, err := newPlannerRecorder(sc.Planner)
	if err != nil {
		return err
	}
	gopts := gateway.Options{Logger: log, Health: prober}
	if rec != nil {
		gopts.Traffic = trafficRecorder{rec}
	}
	g, err := gateway.New(sc.Config, gopts)
	if err != nil {
		return err
	}
	u := &fleetUnion{static: sc.Endpoints, latest: map[int][]fleet.Endpoint{}, g: g, log: log}
	if sc.Planner != nil {
		if len(sc.Sync.Peers) > 0 {
			log.Warn("planner: this replica has sync peers; run the planner on one replica only (each sees its own share of the traffic, and two engine actuators would switch the same engines)")
		}
		if f.loop, err = newPlannerLoop(sc.Planner, rec, g, u, sc.PrefillSpeed, len(srcs) > 0, log); err != nil {
			return err
		}
	}
	return serveGateway(ctx, g, sc, srcs, u, &f, c, stdout, log)
}

// overK8s applies the --k8s-* flags given over the config's
// discovery.kubernetes, field by field (the file's other fields kept); a
// section that only flags make needs --k8s-selector.
func (f *serveFlags) overK8s(d *discoveryConfig) error {
	over := map[string]func(k *k8sConfig){
		"k8s-selector": func(k *k8sConfig) { k.Selector = f.k8s.Selector }, "k8s-namespace": func(k *k8sConfig) { k.Namespace = f.k8s.Namespace },
		"k8s-port-name": func(k *k8sConfig) { k.PortName = f.k8s.PortName }, "k8s-port": func(k *k8sConfig) { k.Port = f.k8s.Port },
		"k8s-model": func(k *k8sConfig) { k.Model = f.k8s.Model }, "kubeconfig": func(k *k8sConfig) { k.Kubeconfig = f.k8s.Kubeconfig },
	}
	var given []string
	for name := range over {
		if f.set[name] {
			given = append(given, "--"+name)
		}
	}
	if len(given) == 0 {
		return nil
	}
	if d.Kubernetes == nil {
		if !f.set["k8s-selector"] {
			slices.Sort(given)
			return fmt.Errorf("%s: Kubernetes discovery needs --k8s-selector (or discovery.kubernetes in --config)", strings.Join(given, ", "))
		}
		d.Kubernetes = &k8sConfig{Namespace: f.k8s.Namespace}
	}
	for name, set := range over {
		if f.set[name] {
			set(d.Kubernetes)
		}
	}
	return nil
}

// load builds the config: the file (if any), then the flags given.
func (f *serveFlags) load(flags gateway.Config) (serveConfig, error) {
	var sc serveConfig
	if f.config != "" {
		data, err := readConfig(f.config)
		if err != nil {
			return sc, fmt.Errorf("--config: %w", err)
		}
		if sc, err = parseServeConfig(data); err != nil {
			return sc, fmt.Errorf("--config %s: %w", f.config, err)
		}
	}
	if f.disc.File != "" {
		sc.Discovery.File = f.disc.File
	}
	if err := f.overK8s(&sc.Discovery); err != nil {
		return sc, err
	}
	c := &sc.Config
	over := map[string]func(){
		"listen": func() { c.Listen = flags.Listen }, "admin": func() { c.Admin = flags.Admin },
		"policy": func() { c.Policy = flags.Policy }, "slo-ttft": func() { c.SLOTTFT = flags.SLOTTFT },
		"predictor": func() { c.Predictor = flags.Predictor }, "hold": func() { c.Hold.Mode = flags.Hold.Mode },
		"displace": func() { c.Displace = flags.Displace },
		"slo-tpot": func() { c.SLOTPOT = flags.SLOTPOT }, "early-reject": func() { c.EarlyReject = flags.EarlyReject },
		"bind-events": func() { c.BindEvents = flags.BindEvents }, "bind-events-ranks": func() { c.BindEventsRanks = flags.BindEventsRanks }, "block-size": func() { c.BlockSize = flags.BlockSize },
		"prefill-speed": func() { c.PrefillSpeed = flags.PrefillSpeed }, "engine-step-tokens": func() { c.EngineStepTokens = flags.EngineStepTokens }, "local-prefill-tokens": func() { c.LocalPrefillTokens = flags.LocalPrefillTokens },
		"max-inflight": func() { c.MaxInflight = flags.MaxInflight }, "log-prompts": func() { c.LogPrompts = flags.LogPrompts },
		"no-lora-slots":      func() { c.NoLoRASlots = flags.NoLoRASlots },
		"sync-bind":          func() { c.Sync.Bind = flags.Sync.Bind },
		"sync-peer":          func() { c.Sync.Peers = append([]string(nil), f.syncPeers...) },
		"no-health-checks":   func() { c.NoHealthChecks = flags.NoHealthChecks },
		"fairness-header":    func() { c.FairnessHeader = flags.FairnessHeader },
		"no-fairness":        func() { c.NoFairness = flags.NoFairness },
		"no-stream-upstream": func() { c.NoStreamUpstream = flags.NoStreamUpstream },
		"upstream-timeout":   func() { c.UpstreamTimeout = flags.UpstreamTimeout }, "connect-timeout": func() { c.ConnectTimeout = flags.ConnectTimeout },
		"shutdown-grace":      func() { c.ShutdownGrace = flags.ShutdownGrace },
		"stream-idle-timeout": func() { c.StreamIdleTimeout = flags.StreamIdleTimeout },
		"migration-limit":     func() { c.MigrationLimit = flags.MigrationLimit },
	}
	httpFlags := map[string]func(){
		"max-body-bytes": func() { c.HTTP.MaxBodyBytes = flags.HTTP.MaxBodyBytes }, "http-max-conns": func() { c.HTTP.MaxConns = flags.HTTP.MaxConns },
		"http-read-header-timeout": func() { c.HTTP.ReadHeaderTimeout = flags.HTTP.ReadHeaderTimeout }, "http-read-timeout": func() { c.HTTP.ReadTimeout = flags.HTTP.ReadTimeout },
		"http-write-timeout": func() { c.HTTP.WriteTimeout = flags.HTTP.WriteTimeout }, "http-idle-timeout": func() { c.HTTP.IdleTimeout = flags.HTTP.IdleTimeout },
		"http-max-header-bytes": func() { c.HTTP.MaxHeaderBytes = flags.HTTP.MaxHeaderBytes }, "http-large-body-bytes": func() { c.HTTP.LargeBodyBytes = flags.HTTP.LargeBodyBytes },
		"http-max-large-bodies": func() { c.HTTP.MaxLargeBodies = flags.HTTP.MaxLargeBodies }, "http-large-body-wait": func() { c.HTTP.LargeBodyWait = flags.HTTP.LargeBodyWait },
	}
	for name, apply := range httpFlags {
		over[name] = apply
	}
	for name, apply := range over {
		if f.set[name] || f.config == "" {
			apply()
		}
	}
	for _, s := range f.engines {
		e, err := fleet.ParseSpec(s)
		if err != nil {
			return sc, fmt.Errorf("--engine: %w", err)
		}
		c.Endpoints = append(c.Endpoints, e)
	}
	c.Tokenizers = append(c.Tokenizers, f.toks...)
	if c.EngineAPIKey == "" {
		c.EngineAPIKey = os.Getenv(engineauth.EnvVar) // as vLLM reads VLLM_API_KEY
	}
	if len(c.Endpoints) == 0 && !sc.Discovery.any() {
		return sc, errors.New("no endpoints: give --engine (repeatable), --endpoints-file, --k8s-selector, or endpoints:/discovery: in --config")
	}
	if err := c.CheckClassTargets(); err != nil {
		return sc, err
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return sc, err
	}
	return sc, nil
}

// maxConfigBytes bounds kvgate serve's config file.
const maxConfigBytes = 4 << 20

// readConfig reads a config file of at most maxConfigBytes: a regular
// file (a FIFO blocked the start for ever, /dev/zero ran out of memory),
// read no further than the bound (a 100 MB file was read whole first).
func readConfig(path string) ([]byte, error) {
	// Checked before it is opened too: opening a FIFO blocks until a
	// writer comes (the check after the open never ran, and the start hung
	// deaf to SIGTERM; walkthrough, 2026-12-04).
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	if st, err := fh.Stat(); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(fh, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxConfigBytes)
	}
	return data, nil
}

// parseServeConfig parses kvgate serve's YAML file; unknown fields are
// errors.
func parseServeConfig(data []byte) (serveConfig, error) {
	var sc serveConfig
	if len(data) > maxConfigBytes {
		return sc, fmt.Errorf("config is %d bytes; at most 4 MiB", len(data))
	}
	if err := yamlstrict.Decode(data, &sc); err != nil {
		return sc, err
	}
	return sc, nil
}

// serveGateway listens, serves until ctx ends, and reloads the config
// file on SIGHUP.
func serveGateway(ctx context.Context, g *gateway.Gateway, sc serveConfig, srcs []discovery.Source, u *fleetUnion,
	f *serveFlags, flags gateway.Config, stdout io.Writer, log *slog.Logger) error {
	cfg := sc.Config
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	aln, err := net.Listen("tcp", cfg.Admin)
	if err != nil {
		ln.Close()
		return fmt.Errorf("admin: %w", err)
	}
	srv, err := httpserve.New(cfg.HTTP, g.Handler())
	if err != nil {
		return err
	}
	adm, err := httpserve.New(httpserve.Config{}, withPlanner(g.AdminHandler(), f.loop))
	if err != nil {
		return err
	}
	// The gateway's own loops (release, sync, KV events, discovery) run
	// on until the requests in flight have drained (drain); the planner
	// stops at the signal.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	errc := make(chan error, 4)
	go func() { errc <- g.Run(runCtx) }()
	if f.loop != nil {
		go func() { _ = f.loop.Run(ctx) }()
	}
	if len(srcs) > 0 {
		go func() {
			if err := runDiscovery(runCtx, srcs, u); err != nil {
				errc <- err // its sources name themselves (discovery:, k8s:)
			}
		}()
	}
	go func() { errc <- fmt.Errorf("serve: %w", srv.Serve(ln)) }()
	go func() { errc <- fmt.Errorf("admin: %w", adm.Serve(aln)) }()
	if err := awaitSyncBound(g, cfg, errc); err != nil {
		cancel()
		_ = srv.Close()
		_ = adm.Close()
		return err
	}
	eps := fmt.Sprintf("%d endpoint(s)", len(cfg.Endpoints))
	if len(srcs) > 0 { // the discovered ones come later (GET /admin/endpoints)
		eps = fmt.Sprintf("%d configured endpoint(s) and %d discovery source(s)", len(cfg.Endpoints), len(srcs))
	}
	fmt.Fprintf(stdout, "kvgate serve: OpenAI API on http://%s, admin on http://%s, %s, policy %s\n",
		ln.Addr(), aln.Addr(), eps, cfg.Policy)
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-errc:
			runErr = err
			break loop
		case <-f.hup:
			reload(g, sc, u, f, flags, log)
		}
	}
	drain(srv, cfg.ShutdownGrace, log)
	cancel()
	sctx, done := context.WithTimeout(context.Background(), time.Second)
	defer done()
	_ = adm.Shutdown(sctx) // the admin API (metrics) answered during the drain
	if errors.Is(runErr, http.ErrServerClosed) {
		runErr = nil
	}
	return runErr
}

// awaitSyncBound waits, at most 5 s, for the replica sync's PUB to be
// bound when the config binds one, so that a bind that fails is told
// before the ready line, not after it (a walkthrough's script waited for
// the line and the gateway then exited); an error of the gateway's loops
// meanwhile is returned.
func awaitSyncBound(g *gateway.Gateway, cfg gateway.Config, errc <-chan error) error {
	if cfg.Sync.Bind == "" {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.SyncAddr() == "" && time.Now().Before(deadline) {
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// drain stops srv accepting connections and waits, at most grace, for
// the requests in flight to finish (streams to their end); a second
// SIGTERM or SIGINT, or the grace's end, cuts the rest. Until 2026-12-05
// the gateway's loops stopped at the signal and streams were cut after
// 5 s (a walkthrough's 1 000-token stream ended without its [DONE]).
func drain(srv *httpserve.Server, grace time.Duration, log *slog.Logger) {
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	sctx, done := context.WithTimeout(context.Background(), grace)
	defer done()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(sctx) }()
	log.Info("kvgate serve: stopping: no new connections; the requests in flight have until the grace ends", "grace", grace)
	select {
	case err := <-shut:
		if err == nil {
			log.Info("kvgate serve: drained")
			return
		}
		log.Warn("kvgate serve: the grace ended with requests in flight; they are cut", "grace", grace)
	case <-again:
		log.Warn("kvgate serve: second signal: the requests in flight are cut")
		done()
		<-shut
	}
	_ = srv.Close()
}

func reload(g *gateway.Gateway, running serveConfig, u *fleetUnion, f *serveFlags, flags gateway.Config, log *slog.Logger) {
	if f.config == "" {
		log.Warn("SIGHUP: no --config to reload")
		return
	}
	next, err := f.load(flags)
	if err == nil {
		var restart []string
		err = u.reload(next.Endpoints, func(routed []fleet.Endpoint) error {
			next.Endpoints = routed
			var rerr error
			restart, rerr = g.Reload(next.Config)
			return rerr
		})
		if !reflect.DeepEqual(next.Discovery, running.Discovery) {
			restart = append(restart, "discovery")
		}
		if !reflect.DeepEqual(next.Planner, running.Planner) {
			restart = append(restart, "planner")
		}
		if err == nil && len(restart) > 0 {
			log.Warn("config reloaded; these fields need a restart and keep their running values", "fields", restart)
		}
	}
	if err != nil {
		g.ReloadRefused()
		log.Error("config reload refused; the running config is kept", "err", err)
		return
	}
	log.Info("config reloaded", "file", f.config)
}
