package gateway

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestFirstStreamedByteTrainsPredictor: every streamed answer's first byte
// is an observation of its endpoint's prefill; a non-streamed answer is
// not (its first byte comes after the whole generation). /admin/endpoints
// and /metrics show the learned speed and the recent error.
func TestFirstStreamedByteTrainsPredictor(t *testing.T) {
	e1 := startEngine(t, fleet.RoleBoth, nil)
	e2 := startEngine(t, fleet.RoleBoth, nil)
	cfg := Config{
		Endpoints: []fleet.Endpoint{endpointOf(e1, fleet.RoleBoth), endpointOf(e2, fleet.RoleBoth)},
		BlockSize: 16,
		Policy:    "kvgate",
	}
	_, url, admin := startGateway(t, cfg, Options{})
	const streamed = 5
	for i := range streamed + 2 {
		stream := i < streamed
		r := post(t, url+"/v1/completions", completion(prefix(fmt.Sprintf("p%d", i)), stream, 3), nil)
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	var st struct {
		Endpoints []EndpointState `json:"endpoints"`
	}
	getJSON(t, admin+"/admin/endpoints", &st)
	samples := 0
	for _, e := range st.Endpoints {
		if e.Predictor == nil {
			t.Fatalf("endpoint %s: no predictor state", e.Name)
		}
		if e.Predictor.Speed <= 0 || e.Predictor.Margin < 1 {
			t.Errorf("endpoint %s: predictor %+v", e.Name, *e.Predictor)
		}
		samples += e.Predictor.Samples
	}
	if samples != streamed {
		t.Errorf("predictor samples %d, want one per streamed answer (%d)", samples, streamed)
	}
	metrics := get(t, admin+"/metrics")
	for _, m := range []string{"kvgate_endpoint_learned_prefill_speed{", "kvgate_endpoint_ttft_prediction_error{"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
}
