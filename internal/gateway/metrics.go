package gateway

import (
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/internal/sched"
)

// metrics are kvgate's own Prometheus metrics, on a registry of the
// gateway's (no global state).
type metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	rejections *prometheus.CounterVec
	// sloMet counts the served answers kvgate_ttft_seconds observes that
	// met their class's TTFT target.
	sloMet       *prometheus.CounterVec
	decision     prometheus.Histogram
	ttft         *prometheus.HistogramVec
	promptTokens prometheus.Counter
	hitTokens    prometheus.Counter
	retries      prometheus.Counter
	migrations   *prometheus.CounterVec
	// whole: requests the client did not stream, by whether the engine
	// was asked to stream them (whole.go).
	whole *prometheus.CounterVec
	// fairRejections: requests rejected because another tenant with less
	// in flight was rejected for the load (fair.go).
	fairRejections prometheus.Counter
	held           prometheus.Counter
	holdSeconds    prometheus.Histogram
	yielded        prometheus.Counter
	displaced      prometheus.Counter
	touches        *prometheus.CounterVec
	touchTokens    *prometheus.CounterVec
	copies         *prometheus.CounterVec
	copyTokens     *prometheus.CounterVec
	// loadRejections counts rejections for the prefill queues by kind
	// (sched.LoadRejections): short (no prefilling endpoint idle) or
	// idle (one was: the request's prefix was cached only on busy ones).
	loadRejections *prometheus.CounterVec
	// passthrough counts requests to vLLM's other APIs by outcome
	// (passthrough.go).
	passthrough *prometheus.CounterVec
	// reloads counts config reloads by result (applied, refused), and
	// lastReload is when the last one was applied (reload.go).
	reloads    *prometheus.CounterVec
	lastReload prometheus.Gauge
}

// ttftBuckets are the TTFT histogram's bounds: 5 ms doubling to 164 s,
// and every class's TTFT target (which fell inside a bucket: 2 s between
// 1.28 and 2.56, so whether answers met it could not be read).
func ttftBuckets(classes []Class) []float64 {
	b := prometheus.ExponentialBuckets(0.005, 2, 16)
	for _, cl := range classes {
		if cl.TTFT > 0 && !slices.Contains(b, cl.TTFT) {
			b = append(b, cl.TTFT)
		}
	}
	slices.Sort(b)
	return b
}

// exportClasses makes the request series of c's models and classes at 0,
// so that rate() and increase() see their first event; at the start, and
// at each reload applied (a class a reload added had none until its first
// request). A failure before a class is known counts class "".
func (m *metrics) exportClasses(c *Config) {
	models := []string{""}
	for _, e := range c.Endpoints {
		if !slices.Contains(models, e.Model) {
			models = append(models, e.Model)
		}
	}
	for _, model := range models {
		for _, cl := range append([]Class{{}}, c.Classes...) {
			for _, o := range allOutcomes {
				m.requests.WithLabelValues(o, model, cl.Name, c.Policy)
			}
			if cl.Name != "" && model != "" {
				m.ttft.WithLabelValues(model, cl.Name)
				m.sloMet.WithLabelValues(model, cl.Name)
			}
		}
	}
	for _, cl := range c.Classes {
		m.rejections.WithLabelValues(cl.Name)
	}
}

