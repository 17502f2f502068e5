package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/tokens"
)

// holdGateway runs a gateway without early rejection over one upstream
// (1 000 prompt tokens/s, a 0.5 s TTFT SLO) on a clock the test moves.
// The upstream holds requests carrying X-Hold until their client goes
// away, and counts the requests it sees.
type holdRig struct {
	url, admin string
	clock      *atomic.Int64 // Unix nanoseconds
	seen       *atomic.Int64 // requests the upstream saw
	inUpstream chan struct{}
	g          *Gateway
}

func holdGateway(t *testing.T, maxHeld int) *holdRig {
	return holdGatewayWith(t, maxHeld, Options{})
}

// holdUpstream is an upstream that counts the requests it sees in seen
// and holds those carrying X-Hold (telling inUpstream) until their client
// goes away; with X-Hold: headers, after sending its response headers.
func holdUpstream(t *testing.T, seen *atomic.Int64, inUpstream chan struct{}) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		seen.Add(1)
		if h := r.Header.Get("X-Hold"); h != "" {
			if h == "headers" {
				// As vLLM streams: the headers go at once, the
				// body with the first token.
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
			}
			inUpstream <- struct{}{}
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
	}))
	t.Cleanup(up.Close)
	return up
}

func holdGatewayWith(t *testing.T, maxHeld int, o Options) *holdRig {
	return holdGatewayHold(t, HoldConfig{MaxRequests: maxHeld}, o)
}

// holdGatewayHold is holdGatewayWith with the hold's settings.
func holdGatewayHold(t *testing.T, hold HoldConfig, o Options) *holdRig {
	seen, inUpstream := &atomic.Int64{}, make(chan struct{}, 16)
	return holdGatewayOver(t, holdUpstream(t, seen, inUpstream), seen, inUpstream, hold, o)
}

// holdGatewayOver is holdGatewayHold over the test's own upstream, which
// counts in seen and tells inUpstream as holdUpstream does.
func holdGatewayOver(t *testing.T, up *httptest.Server, seen *atomic.Int64, inUpstream chan struct{}, hold HoldConfig, o Options) *holdRig {
	clock := &atomic.Int64{}
	clock.Store(time.Unix(1000, 0).UnixNano())
	off := false
	cfg := Config{
		Endpoints:   []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}},
		Classes:     []Class{{Name: "standard", Priority: 1, TTFT: 0.5}},
		EarlyReject: &off,
		Hold:        hold,
	}
	o.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	g, url, admin := startGateway(t, cfg, o)
	return &holdRig{url: url, admin: admin, clock: clock, seen: seen, inUpstream: inUpstream, g: g}
}

// occupy sends a request of token 7 that stays in the upstream until ctx
// ends.
func occupy(t *testing.T, ctx context.Context, url string, tokens int, inUpstream chan struct{}) {
	t.Helper()
	occupyWith(t, ctx, url, 7, tokens, inUpstream)
}

// occupyWith is occupy with a prompt of token id.
func occupyWith(t *testing.T, ctx context.Context, url string, id, tokens int, inUpstream chan struct{}) {
	t.Helper()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(tokenPrompt(id, tokens, true)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Hold", "1")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-inUpstream:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request never reached the upstream")
	}
}

// awaitResult is the answer a held request's client got (the test fails
// after 30 s without one).
func awaitResult(t *testing.T, got <-chan result) result {
	t.Helper()
	select {
	case r := <-got:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the held request never got an answer")
		return result{}
	}
}

