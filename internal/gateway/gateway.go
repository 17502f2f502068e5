// Package gateway is kvgate's serving path: an OpenAI-compatible HTTP
// proxy in front of a fleet of engines (vLLM, SGLang, kvgate's emulator)
// that, for every request, computes its block keys, looks up which engines
// hold its prefix in the KV index, builds a fleet snapshot with the same
// code as the simulator (internal/load), lets the scheduler (internal/sched,
// the simulator's policies) choose the prefill and decode endpoints or
// reject the request before any compute is spent, and proxies it —
// aggregated, or as vLLM's two-leg prefill/decode flow.
//
// The request path reads top to bottom: parse (openai) → tokens and block
// keys (tokens.Set.Prepare) → snapshot (load.Fleet + kvindex) → policy and
// admission (sched.Scheduler) → proxy → feedback (in-flight accounting,
// approximate index entries, observed latencies).
package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/engineauth"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/kvevents"
	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/replicasync"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/tokens"
)

// metricsStaleness is how old an engine's scraped metrics may be and
// still count.
const metricsStaleness = 10 * time.Second

// Options are a Gateway's collaborators; zero values are fine.
type Options struct {
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Health, when set, takes failing endpoints out of the snapshot (its
	// active checks and the proxy's failure reports) and supplies the
	// engines' scraped metrics (KV room and usage); the gateway keeps its
	// endpoint set current (Set).
	Health *health.Prober
	// Traffic, when set, hears of every routed or rejected request and of
	// every streamed answer's latencies (the xPyD planner's recorder).
	Traffic Traffic
	// Transport overrides the upstream transport (tests).
	Transport http.RoundTripper
	// HoldGrace is how long past its deadline a held request waits for
	// an endpoint before it gets 503 (default 30 s).
	HoldGrace time.Duration
	// HoldPoll bounds how long the hold's release loop sleeps between
	// passes (default 50 ms; tests set it long so that only a wake can
	// release).
	HoldPoll time.Duration
	// TokenizeTimeout bounds tokenizing one request (an engine's
	// /tokenize, say); past it the client gets 504 (default 10 s).
	TokenizeTimeout time.Duration
}

// Traffic hears what the gateway routes: a request's sizes when it is
// decided (rejected ones flagged by side; its output as planned:
// max_tokens or the default), a streamed answer's TTFT, TPOT and output
// tokens (every sequence's), with whether they missed the class's SLO,
// and a non-streamed answer's output tokens.
// Times are the gateway's clock in seconds. Implementations must be safe
// for concurrent use.
type Traffic interface {
	Routed(at float64, promptTokens, cachedTokens, outputTokens int, rejectedPrefill, rejectedDecode bool)
	// Answered is a streamed answer: its latencies and output tokens.
	Answered(at, ttft, tpot float64, outputTokens int, ttftMiss, tpotMiss bool)
	// AnsweredOutput is a non-streamed answer: its output tokens (its
	// usage's), no latencies.
	AnsweredOutput(at float64, outputTokens int)
}

// Gateway routes and proxies requests. Create with New, start the KV-event
// subscriber with Run, serve Handler and AdminHandler.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	start   time.Time
	health  *health.Prober
	traffic Traffic
	// respHolders: which endpoint made each Responses API answer
	// (responses.go).
	respHolders *responseHolders
	// respMisses: the response ids no engine kept lately (respfind.go).
	respMisses  responseMisses
	respLookups lookupBudget
	// holdGrace, holdPoll: Options.HoldGrace, Options.HoldPoll.
	holdGrace, holdPoll time.Duration
	// tokenizeTimeout: Options.TokenizeTimeout.
	tokenizeTimeout time.Duration

	sched  atomic.Pointer[sched.Scheduler] // replaced whole on reload
	policy string
	toks   *tokens.Set
	idx    *kvindex.Index
	sub    *kvevents.Subscriber
	// sync shares the in-flight load with other replicas (nil: none).
	sync *replicasync.Sync
	// wholeBytes is the event bytes held by the answers being assembled
	// (whole.go).
	wholeBytes atomic.Int64
	client     *http.Client
	met        *metrics
	shed       shedder
	fair       fairShare
	bodies     *httpserve.BodyLimiter

	setMu sync.Mutex // one SetEndpoints at a time
	// estimateWarned are the models warned of by warnEstimated (under
	// setMu).
	estimateWarned map[string]bool
	// urlWarned are the URLs warned of by warnSharedURL (under setMu).
	urlWarned map[string]bool
	mu        sync.RWMutex
	members   map[string]*member
	models    map[string]*modelFleet
	// adapters maps each LoRA adapter an endpoint declares or its engine
	// lists to its base model, whose fleet serves it (adaptersOf).
	adapters map[string]string
	// clashWarned: adapters listed on an endpoint while another base
	// model serves them, warned of once (adapter NUL endpoint; under mu).
	clashWarned map[string]bool

	classes atomic.Pointer[classSet]
	// running is the configuration running: cfg, then each reload's
	// reloadable fields over it (Reload; GET /admin/config).
	running atomic.Pointer[Config]

	inflight atomic.Int64
	reqSeq   atomic.Uint64
	passTurn atomic.Uint64 // passthrough ties, in turn
	tokTurn  atomic.Uint64 // tokenizers' fallback engines, in turn
	bufs     sync.Pool     // *[]byte: relay's 32 KiB copy buffers
}

