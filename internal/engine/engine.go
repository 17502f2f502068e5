package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/engine/kvpub"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/prometheus/client_golang/prometheus"
)

// Engine is one emulated vLLM instance.
type Engine struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	sched   *scheduler
	mux     http.Handler
	bodies  *httpserve.BodyLimiter
	client  *http.Client
	reqSeq  atomic.Uint64
	ctx     context.Context // set by Start

	// responses is the Responses API store (Config.ResponsesStore).
	responses *responseStore

	mu         sync.Mutex
	addr       string
	role       fleet.Role
	roleState  string     // serving, draining, warming_up
	targetRole fleet.Role // meaningful while roleState is not serving
	started    bool
	pub        *kvpub.Publisher
	srv        *httpserve.Server
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

// Role states reported by GET /admin/role.
const (
	stateServing  = "serving"
	stateDraining = "draining"
	stateWarming  = "warming_up"
)

// New builds an engine; Start runs it.
func New(cfg Config) (*Engine, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.StreamInterval == 0 {
		cfg.StreamInterval = 1
	}
	if err := errors.Join(cfg.Validate(), cfg.HTTP.Validate()); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.Default()
	}
	e := &Engine{
		cfg:       cfg,
		log:       lg.With("engine", cfg.Model),
		metrics:   newMetrics(cfg),
		client:    &http.Client{Timeout: 10 * time.Second},
		bodies:    cfg.HTTP.BodyLimiter(defaultBodyCap(cfg.MaxModelLen)),
		role:      cfg.Role,
		roleState: stateServing,
		responses: newResponseStore(maxStoredResponses),
		ctx:       context.Background(),
	}
	e.sched = newScheduler(cfg, e.log, e.metrics, nil)
	e.sched.onHold = e.holdResponse
	e.sched.onTransfer = e.transferDone
	e.mux = e.authenticated(e.routes())
	return e, nil
}

// Start listens on Host:Port, binds the KV-event sockets and runs the
// scheduler until ctx ends or Close is called.
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started {
		return errors.New("engine already started")
	}
	srv, err := httpserve.New(e.cfg.HTTP, e.mux)
	if err != nil {
		return fmt.Errorf("engine http: %w", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(e.cfg.Host, strconv.Itoa(e.cfg.Port)))
	if err != nil {
		return fmt.Errorf("engine listen: %w", err)
	}
	e.addr = ln.Addr().String()
	if e.cfg.EngineID == "" {
		e.cfg.EngineID = "kvgate-engine-" + e.addr
	}
	ctx, cancel := context.WithCancel(ctx)
	if e.cfg.KVEventsEndpoint != "" {
		topic := e.cfg.KVEventsTopic
		if topic == "" && !e.cfg.KVEventsTopicSet {
			topic = "kv@" + e.addr + "@" + e.cfg.Model
		}
		pub, err := kvpub.New(ctx, kvpub.Config{
			Endpoint:       e.cfg.KVEventsEndpoint,
			ReplayEndpoint: e.cfg.KVEventsReplayEndpoint,
			Topic:          topic,
			Format:         e.cfg.KVEventsFormat,
			Style:          e.cfg.KVEventsStyle,
			BufferSteps:    e.cfg.KVEventsBufferSteps,
			Logger:         e.log,
		})
		if err != nil {
			cancel()
			ln.Close()
			return fmt.Errorf("engine kv events: %w", err)
		}
		e.pub = pub
		e.sched.pub = pub
		e.metrics.reg.MustRegister(pub.Collector(prometheus.Labels{"model_name": e.cfg.Model, "engine": "0"}))
	}
	e.ctx, e.cancel, e.started = ctx, cancel, true
	srv.HTTP.BaseContext = func(net.Listener) context.Context { return ctx }
	e.srv = srv
	e.wg.Add(3)
	go func() {
		defer e.wg.Done()
		e.sched.run(ctx)
	}()
	go func() {
		defer e.wg.Done()
		if err := e.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Error("engine http server", "err", err)
		}
	}()
	go func() {
		defer e.wg.Done()
		<-ctx.Done()
		e.srv.Close()
	}()
	e.log.Info("engine started", "addr", e.addr, "role", e.role, "kv_events", e.KVEventsEndpoint())
	return nil
}

// Close stops the engine and waits for its goroutines.
func (e *Engine) Close() error {
	e.mu.Lock()
	cancel, pub := e.cancel, e.pub
	e.cancel = nil
	e.mu.Unlock()
	if cancel == nil {
		return nil // never started or already closed
	}
	cancel()
	e.wg.Wait()
	if pub != nil {
		return pub.Close()
	}
	return nil
}

// Handler is the engine's HTTP API (also served by Start's listener), for
// mounting in another server, which should give it httpserve's
// protections (httpserve.Deadlines at least). Requests are only served
// once Start runs the scheduler.
func (e *Engine) Handler() http.Handler { return e.mux }

// Addr is the listening host:port (after Start).
func (e *Engine) Addr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addr
}

// URL is http://host:port (after Start).
func (e *Engine) URL() string { return "http://" + e.Addr() }

// Config is the engine's configuration (EngineID filled in by Start).
func (e *Engine) Config() Config {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cfg
}

// KVEventsEndpoint is the bound PUB endpoint, or "" without KV events.
func (e *Engine) KVEventsEndpoint() string {
	if e.pub == nil {
		return ""
	}
	return e.pub.Endpoint()
}

// KVEventsReplayEndpoint is the bound replay endpoint, or "".
func (e *Engine) KVEventsReplayEndpoint() string {
	if e.pub == nil {
		return ""
	}
	return e.pub.ReplayEndpoint()
}

// KVEventsTopic is the topic of the KV events, or "".
func (e *Engine) KVEventsTopic() string {
	if e.pub == nil {
		return ""
	}
	return e.pub.Topic()
}

// KVEventsSeq is the sequence number the next KV-event batch will carry
// (0 without KV events).
func (e *Engine) KVEventsSeq() uint64 {
	if e.pub == nil {
		return 0
	}
	return e.pub.Seq()
}

// KVEventsStats are the KV-event sockets' counters (zero without KV
// events).
func (e *Engine) KVEventsStats() kvpub.Stats {
	if e.pub == nil {
		return kvpub.Stats{}
	}
	return e.pub.Stats()
}

// Role is the role the engine currently serves.
func (e *Engine) Role() fleet.Role {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.role
}

// InFlight is the number of requests inside the engine.
func (e *Engine) InFlight() int { return int(e.sched.inflight.Load()) }

// Lag is the real time the engine has fallen behind its timing model so
// far: steps due at once that started more than a few milliseconds late
// (kvgate_engine_lag_seconds_total in modelled seconds). On a machine short
// of CPU every latency it reports is longer than the model's by about this
// much.
func (e *Engine) Lag() time.Duration { return time.Duration(e.sched.lag.Load()) }