// TestHeldRequestWaitsForSlack: a request that fits nowhere (600 tokens
// at 1 000 tokens/s against a 0.5 s SLO) waits at the gateway while the
// endpoint is busy, and is sent when the endpoint's queue runs empty.
func TestHeldRequestWaitsForSlack(t *testing.T) {
	h := holdGateway(t, 0)
	url, clock, seen, g := h.url, h.clock, h.seen, h.g
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, url, 200, h.inUpstream) // 0.2 s of predicted prefill
	got := make(chan result, 1)
	go func() { got <- post(t, url+"/v1/completions", tokenPrompt(8, 600, false), nil) }()
	waitFor(t, func() bool { return g.heldNow() == 1 })
	time.Sleep(3 * holdPoll) // release passes run; the endpoint is still busy
	if g.heldNow() != 1 || seen.Load() != 1 {
		t.Fatalf("held %d, upstream saw %d: the held request left before the endpoint had slack", g.heldNow(), seen.Load())
	}
	clock.Add(int64(300 * time.Millisecond)) // past the first prefill's predicted end (0.2 s), before the deadline (0.5 s)
	r := awaitResult(t, got)
	if r.status != 200 || !strings.Contains(r.header.Get(hdrReason), "released from hold (slack)") {
		t.Fatalf("released request: %d %q %s", r.status, r.header.Get(hdrReason), r.body)
	}
	if h := r.header.Get(hdrHeld); h != "300.0" {
		t.Errorf("%s = %q, want the 300 ms it was held", hdrHeld, h)
	}
	if g.heldNow() != 0 || seen.Load() != 2 {
		t.Fatalf("held %d, upstream saw %d after the release", g.heldNow(), seen.Load())
	}
	if m := get(t, h.admin+"/metrics"); !strings.Contains(m, "kvgate_held_total 1") {
		t.Fatal("kvgate_held_total is not 1")
	}
}

// TestPrefillEndWakesRelease: a prefill that ends long before its
// predicted end wakes the release loop, which sends the held request to
// the endpoint it freed at once. The clock stands still and the loop's
// poll is an hour, so only the wake can release it before the first
// prefill's predicted end (20 s of real time away).
func TestPrefillEndWakesRelease(t *testing.T) {
	h := holdGatewayWith(t, 0, Options{HoldPoll: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, h.url, 20000, h.inUpstream) // 20 s of predicted prefill
	got := make(chan result, 1)
	go func() { got <- post(t, h.url+"/v1/completions", tokenPrompt(8, 600, false), nil) }()
	waitFor(t, func() bool { return h.g.heldNow() == 1 })
	cancel() // the first request's client leaves: its prefill ends now, 20 s early
	select {
	case r := <-got:
		if r.status != 200 || !strings.Contains(r.header.Get(hdrReason), "released from hold") {
			t.Fatalf("released request: %d %q %s", r.status, r.header.Get(hdrReason), r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held request waited for the first prefill's predicted end: the release loop was not woken")
	}
	if h.seen.Load() != 2 {
		t.Fatalf("upstream saw %d requests, want 2", h.seen.Load())
	}
}

// TestHeldClientLeaves: a client that gives up while held leaves the
// queue; nothing reaches the upstream and nothing stays accounted.
func TestHeldClientLeaves(t *testing.T) {
	h := holdGateway(t, 0)
	url, seen, g := h.url, h.seen, h.g
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, url, 200, h.inUpstream)
	hctx, hcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(hctx, http.MethodPost, url+"/v1/completions", strings.NewReader(tokenPrompt(8, 600, false)))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, func() bool { return g.heldNow() == 1 })
	hcancel()
	<-done
	waitFor(t, func() bool { return g.heldNow() == 0 })
	cancel()
	waitFor(t, func() bool { return g.inflight.Load() == 0 })
	if seen.Load() != 1 {
		t.Fatalf("upstream saw %d requests, want only the first", seen.Load())
	}
	var st struct{ Endpoints []EndpointState }
	getJSON(t, h.admin+"/admin/endpoints", &st)
	if len(st.Endpoints) != 1 || st.Endpoints[0].Load.InflightRequests != 0 || st.Endpoints[0].Load.InflightUncached != 0 {
		t.Fatalf("load left behind: %+v", st.Endpoints)
	}
	g.mu.RLock()
	hq := g.models[testModel].hold.q
	g.mu.RUnlock()
	if hq.Len() != 0 || hq.Compute() != 0 {
		t.Fatalf("hold queue: %d held, %v s of compute", hq.Len(), hq.Compute())
	}
}

// TestClientGoneLeavesNoClaim: a request whose client leaves before its
// first token no longer has its prompt claimed by the index on its engine
// (which, sending no KV events here, computed none of it); while it was
// in the engine, the index claimed it there.
func TestClientGoneLeavesNoClaim(t *testing.T) {
	h := holdGateway(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, h.url, 200, h.inUpstream)
	if !indexHolds(t, h.admin, 7, 200) {
		t.Fatal("the index does not claim the prompt of the request in its engine")
	}
	cancel()
	waitFor(t, func() bool { return h.g.inflight.Load() == 0 })
	if indexHolds(t, h.admin, 7, 200) {
		t.Error("the index still claims the prompt of a request whose client left before its first token")
	}
}

// TestHoldQueueFull: beyond hold.max_requests a request that fits nowhere
// gets 429 at once.
func TestHoldQueueFull(t *testing.T) {
	h := holdGateway(t, 1)
	url, g := h.url, h.g
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, url, 200, h.inUpstream)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(tokenPrompt(8, 600, false)))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, func() bool { return g.heldNow() == 1 })
	r := post(t, url+"/v1/completions", tokenPrompt(9, 600, false), nil)
	if r.status != 429 || !strings.Contains(r.body, "already held") {
		t.Fatalf("past the hold cap: %d %s", r.status, r.body)
	}
}

func TestHoldConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		h    HoldConfig
		want string
	}{
		{HoldConfig{Mode: "sometimes"}, "hold.mode"},
		{HoldConfig{Backlog: -1}, "hold.backlog"},
		{HoldConfig{Slack: 2}, "hold.slack_slos"},
		{HoldConfig{Quiet: -1}, "hold.quiet_slos"},
		{HoldConfig{Quiet: 1e9}, "hold.quiet_slos"},
		{HoldConfig{Max: 2 * time.Hour}, "hold.max"},
		{HoldConfig{MaxRequests: -3}, "hold.max_requests"},
		{HoldConfig{TouchPriority: 1 << 40}, "hold.touch_priority"},
	} {
		c := Config{Hold: tc.h}
		c.Defaults()
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.h, err, tc.want)
		}
	}
	c := Config{}
	c.Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if sc := c.scheduler(mustPolicy(t, "kvgate")); !sc.EarlyReject || !sc.Hold || sc.HoldQuiet != 0 {
		t.Fatalf("defaults: %+v (kvgate holds; the quiet window is sched's default)", sc)
	}
	c.Hold.Quiet = 12
	if sc := c.scheduler(mustPolicy(t, "kvgate")); sc.HoldQuiet != 12 {
		t.Fatalf("hold.quiet_slos 12: scheduler has %v", sc.HoldQuiet)
	}
	c.Hold.Mode = HoldOff
	if sc := c.scheduler(mustPolicy(t, "kvgate")); sc.Hold {
		t.Fatal("hold off still holds")
	}
	c.Hold.Mode = HoldPolicy
	if sc := c.scheduler(mustPolicy(t, "cache-only")); sc.Hold {
		t.Fatal("cache-only holds in mode policy")
	}
}

