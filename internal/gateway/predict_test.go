package gateway

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestFirstStreamedByteTrainsPredictor: every streamed answer's first byte
// is an observation of its endpoint's prefill. A request the client did
// not stream is one too, streamed from the engine and answered whole
// (whole.go); sent as the client sent it (NoStreamUpstream) it is not: its
// first byte comes after the whole generation. /admin/endpoints and
// /metrics show the learned speed and the recent error.
func TestFirstStreamedByteTrainsPredictor(t *testing.T) {
	for _, c := range []struct {
		asSent bool
		want   int
	}{{false, 7}, {true, 5}} {
		t.Run(fmt.Sprintf("no_stream_upstream=%v", c.asSent), func(t *testing.T) {
			_, _, eps := twoAggregated(t)
			cfg := Config{Endpoints: eps, BlockSize: 16, Policy: "kvgate", NoStreamUpstream: c.asSent}
			_, url, admin := startGateway(t, cfg, Options{})
			sendCompletions(t, url, "p", 5, 3)
			sendCompletions(t, url, "q", -2, 3)
			samples := 0
			for _, e := range adminEndpoints(t, admin) {
				if e.Predictor == nil {
					t.Fatalf("endpoint %s: no predictor state", e.Name)
				}
				if e.Predictor.Speed <= 0 || e.Predictor.Margin < 1 {
					t.Errorf("endpoint %s: predictor %+v", e.Name, *e.Predictor)
				}
				samples += e.Predictor.Samples
			}
			if samples != c.want {
				t.Errorf("predictor samples %d, want %d", samples, c.want)
			}
			metrics := get(t, admin+"/metrics")
			for _, m := range []string{"kvgate_endpoint_learned_prefill_speed{", "kvgate_endpoint_ttft_prediction_error{"} {
				if !strings.Contains(metrics, m) {
					t.Errorf("/metrics lacks %s", m)
				}
			}
		})
	}
}

// TestStreamTPOTTrainsDecodePredictor: with the learned predictor a
// streamed answer's TPOT trains its endpoint's TPOT model, which
// /admin/endpoints and /metrics show (the emulated engines run 50× faster
// than the analytic step the model starts from, so the learned TPOT falls
// below it); with the analytic predictor there is no TPOT model to show.
func TestStreamTPOTTrainsDecodePredictor(t *testing.T) {
	for _, c := range []struct {
		predictor string
		learned   bool
	}{{"", true}, {PredictorLearned, true}, {PredictorAnalytic, false}} {
		t.Run(c.predictor, func(t *testing.T) {
			e1 := startEngine(t, fleet.RoleBoth, nil)
			cfg := Config{Endpoints: []fleet.Endpoint{endpointOf(e1, fleet.RoleBoth)}, BlockSize: 16, Policy: "kvgate",
				Predictor: c.predictor}
			_, url, admin := startGateway(t, cfg, Options{})
			const streamed = 6
			sendCompletions(t, url, "t", streamed, 24)
			d := adminEndpoints(t, admin)[0].DecodePredictor
			metrics := get(t, admin+"/metrics")
			hasMetric := strings.Contains(metrics, "kvgate_endpoint_learned_tpot_seconds{") &&
				strings.Contains(metrics, "kvgate_endpoint_tpot_prediction_error{")
			if !c.learned {
				if d != nil || hasMetric {
					t.Errorf("analytic predictor shows a TPOT model: %+v, metric %v", d, hasMetric)
				}
				return
			}
			if d == nil || !hasMetric {
				t.Fatalf("learned predictor: decode predictor %+v, metric %v", d, hasMetric)
			}
			if d.Samples < 1 || d.Samples > streamed || !(d.TPOT > 0 && d.TPOT < d.Analytic) {
				t.Errorf("decode predictor %+v: want 1..%d samples and a TPOT below the analytic one", *d, streamed)
			}
		})
	}
}

// TestConfigPredictor: the predictor defaults to learned; analytic and
// learned are valid; anything else is an error naming the field and flag.
func TestConfigPredictor(t *testing.T) {
	for _, c := range []struct {
		in, want, err string
	}{
		{"", PredictorLearned, ""},
		{"learned", PredictorLearned, ""},
		{"analytic", PredictorAnalytic, ""},
		{"Learned", "", `predictor (--predictor): unknown predictor "Learned"`},
		{"true", "", "unknown predictor"},
	} {
		cfg := Config{Predictor: c.in}
		cfg.Defaults()
		err := cfg.Validate()
		switch {
		case c.err == "" && (err != nil || cfg.Predictor != c.want):
			t.Errorf("predictor %q: %q, %v; want %q", c.in, cfg.Predictor, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("predictor %q: error %v, want %q", c.in, err, c.err)
		}
	}
	parsed, err := ParseConfig([]byte("predictor: analytic\n"))
	if err != nil || parsed.Predictor != PredictorAnalytic {
		t.Errorf("YAML predictor: %q, %v", parsed.Predictor, err)
	}
}

// sendCompletions sends |n| completions of distinct prompts (tag and an
// index) for maxTokens tokens, streamed if n > 0; each must succeed.
func sendCompletions(t *testing.T, url, tag string, n, maxTokens int) {
	t.Helper()
	stream := n > 0
	for i := range max(n, -n) {
		r := post(t, url+"/v1/completions", completion(prefix(fmt.Sprintf("%s%d", tag, i)), stream, maxTokens), nil)
		if r.status != 200 {
			t.Fatalf("request %s%d: %d %s", tag, i, r.status, r.body)
		}
	}
}

// adminEndpoints is /admin/endpoints.
func adminEndpoints(t *testing.T, admin string) []EndpointState {
	t.Helper()
	var st struct {
		Endpoints []EndpointState `json:"endpoints"`
	}
	getJSON(t, admin+"/admin/endpoints", &st)
	return st.Endpoints
}
