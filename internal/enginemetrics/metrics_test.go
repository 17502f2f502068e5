package enginemetrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func parseFile(t *testing.T, name, model string) Metrics {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := Parse(f, model)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return m
}

// same compares two results field by field.
func same(t *testing.T, name string, got, want Metrics) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %+v\nwant %+v", name, got, want)
	}
}

const vllmAll = FieldWaiting | FieldRunning | FieldKVUsage | FieldCacheConfig | FieldPrefixCounters

func TestParseEmulator(t *testing.T) {
	// Captured from `kvgate engine` (internal/engine) after three requests.
	got := parseFile(t, "emulator.txt", "")
	same(t, "emulator", got, Metrics{
		Flavor: FlavorVLLM, Have: vllmAll,
		BlockSize: 16, NumGPUBlocks: 2048, PrefixQueries: 69, PrefixHits: 32,
	})
	// Filtering by its own model changes nothing; another model keeps only
	// the series without a model label (cache_config_info).
	same(t, "emulator, own model", parseFile(t, "emulator.txt", "meta-llama/Llama-3.1-8B-Instruct"), got)
	same(t, "emulator, other model", parseFile(t, "emulator.txt", "other"), Metrics{
		Flavor: FlavorVLLM, Have: FieldCacheConfig, BlockSize: 16, NumGPUBlocks: 2048,
	})
}

func TestParseVLLMDataParallel(t *testing.T) {
	// Two data-parallel engines: counts and blocks add up, usage averages.
	same(t, "vllm dp2", parseFile(t, "vllm_dp2.txt", "Qwen/Qwen3-8B"), Metrics{
		Flavor: FlavorVLLM, Have: vllmAll,
		Waiting: 13, Running: 12, KVUsage: 0.5,
		BlockSize: 16, NumGPUBlocks: 27910 + 27906,
		PrefixQueries: 2e6, PrefixHits: 8e5,
	})
}

func TestParseSGLang(t *testing.T) {
	// Tensor-parallel ranks repeat one scheduler's numbers: counted once.
	same(t, "sglang tp2", parseFile(t, "sglang_tp2.txt", ""), Metrics{
		Flavor: FlavorSGLang, Have: FieldWaiting | FieldRunning | FieldKVUsage | FieldCacheHitRate | FieldMaxTotalTokens,
		Waiting: 3, Running: 12, KVUsage: 0.28, CacheHitRate: 0.007507552643049313, MaxTotalTokens: 161721,
	})
	// Data-parallel ranks are separate schedulers: summed (usage averaged).
	dp := `
sglang:num_queue_reqs{dp_rank="0",model_name="m",tp_rank="0"} 1
sglang:num_queue_reqs{dp_rank="0",model_name="m",tp_rank="1"} 1
sglang:num_queue_reqs{dp_rank="1",model_name="m",tp_rank="0"} 4
sglang:token_usage{dp_rank="0",model_name="m"} 0.5
sglang:token_usage{dp_rank="1",model_name="m"} 0.25
`
	m, err := Parse(strings.NewReader(dp), "m")
	if err != nil {
		t.Fatal(err)
	}
	same(t, "sglang dp2", m, Metrics{Flavor: FlavorSGLang, Have: FieldWaiting | FieldKVUsage, Waiting: 5, KVUsage: 0.375})
	for rank, want := range []Metrics{
		{Flavor: FlavorSGLang, Have: FieldWaiting | FieldKVUsage, Waiting: 1, KVUsage: 0.5},
		{Flavor: FlavorSGLang, Have: FieldWaiting | FieldKVUsage, Waiting: 4, KVUsage: 0.25},
	} {
		m, err := ParseRank(strings.NewReader(dp), "m", rank)
		if err != nil {
			t.Fatal(err)
		}
		same(t, fmt.Sprintf("sglang dp rank %d", rank), m, want)
	}
}