// member is one endpoint the gateway knows.
type member struct {
	ep   fleet.Endpoint // immutable once the member is published
	kvID kvindex.EndpointID
	obs  observed
	lora adapterFlights // its requests in flight per LoRA adapter
	// passing counts its passthrough requests in flight (passthrough.go).
	passing atomic.Int64
	// found are the LoRA adapters its engine lists and ep does not
	// declare (health.Prober.Adapters), kept current by refresh.
	found   atomic.Pointer[[]string]
	removed atomic.Bool // left the fleet; its index id may be reused
	// reportsCached: its engine reported a cached count in an answer's
	// usage (vLLM's --enable-prompt-tokens-details; staleCheck).
	reportsCached atomic.Bool
	// staleAnswers counts its answers in a row that found none of a
	// claimed prompt cached (staleCheck).
	staleAnswers atomic.Int32
	// ejected: it is out by a passive ejection (refresh).
	ejected atomic.Bool
	// gone ends when the health checks take the member out (a new one
	// is made when they bring it back): the requests waiting for its
	// first byte are sent elsewhere (idle.go).
	goneMu     sync.Mutex
	gone       context.Context
	cancelGone context.CancelFunc
	isOut      bool
}

// goneContext ends when the health checks take m out.
func (m *member) goneContext() context.Context {
	m.goneMu.Lock()
	defer m.goneMu.Unlock()
	if m.gone == nil {
		m.gone, m.cancelGone = context.WithCancel(context.Background())
		if m.isOut {
			m.cancelGone()
		}
	}
	return m.gone
}

// setOut records whether the health checks have m out, ending its gone
// context when they take it out, and reports whether they just brought
// it back, or just took it out (left).
func (m *member) setOut(out bool) (back, left bool) {
	m.goneMu.Lock()
	defer m.goneMu.Unlock()
	switch {
	case out == m.isOut:
	case out:
		if m.cancelGone != nil {
			m.cancelGone()
		}
		left = true
	default:
		m.gone, m.cancelGone = nil, nil // made anew when asked
		back = true
	}
	m.isOut = out
	return back, left
}

// modelFleet is the endpoints serving one model that may take traffic now,
// in the order of the load fleet's snapshots.
type modelFleet struct {
	name    string
	load    *load.Fleet
	members []*member
	matcher *kvindex.Matcher // the index, in members' order
	hold    *holdQueue       // requests held at the router (hold.go)
	// investing are the hold's investments in progress (invest.go).
	investing stoppables
	// queued are its aggregated requests not yet answered, which a
	// request rejected for the load may displace (displace.go).
	queued stoppables
	// prefixRequests counts its prefix requests in flight: the hold's touches
	// (touch.go) and copies ahead of the conversation balance (copy.go).
	prefixRequests atomic.Int64
	// outputs are its latest answers' lengths (outputlen.go).
	outputs outputLengths
}

