package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
)

// displaceRig runs a gateway with early rejection over one upstream (1 000
// prompt tokens/s, the analytic predictor's first margin of 1.5, a 2 s
// TTFT SLO, engines that prefill whole
// prompts) on a clock that stands still; displace is its --displace.
func displaceRig(t *testing.T, displace string) *holdRig {
	seen, inUpstream := &atomic.Int64{}, make(chan struct{}, 4)
	up := holdUpstream(t, seen, inUpstream)
	clock := &atomic.Int64{}
	clock.Store(time.Unix(1000, 0).UnixNano())
	on, steps := true, 0
	cfg := Config{
		Endpoints:        []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}},
		Classes:          []Class{{Name: "standard", Priority: 1, TTFT: 2}, {Name: "batch"}},
		EarlyReject:      &on,
		Predictor:        PredictorAnalytic,
		EngineStepTokens: &steps,
		Displace:         displace,
	}
	g, url, admin := startGateway(t, cfg, Options{Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	return &holdRig{url: url, admin: admin, clock: clock, seen: seen, inUpstream: inUpstream, g: g}
}

// TestDisplacement: A (500 tokens, 0.5 s) runs; B (800 tokens) queues
// behind it (pessimistic 0.75 + 1.2 s: the margin stretches the queue
// too) and its engine sends its stream's headers at once, as vLLM does;
// C (400 tokens) would be 1.95 + 0.6 s, misses, fits alone, computes
// less than B, and takes B's place: B's upstream request is
// aborted and its client gets 429, nothing of the 200 its engine began;
// C is served. The same when B's engine has sent nothing yet (an answer
// not streamed). With displacement off, or B of a class without a TTFT
// target (it cannot be late), C is rejected and B keeps its place.
func TestDisplacement(t *testing.T) {
	for _, c := range []struct{ displace, bHold, bClass string }{
		{HoldPolicy, "headers", ""}, {HoldPolicy, "1", ""}, {HoldOff, "headers", ""},
		{HoldPolicy, "headers", "batch"}, // no TTFT target: never late, never displaced
	} {
		displace, bClass := c.displace, c.bClass
		t.Run(displace+"/"+c.bHold+"/"+bClass, func(t *testing.T) {
			rig := displaceRig(t, displace)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			occupyWith(t, ctx, rig.url, 7, 500, rig.inUpstream) // A
			gotB := make(chan result, 1)
			hdr := map[string]string{"X-Hold": c.bHold}
			if c.bClass != "" {
				hdr["X-Kvgate-Class"] = c.bClass
			}
			go func() { gotB <- sendUntil(ctx, rig.url, tokenPrompt(8, 800, true), hdr) }() // B, until its answer or the test's end
			select {
			case <-rig.inUpstream:
			case b := <-gotB:
				t.Fatalf("B never reached the upstream: %d %v %s", b.status, b.header, b.body)
			case <-time.After(30 * time.Second):
				t.Fatal("B never reached the upstream")
			}
			c := post(t, rig.url+"/v1/completions", tokenPrompt(9, 400, false), nil)
			m := get(t, rig.admin+"/metrics")
			if displace == HoldOff || bClass == "batch" {
				if c.status != 429 || !strings.Contains(c.body, "rejected") {
					t.Fatalf("C without displacement: %d %s, want 429", c.status, c.body)
				}
				if counted(m, "displaced") || !strings.Contains(m, "kvgate_displaced_total 0") {
					t.Error("displaced with --displace off")
				}
				cancel() // A's and B's clients go
				return
			}
			if c.status != 200 {
				t.Fatalf("C: %d %s, want it served in B's place", c.status, c.body)
			}
			b := awaitResult(t, gotB)
			if b.status != 429 || !strings.Contains(b.body, "took its place") || b.header.Get("X-Should-Retry") != "false" || b.header.Get("Retry-After") == "" {
				t.Fatalf("B: %d %v %s, want the displaced 429", b.status, b.header, b.body)
			}
			for k := range b.header {
				if strings.HasPrefix(strings.ToLower(k), "x-kvgate-") {
					t.Errorf("B's 429 carries %s: %q", k, b.header.Get(k))
				}
			}
			m = get(t, rig.admin+"/metrics")
			if !strings.Contains(m, "kvgate_displaced_total 1") || !counted(m, "displaced") || !strings.Contains(m, `kvgate_rejections_total{class="standard"} 1`) {
				t.Error("kvgate_displaced_total is not 1, or B is not outcome displaced, or not counted a rejection")
			}
		})
	}
}

// TestDisplacementBetweenTenants: the same three requests as
// TestDisplacement, A and C of tenant s, B of tenant b (llm-d's fairness
// header). C of 250 tokens takes B's place: b holds 800 tokens in flight,
// s would hold 750 with C. C of 400 does not: s would hold 900, more than
// b, and displacing b's request would favour the tenant already served
// more; C is rejected and B keeps its place.
func TestDisplacementBetweenTenants(t *testing.T) {
	for _, c := range []struct {
		tokens    int
		displaced bool
	}{{250, true}, {400, false}} {
		t.Run(fmt.Sprint(c.tokens), func(t *testing.T) {
			rig := displaceRig(t, HoldPolicy)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			send := func(id, tokens int, name, hold string, got chan<- result) {
				hdr := map[string]string{DefaultFairnessHeader: name}
				if hold != "" {
					hdr["X-Hold"] = hold
				}
				got <- sendUntil(ctx, rig.url, tokenPrompt(id, tokens, false), hdr)
			}
			gotA, gotB, gotC := make(chan result, 1), make(chan result, 1), make(chan result, 1)
			for _, r := range []struct {
				id, tokens int
				name       string
				got        chan result
			}{{7, 500, "s", gotA}, {8, 800, "b", gotB}} {
				go send(r.id, r.tokens, r.name, "1", r.got)
				select {
				case <-rig.inUpstream:
				case x := <-r.got:
					t.Fatalf("request %d never reached the upstream: %d %s", r.id, x.status, x.body)
				case <-time.After(30 * time.Second):
					t.Fatalf("request %d never reached the upstream", r.id)
				}
			}
			go send(9, c.tokens, "s", "", gotC)
			r := awaitResult(t, gotC)
			m := get(t, rig.admin+"/metrics")
			if c.displaced {
				if r.status != 200 || !strings.Contains(m, "kvgate_displaced_total 1") {
					t.Fatalf("C of %d tokens: %d %s, want served in B's place", c.tokens, r.status, r.body)
				}
				if b := awaitResult(t, gotB); b.status != 429 || !strings.Contains(b.body, "took its place") {
					t.Fatalf("B: %d %s, want the displaced 429", b.status, b.body)
				}
				return
			}
			if r.status != 429 || !strings.Contains(m, "kvgate_displaced_total 0") {
				t.Fatalf("C of %d tokens: %d %s, want rejected, B kept", c.tokens, r.status, r.body)
			}
		})
	}
}

// sendUntil posts a completion body with headers hdr to url until its
// answer or ctx's end (a zero result).
func sendUntil(ctx context.Context, url, body string, hdr map[string]string) result {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, string(b)}
}
