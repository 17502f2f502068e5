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
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/engineauth"
	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
	"github.com/kvgate/kvgate/internal/yamlstrict"
)

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// enginesFile is the --engines YAML file: fleet endpoints, under
// "endpoints:" (as kvgate serve's files) or "engines:" (older files).
type enginesFile struct {
	Endpoints []fleet.Endpoint `yaml:"endpoints"`
	Engines   []fleet.Endpoint `yaml:"engines"`
}

func loadEnginesFile(path string) ([]fleet.Endpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--engines: %w", err)
	}
	var f enginesFile
	if err := yamlstrict.Decode(data, &f); err != nil {
		return nil, fmt.Errorf("--engines %s: %w", path, err)
	}
	eps, err := fleet.Validate(append(f.Endpoints, f.Engines...))
	if err != nil {
		return nil, fmt.Errorf("--engines %s: %w", path, err)
	}
	return eps, nil
}

// zmqEndpoint accepts host:port or a full ZMQ endpoint.
func zmqEndpoint(s string) string {
	if s == "" || strings.Contains(s, "://") {
		return s
	}
	return "tcp://" + s
}

// kvindexLimits are the ranges of kvgate kvindex's numeric flags.
type kvindexLimits struct {
	blockSize, maxKeys       flagrange.Range[int]
	approxTTL, replayTimeout flagrange.Range[time.Duration]
}

func kvindexRanges() kvindexLimits {
	return kvindexLimits{
		blockSize:     flagrange.Range[int]{Min: 1, Max: 4096, Unit: "tokens"},
		maxKeys:       flagrange.Range[int]{Min: 1024, Max: 1 << 26, Unit: "keys"},
		approxTTL:     flagrange.Range[time.Duration]{Min: time.Second, Max: 24 * time.Hour},
		replayTimeout: flagrange.Range[time.Duration]{Min: time.Millisecond, Max: 10 * time.Minute},
	}
}

// kvindexOptions are kvgate kvindex's flags.
type kvindexOptions struct {
	engineSpecs, tokenizers        listFlag
	enginesPath, bindEvents, admin string
	logLevel                       string
	blockSize, maxKeys             int
	approxTTL, replayTimeout       time.Duration
	replayBudget                   time.Duration
	maxCentral, maxRouted          int
	bindRanks                      int
	maxMsg                         int64
	http                           httpserve.Config
}

// newKVIndexFlagSet registers the kvindex flags on o, with their defaults
// and ranges.
func newKVIndexFlagSet(o *kvindexOptions, stderr io.Writer) (*flag.FlagSet, *flagrange.Flags) {
	*o = kvindexOptions{
		admin: "127.0.0.1:8090", logLevel: "info",
		blockSize: 16, approxTTL: 2 * time.Minute, maxKeys: 4 << 20, replayTimeout: 2 * time.Second,
		replayBudget: kvevents.DefaultReplayBudget, maxCentral: kvevents.DefaultMaxCentralEngines, maxMsg: kvevents.DefaultMaxMsgSize,
		maxRouted: kvindex.DefaultMaxRoutedEndpoints, bindRanks: 1,
		http: httpserve.Config{MaxBodyBytes: kvindex.DefaultMaxBodyBytes},
	}
	fs := flag.NewFlagSet("kvindex", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&o.engineSpecs, "engine", "an engine, as kvgate serve's: name=HOST:PORT,model=M[,events=tcp://HOST:PORT][,replay=tcp://HOST:PORT][,url=URL][,lora=ADAPTER…][,dp_size=N] (repeatable; lora= once per adapter)")
	fs.StringVar(&o.enginesPath, "engines", "", "YAML file listing engines (endpoints: [{name, model, events, replay}], as kvgate serve's files)")
	fs.StringVar(&o.bindEvents, "bind-events", "", "central mode: bind a SUB here (e.g. tcp://0.0.0.0:5557) that engines dial; engines are named by topic kv@HOST:PORT@MODEL, or, for another topic (vLLM's default is \"\"), by the IP they dial from when one configured engine without events= has it")
	fs.StringVar(&o.admin, "admin", o.admin, "admin HTTP address")
	fl := flagrange.New(fs)
	lim := kvindexRanges()
	flagrange.Var(fl, &o.blockSize, "block-size", lim.blockSize, "router block size in tokens")
	fs.Var(&o.tokenizers, "tokenizer", "tokenizer spec: [model=M,]source=estimate|engine|local[,url=URL][,file=PATH][,template=chatml|llama3|plain][,bytes_per_token=N][,exact_chat=false][,inline_system=auto|preserve|fold|hoist] (repeatable; without model= it is the default; source=engine renders chats with the engine's template unless exact_chat=false; inline_system: where the engines put a Messages request's system messages inside messages)")
	flagrange.Var(fl, &o.approxTTL, "approx-ttl", lim.approxTTL, "lifetime of approximate (routed) entries")
	flagrange.Var(fl, &o.maxKeys, "max-keys", lim.maxKeys, "bound on keys per index table (model × group × 64 endpoints × tier)")
	flagrange.Var(fl, &o.replayTimeout, "replay-timeout", lim.replayTimeout, "wait for each replay reply")
	flagrange.Var(fl, &o.replayBudget, "replay-budget", flagrange.Range[time.Duration]{Min: time.Millisecond, Max: time.Hour}, "longest whole replay (live events wait meanwhile)")
	flagrange.Var(fl, &o.maxCentral, "max-central-engines", flagrange.Range[int]{Min: 1, Max: 1 << 16, Unit: "engines"}, "central mode: most engines registered from topics")
	flagrange.Var(fl, &o.bindRanks, "bind-events-ranks", flagrange.Range[int]{Min: 1, Max: fleet.MaxDPSize, Unit: "ports"}, "central mode: bind this many SUBs, at --bind-events' port + 0 … N-1, for data-parallel engines (dp_size) whose rank R dials the port + R")
	flagrange.Var(fl, &o.maxMsg, "zmq-max-msg-bytes", flagrange.Range[int64]{Min: 1 << 10, Max: 1 << 30, Unit: "bytes"}, "largest ZMQ message accepted from an engine")
	fs.StringVar(&o.logLevel, "log-level", o.logLevel, "debug, info, warn or error")
	httpserve.AddFlags(fl, &o.http)
	flagrange.Var(fl, &o.maxRouted, "max-routed-endpoints", flagrange.Range[int]{Zero: "built-in, 1024", Min: 1, Max: kvindex.MaxEndpoints, Unit: "endpoints"}, "most endpoints registered for POST /admin/kv/routed to add one")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvgate kvindex [flags]\n\nRuns the KV-event subscriber, the global prefix index and its admin API\n(POST /admin/kv/lookup, POST /admin/kv/routed, GET /admin/kv/stats).\n\nFlags:")
		fs.PrintDefaults()
	}
	return fs, fl
}