// New builds a gateway from a validated config.
func New(cfg Config, o Options) (*Gateway, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.HoldGrace <= 0 {
		o.HoldGrace = defaultHoldGrace
	}
	if o.HoldPoll <= 0 {
		o.HoldPoll = holdPoll
	}
	if o.TokenizeTimeout <= 0 {
		o.TokenizeTimeout = defaultTokenizeTimeout
	}
	pol, err := sched.New(cfg.Policy, sched.Options{})
	if err != nil {
		return nil, err
	}
	var g *Gateway
	toks, err := newTokenizers(cfg.Tokenizers, cfg.EngineAPIKey, func(model, configured string) ([]string, bool) { return g.tokenizerEngines(model, configured) })
	if err != nil {
		return nil, err
	}
	toks.SetLogger(o.Logger)
	g = &Gateway{
		cfg: cfg, log: o.Logger, now: o.Now, health: o.Health, traffic: o.Traffic, holdGrace: o.HoldGrace, respHolders: newResponseHolders(),
		holdPoll: o.HoldPoll, tokenizeTimeout: o.TokenizeTimeout, policy: cfg.Policy,
		toks:     toks,
		idx:      kvindex.New(kvindex.Config{BlockSize: cfg.BlockSize}),
		members:  map[string]*member{},
		models:   map[string]*modelFleet{},
		adapters: map[string]string{},
	}
	g.sched.Store(cfg.scheduler(pol))
	g.start = g.now()
	g.classes.Store(newClassSet(&cfg))
	run := cfg
	g.running.Store(&run)
	g.client = &http.Client{Transport: o.Transport}
	if g.client.Transport == nil {
		g.client.Transport = newTransport(cfg.ConnectTimeout)
	}
	// Every request kvgate sends an engine carries the engines' key, if
	// they need one: its own (touches, prefix copies) as the clients'.
	g.client.Transport = engineauth.Transport(g.client.Transport, cfg.EngineAPIKey)
	if cfg.Sync.Enabled() {
		sc := cfg.Sync
		sc.BlockSize = cfg.BlockSize
		if g.sync, err = replicasync.New(sc, syncLocal{g}, g.clock, o.Logger); err != nil {
			return nil, err
		}
	}
	g.met = newMetrics(g)
	g.bodies = cfg.HTTP.BodyLimiter(defaultBodyBytes)
	// The subscriber runs even without engines with events: discovery may
	// bring some.
	g.sub, err = kvevents.New(kvevents.Config{Engines: subscribed(cfg.Endpoints, cfg.BindEvents != ""),
		BindEvents: cfg.BindEvents, BindRanks: cfg.BindEventsRanks, Logger: o.Logger}, g.idx)
	if err != nil {
		return nil, err
	}
	if err := g.SetEndpoints(cfg.Endpoints); err != nil {
		return nil, err
	}
	return g, nil
}

// newTokenizers builds the models' tokenizers from their specs; a
// source=engine tokenizer asks the model's other engines through engines
// (the gateway's, set once it exists).
func newTokenizers(specs []string, key string, engines tokens.EngineFallback) (*tokens.Set, error) {
	var parsed []tokens.Spec
	for _, s := range specs {
		sp, err := tokens.ParseSpec(s)
		if err != nil {
			return nil, err
		}
		parsed = append(parsed, sp)
	}
	return tokens.NewSet(parsed, tokens.NewCache(0), &http.Client{Timeout: 30 * time.Second, Transport: engineauth.Transport(nil, key)}, engines)
}

// newTransport is tuned for many concurrent streams to a few engines.
func newTransport(connect time.Duration) *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // prefill of a long prompt may take long
		ForceAttemptHTTP2:     false,
		DisableCompression:    true,
	}
}

// Run runs the KV-event subscriber and the membership refresh until ctx
// ends.
func (g *Gateway) Run(ctx context.Context) error {
	errc := make(chan error, 2)
	go func() {
		if err := g.sub.Run(ctx); err != nil {
			errc <- fmt.Errorf("kv events: %w", err)
		}
	}()
	if g.sync != nil {
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := g.sync.Run(ctx); err != nil {
				errc <- fmt.Errorf("replica sync: %w", err)
			}
		}()
		defer func() { cancel(); <-done }()
	}
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-t.C:
			g.refresh()
		}
	}
}

// clock is the fleet's time: seconds since the gateway started.
func (g *Gateway) clock() float64 { return g.now().Sub(g.start).Seconds() }