// TestParseAPIServerProcesses: vLLM with several API server processes
// exports a gauge once a process (label pid, prometheus_client's
// multiprocess mode): views of one engine, de-duplicated, not averaged
// as ranks (walkthrough, 2026-12-04: 0.8 and a stale 0.0 read 0.4).
func TestParseAPIServerProcesses(t *testing.T) {
	raw := `
vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="101"} 0.8
vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="102"} 0
vllm:num_requests_running{engine="0",model_name="m",pid="101"} 3
vllm:num_requests_running{engine="0",model_name="m",pid="102"} 0
`
	m, err := Parse(strings.NewReader(raw), "m")
	if err != nil {
		t.Fatal(err)
	}
	if m.KVUsage != 0.8 || m.Running != 3 {
		t.Errorf("two API server processes: usage %v, running %d; want 0.8, 3", m.KVUsage, m.Running)
	}
}

// TestParseRank: one rank of a data-parallel vLLM engine is its own
// engine="R" series; series without the label (lora_requests_info) stay;
// a rank the engine does not have reads as nothing of it.
func TestParseRank(t *testing.T) {
	raw, err := os.ReadFile("testdata/vllm_dp2.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		rank int
		want Metrics
	}{
		{0, Metrics{Flavor: FlavorVLLM, Have: vllmAll, Waiting: 2, Running: 7, KVUsage: 0.25, BlockSize: 16, NumGPUBlocks: 27910, PrefixQueries: 1.2e6, PrefixHits: 6e5}},
		{1, Metrics{Flavor: FlavorVLLM, Have: vllmAll, Waiting: 11, Running: 5, KVUsage: 0.75, BlockSize: 16, NumGPUBlocks: 27906, PrefixQueries: 8e5, PrefixHits: 2e5}},
		{-1, Metrics{Flavor: FlavorVLLM, Have: vllmAll, Waiting: 13, Running: 12, KVUsage: 0.5, BlockSize: 16, NumGPUBlocks: 27910 + 27906, PrefixQueries: 2e6, PrefixHits: 8e5}},
	} {
		m, err := ParseRank(bytes.NewReader(raw), "Qwen/Qwen3-8B", tt.rank)
		if err != nil {
			t.Fatal(err)
		}
		same(t, fmt.Sprintf("vllm dp2 rank %d", tt.rank), m, tt.want)
	}
	if _, err := ParseRank(bytes.NewReader(raw), "Qwen/Qwen3-8B", 2); !errors.Is(err, ErrNoEngineMetrics) {
		t.Errorf("rank 2 of 2: %v, want ErrNoEngineMetrics", err)
	}
}

func TestParseVariants(t *testing.T) {
	tests := []struct {
		name, in, model string
		want            Metrics
	}{
		{name: "older vLLM names", in: `
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:gpu_prefix_cache_queries_total{model_name="m"} 100
vllm:gpu_prefix_cache_hits_total{model_name="m"} 40
vllm:num_requests_waiting{model_name="m"} 0
`, want: Metrics{Flavor: FlavorVLLM, Have: FieldWaiting | FieldKVUsage | FieldPrefixCounters, KVUsage: 0.5, PrefixQueries: 100, PrefixHits: 40}},
		{name: "current name wins over deprecated", in: `
vllm:gpu_cache_usage_perc 0.9
vllm:kv_cache_usage_perc 0.1
vllm:gpu_prefix_cache_queries_total 5
vllm:gpu_prefix_cache_hits_total 5
vllm:prefix_cache_queries_total 10
vllm:prefix_cache_hits_total 1
`, want: Metrics{Flavor: FlavorVLLM, Have: FieldKVUsage | FieldPrefixCounters, KVUsage: 0.1, PrefixQueries: 10, PrefixHits: 1}},
		{name: "two models, filtered", model: "b", in: `
vllm:num_requests_waiting{model_name="a"} 5
vllm:num_requests_waiting{model_name="b"} 2
vllm:num_requests_running{model_name="a"} 1
`, want: Metrics{Flavor: FlavorVLLM, Have: FieldWaiting, Waiting: 2}},
		{name: "two models, summed", in: `
vllm:num_requests_waiting{model_name="a"} 5
vllm:num_requests_waiting{model_name="b"} 2
`, want: Metrics{Flavor: FlavorVLLM, Have: FieldWaiting, Waiting: 7}},
		{name: "clamps, NaN, timestamps, escapes, blanks", in: "\t vllm:num_requests_waiting{a=\"x\\\"y\\\\z\\n\" , } -3 1700000000000\r\n" +
			"vllm:num_requests_running NaN\n" +
			"vllm:kv_cache_usage_perc +Inf\n" +
			"vllm:cache_config_info{block_size=\"None\",num_gpu_blocks=\"10\"} 1\n",
			want: Metrics{Flavor: FlavorVLLM, Have: FieldWaiting | FieldKVUsage, KVUsage: 1}},
		{name: "huge counts are capped", in: "vllm:num_requests_waiting 1e300\nvllm:prefix_cache_queries_total 1e300\nvllm:prefix_cache_hits_total -1\n",
			want: Metrics{Flavor: FlavorVLLM, Have: FieldWaiting | FieldPrefixCounters, Waiting: maxCount, PrefixQueries: 1 << 53}},
		{name: "malformed lines of other metrics are not read", in: "foo{{{ bar\nvllm:num_requests_waitingX garbage\nvllm:num_requests_waiting 1\n",
			want: Metrics{Flavor: FlavorVLLM, Have: FieldWaiting, Waiting: 1}},
	}
	for _, tt := range tests {
		m, err := Parse(strings.NewReader(tt.in), tt.model)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		same(t, tt.name, m, tt.want)
	}
}

