package gateway

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/replicasync"
	"github.com/kvgate/kvgate/internal/sched"
)

// syncedPair starts two gateway replicas over eps, a publishing and b
// subscribed to it, and returns their client URLs once b hears a.
func syncedPair(t *testing.T, eps []fleet.Endpoint) (a, b *Gateway, urlA, urlB string) {
	t.Helper()
	return syncedPairOf(t, eps, "kvgate")
}

// syncedPairOf is syncedPair with another policy.
func syncedPairOf(t *testing.T, eps []fleet.Endpoint, policy string) (a, b *Gateway, urlA, urlB string) {
	t.Helper()
	a, urlA, _ = startGateway(t, Config{Endpoints: eps, Policy: policy, BlockSize: 16,
		Sync: replicasync.Config{Bind: "tcp://127.0.0.1:0"}}, Options{})
	waitFor(t, func() bool { return a.sync.Addr() != "" })
	b, urlB, _ = startGateway(t, Config{Endpoints: eps, Policy: policy, BlockSize: 16,
		Sync: replicasync.Config{Peers: []string{a.sync.Addr()}}}, Options{})
	// b's subscription takes a moment: requests through a until b has
	// applied one of a's events.
	for i := 0; b.sync.Stats().Applied == 0; i++ {
		if i == 400 {
			t.Fatal("b never heard a")
		}
		post(t, urlA+"/v1/completions", completion(fmt.Sprintf("warm-up %d", i), false, 1), nil)
	}
	return a, b, urlA, urlB
}

// inflight is endpoint name's requests in flight on g's view.
func inflight(g *Gateway, name string) int {
	g.mu.RLock()
	mf := g.models[testModel]
	g.mu.RUnlock()
	var snap sched.Snapshot
	for i, e := range mf.load.Snapshot(g.clock(), 0, nil, nil, nil, &snap) {
		if e.Info().Name == name {
			return snap.Endpoints[i].InflightRequests
		}
	}
	return -1
}