// SetEndpoints replaces the fleet (discovery calls it): new endpoints are
// registered in the index and their KV events subscribed, removed ones
// leave the snapshot at once, their event streams stop and their index
// entries go; their requests in flight finish where they are. An invalid
// list changes nothing.
func (g *Gateway) SetEndpoints(eps []fleet.Endpoint) error {
	eps, err := fleet.Validate(eps)
	if err != nil {
		return err
	}
	if err := fleet.CheckCentralMode(g.cfg.BindEvents, g.cfg.BindEventsRanks, eps); err != nil {
		return err
	}
	g.setMu.Lock()
	defer g.setMu.Unlock()
	g.mu.Lock()
	next := make(map[string]*member, len(eps))
	var gone []*member
	for _, e := range eps {
		if m := g.members[e.Name]; m != nil && m.ep.Model == e.Model {
			next[e.Name] = m
		}
	}
	for name, m := range g.members {
		if next[name] != m {
			gone = append(gone, m)
		}
	}
	g.mu.Unlock()
	// Streams of gone engines stop before their index ids are freed, so
	// no late event lands on a reused id.
	subErr := g.sub.SetEngines(subscribed(eps, g.cfg.BindEvents != ""))
	for _, m := range gone {
		m.removed.Store(true)
		_ = g.idx.RemoveEndpoint(m.kvID) // absent already: nothing to free
	}
	for _, e := range eps {
		// A member's ep never changes once published (requests read it
		// without a lock): a changed endpoint (its role, URL, sockets)
		// gets a new member with the same index id.
		switch m := next[e.Name]; {
		case m == nil:
			id, err := g.idx.AddEndpoint(e.Name, e.Model)
			if err != nil {
				return fmt.Errorf("endpoint %s: %w", e.Name, err)
			}
			next[e.Name] = &member{kvID: id, ep: e}
		case !m.ep.Equal(e):
			if m.ep.URL != e.URL || m.ep.Events != e.Events {
				// Another engine under the same name (a pod recreated
				// with a new IP): none of the blocks indexed are its
				// (they were kept until 2026-12-04, and routing claimed
				// them). Its stream restarted above (Addr changed). So
				// with its events: another socket's stream starts again,
				// and without one nothing would ever remove the blocks
				// the old stream indexed (they stayed claimed, frozen,
				// and drew the traffic: a walkthrough, 2026-12-04).
				g.idx.ClearEndpoint(m.kvID)
			}
			next[e.Name] = &member{kvID: m.kvID, ep: e}
		}
	}
	g.mu.Lock()
	g.members = next
	g.mu.Unlock()
	if g.health != nil {
		g.health.Set(eps)
	}
	g.refresh()
	g.warnEstimated(eps)
	g.warnSharedURL(eps)
	if subErr != nil {
		return fmt.Errorf("kv events: %w", subErr)
	}
	return nil
}

// warnSharedURL warns, once per URL (under setMu), of endpoints under
// different names at one engine's URL (data-parallel ranks aside, which
// share their engine's API): its load would be counted as several
// engines'.
func (g *Gateway) warnSharedURL(eps []fleet.Endpoint) {
	names := map[string][]string{}
	for _, e := range eps {
		if u := strings.TrimRight(e.URL, "/"); u != "" && !e.Ranked() {
			names[u] = append(names[u], e.Name)
		}
	}
	for u, ns := range names {
		if len(ns) < 2 || g.urlWarned[u] {
			continue
		}
		if g.urlWarned == nil {
			g.urlWarned = map[string]bool{}
		}
		g.urlWarned[u] = true
		g.log.Warn("endpoints: several endpoints at one URL: one engine's load is counted as several engines' (use dp_size for data-parallel ranks behind one API)",
			"url", u, "endpoints", ns)
	}
}

// warnEstimated warns, once per model (under setMu), of a model whose
// engines publish KV events while its tokenizer is the byte estimate:
// the estimate's block keys never match an engine's, so those events
// index blocks no request finds.
func (g *Gateway) warnEstimated(eps []fleet.Endpoint) {
	for _, e := range subscribed(eps, g.cfg.BindEvents != "") {
		if g.estimateWarned[e.Model] || !g.toks.For(e.Model).Estimated() {
			continue
		}
		if g.estimateWarned == nil {
			g.estimateWarned = map[string]bool{}
		}
		g.estimateWarned[e.Model] = true
		g.log.Warn(tokens.EstimatedWarning, "model", e.Model)
	}
}

