package engine

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the engine's Prometheus metrics under vLLM's names, in a
// registry of their own (never the global one) so that many engines can
// live in one process. Latencies are in modelled seconds.
type metrics struct {
	reg *prometheus.Registry

	running, waiting, kvUsage, gpuUsage prometheus.Gauge
	cacheQueries, cacheHits             prometheus.Counter
	promptTokens, generationTokens      prometheus.Counter
	preemptions                         prometheus.Counter
	// lag: the emulator's own, not vLLM's (scheduler.lag).
	lag                                prometheus.Counter
	success                            *prometheus.CounterVec
	ttft, itl, tpot, e2e               prometheus.Observer
	queueTime, prefillTime, decodeTime prometheus.Observer
	// lora is vllm:lora_requests_info: one series, labelled with the
	// adapters running and waiting, whose value is when it was set.
	lora    *prometheus.GaugeVec
	maxLoRA string
}

var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets  = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

func newMetrics(cfg Config) *metrics {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": cfg.Model, "engine": "0"}
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
		f(g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		f(c)
		return c
	}
	hist := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
		f(h)
		return h
	}
	m := &metrics{reg: reg}
	m.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
	m.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
	m.kvUsage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
	m.gpuUsage = gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (deprecated name of vllm:kv_cache_usage_perc).")
	m.cacheQueries = counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.")
	m.cacheHits = counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.")
	m.promptTokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	m.generationTokens = counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
	m.preemptions = counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.")
	m.lag = counter("kvgate_engine_lag_seconds_total", "Modelled seconds the emulator fell behind its timing model (steps started late: the machine is short of CPU); not a vLLM metric.")
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	f(m.success)
	m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	m.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets)
	m.tpot = hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds (deprecated name of vllm:inter_token_latency_seconds).", itlBuckets)
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets)
	m.queueTime = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", e2eBuckets)
	m.prefillTime = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", e2eBuckets)
	m.decodeTime = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", e2eBuckets)

	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig.",
	}, []string{"block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype"})
	info.WithLabelValues(strconv.Itoa(cfg.BlockSize), strconv.Itoa(cfg.NumGPUBlocks), "True", "auto").Set(1)
	f(info)
	lora := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm:lora_requests_info", Help: "Running stats on lora requests.",
	}, []string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"})
	m.lora, m.maxLoRA = lora, "0"
	if len(cfg.LoRAModules) > 0 {
		m.maxLoRA = strconv.Itoa(cfg.MaxLoRAs)
	}
	lora.WithLabelValues(m.maxLoRA, "", "").Set(0)
	f(lora)
	for _, r := range []string{finishStop, finishLength, finishAbort} {
		m.success.WithLabelValues(r)
	}
	return m
}

func (m *metrics) finished(reason string) { m.success.WithLabelValues(reason).Inc() }

// setLoRA reports the adapters of the running and waiting requests
// (comma-separated names) as vLLM does: the one series of
// vllm:lora_requests_info, its value the time it was set.
func (m *metrics) setLoRA(running, waiting string, at time.Time) {
	m.lora.Reset()
	m.lora.WithLabelValues(m.maxLoRA, running, waiting).Set(float64(at.UnixNano()) / 1e9)
}