func newMetrics(g *Gateway) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_requests_total",
			Help: "Requests by outcome (ok, rejected, yielded, displaced, bad_request, unavailable, engine_refused, upstream_error, tokenizer_error, broken_stream, client_gone, overloaded, hold_full, internal_error; docs/serve.md), model (\"\" before one the fleet serves is known), SLO class and policy."},
			[]string{"outcome", "model", "class", "policy"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_rejections_total",
			Help: "Requests rejected (429) by admission before any compute (at once, or displaced from an engine's queue before their prefill), or as yielded investments after some, by SLO class."}, []string{"class"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvgate_decision_seconds",
			Help:    "Time to decide one request (snapshot, policy, admission).",
			Buckets: prometheus.ExponentialBuckets(1e-6, 2, 20)}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_ttft_seconds",
			Help:    "Time to first byte of answers the engine streamed (answered whole from a stream too) as the gateway sees it, by SLO class; the classes' TTFT targets at the start are bucket bounds.",
			Buckets: ttftBuckets(g.cfg.Classes)}, []string{"model", "class"}),
		sloMet: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_ttft_slo_met_total",
			Help: "Served answers (outcome ok) whose first byte came within their class's TTFT target (its ttft plus ttft_per_1k_tokens for the prompt; any, for a class without one), of those kvgate_ttft_seconds observes; over kvgate_requests_total of the class it is the TTFT attainment, every other outcome a miss."}, []string{"model", "class"}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_prompt_tokens_total",
			Help: "Prompt tokens of routed requests."}),
		hitTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_prefix_hit_tokens_total",
			Help: "Prompt tokens the chosen endpoint held in its prefix cache, per the index."}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_retries_total",
			Help: "Requests sent again to another endpoint after a failure before the client had any byte."}),
		migrations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_migrations_total",
			Help: "Streams broken after they began and continued on another engine (--migration-limit): ok, the client got the whole answer; failed, no continuation finished it."}, []string{"result"}),
		whole: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_whole_answers_total",
			Help: "Chat, completion, Responses and Messages requests the client did not stream, by how they went to the engine: streamed (the gateway answers whole from the engine's stream, whole.go), as_sent (a key the stream cannot answer exactly, background mode, or --no-stream-upstream)."}, []string{"engine"}),
		fairRejections: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_fairness_rejections_total",
			Help: "With early rejection, requests rejected because a tenant (fairness header) with less in flight was rejected for the load within the last second."}),
		held: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_held_total",
			Help: "Requests held at the router: without early rejection, those that fit nowhere; with it, those that miss their SLO even alone."}),
		holdSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvgate_hold_seconds",
			Help:    "Time held requests spent in the hold queue until released (or, with early rejection, rejected at their deadline).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16)}),
		yielded: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_hold_yielded_total",
			Help: "Requests served late as the hold's investments that gave their engine up to a request that would have been rejected for the load (their clients got 429)."}),
		displaced: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_displaced_total",
			Help: "Requests displaced from an engine's queue before their prefill by a request of less compute that was rejected for the load (their clients got 429; docs/policies.md, Displacement)."}),
		touches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_hold_touches_total",
			Help: "One-token requests that kept held requests' cached prefixes warm (docs/policies.md), by outcome: done, failed, skipped (too many in flight), not_engine_ids (the prompt's token ids are the estimating tokenizer's, which find nothing cached: not sent)."},
			[]string{"outcome"}),
		touchTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_hold_touch_tokens_total",
			Help: "Prompt tokens of done touches, by kind: cached (found in the engine's prefix cache, as meant) or computed (one a touch, plus what the engine had evicted before the touch came); from the answers' usage.prompt_tokens_details."},
			[]string{"kind"}),
		copies: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_prefix_copies_total",
			Help: "One-token requests that copied a new conversation's cached shared prefix (its system prompt) to the endpoint kvgate's conversation balance sends the next such conversations to, ahead of them, on an idle fleet (docs/policies.md), by outcome: done, failed, skipped (too many prefix requests in flight)."},
			[]string{"outcome"}),
		copyTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_prefix_copy_tokens_total",
			Help: "Prompt tokens of done prefix copies, by kind: computed (the copy, as meant) or cached (the endpoint held them already); from the answers' usage.prompt_tokens_details."},
			[]string{"kind"}),
		loadRejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_load_rejections_total",
			Help: "Requests rejected because a prefill queue pushed their predicted TTFT over the SLO, by kind: short (no prefilling endpoint was idle: the fleet is short of compute, and kvgate prices compute first) or idle (one was: the request's prefix was cached only on busy endpoints, and kvgate routes by TTFT for a while so that prefixes are copied)."},
			[]string{"kind"}),
		passthrough: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_passthrough_requests_total",
			Help: "Requests to the engines' other APIs (/v1/embeddings, /tokenize, …) forwarded whole, by outcome: ok (an engine answered), refused (kvgate answered: a bad body, an unknown model, no endpoint), upstream (no engine could be reached, or the last answered 5xx), client_gone."},
			[]string{"outcome"}),
	}
	for _, o := range []string{passOK, passRefused, passUpstream, passGone} {
		m.passthrough.WithLabelValues(o)
	}
	for _, o := range []string{prefixDone, prefixFailed, prefixSkipped, touchNotEngineIDs} {
		m.touches.WithLabelValues(o)
	}
	for _, o := range []string{prefixDone, prefixFailed, prefixSkipped} {
		m.copies.WithLabelValues(o)
	}
	for _, k := range []string{"cached", "computed"} {
		m.touchTokens.WithLabelValues(k)
		m.copyTokens.WithLabelValues(k)
	}
	for _, kind := range []string{"short", "idle"} {
		m.loadRejections.WithLabelValues(kind) // exported from the start, at 0
	}
	m.exportClasses(&g.cfg)
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_config_reloads_total",
		Help: "Config reloads (SIGHUP) by result: applied, or refused (the running config kept; GET /admin/config shows what runs)."}, []string{"result"})
	m.reloads.WithLabelValues("applied")
	m.reloads.WithLabelValues("refused")
	m.lastReload = prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_config_last_reload_success_timestamp_seconds",
		Help: "When the running config was loaded: the start, then each reload applied (Unix seconds)."})
	m.lastReload.SetToCurrentTime()
	heldNow := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_held_requests",
		Help: "Requests held at the router now."}, func() float64 { return float64(g.heldNow()) })
	m.reg.MustRegister(m.requests, m.rejections, m.decision, m.ttft, m.sloMet, m.promptTokens, m.hitTokens, m.retries, m.migrations, m.whole, m.fairRejections,
		m.held, m.holdSeconds, m.yielded, m.displaced, m.touches, m.touchTokens, m.copies, m.copyTokens, m.loadRejections, m.passthrough, heldNow,
		m.reloads, m.lastReload,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&fleetCollector{g: g})
	if g.sync != nil {
		m.reg.MustRegister(syncCollector{g.sync})
	}
	return m
}

