// Package demo runs kvgate's built-in comparison: an emulated fleet of
// engines (internal/engine) on loopback, the gateway (internal/gateway) in
// front of it with one policy at a time, and the baseline chapter's chat
// workload sent through real HTTP by the load generator (internal/bench).
// Everything runs in one process and is torn down after each run.
package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/replicasync"
)

// Config is one demo.
type Config struct {
	// TimeScale: the engines run this many times faster than real time;
	// every latency is reported in the engines' (modelled) time, which is
	// the simulator's timing model.
	TimeScale float64
	// Chat is the workload (rates and durations in modelled time).
	Chat bench.ChatConfig
	SLO  bench.SLO
	// Runs to make, in order.
	Runs []RunSpec
	// Logger for the fleet (default: discard).
	Logger *slog.Logger
}

// RunSpec is one row of the comparison.
type RunSpec struct {
	Policy      string
	EarlyReject bool
	// Prefill and Decode count the engines: Decode 0 is an aggregated
	// fleet of Prefill engines; otherwise Prefill prefill-only and Decode
	// decode-only engines.
	Prefill, Decode int
	// Replicas is how many gateway replicas front the fleet (0 counts as
	// 1), requests spread over them in turn; Unsynced leaves them each
	// counting only their own requests in flight (no replica sync).
	Replicas int
	Unsynced bool
}

// Fleet names the shape of a run.
func (r RunSpec) Fleet() string {
	s := fmt.Sprintf("P/D %dP%dD", r.Prefill, r.Decode)
	if r.Decode == 0 {
		s = fmt.Sprintf("aggregated %d", r.Prefill)
	}
	if r.Replicas > 1 {
		sync := "synced"
		if r.Unsynced {
			sync = "unsynced"
		}
		s += fmt.Sprintf(", %d replicas %s", r.Replicas, sync)
	}
	return s
}

// Result is one run.
type Result struct {
	Spec    RunSpec
	Summary bench.Summary
	Records []bench.Record
	// EngineLag is the most any engine fell behind its timing model during
	// the run, as a share of the run's wall time (engine.Engine.Lag): on a
	// machine short of CPU the engines run slower than modelled and every
	// latency of the run is inflated.
	EngineLag float64
}

const model = "kvgate-demo"

// Run makes every run; progress, when set, hears of each request.
func Run(ctx context.Context, cfg Config, progress func(run int, done, total int)) ([]Result, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	items, err := bench.Chat(cfg.Chat)
	if err != nil {
		return nil, err
	}
	var out []Result
	for i, spec := range cfg.Runs {
		var pr bench.Progress
		if progress != nil {
			pr = func(d, t int) { progress(i, d, t) }
		}
		res, err := runOne(ctx, cfg, spec, items, pr)
		if err != nil {
			return out, fmt.Errorf("%s on %s: %w", spec.Policy, spec.Fleet(), err)
		}
		out = append(out, res)
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
	}
	return out, nil
}

// runOne starts a fresh fleet (cold caches) and gateway, sends the
// workload and tears everything down.
func runOne(ctx context.Context, cfg Config, spec RunSpec, items []bench.Item, progress bench.Progress) (Result, error) {
	eps, lag, stop, err := startEngines(ctx, cfg, spec)
	defer stop()
	if err != nil {
		return Result{}, err
	}
	urls, fails, stopGWs, err := startReplicas(ctx, cfg, spec, eps, freeLoopback)
	defer stopGWs()
	if err != nil {
		return Result{}, err
	}
	client := &bench.Client{URL: urls[0], More: urls[1:], Model: model, TimeScale: cfg.TimeScale,
		HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048, MaxIdleConns: 2048}}}
	recs, wall, err := bench.Run(ctx, client, items, bench.Mode{}, progress)
	if err != nil {
		return Result{}, err
	}
	for _, f := range fails {
		select {
		case err := <-f:
			return Result{}, fmt.Errorf("gateway: %w", err)
		default:
		}
	}
	label := spec.Policy
	if spec.EarlyReject {
		label += " +reject"
	}
	label += " / " + spec.Fleet()
	return Result{Spec: spec, Summary: bench.Summarize(label, recs, wall.Seconds()*cfg.TimeScale, cfg.SLO), Records: recs,
		EngineLag: lag().Seconds() / max(wall.Seconds(), 1e-9)}, nil
}

// startEngines starts the run's engines; lag reports the most any of them
// has fallen behind its timing model so far.
func startEngines(ctx context.Context, cfg Config, spec RunSpec) (eps []fleet.Endpoint, lag func() time.Duration, stop func(), err error) {
	var engines []*engine.Engine
	stop = func() {
		for _, e := range engines {
			e.Close()
		}
	}
	lag = func() time.Duration {
		var most time.Duration
		for _, e := range engines {
			most = max(most, e.Lag())
		}
		return most
	}
	add := func(role fleet.Role) error {
		ec := engine.DefaultConfig()
		ec.Model, ec.Port, ec.Role, ec.TimeScale = model, 0, role, cfg.TimeScale
		ec.KVEventsEndpoint = "tcp://127.0.0.1:0"
		ec.NumGPUBlocks = 3000 * 64 / ec.BlockSize // the baseline's 3 000 blocks of 64 tokens
		ec.Logger = cfg.Logger
		e, err := engine.New(ec)
		if err != nil {
			return err
		}
		if err := e.Start(ctx); err != nil {
			return err
		}
		engines = append(engines, e)
		eps = append(eps, fleet.Endpoint{Name: e.Addr(), URL: e.URL(), Model: model, Role: role,
			Events: e.KVEventsEndpoint(), PrefillSpeed: ec.Perf.PrefillTokensPerSec})
		return nil
	}
	prole := fleet.RoleBoth
	if spec.Decode > 0 {
		prole = fleet.RolePrefill
	}
	for i := 0; i < spec.Prefill; i++ {
		if err := add(prole); err != nil {
			return nil, lag, stop, err
		}
	}
	for i := 0; i < spec.Decode; i++ {
		if err := add(fleet.RoleDecode); err != nil {
			return nil, lag, stop, err
		}
	}
	return eps, lag, stop, nil
}

