package gateway

import (
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestOutputLengths: until 64 answers are seen a request's output is
// planned at its limit; then at the answers' 95th percentile, within a
// limit the request set, and at it when it set none; the percentile
// follows the latest 512 answers.
func TestOutputLengths(t *testing.T) {
	var o outputLengths
	for i := 1; i < outputMinSamples; i++ {
		o.observe(i)
	}
	if got := o.planned(32000, true); got != 32000 {
		t.Fatalf("planned %d before enough answers", got)
	}
	o.observe(outputMinSamples) // 1…64: the 95th percentile is 61
	for _, c := range []struct {
		limit   int
		limited bool
		want    int
	}{{32000, true, 61}, {10, true, 10}, {defaultOutputTokens, false, 61}} {
		if got := o.planned(c.limit, c.limited); got != c.want {
			t.Errorf("planned(%d, %v) = %d, want %d", c.limit, c.limited, got, c.want)
		}
	}
	for range outputWindow {
		o.observe(1000)
	}
	if got := o.planned(32000, true); got != 1000 {
		t.Errorf("after a window of longer answers: %d, want 1000", got)
	}
	o.observe(0)
	o.observe(-5) // not answers
	if o.n != outputWindow {
		t.Errorf("%d samples kept", o.n)
	}
}

// TestOutputPlannedFromAnswers: the answers a gateway relays plan the
// next requests' output: after 64 answers of 8 tokens, a request asking
// for 32 000 is planned at 8 (the KV room its sequence needs on a decode
// endpoint, sched.Request.KVTokens).
func TestOutputPlannedFromAnswers(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, nil)
	g, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}, Policy: "kvgate", BlockSize: 16}, Options{})
	for i := range outputMinSamples {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"stream":%v,"messages":[{"role":"user","content":"question %d"}]}`, testModel, i%2 == 0, i)
		if r := post(t, url+"/v1/chat/completions", body, nil); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	g.mu.RLock()
	mf := g.models[testModel]
	g.mu.RUnlock()
	class, err := g.classOf(httptest.NewRequest("POST", "/", nil))
	if err != nil {
		t.Fatal(err)
	}
	rt := &routed{outN: 32000, outLimited: true, outputs: &mf.outputs, class: class}
	if got := g.schedRequest(rt, 0).OutputTokens; got != 8 {
		t.Fatalf("planned %d output tokens, want 8", got)
	}
}