func TestParseErrors(t *testing.T) {
	for in, want := range map[string]string{
		"":                                                               "no vLLM or SGLang metrics",
		"# only comments\nfoo 1\n":                                       "no vLLM or SGLang metrics",
		"vllm:num_requests_waiting\n":                                    "line 1: vllm:num_requests_waiting: missing value",
		"\nvllm:num_requests_waiting many\n":                             `line 2: vllm:num_requests_waiting: value "many" is not a number`,
		"vllm:num_requests_waiting 1 later\n":                            `timestamp "later" is not an integer`,
		`vllm:num_requests_waiting{a="b} 1`:                              "unterminated value",
		`vllm:num_requests_waiting{a="\t"} 1`:                            `bad escape \t`,
		`vllm:num_requests_waiting{a=b} 1`:                               "label a: value is not quoted",
		`vllm:num_requests_waiting{a} 1`:                                 "label a: missing =",
		`vllm:num_requests_waiting{9a="b"} 1`:                            "bad label name",
		`vllm:num_requests_waiting{a="b" c} 1`:                           "expected , or }",
		`vllm:num_requests_waiting{a="b",`:                               "unterminated label set",
		"vllm:kv_cache_usage_perc " + strings.Repeat("1", maxLineLen+10): "longer than",
	} {
		_, err := Parse(strings.NewReader(in), "")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.50q: error %v, want %q", in, err, want)
		}
	}
	if _, err := Parse(strings.NewReader("x 1"), ""); !errors.Is(err, ErrNoEngineMetrics) {
		t.Errorf("want ErrNoEngineMetrics, got %v", err)
	}
	// An over-long line of another metric is skipped.
	long := "foo{a=\"" + strings.Repeat("x", 3*maxLineLen) + "\"} 1\nvllm:num_requests_waiting 2\n"
	if m, err := Parse(strings.NewReader(long), ""); err != nil || m.Waiting != 2 {
		t.Errorf("long unrelated line: %+v %v", m, err)
	}
	var series strings.Builder
	for i := range maxSeriesPerName + 1 {
		series.WriteString("vllm:num_requests_waiting{engine=\"")
		series.WriteString(strings.Repeat("e", i%7) + string(rune('a'+i%26)) + time.Duration(i).String())
		series.WriteString("\"} 1\n")
	}
	if _, err := Parse(strings.NewReader(series.String()), ""); err == nil || !strings.Contains(err.Error(), "label sets") {
		t.Errorf("too many series: %v", err)
	}
}