func mustPolicy(t *testing.T, name string) sched.Policy {
	t.Helper()
	p, err := sched.New(name, sched.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestManyHeldUnderRace: many requests that fit nowhere, held at once
// while the clock moves and clients give up at random; every one is
// answered or gone, nothing stays held or accounted (run with -race).
func TestManyHeldUnderRace(t *testing.T) {
	h := holdGateway(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, h.url, 200, h.inUpstream)
	const n = 40
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer rcancel()
			if i%4 == 3 {
				var c context.CancelFunc
				rctx, c = context.WithTimeout(rctx, time.Duration(5+i)*time.Millisecond)
				defer c()
			}
			req, _ := http.NewRequestWithContext(rctx, http.MethodPost, h.url+"/v1/completions", strings.NewReader(tokenPrompt(100+i, 600, false)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes[i] = -1 // gave up
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	// Move the clock on while they wait: deadlines pass, releases follow.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
			h.clock.Add(int64(100 * time.Millisecond))
		}
	}
	for i, c := range codes {
		if c != 200 && !(c == -1 && i%4 == 3) {
			t.Errorf("request %d: status %d", i, c)
		}
	}
	cancel()
	waitFor(t, func() bool { return h.g.inflight.Load() == 0 && h.g.heldNow() == 0 })
	var st struct{ Endpoints []EndpointState }
	getJSON(t, h.admin+"/admin/endpoints", &st)
	if l := st.Endpoints[0].Load; l.InflightRequests != 0 || l.InflightUncached != 0 {
		t.Fatalf("load left behind: %+v", l)
	}
}

// TestHeldWithoutFleet: a held request whose fleet goes away gets 503 once
// its deadline and the grace have passed, and leaves the queue.
func TestHeldWithoutFleet(t *testing.T) {
	h := holdGatewayWith(t, 0, Options{HoldGrace: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, h.url, 200, h.inUpstream)
	got := make(chan result, 1)
	go func() { got <- post(t, h.url+"/v1/completions", tokenPrompt(8, 600, false), nil) }()
	waitFor(t, func() bool { return h.g.heldNow() == 1 })
	if err := h.g.SetEndpoints(nil); err != nil {
		t.Fatal(err)
	}
	h.clock.Add(int64(time.Second)) // past the deadline (0.5 s), nowhere to go
	if r := awaitResult(t, got); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "held past its deadline") {
		t.Fatalf("%d %s", r.status, r.body)
	}
	waitFor(t, func() bool { return h.g.heldNow() == 0 })
}

// rejectingHoldGateway runs a gateway with early rejection over two
// upstreams (1 000 prompt tokens/s each, a 0.5 s TTFT SLO, the analytic
// predictor) on a clock the test moves; the upstreams are holdUpstream's.
func rejectingHoldGateway(t *testing.T) *holdRig {
	inUpstream := make(chan struct{}, 4)
	seen := &atomic.Int64{}
	a, b := holdUpstream(t, seen, inUpstream), holdUpstream(t, seen, inUpstream)
	clock := &atomic.Int64{}
	clock.Store(time.Unix(1000, 0).UnixNano())
	on := true
	cfg := Config{
		Endpoints: []fleet.Endpoint{{Name: "a", URL: a.URL, Model: testModel, PrefillSpeed: 1000},
			{Name: "b", URL: b.URL, Model: testModel, PrefillSpeed: 1000}},
		Classes:     []Class{{Name: "standard", Priority: 1, TTFT: 0.5}},
		EarlyReject: &on,
		Predictor:   PredictorAnalytic,
	}
	g, url, admin := startGateway(t, cfg, Options{Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	return &holdRig{url: url, admin: admin, clock: clock, seen: seen, inUpstream: inUpstream, g: g}
}

// TestHeldWithEarlyRejection: with early rejection, a request that misses
// its SLO even on an idle endpoint (600 tokens at 1 000 tokens/s against a
// 0.5 s SLO) is held, not rejected: served at once while two endpoints are
// idle and nothing was rejected for the load; with one endpoint busy
// (only one idle, kept for what arrives) it waits, and at its deadline
// (arrival + 1 SLO) it gets 429 without a class being shed.
func TestHeldWithEarlyRejection(t *testing.T) {
	rig := rejectingHoldGateway(t)
	g, url, clock, seen, inUpstream := rig.g, rig.url, rig.clock, rig.seen, rig.inUpstream

	r := post(t, url+"/v1/completions", tokenPrompt(8, 600, false), nil)
	if r.status != 200 || !strings.Contains(r.header.Get(hdrReason), "released from hold (idle endpoint, quiet fleet)") {
		t.Fatalf("two idle endpoints: %d %q %s", r.status, r.header.Get(hdrReason), r.body)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, url, 100, inUpstream) // 0.1 s: one endpoint busy
	got := make(chan result, 1)
	go func() { got <- post(t, url+"/v1/completions", tokenPrompt(9, 600, false), nil) }()
	waitFor(t, func() bool { return g.heldNow() == 1 })
	time.Sleep(3 * holdPoll)
	if g.heldNow() != 1 || seen.Load() != 2 {
		t.Fatalf("held %d, upstreams saw %d: released with one endpoint idle", g.heldNow(), seen.Load())
	}
	clock.Add(int64(600 * time.Millisecond)) // past its deadline, 0.5 s
	if r := awaitResult(t, got); r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "even on an idle endpoint") {
		t.Fatalf("overdue: %d %s, want 429", r.status, r.body)
	}
	if seen.Load() != 2 || g.heldNow() != 0 {
		t.Fatalf("upstreams saw %d, held %d", seen.Load(), g.heldNow())
	}
	// It missed alone: its class is not shed; a small request is served.
	if r := post(t, url+"/v1/completions", tokenPrompt(10, 100, false), nil); r.status != 200 {
		t.Fatalf("after the rejection: %d %s", r.status, r.body)
	}
}

// TestHeldWithEarlyRejectionStopsWhenNothingComesBack: with early
// rejection the gateway serves late a request that misses its SLO even
// alone (600 tokens at 1 000 tokens/s against a 0.5 s SLO) on an idle
// fleet, and remembers its prompt (sched.Returns); when no later request
// extends three such prompts within the quiet window (30 SLOs, 15 s), it
// stops: the fourth waits and gets 429 at its deadline.
func TestHeldWithEarlyRejectionStopsWhenNothingComesBack(t *testing.T) {
	rig := rejectingHoldGateway(t)
	g, url, admin, clock := rig.g, rig.url, rig.admin, rig.clock
	for i := range 3 {
		r := post(t, url+"/v1/completions", tokenPrompt(20+i, 600, false), nil)
		if r.status != 200 || !strings.Contains(r.header.Get(hdrReason), "released from hold (idle endpoint, quiet fleet)") {
			t.Fatalf("investment %d: %d %q %s", i+1, r.status, r.header.Get(hdrReason), r.body)
		}
		clock.Add(int64(16 * time.Second))
		// An unrelated request: the investment's window has passed.
		if r := post(t, url+"/v1/completions", tokenPrompt(90+i, 50, false), nil); r.status != 200 {
			t.Fatalf("small request %d: %d %s", i+1, r.status, r.body)
		}
	}
	// Three lost, none came back: (0 + 1) / (3 + 2) but for the fading
	// of the first two over 32 s and 16 s (ReturnsMemory 600 s): 0.203.
	name := fmt.Sprintf(`kvgate_hold_returns_ratio{model=%q}`, testModel)
	if ratio, err := gauge(t, admin, name); err != nil || ratio < 0.2 || ratio > 0.21 {
		t.Errorf("%s %v (%v), want 0.203", name, ratio, err)
	}
	got := make(chan result, 1)
	go func() { got <- post(t, url+"/v1/completions", tokenPrompt(30, 600, false), nil) }()
	waitFor(t, func() bool { return g.heldNow() == 1 })
	time.Sleep(3 * holdPoll)
	if g.heldNow() != 1 {
		t.Fatalf("held %d: served after three investments that never came back", g.heldNow())
	}
	clock.Add(int64(600 * time.Millisecond)) // past its deadline, 0.5 s
	if r := awaitResult(t, got); r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "even on an idle endpoint") {
		t.Fatalf("overdue: %d %s, want 429", r.status, r.body)
	}
}

// TestInvestmentYields: with early rejection, a request that misses its
// SLO even alone (600 tokens at 1 000 tokens/s against a 0.5 s SLO) is
// served late on an idle endpoint of a quiet fleet, an investment; its
// engine sends its response headers at once, as vLLM does, and its first
// token never comes. The other endpoint takes 0.2 s of work. A 250-token
// request then fits nowhere (the analytic predictor's first margin, 1.5,
// makes it 0.375 s: 0.2 + 0.375 s on the other endpoint) but alone on the
// investment's endpoint: the investment gives it up. Its upstream request
// is aborted and its client gets 429, nothing else (the 200 headers its
// engine sent never reach it); the new request is served there.
func TestInvestmentYields(t *testing.T) {
	rig := rejectingHoldGateway(t)
	g, url, admin := rig.g, rig.url, rig.admin
	got := startInvestment(t, rig)

	r := post(t, url+"/v1/completions", tokenPrompt(41, 250, false), nil)
	if r.status != 200 {
		t.Fatalf("the request the investment yielded to: %d %s", r.status, r.body)
	}
	inv := awaitResult(t, got)
	if inv.status != http.StatusTooManyRequests || !strings.Contains(inv.body, "gave the engine up") {
		t.Fatalf("the investment: %d %s, want 429", inv.status, inv.body)
	}
	// Its 429 is early rejection's: no routing headers from its dispatch
	// (the request it yielded to has them).
	for k := range inv.header {
		if strings.HasPrefix(strings.ToLower(k), "x-kvgate-") {
			t.Errorf("the investment's 429 carries %s: %q", k, inv.header.Get(k))
		}
	}
	if inv.header.Get("Retry-After") == "" || inv.header.Get("X-Should-Retry") != "false" || r.header.Get(hdrPrefill) == "" {
		t.Errorf("Retry-After %q on the 429, %s %q on the 200", inv.header.Get("Retry-After"), hdrPrefill, r.header.Get(hdrPrefill))
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, "kvgate_hold_yielded_total 1") || !counted(m, "yielded") ||
		strings.Contains(m, `kvgate_rejections_total{class="standard"} 1`) {
		t.Error("kvgate_hold_yielded_total is not 1, or the yielded request is not outcome yielded (or counted a rejection before compute)")
	}
	if g.heldNow() != 0 {
		t.Fatalf("held %d", g.heldNow())
	}
	// The index no longer claims the investment's prompt anywhere (its
	// engine computed none of it; routing had written it there), and
	// still claims the served request's and the occupying one's, which
	// is in its engine.
	for _, c := range []struct {
		token, n int
		want     bool
	}{{40, 600, false}, {41, 250, true}, {7, 200, true}} {
		if held := indexHolds(t, admin, c.token, c.n); held != c.want {
			t.Errorf("index holds the prompt of %d × token %d: %v, want %v", c.n, c.token, held, c.want)
		}
	}
}

// startInvestment sends, on rig, a streamed request of 600 × token 40
// that misses its SLO even alone: served late on an idle endpoint as an
// investment, whose engine sends its headers and never its first token.
// Once it is there, 200 tokens of token 7 occupy the other endpoint until
// the test ends. It returns where the investment's answer will come.
func startInvestment(t *testing.T, rig *holdRig) <-chan result {
	t.Helper()
	got := make(chan result, 1)
	go func() {
		got <- post(t, rig.url+"/v1/completions", tokenPrompt(40, 600, true), map[string]string{"X-Hold": "headers"})
	}()
	select {
	case <-rig.inUpstream:
	case r := <-got:
		t.Fatalf("the investment was answered before reaching its engine: %d %s", r.status, r.body)
	case <-time.After(30 * time.Second):
		t.Fatal("the investment never reached its engine")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	occupy(t, ctx, rig.url, 200, rig.inUpstream)
	return got
}

// TestYieldedInvestmentLeavesNoClaim: as TestInvestmentYields, but the
// request the investment yields to starts with the investment's prompt
// (250 of its 600 tokens). It is decided again right after the yield, and
// then the index no longer claims the investment's prompt on its engine,
// which computed none of it (its upstream sends no KV events): it is
// routed with nothing believed cached.
func TestYieldedInvestmentLeavesNoClaim(t *testing.T) {
	rig := rejectingHoldGateway(t)
	url := rig.url
	got := startInvestment(t, rig)
	r := post(t, url+"/v1/completions", tokenPrompt(40, 250, false), nil)
	if r.status != 200 {
		t.Fatalf("the request the investment yielded to: %d %s", r.status, r.body)
	}
	if inv := awaitResult(t, got); inv.status != http.StatusTooManyRequests {
		t.Fatalf("the investment: %d %s, want 429", inv.status, inv.body)
	}
	if c := r.header.Get(hdrCached); c != "0" {
		t.Errorf("routed believing %s tokens cached, want 0 (the yielded investment computed none)", c)
	}
}

// indexHolds: the gateway's index (/admin/kv/lookup) has some of a prompt
// of n × token on some endpoint.
func indexHolds(t *testing.T, admin string, token, n int) bool {
	t.Helper()
	ids := strings.TrimSuffix(strings.Repeat(fmt.Sprintf("%d,", token), n), ",")
	r := post(t, admin+"/admin/kv/lookup", fmt.Sprintf(`{"model":%q,"token_ids":[%s]}`, testModel, ids), nil)
	var out struct {
		Endpoints []struct {
			Matched int `json:"matched_tokens"`
		} `json:"endpoints"`
	}
	if r.status != 200 || json.Unmarshal([]byte(r.body), &out) != nil {
		t.Fatalf("lookup: %d %s", r.status, r.body)
	}
	for _, e := range out.Endpoints {
		if e.Matched > 0 {
			return true
		}
	}
	return false
}

// TestLoadRejectionKinds: a rejection for the prefill queue while another
// endpoint is idle is told apart from one on a fleet with no idle
// endpoint (sched.LoadRejections; kvgate prices compute at nothing after
// the first, first after the second). Predictions are stretched by the
// analytic predictor's margin, 1.5. 200 tokens of token 7 occupy one
// endpoint (0.2 s at 1 000 tokens/s); 400 tokens of token 7 then fit the
// 0.5 s SLO alone only there (200 uncached: 0.3 s with the margin), and
// not behind its queue (0.6 s): rejected, the other endpoint idle (0.6 s
// alone there). With the other endpoint occupied too, 250 tokens of
// token 9 miss on both (0.675 s) and fit alone: short.
func TestLoadRejectionKinds(t *testing.T) {
	rig := rejectingHoldGateway(t)
	url, admin := rig.url, rig.admin
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	metric := func(kind string) string {
		return fmt.Sprintf("kvgate_load_rejections_total{kind=%q} ", kind)
	}
	counts := func(idle, short int) {
		t.Helper()
		m := get(t, admin+"/metrics")
		if !strings.Contains(m, metric("idle")+strconv.Itoa(idle)) || !strings.Contains(m, metric("short")+strconv.Itoa(short)) {
			t.Fatalf("want idle %d, short %d:\n%s", idle, short, grepLines(m, "kvgate_load_rejections_total"))
		}
	}
	counts(0, 0)
	occupy(t, ctx, url, 200, rig.inUpstream)
	if r := post(t, url+"/v1/completions", tokenPrompt(7, 400, false), nil); r.status != http.StatusTooManyRequests {
		t.Fatalf("400 tokens behind 0.2 s on their prefix's endpoint: %d %s, want 429", r.status, r.body)
	}
	counts(1, 0)
	occupyWith(t, ctx, url, 8, 200, rig.inUpstream)
	if r := post(t, url+"/v1/completions", tokenPrompt(9, 250, false), nil); r.status != http.StatusTooManyRequests {
		t.Fatalf("250 tokens behind 0.2 s everywhere: %d %s, want 429", r.status, r.body)
	}
	counts(1, 1)
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestHeldCachedFirstOnceAtRisk: the gateway's release loop runs the
// hold's cache-first order (sched.Scheduler.ReleaseHeld) on the caches its
// KV index reports. Three requests that fit nowhere are held in order A,
// B, C; the endpoint is reported holding B's whole prompt (592 tokens: a
// turnover of 0.59 s at 1 000 tokens/s). Once they have waited 1 s and the
// endpoint has slack, B goes first, and A and C wait for more slack.
func TestHeldCachedFirstOnceAtRisk(t *testing.T) {
	// Deadlines 10 s after arrival: nothing goes overdue here.
	h := holdGatewayHold(t, HoldConfig{Min: 20}, Options{})
	g, url, clock := h.g, h.url, h.clock
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, url, 200, h.inUpstream) // the endpoint is busy for 0.2 s
	ids := map[string]int{"A": 8, "B": 9, "C": 10}
	got := map[string]chan result{}
	for i, name := range []string{"A", "B", "C"} {
		ch := make(chan result, 1)
		got[name] = ch
		body := tokenPrompt(ids[name], 600, false) // 0.6 s alone: fits nowhere against 0.5 s
		go func() { ch <- post(t, url+"/v1/completions", body, nil) }()
		waitFor(t, func() bool { return g.heldNow() == i+1 })
	}
	b := make([]uint32, 600)
	for i := range b {
		b[i] = uint32(ids["B"])
	}
	prep, err := g.toks.Prepare(context.Background(), testModel, tokens.Input{TokenIDs: b}, g.cfg.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	eps := g.idx.Endpoints(testModel)
	if len(eps) != 1 {
		t.Fatalf("%d index endpoints, want 1", len(eps))
	}
	g.idx.Store(eps[0], 0, kvindex.TierGPU, prep.Keys)
	clock.Add(int64(time.Second))
	var first string
	var r result
	select {
	case r = <-got["A"]:
		first = "A"
	case r = <-got["B"]:
		first = "B"
	case r = <-got["C"]:
		first = "C"
	case <-time.After(30 * time.Second):
		t.Fatal("no held request was released")
	}
	if first != "B" || r.status != 200 || !strings.Contains(r.header.Get(hdrReason), "released from hold (slack)") {
		t.Fatalf("first released %s (%d %q), want B, whose prompt the endpoint holds", first, r.status, r.header.Get(hdrReason))
	}
	time.Sleep(3 * holdPoll) // release passes run; until the clock moves, neither A nor C has slack
	if g.heldNow() != 2 {
		t.Fatalf("held %d after B's release, want A and C still held", g.heldNow())
	}
	// A and C go one a second as the clock moves (both cached nowhere:
	// the older first). A release pass sees one instant
	// (sched.HoldFleet.SnapshotFor): when each snapshot read the clock,
	// a move of the clock between A's and C's in a pass put C first, and
	// one CI run (2026-12-03) waited here for A
	// (TestReleasePassSnapshotsOneInstant).
	for _, name := range []string{"A", "C"} {
		clock.Add(int64(time.Second))
		select {
		case r := <-got[name]:
			if r.status != 200 {
				t.Fatalf("%s: %d %q", name, r.status, r.header.Get(hdrReason))
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not released a second after the last: %d still held, clock %v, endpoints %s",
				name, g.heldNow(), time.Unix(0, clock.Load()), get(t, h.admin+"/admin/endpoints"))
		}
	}
}

// TestReleasePassSnapshotsOneInstant: a release pass's snapshots are the
// fleet at the pass's time, not at whatever the clock reads when each is
// taken. On a clock read per snapshot, a held request looked at later in
// a pass could find slack that an older one was refused a moment before,
// and go first (the ordering TestHeldCachedFirstOnceAtRisk checks).
func TestReleasePassSnapshotsOneInstant(t *testing.T) {
	h := holdGatewayHold(t, HoldConfig{}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, h.url, 200, h.inUpstream) // busy 0.2 s from the clock's start
	pass := h.g.clock() + 0.05
	h.clock.Add(int64(5 * time.Second)) // the clock has moved on since the pass began
	prep, err := h.g.toks.Prepare(context.Background(), testModel, tokens.Input{TokenIDs: make([]uint32, 600)}, h.g.cfg.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	h.g.mu.RLock()
	mf := h.g.models[testModel]
	h.g.mu.RUnlock()
	rt := &routed{req: &openai.Request{Model: testModel}, prep: prep, promptN: 600}
	var s sched.Snapshot
	(&releaseFleet{g: h.g, mf: mf}).SnapshotFor(&sched.Held{Value: &waiter{rt: rt}}, pass, &s)
	if s.Now != pass || len(s.Endpoints) != 1 {
		t.Fatalf("snapshot at %v with %d endpoints, want the pass's time %v and one endpoint", s.Now, len(s.Endpoints), pass)
	}
	if w := s.Endpoints[0].QueueWait; math.Abs(w-0.15) > 1e-6 {
		t.Fatalf("queue wait %v at the pass's time, want 0.15 s (busy until 0.2 s)", w)
	}
}

// TestSlowAnswerLeavesEndpointIdle: a non-streamed answer slower than its
// predicted prefill has its prefill ended by the prediction's timer,
// which runs on the machine's time; on a gateway clock that stands still
// the prefill must end at that clock, not at its predicted end ahead of
// it, or the endpoint stays predicted busy for good and a held request
// that needs it idle is never released (TestHeldPrefixTouched hung so
// in CI when its upstream answered slowly). The upstream answers only
// once the endpoint reads idle (or after 10 s), so the answer cannot
// end the prefill before the timer does, however late the timer fires.
func TestSlowAnswerLeavesEndpointIdle(t *testing.T) {
	var gw atomic.Pointer[Gateway]
	idle := func() bool {
		g := gw.Load()
		g.mu.RLock()
		lf := g.models[testModel].load
		g.mu.RUnlock()
		return math.IsInf(lf.NextIdle(g.clock()), 1)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		// The prediction: 10 tokens at 1 000 tokens/s, 10 ms.
		for deadline := time.Now().Add(10 * time.Second); !idle() && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
	}))
	t.Cleanup(srv.Close)
	h := holdGatewayOver(t, srv, &atomic.Int64{}, make(chan struct{}, 1), HoldConfig{}, Options{})
	gw.Store(h.g)
	if r := post(t, h.url+"/v1/completions", tokenPrompt(8, 10, false), nil); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if !idle() {
		t.Fatal("endpoint still predicted busy after its answer: want idle")
	}
}