// subscribed are the engines whose KV events the subscriber hears: those
// with an events endpoint to dial and, in central mode (the engines dial
// kvgate), every endpoint, so that an engine whose topic does not name it
// is known by its connection. Each carries its HTTP API's host:port when
// its name is not that (a name the user or discovery chose): a central
// topic kv@<host:port>@<model>, as vLLM is told to send, then reaches it;
// before, such an endpoint's events went to an engine of their own that
// no request was routed by.
func subscribed(eps []fleet.Endpoint, central bool) []kvevents.EngineConfig {
	var out []kvevents.EngineConfig
	for _, e := range eps {
		if e.Events == "" && !central {
			continue
		}
		out = append(out, kvevents.EngineFor(e))
	}
	return out
}

// refresh recomputes each model's eligible endpoints (discovered and
// healthy) and hands them to its load fleet.
func (g *Gateway) refresh() {
	g.mu.Lock()
	defer g.mu.Unlock()
	byModel := map[string][]*member{}
	g.adapters = g.adaptersOf()
	for _, m := range g.members {
		in := g.health == nil || g.health.Available(m.ep.Name)
		back, left := m.setOut(!in)
		if left && g.health != nil {
			// Out with its checks passing: a passive ejection, whose
			// end nothing else tells (the checks log their own).
			st, ok := g.health.State(m.ep.Name)
			m.ejected.Store(ok && st.Healthy)
		}
		if back && m.ejected.Swap(false) {
			g.log.Info("endpoint back from its passive ejection: routed again", "endpoint", m.ep.Name)
		}
		if mf := g.models[m.ep.Model]; back && mf != nil {
			// Back from out: it may have restarted as another engine
			// (another GPU, another speed); what the predictor learned
			// of it starts again from its pool.
			mf.load.Forget(m.ep.Name)
		}
		switch {
		case back && m.ep.Events == "" && g.cfg.BindEvents == "":
			// Back from out, with no KV events: it may have restarted
			// with an empty cache, and nothing would say so; what
			// kvgate's own routing put in the index for it is dropped
			// (kept until 2026-12-04: a restarted engine was claimed to
			// hold its old prompts, predicted at 2.5 ms for 131, and the
			// predictor learned it 20× slow from the misses).
			g.idx.ClearEndpoint(m.kvID)
		case back && m.ep.Events == "" && m.ep.Replay != "":
			// Back from out, in central mode: it may have restarted,
			// and it says nothing until its next batch (Resync).
			go g.sub.Resync(m.ep.Name)
		}
		if in {
			byModel[m.ep.Model] = append(byModel[m.ep.Model], m)
		}
	}
	for name := range g.models {
		if _, ok := byModel[name]; !ok {
			byModel[name] = nil // keep the fleet (in-flight state), empty
		}
	}
	for name, ms := range byModel {
		sort.Slice(ms, func(i, j int) bool { return ms[i].ep.Name < ms[j].ep.Name })
		infos := make([]load.Info, len(ms))
		for i, m := range ms {
			speed := m.ep.PrefillSpeed
			if speed == 0 {
				speed = g.cfg.PrefillSpeed
			}
			infos[i] = load.Info{Name: m.ep.Name, Role: m.ep.Role, PrefillSpeed: speed, Decode: decodeStep(g.cfg.Predictor),
				StepTokens: g.cfg.engineStepTokens()}
		}
		mf := g.models[name]
		if mf == nil {
			mf = &modelFleet{name: name, load: load.New(nil, load.NeedsActive(g.sched.Load().Policy)),
				hold: newHoldQueue(g.cfg.Hold.MaxRequests)}
			// A prefill that frees its endpoint sooner than predicted
			// wakes the release loop (releaseLoop).
			mf.load.WakeOnSlack(mf.hold.wake)
			p, err := newPredictor(g.cfg.Predictor)
			if err != nil {
				panic(err) // Validate checked the name
			}
			mf.load.SetPredictor(p)
			mf.load.SetBatchingEngines(true) // vLLM and SGLang batch prefills
			if g.sync != nil {
				mf.load.SetObserver(g.sync.Observer(name))
			}
			g.models[name] = mf
		}
		if sameMembers(mf.members, ms) {
			continue
		}
		mf.load.Set(infos)
		ids := make([]kvindex.EndpointID, len(ms))
		for i, m := range ms {
			ids[i] = m.kvID
		}
		mf.members, mf.matcher = ms, g.idx.NewMatcher(name, ids)
	}
}

func sameMembers(a, b []*member) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] || !a[i].ep.Equal(b[i].ep) {
			return false
		}
	}
	return true
}

