package enginemetrics

import (
	"bytes"
	"math"
	"os"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// expfmtValues parses with the Prometheus library and returns the value of
// every metric family with exactly one sample.
func expfmtValues(data []byte) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, f := range fams {
		if len(f.Metric) != 1 {
			continue
		}
		out[name] = sampleValue(f.Metric[0])
	}
	return out, nil
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return math.NaN()
}

// FuzzParse checks that Parse never panics and, on every input the
// Prometheus library accepts, agrees with it on the metrics that have a
// single series.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"emulator.txt", "vllm_dp2.txt", "sglang_tp2.txt"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("vllm:num_requests_waiting{a=\"x\\\"\"} 3 17\n"))
	f.Add([]byte("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2.5e1\n"))
	f.Add([]byte("sglang:num_queue_reqs{tp_rank=\"0\"} 4\nsglang:token_usage 0.5\n"))
	f.Add([]byte("vllm:kv_cache_usage_perc{,} -0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(bytes.NewReader(data), "")
		if err == nil {
			if m.Waiting < 0 || m.Running < 0 || m.KVUsage < 0 || m.KVUsage > 1 || m.CacheHitRate < 0 || m.CacheHitRate > 1 ||
				m.PrefixQueries < 0 || m.PrefixHits < 0 || m.NumGPUBlocks < 0 || m.BlockSize < 0 {
				t.Fatalf("out of range: %+v", m)
			}
		}
		ref, rerr := expfmtValues(data)
		if rerr != nil {
			return
		}
		if err != nil {
			if err == ErrNoEngineMetrics {
				return
			}
			if strings.Contains(err.Error(), "longer than") {
				return // a line the library accepts and we cap
			}
			t.Fatalf("expfmt accepts, Parse fails: %v", err)
		}
		check := func(name string, have bool, got float64, conv func(float64) float64) {
			v, ok := ref[name]
			if !ok || math.IsNaN(v) {
				return
			}
			if !have || got != conv(v) {
				t.Fatalf("%s: Parse %v (have %v), expfmt %v", name, got, have, v)
			}
		}
		if m.Flavor == FlavorVLLM {
			check("vllm:num_requests_waiting", m.Has(FieldWaiting), float64(m.Waiting), func(v float64) float64 { return float64(count(v)) })
			check("vllm:num_requests_running", m.Has(FieldRunning), float64(m.Running), func(v float64) float64 { return float64(count(v)) })
			check("vllm:kv_cache_usage_perc", m.Has(FieldKVUsage), m.KVUsage, fraction)
		}
	})
}