func (m *metrics) outcome(outcome, model, class, policy string) {
	m.requests.WithLabelValues(outcome, model, class, policy).Inc()
}

// modelLabel is rt's model as a metric label: "" until a model the
// fleet serves is known (a client's own name for one would let it make
// series without bound).
func (g *Gateway) modelLabel(rt *routed) string {
	if rt == nil || rt.model == "" {
		return ""
	}
	g.mu.RLock()
	_, ok := g.models[rt.model]
	g.mu.RUnlock()
	if !ok {
		return ""
	}
	return rt.model
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// fleetCollector exports per-endpoint load at scrape time.
type fleetCollector struct{ g *Gateway }

var (
	descInflight  = prometheus.NewDesc("kvgate_endpoint_inflight_requests", "Requests routed to the endpoint and not finished.", []string{"endpoint", "model"}, nil)
	descUncached  = prometheus.NewDesc("kvgate_endpoint_inflight_uncached_tokens", "Uncached prompt tokens routed to the endpoint and not yet past their prefill.", []string{"endpoint", "model"}, nil)
	descWait      = prometheus.NewDesc("kvgate_endpoint_predicted_queue_seconds", "Predicted prefill queue wait.", []string{"endpoint", "model"}, nil)
	descSpeed     = prometheus.NewDesc("kvgate_endpoint_learned_prefill_speed", "Prefill speed (tokens/s) the endpoint's predictor expects for a 2048-token uncached prompt.", []string{"endpoint", "model"}, nil)
	descPredErr   = prometheus.NewDesc("kvgate_endpoint_ttft_prediction_error", "Recent absolute percentage error of the endpoint's predicted TTFT (exponentially weighted over its observed first tokens, so unchanged while it gets none; 0.1 is 10%).", []string{"endpoint", "model"}, nil)
	descTPOT      = prometheus.NewDesc("kvgate_endpoint_learned_tpot_seconds", "TPOT (seconds per output token) the endpoint's learned model predicts for one more stream now.", []string{"endpoint", "model"}, nil)
	descTPOTErr   = prometheus.NewDesc("kvgate_endpoint_tpot_prediction_error", "Recent absolute percentage error of the endpoint's predicted TPOT (exponentially weighted; 0.1 is 10%).", []string{"endpoint", "model"}, nil)
	descEligible  = prometheus.NewDesc("kvgate_endpoint_eligible", "1 while requests may be routed to the endpoint (listed, healthy, not ejected), else 0.", []string{"endpoint", "model"}, nil)
	descHealthy   = prometheus.NewDesc("kvgate_endpoint_healthy", "1 while the endpoint's active health checks pass (with hysteresis), else 0; absent without health checks.", []string{"endpoint", "model"}, nil)
	descEjections = prometheus.NewDesc("kvgate_endpoint_ejections", "Passive ejections of the endpoint in its current run of failures (0 once it has stayed in for health.eject_max since the last one ended).", []string{"endpoint", "model"}, nil)
	descLag       = prometheus.NewDesc("kvgate_kv_events_last_seq", "Last KV-event sequence number applied per engine.", []string{"endpoint", "model"}, nil)
	descGaps      = prometheus.NewDesc("kvgate_kv_events_gaps_total", "KV-event sequence gaps per engine.", []string{"endpoint", "model"}, nil)
	descStepSlack = prometheus.NewDesc("kvgate_step_slack_seconds", "On engines that prefill in steps (engine_step_tokens): how much later than predicted the first tokens of requests routed near their SLO come (the 0.9 quantile), which admission adds to the pessimistic TTFT of a request that would queue (docs/predictor.md).", []string{"model"}, nil)
	descReturns   = prometheus.NewDesc("kvgate_hold_returns_ratio", "With early rejection: the share of requests served late (they miss their SLO even alone) whose prompt a later request extended, with a Laplace prior (0.5 before any); below 0.25 the hold serves no more of them (docs/policies.md).", []string{"model"}, nil)
)

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEligible, descHealthy, descEjections, descInflight, descUncached, descWait, descSpeed, descPredErr, descTPOT, descTPOTErr, descLag, descGaps, descReturns, descStepSlack} {
		ch <- d
	}
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.g.endpointStates() {
		ch <- prometheus.MustNewConstMetric(descEligible, prometheus.GaugeValue, bool01(st.Eligible), st.Name, st.Model)
		if h := st.Health; h != nil {
			if c.g.health.Probing() {
				ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, bool01(h.Healthy), st.Name, st.Model)
			}
			ch <- prometheus.MustNewConstMetric(descEjections, prometheus.GaugeValue, float64(h.Ejections), st.Name, st.Model)
		}
		ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(st.Load.InflightRequests), st.Name, st.Model)
		ch <- prometheus.MustNewConstMetric(descUncached, prometheus.GaugeValue, float64(st.Load.InflightUncached), st.Name, st.Model)
		if p := st.Predictor; p != nil {
			ch <- prometheus.MustNewConstMetric(descSpeed, prometheus.GaugeValue, p.Speed, st.Name, st.Model)
			ch <- prometheus.MustNewConstMetric(descPredErr, prometheus.GaugeValue, p.APE, st.Name, st.Model)
		}
		if d := st.DecodePredictor; d != nil {
			ch <- prometheus.MustNewConstMetric(descTPOT, prometheus.GaugeValue, d.TPOT, st.Name, st.Model)
			ch <- prometheus.MustNewConstMetric(descTPOTErr, prometheus.GaugeValue, d.APE, st.Name, st.Model)
		}
		ch <- prometheus.MustNewConstMetric(descWait, prometheus.GaugeValue, st.Load.QueueWait, st.Name, st.Model)
	}
	for model, r := range c.g.holdReturns() {
		ch <- prometheus.MustNewConstMetric(descReturns, prometheus.GaugeValue, r, model)
	}
	for model, v := range c.g.stepSlacks() {
		ch <- prometheus.MustNewConstMetric(descStepSlack, prometheus.GaugeValue, v, model)
	}
	{
		for _, s := range c.g.sub.Stats() {
			if s.LastSeq != nil {
				ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(*s.LastSeq), s.Endpoint, s.Model)
			}
			ch <- prometheus.MustNewConstMetric(descGaps, prometheus.CounterValue, float64(s.Gaps), s.Endpoint, s.Model)
		}
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// endpointLoad is the load part of /admin/endpoints.
type endpointLoad struct {
	QueueWait        float64 `json:"predicted_queue_seconds"`
	InflightRequests int     `json:"inflight_requests"`
	InflightUncached int     `json:"inflight_uncached_tokens"`
	DecodeStreams    int     `json:"decode_streams"`
	// Conversations: conversations opened here recently (a decayed
	// count, sched.Endpoint.Conversations), which kvgate keeps in balance.
	Conversations float64 `json:"conversations"`
}

func loadOf(e *sched.Endpoint) endpointLoad {
	return endpointLoad{QueueWait: e.QueueWait, InflightRequests: e.InflightRequests,
		InflightUncached: e.InflightUncached, DecodeStreams: e.DecodeStreams, Conversations: e.Conversations}
}

// stepSlacks is each model fleet's step slack (load.Fleet.StepSlack).
func (g *Gateway) stepSlacks() map[string]float64 {
	now := g.clock()
	return g.perModel(func(mf *modelFleet) float64 { return mf.load.StepSlackAt(now) })
}

// perModel is v of each model's fleet, by model name.
func (g *Gateway) perModel(v func(*modelFleet) float64) map[string]float64 {
	g.mu.RLock()
	defer g.mu.RUnlock()
	out := make(map[string]float64, len(g.models))
	for model, mf := range g.models {
		out[model] = v(mf)
	}
	return out
}