// startReplicas serves the run's gateway replicas on loopback. Synced
// replicas are given free ports to bind for their sync, which another
// process may take between the choice and the bind: a replica whose sync
// cannot bind within bindWait has every replica stopped and started
// again on other ports, up to three times.
func startReplicas(ctx context.Context, cfg Config, spec RunSpec, eps []fleet.Endpoint, freeAddr func() (string, error)) (urls []string, fails []<-chan error, stop func(), err error) {
	for try := 0; ; try++ {
		var stops []func()
		stop = func() {
			for _, s := range stops {
				s()
			}
		}
		urls, fails = nil, nil
		syncs, err := syncConfigs(spec, freeAddr)
		if err != nil {
			return nil, nil, stop, err
		}
		var gws []*gateway.Gateway
		for _, sc := range syncs {
			g, url, stopGW, failed, err := startGateway(ctx, cfg, spec, eps, sc)
			stops = append(stops, stopGW)
			if err != nil {
				return nil, nil, stop, err
			}
			gws, urls, fails = append(gws, g), append(urls, url), append(fails, failed)
		}
		err = syncsBound(ctx, gws, syncs, fails)
		if err == nil {
			return urls, fails, stop, nil
		}
		stop()
		if try == 2 || ctx.Err() != nil {
			return nil, nil, func() {}, err
		}
	}
}

// freeLoopback is a loopback address free a moment ago (tcp://HOST:PORT).
func freeLoopback() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return "tcp://" + ln.Addr().String(), nil
}

// bindWait bounds how long a replica's sync may take to bind.
const bindWait = 10 * time.Second

// syncsBound waits until every replica given a sync bind has bound it;
// an error when one failed (its port taken) or none came in time.
func syncsBound(ctx context.Context, gws []*gateway.Gateway, syncs []replicasync.Config, fails []<-chan error) error {
	deadline := time.Now().Add(bindWait)
	for i, g := range gws {
		for syncs[i].Bind != "" && g.SyncAddr() == "" {
			select {
			case err := <-fails[i]:
				return fmt.Errorf("gateway replica %d: %w", i, err)
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("gateway replica %d: its sync did not bind within %v", i, bindWait)
			}
		}
	}
	return nil
}

// startGateway serves a gateway for the run on loopback. Its clock runs
// at the fleet's speed: predictions and SLOs are in modelled seconds.
//
// failed hears the gateway's error if it stops serving before stop (its
// replica sync could not bind, say).
func startGateway(ctx context.Context, cfg Config, spec RunSpec, eps []fleet.Endpoint, sync replicasync.Config) (g *gateway.Gateway, url string, stop func(), failed <-chan error, err error) {
	early := spec.EarlyReject
	start := time.Now()
	scaled := func() time.Time { return start.Add(time.Duration(float64(time.Since(start)) * cfg.TimeScale)) }
	gc := gateway.Config{Endpoints: eps, Policy: spec.Policy, EarlyReject: &early, SLOTTFT: cfg.SLO.TTFT, SLOTPOT: cfg.SLO.TPOT,
		Tokenizers: []string{"model=" + model + ",source=engine,url=" + eps[0].URL}, NoHealthChecks: true, Sync: sync}
	g, err = gateway.New(gc, gateway.Options{Logger: cfg.Logger, Now: scaled})
	if err != nil {
		return nil, "", func() {}, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", func() {}, nil, err
	}
	srv, err := httpserve.New(httpserve.Config{MaxConns: 8192}, g.Handler())
	if err != nil {
		ln.Close()
		return nil, "", func() {}, nil, err
	}
	gctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	fail := make(chan error, 1)
	go func() {
		defer close(done)
		if err := g.Run(gctx); err != nil {
			fail <- err
		}
	}()
	go func() { _ = srv.Serve(ln) }()
	stop = func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		_ = srv.Shutdown(sctx)
		cancel()
		<-done
	}
	return g, "http://" + ln.Addr().String(), stop, fail, nil
}

// syncConfigs is each gateway replica's sync: with more than one and
// sync on, each binds an address freeAddr gives and dials every other's.
func syncConfigs(spec RunSpec, freeAddr func() (string, error)) ([]replicasync.Config, error) {
	n := max(spec.Replicas, 1)
	out := make([]replicasync.Config, n)
	if n == 1 || spec.Unsynced {
		return out, nil
	}
	addrs := make([]string, n)
	for i := range addrs {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	for i := range out {
		out[i].Bind = addrs[i]
		for j, a := range addrs {
			if j != i {
				out[i].Peers = append(out[i].Peers, a)
			}
		}
	}
	return out, nil
}