// parseKVIndexFlags parses and range-checks the kvindex command line.
func parseKVIndexFlags(args []string, stderr io.Writer) (*kvindexOptions, error) {
	o := new(kvindexOptions)
	fs, fl := newKVIndexFlagSet(o, stderr)
	if err := parseFlags(fs, fl, args); err != nil {
		return nil, err
	}
	return o, nil
}

// engines collects the engines of --engines and every --engine, with
// their sockets normalised, and the endpoints they came from.
func (o *kvindexOptions) engines() ([]kvevents.EngineConfig, []fleet.Endpoint, error) {
	var eps []fleet.Endpoint
	if o.enginesPath != "" {
		es, err := loadEnginesFile(o.enginesPath)
		if err != nil {
			return nil, nil, err
		}
		eps = append(eps, es...)
	}
	for _, s := range o.engineSpecs {
		e, err := fleet.ParseSpec(s)
		if err != nil {
			return nil, nil, fmt.Errorf("--engine: %w", err)
		}
		eps = append(eps, e)
	}
	eps, err := fleet.Validate(eps)
	if err == nil {
		err = fleet.CheckCentralMode(o.bindEvents, o.bindRanks, eps)
	}
	if err != nil {
		return nil, nil, err
	}
	engines := make([]kvevents.EngineConfig, len(eps))
	for i, e := range eps {
		engines[i] = kvevents.EngineFor(e)
	}
	if len(engines) == 0 && o.bindEvents == "" {
		return nil, nil, errors.New("nothing to subscribe to: give --engine, --engines or --bind-events")
	}
	return engines, eps, nil
}

// adapters maps each LoRA adapter the endpoints serve to its base model
// (fleet.Validate let no two base models claim one).
func adapters(eps []fleet.Endpoint) func(string) (string, bool) {
	base := map[string]string{}
	for _, e := range eps {
		for _, a := range e.LoRA {
			base[a] = e.Model
		}
	}
	return func(name string) (string, bool) {
		b, ok := base[name]
		return b, ok
	}
}

// logEngines says at start what each engine will give the index: an
// engine without events only approximate entries, a replay socket
// without events nothing more; and warns of each model whose engines
// publish KV events while its tokenizer is the byte estimate (as the
// gateway does).
func logEngines(log *slog.Logger, toks *tokens.Set, engines []kvevents.EngineConfig, central bool) {
	warned := map[string]bool{}
	for _, e := range engines {
		switch {
		case e.Events == "" && !central && e.Replay != "":
			log.Warn("engine with a replay socket but no events socket: its replay is never asked; only approximate entries (POST /admin/kv/routed)", "endpoint", e.Name, "model", e.Model)
		case e.Events == "" && !central:
			log.Info("engine without events: only approximate entries (POST /admin/kv/routed)", "endpoint", e.Name, "model", e.Model)
		}
		if (e.Events != "" || central) && !warned[e.Model] && toks.For(e.Model).Estimated() {
			warned[e.Model] = true
			log.Warn(tokens.EstimatedWarning, "model", e.Model)
		}
	}
}