// TestReplicaSyncLoad: a request streaming through one replica loads its
// endpoint on the other replica's view until it ends.
func TestReplicaSyncLoad(t *testing.T) {
	slow := func(c *engine.Config) { c.TimeScale = 1 } // 400 tokens: about 8 s
	e1, e2 := startEngine(t, fleet.RoleBoth, slow), startEngine(t, fleet.RoleBoth, slow)
	eps := []fleet.Endpoint{endpointOf(e1, fleet.RoleBoth), endpointOf(e2, fleet.RoleBoth)}
	for i := range eps {
		eps[i].PrefillSpeed = 20000
	}
	a, b, urlA, _ := syncedPair(t, eps)
	waitFor(t, func() bool { return inflight(b, eps[0].Name)+inflight(b, eps[1].Name) == 0 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urlA+"/v1/completions", strings.NewReader(completion("a long answer", true, 400)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	home := resp.Header.Get(hdrPrefill)
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil { // streaming
		t.Fatal(err)
	}
	waitFor(t, func() bool { return inflight(b, home) == 1 })
	if n := inflight(a, home); n != 1 {
		t.Fatalf("a's own view: %d in flight on %s", n, home)
	}
	cancel()
	waitFor(t, func() bool { return inflight(b, home) == 0 && b.sync.Stats().PeerFlights == 0 })
}

// TestReplicaSyncPrefix: a prompt routed by one replica is known cached on
// its endpoint to the other before any KV event (these engines send
// none): the other replica routes it there too, predicting it cached.
func TestReplicaSyncPrefix(t *testing.T) {
	_, _, eps := twoAggregated(t)
	for i := range eps {
		eps[i].Events, eps[i].Replay = "", ""
	}
	_, b, urlA, urlB := syncedPair(t, eps)
	p := completion(prefix("replicas"), false, 1)
	before := b.sync.Stats().Applied
	ra := post(t, urlA+"/v1/completions", p, nil)
	if ra.status != 200 {
		t.Fatalf("a: %d %s", ra.status, ra.body)
	}
	// Its route, prefix note, first token and end, in that order: once
	// three are applied the note is.
	waitFor(t, func() bool { return b.sync.Stats().Applied >= before+3 })
	rb := post(t, urlB+"/v1/completions", p, nil)
	cached, _ := strconv.Atoi(rb.header.Get(hdrCached))
	if rb.status != 200 || rb.header.Get(hdrPrefill) != ra.header.Get(hdrPrefill) || cached < 1000 {
		t.Fatalf("b routed a's prompt to %s predicting %d tokens cached (status %d); a routed it to %s",
			rb.header.Get(hdrPrefill), cached, rb.status, ra.header.Get(hdrPrefill))
	}
}

// TestReplicaSyncLoRAPlaces: a LoRA adapter's request in flight through
// one replica takes its batch place on the other's view too: the other
// replica sends another adapter's request to the engine with a place for
// it, not to the one holding its prefix whose only place is taken.
func TestReplicaSyncLoRAPlaces(t *testing.T) {
	mk := func(c *engine.Config) { c.LoRAModules = []string{"sql", "chat"} }
	x, y := startEngine(t, fleet.RoleBoth, mk), startEngine(t, fleet.RoleBoth, mk)
	eps := []fleet.Endpoint{endpointOf(x, fleet.RoleBoth), endpointOf(y, fleet.RoleBoth)}
	for i := range eps {
		eps[i].LoRA = []string{"sql", "chat"}
	}
	a, b, _, urlB := syncedPair(t, eps)
	waitSubscribed(t, b)
	chat := func(chars int) string { return chatAdapter(t, urlB, "places", chars, 1) }
	home := chat(3000)
	if again := chat(3100); again != home {
		t.Fatalf("chat's second request went to %s, its prefix is on %s", again, home)
	}
	a.mu.RLock()
	done := a.loraStart(a.members[home], "sql") // as if sql were in flight on home through a
	a.mu.RUnlock()
	b.mu.RLock()
	m := b.members[home]
	b.mu.RUnlock()
	waitFor(t, func() bool { return m.lora.counts()["sql"] == 1 })
	if to := chat(3200); to == home {
		t.Errorf("chat went to %s, where a's sql request holds the only place", to)
	}
	done()
	waitFor(t, func() bool { return m.lora.counts() == nil })
}

// TestReplicaSyncDrains: replicas serve concurrent requests (some called
// off by their clients mid-stream) and hear each other's; once all have
// ended, no request is left in flight on any view, and none of a peer's
// flights had to be ended by a heartbeat or silence. a publishes, b
// publishes and hears a, c hears both (port 0 binds: each dials the ones
// bound before it).
func TestReplicaSyncDrains(t *testing.T) {
	_, _, eps := twoAggregated(t)
	start := func(bind string, peers ...string) (*Gateway, string) {
		g, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "kvgate", BlockSize: 16,
			Sync: replicasync.Config{Bind: bind, Peers: peers}}, Options{})
		if bind != "" {
			waitFor(t, func() bool { return g.sync.Addr() != "" })
		}
		return g, url
	}
	a, urlA := start("tcp://127.0.0.1:0")
	b, urlB := start("tcp://127.0.0.1:0", a.sync.Addr())
	c, _ := start("", a.sync.Addr(), b.sync.Addr())
	// Subscriptions take a moment: until c has heard both.
	for i := 0; c.sync.Stats().Peers < 2; i++ {
		if i == 400 {
			t.Fatal("c never heard both")
		}
		post(t, urlA+"/v1/completions", completion(fmt.Sprintf("warm-up %d", i), false, 1), nil)
		post(t, urlB+"/v1/completions", completion(fmt.Sprintf("warm-up %d", i), false, 1), nil)
	}
	urls := []string{urlA, urlB}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			body := completion(fmt.Sprintf("%s turn %d", prefix(fmt.Sprintf("drain%d", i%5)), i), true, 40)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urls[i%2]+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			for n := 0; ; n++ {
				if i%4 == 0 && n == 3 {
					return // called off mid-stream
				}
				if _, err := br.ReadString('\n'); err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, g := range []*Gateway{a, b, c} {
		waitFor(t, func() bool {
			return inflight(g, eps[0].Name) == 0 && inflight(g, eps[1].Name) == 0 && g.sync.Stats().PeerFlights == 0
		})
		if st := g.sync.Stats(); st.ExpiredByHeartbeat != 0 || st.BySilence != 0 || st.Refused != 0 || (g != a && st.Applied == 0) {
			t.Fatalf("sync stats %+v", st)
		}
	}
}

// TestReplicaSyncResponses: a Responses API answer made through one
// replica is known to the other, which sends a request continuing it
// (and its GET) to the engine that keeps it, round-robin or not.
func TestReplicaSyncResponses(t *testing.T) {
	store := func(c *engine.Config) { c.ResponsesStore = true }
	e1, e2 := startEngine(t, fleet.RoleBoth, store), startEngine(t, fleet.RoleBoth, store)
	eps := []fleet.Endpoint{endpointOf(e1, fleet.RoleBoth), endpointOf(e2, fleet.RoleBoth)}
	_, b, urlA, urlB := syncedPairOf(t, eps, "round-robin")
	before := b.sync.Stats().Applied
	ra := post(t, urlA+"/v1/responses", `{"model":"`+testModel+`","input":"remember me","max_output_tokens":3}`, nil)
	i := strings.Index(ra.body, `"id":"`)
	if ra.status != 200 || i < 0 {
		t.Fatalf("a: %d %s", ra.status, ra.body)
	}
	id := ra.body[i+6 : i+6+strings.IndexByte(ra.body[i+6:], '"')]
	// Its route, response note, prefix note, first token and end.
	waitFor(t, func() bool { return b.respHolders.holder(id) != "" && b.sync.Stats().Applied >= before+2 })
	for k := range 4 {
		rb := post(t, urlB+"/v1/responses", `{"model":"`+testModel+`","input":"go on","previous_response_id":"`+id+`","max_output_tokens":2}`, nil)
		if rb.status != 200 || rb.header.Get(hdrPrefill) != ra.header.Get(hdrPrefill) {
			t.Fatalf("b, continuation %d: %d on %s, want 200 on %s: %s", k, rb.status, rb.header.Get(hdrPrefill), ra.header.Get(hdrPrefill), rb.body)
		}
	}
	if g := get(t, urlB+"/v1/responses/"+id); !strings.Contains(g, id) {
		t.Fatalf("b, GET: %s", g)
	}
}

// TestSyncConfigShowsHeartbeat: GET /admin/config shows the heartbeat a
// replica publishes at, its default included (it showed 0s: walkthrough,
// 2026-12-05).
func TestSyncConfigShowsHeartbeat(t *testing.T) {
	_, _, eps := twoAggregated(t)
	_, _, admin := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true, Sync: replicasync.Config{Bind: "tcp://127.0.0.1:0"}}, Options{})
	if c := get(t, admin+"/admin/config"); !strings.Contains(c, "heartbeat: 1s") {
		t.Errorf("/admin/config does not show the 1 s heartbeat:\n%s", c)
	}
}