// tokenizerEngines is the tokenizers' tokens.EngineFallback: the base
// URLs of model's eligible endpoints (discovered, healthy) other than
// configured, in turn from one call to the next so that a dead
// configured engine's load spreads, and whether configured is a member
// of the fleet that is not eligible now.
func (g *Gateway) tokenizerEngines(model, configured string) ([]string, bool) {
	configured = strings.TrimRight(configured, "/")
	g.mu.RLock()
	defer g.mu.RUnlock()
	var urls []string
	eligible := false
	if mf := g.models[model]; mf != nil {
		start := int(g.tokTurn.Add(1) % uint64(max(len(mf.members), 1)))
		for i := range mf.members {
			u := strings.TrimRight(mf.members[(start+i)%len(mf.members)].ep.URL, "/")
			switch {
			case u == configured:
				eligible = true
			case u != "" && !slices.Contains(urls, u): // data-parallel ranks share a URL
				urls = append(urls, u)
			}
		}
	}
	out := false
	if configured != "" && !eligible {
		for _, m := range g.members {
			if m.ep.Model == model && strings.TrimRight(m.ep.URL, "/") == configured {
				out = true // one of the model's engines, and not eligible now
				break
			}
		}
	}
	return urls, out
}

// Models lists the models the fleet serves: its base models, and then
// each LoRA adapter with its base model as parent.
func (g *Gateway) Models() []ServedModel {
	g.mu.RLock()
	defer g.mu.RUnlock()
	lens := map[string]int{} // a model's max_model_len: the least its engines listed
	for _, m := range g.members {
		n := lens[m.ep.Model]
		if g.health != nil {
			if l, ok := g.health.MaxModelLen(m.ep.Name); ok && (n == 0 || l < n) {
				n = l
			}
		}
		lens[m.ep.Model] = n
	}
	out := make([]ServedModel, 0, len(lens)+len(g.adapters))
	for model, n := range lens {
		out = append(out, ServedModel{ID: model, MaxModelLen: n})
	}
	for a, base := range g.adapters {
		out = append(out, ServedModel{ID: a, Parent: base, MaxModelLen: lens[base], Root: g.adapterRoot(base, a)})
	}
	sort.Slice(out, func(i, j int) bool {
		if (out[i].Parent == "") != (out[j].Parent == "") {
			return out[i].Parent == ""
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// ServedModel is a model the fleet serves; Parent is a LoRA adapter's base
// model ("" for a base model).
type ServedModel struct {
	ID, Parent string
	// Root is an adapter's root as an engine of its base lists it
	// (vLLM's: its path; "" when none did).
	Root string
	// MaxModelLen is the least its engines' /v1/models listed (0: none
	// listed one yet).
	MaxModelLen int
}

// adapterRoot is the root an engine of base lists for adapter ("" when
// none does; under g.mu).
func (g *Gateway) adapterRoot(base, adapter string) string {
	if g.health == nil {
		return ""
	}
	for _, m := range g.members {
		if m.ep.Model == base {
			if r, ok := g.health.AdapterRoot(m.ep.Name, adapter); ok {
				return r
			}
		}
	}
	return ""
}

// resolve is the fleet that serves model and the LoRA adapter a request
// naming it is served with: (model, "") for a base model, (its base,
// model) for an adapter.
func (g *Gateway) resolve(model string) (base, lora string) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if b, ok := g.adapters[model]; ok {
		return b, model
	}
	return model, ""
}

// Eligible is the names of the endpoints requests may be routed to now
// (configured or discovered, and in by the health checks).
func (g *Gateway) Eligible() map[string]bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	in := map[string]bool{}
	for _, mf := range g.models {
		for _, m := range mf.members {
			in[m.ep.Name] = true
		}
	}
	return in
}

// AddCollector registers more metrics on the gateway's /metrics (a
// planner's, say).
func (g *Gateway) AddCollector(c prometheus.Collector) error { return g.met.reg.Register(c) }

// Clock is the gateway's clock in seconds (the times Traffic hears).
func (g *Gateway) Clock() float64 { return g.clock() }

// SyncAddr is the address the replica sync's PUB is bound to (tcp://
// HOST:PORT), "" before Run has bound it or without a sync bind.
func (g *Gateway) SyncAddr() string {
	if g.sync == nil {
		return ""
	}
	return g.sync.Addr()
}