// tokenizerSet builds the --tokenizer set over a fresh cache.
func tokenizerSet(specs []string) (*tokens.Set, *tokens.Cache, error) {
	var parsed []tokens.Spec
	for _, s := range specs {
		sp, err := tokens.ParseSpec(s)
		if err != nil {
			return nil, nil, err
		}
		parsed = append(parsed, sp)
	}
	cache := tokens.NewCache(0)
	// The engines' key, as kvgate serve sends it (an engine with an API
	// key, SGLang's, may refuse /tokenize without it).
	key := os.Getenv(engineauth.EnvVar)
	if key != "" {
		if err := engineauth.Check(key); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", engineauth.EnvVar, err)
		}
	}
	toks, err := tokens.NewSet(parsed, cache, &http.Client{Timeout: 30 * time.Second, Transport: engineauth.Transport(nil, key)}, nil)
	if err != nil {
		return nil, nil, err
	}
	return toks, cache, nil
}

// newKVIndexAdmin is the admin API over the index, with the subscriber's
// and the tokenizer cache's statistics.
func newKVIndexAdmin(o *kvindexOptions, eps []fleet.Endpoint, idx *kvindex.Index, sub *kvevents.Subscriber, toks *tokens.Set, cache *tokens.Cache) (*kvindex.Admin, error) {
	adm := &kvindex.Admin{
		Index:  idx,
		Tokens: toks,
		Events: func() []kvindex.EndpointEvents {
			var out []kvindex.EndpointEvents
			for _, s := range sub.Stats() {
				out = append(out, kvindex.EndpointEvents{Endpoint: s.Endpoint, Model: s.Model, Stats: s})
			}
			return out
		},
		Extra: func() map[string]any {
			h, m, n := cache.Stats()
			return map[string]any{
				"central_malformed_frames":    sub.CentralMalformed(),
				"central_refused_frames":      sub.CentralRefused(),
				"central_unidentified_frames": sub.CentralUnidentified(),
				"central_zmq":                 sub.CentralSocketStats(),
				"tokenizer_cache":             map[string]any{"hits": h, "misses": m, "tokens": n},
			}
		},
		Bodies:             o.http.BodyLimiter(kvindex.DefaultMaxBodyBytes),
		MaxRoutedEndpoints: o.maxRouted,
		Adapter:            adapters(eps),
	}
	if err := adm.Validate(); err != nil {
		return nil, err
	}
	return adm, nil
}

func runKVIndex(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseKVIndexFlags(args, stderr)
	if err != nil {
		return err
	}
	log, err := textLogger(stderr, o.logLevel)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	engines, eps, err := o.engines()
	if err != nil {
		return err
	}
	toks, cache, err := tokenizerSet(o.tokenizers)
	if err != nil {
		return err
	}
	toks.SetLogger(log)
	logEngines(log, toks, engines, o.bindEvents != "")
	idx := kvindex.New(kvindex.Config{BlockSize: o.blockSize, ApproxTTL: o.approxTTL, MaxKeys: o.maxKeys})
	sub, err := kvevents.New(kvevents.Config{
		Engines: engines, BindEvents: zmqEndpoint(o.bindEvents), BindRanks: o.bindRanks,
		ReplayTimeout: o.replayTimeout, ReplayBudget: o.replayBudget, MaxCentralEngines: o.maxCentral,
		MaxMsgSize: o.maxMsg, Logger: log,
	}, idx)
	if err != nil {
		return err
	}
	adm, err := newKVIndexAdmin(o, eps, idx, sub, toks, cache)
	if err != nil {
		return err
	}
	srv, err := httpserve.New(o.http, adm.Handler())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.admin)
	if err != nil {
		return fmt.Errorf("--admin: %w", err)
	}
	err = serveKVIndex(ctx, sub, srv, ln, func() {
		events := "each engine's own socket"
		if o.bindEvents != "" {
			events = "central, engines dial " + zmqEndpoint(o.bindEvents)
		}
		fmt.Fprintf(stdout, "kvgate kvindex: admin on http://%s, %d engine(s) configured, KV events: %s, block size %d\n",
			ln.Addr(), len(engines), events, o.blockSize)
	})
	if err == nil {
		log.Info("kvgate kvindex: stopped")
	}
	return err
}

// serveKVIndex runs the subscriber and the admin server (calling started
// once both run) until ctx ends or either fails, then shuts both down.
func serveKVIndex(ctx context.Context, sub *kvevents.Subscriber, srv *httpserve.Server, ln net.Listener, started func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	subErr := make(chan error, 1)
	go func() { subErr <- sub.Run(ctx) }()
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()
	started()

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-subErr:
		runErr = err
		subErr <- nil
	case err := <-srvErr:
		runErr = fmt.Errorf("admin server: %w", err)
		srvErr <- nil
	}
	cancel()
	shutCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	_ = srv.Shutdown(shutCtx)
	<-subErr
	return runErr
}
