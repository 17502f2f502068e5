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

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/kvspec"
	"github.com/kvgate/kvgate/internal/tokens"
)

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// parseEngineFlag parses "name=127.0.0.1:8001,events=tcp://127.0.0.1:5557,
// replay=tcp://127.0.0.1:5558,model=m".
func parseEngineFlag(s string) (kvevents.EngineConfig, error) {
	var ec kvevents.EngineConfig
	err := kvspec.Each(s, func(k, v string) error {
		switch k {
		case "name":
			ec.Name = v
		case "model":
			ec.Model = v
		case "events":
			ec.Events = v
		case "replay":
			ec.Replay = v
		default:
			return fmt.Errorf("unknown key %q (name, model, events, replay)", k)
		}
		return nil
	})
	if err != nil {
		return ec, fmt.Errorf("--engine %q: %w", s, err)
	}
	if ec.Name == "" || ec.Model == "" {
		return ec, fmt.Errorf("--engine %q: name= and model= are required", s)
	}
	return ec, nil
}

// enginesFile is the --engines YAML file.
type enginesFile struct {
	Engines []kvevents.EngineConfig `yaml:"engines"`
}

func loadEnginesFile(path string) ([]kvevents.EngineConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--engines: %w", err)
	}
	var f enginesFile
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("--engines %s: %w", path, err)
	}
	for i, e := range f.Engines {
		if e.Name == "" || e.Model == "" {
			return nil, fmt.Errorf("--engines %s: engine %d needs name and model", path, i)
		}
	}
	return f.Engines, nil
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

func runKVIndex(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvindex", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var engineFlags, tokFlags listFlag
	fs.Var(&engineFlags, "engine", "an engine: name=HOST:PORT,model=M[,events=tcp://HOST:PORT][,replay=tcp://HOST:PORT] (repeatable)")
	enginesPath := fs.String("engines", "", "YAML file listing engines (engines: [{name, model, events, replay}])")
	bindEvents := fs.String("bind-events", "", "central mode: bind a SUB here (e.g. tcp://0.0.0.0:5557) that engines dial; engines are named by topic kv@HOST:PORT@MODEL, or, for another topic (vLLM's default is \"\"), by the IP they dial from when one configured engine without events= has it")
	admin := fs.String("admin", "127.0.0.1:8090", "admin HTTP address")
	fl := flagrange.New(fs)
	lim := kvindexRanges()
	blockSize, approxTTL, maxKeys, replayTimeout := new(int), new(time.Duration), new(int), new(time.Duration)
	*blockSize, *approxTTL, *maxKeys, *replayTimeout = 16, 2*time.Minute, 4<<20, 2*time.Second
	flagrange.Var(fl, blockSize, "block-size", lim.blockSize, "router block size in tokens")
	fs.Var(&tokFlags, "tokenizer", "tokenizer spec: [model=M,]source=estimate|engine|local[,url=URL][,file=PATH][,template=chatml|llama3|plain][,bytes_per_token=N][,exact_chat=false] (repeatable; without model= it is the default; source=engine renders chats with the engine's template unless exact_chat=false)")
	flagrange.Var(fl, approxTTL, "approx-ttl", lim.approxTTL, "lifetime of approximate (routed) entries")
	flagrange.Var(fl, maxKeys, "max-keys", lim.maxKeys, "bound on keys per index table (model × group × 64 endpoints × tier)")
	flagrange.Var(fl, replayTimeout, "replay-timeout", lim.replayTimeout, "wait for each replay reply")
	replayBudget, maxCentral, maxMsg := new(time.Duration), new(int), new(int64)
	*replayBudget, *maxCentral, *maxMsg = kvevents.DefaultReplayBudget, kvevents.DefaultMaxCentralEngines, kvevents.DefaultMaxMsgSize
	flagrange.Var(fl, replayBudget, "replay-budget", flagrange.Range[time.Duration]{Min: time.Millisecond, Max: time.Hour}, "longest whole replay (live events wait meanwhile)")
	flagrange.Var(fl, maxCentral, "max-central-engines", flagrange.Range[int]{Min: 1, Max: 1 << 16, Unit: "engines"}, "central mode: most engines registered from topics")
	flagrange.Var(fl, maxMsg, "zmq-max-msg-bytes", flagrange.Range[int64]{Min: 1 << 10, Max: 1 << 30, Unit: "bytes"}, "largest ZMQ message accepted from an engine")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	httpCfg := httpserve.Config{MaxBodyBytes: kvindex.DefaultMaxBodyBytes}
	httpserve.AddFlags(fl, &httpCfg)
	maxRouted := new(int)
	*maxRouted = kvindex.DefaultMaxRoutedEndpoints
	flagrange.Var(fl, maxRouted, "max-routed-endpoints", flagrange.Range[int]{Min: 0, Max: kvindex.MaxEndpoints, Unit: "endpoints"}, "most endpoints registered for POST /admin/kv/routed to add one")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvgate kvindex [flags]\n\nRuns the KV-event subscriber, the global prefix index and its admin API\n(POST /admin/kv/lookup, POST /admin/kv/routed, GET /admin/kv/stats).\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := fl.Check(); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	var engines []kvevents.EngineConfig
	if *enginesPath != "" {
		es, err := loadEnginesFile(*enginesPath)
		if err != nil {
			return err
		}
		engines = append(engines, es...)
	}
	for _, s := range engineFlags {
		ec, err := parseEngineFlag(s)
		if err != nil {
			return err
		}
		engines = append(engines, ec)
	}
	for i := range engines {
		engines[i].Events = zmqEndpoint(engines[i].Events)
		engines[i].Replay = zmqEndpoint(engines[i].Replay)
	}
	if len(engines) == 0 && *bindEvents == "" {
		return errors.New("nothing to subscribe to: give --engine, --engines or --bind-events")
	}
	var specs []tokens.Spec
	for _, s := range tokFlags {
		sp, err := tokens.ParseSpec(s)
		if err != nil {
			return err
		}
		specs = append(specs, sp)
	}
	cache := tokens.NewCache(0)
	toks, err := tokens.NewSet(specs, cache, &http.Client{Timeout: 30 * time.Second})
	if err != nil {
		return err
	}

	idx := kvindex.New(kvindex.Config{BlockSize: *blockSize, ApproxTTL: *approxTTL, MaxKeys: *maxKeys})
	sub, err := kvevents.New(kvevents.Config{
		Engines: engines, BindEvents: zmqEndpoint(*bindEvents),
		ReplayTimeout: *replayTimeout, ReplayBudget: *replayBudget, MaxCentralEngines: *maxCentral,
		MaxMsgSize: *maxMsg, Logger: log,
	}, idx)
	if err != nil {
		return err
	}
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
		Bodies:             httpCfg.BodyLimiter(kvindex.DefaultMaxBodyBytes),
		MaxRoutedEndpoints: *maxRouted,
	}
	if err := adm.Validate(); err != nil {
		return err
	}
	srv, err := httpserve.New(httpCfg, adm.Handler())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *admin)
	if err != nil {
		return fmt.Errorf("--admin: %w", err)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	subErr := make(chan error, 1)
	go func() { subErr <- sub.Run(ctx) }()
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "kvgate kvindex: admin on http://%s, %d engine(s), central=%q, block size %d\n",
		ln.Addr(), len(engines), *bindEvents, *blockSize)

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