func TestHitRate(t *testing.T) {
	v := func(q, h float64) Metrics {
		return Metrics{Have: FieldPrefixCounters, PrefixQueries: q, PrefixHits: h}
	}
	tests := []struct {
		prev, cur Metrics
		rate      float64
		ok        bool
	}{
		{v(100, 10), v(300, 110), 0.5, true},
		{v(100, 10), v(100, 10), 0, false}, // no queries in between
		{v(100, 10), v(50, 5), 0, false},   // restart
		{Metrics{}, v(50, 5), 0, false},
		{Metrics{}, Metrics{Have: FieldCacheHitRate, CacheHitRate: 0.3}, 0.3, true},
	}
	for i, tt := range tests {
		r, ok := HitRate(tt.prev, tt.cur)
		if ok != tt.ok || math.Abs(r-tt.rate) > 1e-12 {
			t.Errorf("%d: got %v %v, want %v %v", i, r, ok, tt.rate, tt.ok)
		}
	}
}

func TestMetricsHelpers(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := Metrics{Time: t0, Flavor: FlavorVLLM, Have: FieldWaiting | FieldCacheConfig, Waiting: 0, BlockSize: 16, NumGPUBlocks: 100}
	if !m.Fresh(t0.Add(time.Second), time.Second) || m.Fresh(t0.Add(2*time.Second), time.Second) || (Metrics{}).Fresh(t0, time.Hour) {
		t.Error("Fresh")
	}
	if m.CapacityTokens() != 1600 || (Metrics{Have: FieldMaxTotalTokens, MaxTotalTokens: 7}).CapacityTokens() != 7 || (Metrics{}).CapacityTokens() != 0 {
		t.Error("CapacityTokens")
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	// Present zero values are written; absent ones are not.
	if got["waiting"] != 0.0 || got["block_size"] != 16.0 || got["num_gpu_blocks"] != 100.0 || got["flavor"] != "vllm" {
		t.Errorf("json: %s", b)
	}
	if _, ok := got["kv_usage"]; ok {
		t.Errorf("json has an absent field: %s", b)
	}
}

// TestParseLoRA: vllm:lora_requests_info is read from its latest series
// (vLLM leaves every label set it ever set behind, each valued with the
// time it was set).
func TestParseLoRA(t *testing.T) {
	const expo = `vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.764221150e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters="code"} 1.764221170e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1.764221160e+09
`
	m, err := Parse(strings.NewReader(expo), "m")
	if err != nil {
		t.Fatal(err)
	}
	if !m.Has(FieldLoRA) || m.MaxLoRA != 2 || !reflect.DeepEqual(m.LoRARunning, []string{"sql", "chat"}) || !reflect.DeepEqual(m.LoRAWaiting, []string{"code"}) {
		t.Fatalf("got max %d running %q waiting %q (have %b)", m.MaxLoRA, m.LoRARunning, m.LoRAWaiting, m.Have)
	}
	// Series set in the same second (llm-d-inference-sim's whole seconds)
	// are read together: a place taken in either is taken.
	tie, err := Parse(strings.NewReader(`vllm:num_requests_running 1
vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 1764221170
vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql",waiting_lora_adapters="chat"} 1764221170
vllm:lora_requests_info{max_lora="1",running_lora_adapters="chat",waiting_lora_adapters=""} 1764221169
`), "")
	if err != nil || !reflect.DeepEqual(tie.LoRARunning, []string{"sql"}) || !reflect.DeepEqual(tie.LoRAWaiting, []string{"chat"}) || tie.MaxLoRA != 1 {
		t.Fatalf("same-second series: running %q waiting %q, %v", tie.LoRARunning, tie.LoRAWaiting, err)
	}
	// An engine without adapters reports max_lora 0: nothing to read.
	none, err := Parse(strings.NewReader(`vllm:num_requests_running 1
vllm:lora_requests_info{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""} 0
`), "")
	if err != nil || none.Has(FieldLoRA) {
		t.Fatalf("no adapters: have %b, %v", none.Have, err)
	}
	// The LoRA info alone is no engine's metrics.
	if _, err := Parse(strings.NewReader(`vllm:lora_requests_info{max_lora="1"} 1`), ""); !errors.Is(err, ErrNoEngineMetrics) {
		t.Fatalf("LoRA info alone: %v", err)
	}
}
