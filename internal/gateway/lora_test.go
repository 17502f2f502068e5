package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/discovery/discoverytest"
	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/sched"
)

// TestLoRAAdapters: a request naming a LoRA adapter goes only to the
// endpoints of its base model that serve the adapter, and the gateway's
// index tells the adapter's KV (the engines' events carry lora_name) from
// the base model's: the cached prefix it predicts for each request equals
// what the engine found, for the adapter's later turns and for a base
// model request of the same tokens, which finds nothing.
func TestLoRAAdapters(t *testing.T) {
	withLoRA := func(names ...string) func(*engine.Config) {
		return func(c *engine.Config) { c.LoRAModules = names }
	}
	e1 := startEngine(t, fleet.RoleBoth, withLoRA("sql"))
	e2 := startEngine(t, fleet.RoleBoth, withLoRA("sql", "chat"))
	e3 := startEngine(t, fleet.RoleBoth, nil)
	eps := []fleet.Endpoint{endpointOf(e1, fleet.RoleBoth), endpointOf(e2, fleet.RoleBoth), endpointOf(e3, fleet.RoleBoth)}
	eps[0].LoRA, eps[1].LoRA = []string{"sql"}, []string{"sql", "chat"}
	g, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "kvgate", BlockSize: 16}, Options{})
	waitSubscribed(t, g)

	byName := map[string]*engine.Engine{e1.Addr(): e1, e2.Addr(): e2, e3.Addr(): e3}
	send := func(model string, ids []int) (home string, claimed, found int) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"model": model, "prompt": ids, "max_tokens": 1})
		r := post(t, url+"/v1/completions", string(b), nil)
		if r.status != 200 {
			t.Fatalf("%s: %d %s", model, r.status, r.body)
		}
		home = r.header.Get(hdrPrefill)
		claimed, _ = strconv.Atoi(r.header.Get(hdrCached))
		found, _ = usageCached([]byte(r.body))
		e := byName[home]
		// Quiet: the engine's events reached the index.
		waitIndexed(t, g, e)
		return home, claimed, found
	}
	ids := func(tag, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = 1000 + tag*n + i
		}
		return out
	}
	for i := range 6 {
		if home, _, _ := send("chat", ids(i, 40)); home != e2.Addr() {
			t.Fatalf("chat request %d went to %s; only %s serves the adapter", i, home, e2.Addr())
		}
		if home, _, _ := send("sql", ids(10+i, 40)); home == e3.Addr() {
			t.Fatalf("sql request %d went to %s, which does not serve it", i, home)
		}
	}
	conv := ids(99, 300)
	home, _, _ := send("sql", conv)
	for turn := range 3 {
		conv = append(conv, ids(200+turn, 50)...)
		h, claimed, found := send("sql", conv)
		if h != home || claimed == 0 || claimed != found {
			t.Fatalf("sql turn %d: %s (first turn on %s), claimed %d cached, the engine found %d", turn, h, home, claimed, found)
		}
	}
	// The base model's request of the same tokens finds none of the
	// adapter's KV, and the gateway knows it.
	if h, claimed, found := send(testModel, conv); claimed != 0 || found != 0 {
		t.Fatalf("base model on %s: claimed %d cached, the engine found %d (the adapter's KV must not count)", h, claimed, found)
	}

	var models struct {
		Data []struct{ ID, Parent string } `json:"data"`
	}
	getJSON(t, url+"/v1/models", &models)
	if len(models.Data) != 3 || models.Data[0].ID != testModel || models.Data[1].ID != "chat" || models.Data[1].Parent != testModel || models.Data[2].ID != "sql" {
		t.Errorf("models: %+v", models.Data)
	}
	if r := post(t, url+"/v1/completions", `{"model":"nope","prompt":"x","max_tokens":1}`, nil); r.status != 404 {
		t.Errorf("unknown model: %d %s", r.status, r.body)
	}
	// A fleet in which an adapter is also a model is refused whole.
	bad := append([]fleet.Endpoint(nil), eps...)
	bad[2].Model = "sql"
	if err := g.SetEndpoints(bad); err == nil {
		t.Error("an adapter that is a model elsewhere must be refused")
	}
}

// TestLoRAPrefillDecode: in a P/D fleet both legs of an adapter's request
// go to endpoints that serve the adapter, and the decode engine, pulling
// the adapter's KV from the prefill engine, serves it.
func TestLoRAPrefillDecode(t *testing.T) {
	sql := func(c *engine.Config) { c.LoRAModules = []string{"sql"} }
	p := startEngine(t, fleet.RolePrefill, sql)
	d1 := startEngine(t, fleet.RoleDecode, nil)
	d2 := startEngine(t, fleet.RoleDecode, sql)
	eps := []fleet.Endpoint{endpointOf(p, fleet.RolePrefill), endpointOf(d1, fleet.RoleDecode), endpointOf(d2, fleet.RoleDecode)}
	eps[0].LoRA, eps[2].LoRA = []string{"sql"}, []string{"sql"}
	_, url, _ := startGateway(t, Config{Endpoints: eps}, Options{})
	for i, stream := range []bool{false, true, false, true} {
		b, _ := json.Marshal(map[string]any{"model": "sql", "prompt": prefix("lora-pd") + strconv.Itoa(i), "max_tokens": 4, "stream": stream})
		r := post(t, url+"/v1/completions", string(b), nil)
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		if r.header.Get(hdrPrefill) != p.Addr() || r.header.Get(hdrDecode) != d2.Addr() {
			t.Fatalf("request %d: prefill %s decode %s; only %s decodes the adapter", i, r.header.Get(hdrPrefill), r.header.Get(hdrDecode), d2.Addr())
		}
	}
}

// TestLoRASlots: an adapter's request is not sent where the engine's
// batch has no place for it (as many other adapters in flight there as
// its vllm:lora_requests_info's max_lora), even where its prefix is
// cached, while another endpoint has a place; once the slot frees, its
// cache brings it back.
func TestLoRASlots(t *testing.T) {
	mk := func(c *engine.Config) { c.LoRAModules, c.MaxLoRAs, c.TimeScale = []string{"sql", "chat"}, 1, 10 }
	x, y := startEngine(t, fleet.RoleBoth, mk), startEngine(t, fleet.RoleBoth, mk)
	epX, epY := endpointOf(x, fleet.RoleBoth), endpointOf(y, fleet.RoleBoth)
	epX.LoRA, epY.LoRA = []string{"sql", "chat"}, []string{"sql", "chat"}
	pr, err := health.New(health.Config{Interval: 20 * time.Millisecond, Timeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	g, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{epX}, Policy: "kvgate", BlockSize: 16}, Options{Health: pr})
	waitSubscribed(t, g)
	chat := func(tag string, chars int) string { return chatAdapter(t, url, tag, chars, 2) }
	chat("slot", 3000) // two prefixes cached on x
	chat("back", 3000)
	long, stop := context.WithCancel(context.Background())
	defer stop()
	sqlDone := make(chan struct{})
	go func() {
		defer close(sqlDone)
		b, _ := json.Marshal(map[string]any{"model": "sql", "prompt": "a long answer", "max_tokens": 15000})
		req, _ := http.NewRequestWithContext(long, http.MethodPost, url+"/v1/completions", strings.NewReader(string(b)))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	// The engine runs sql and reported its max_lora; the gateway has sql
	// in flight there.
	waitFor(t, func() bool {
		m, ok := pr.Metrics(epX.Name)
		return ok && m.MaxLoRA == 1 && slices.Equal(m.LoRARunning, []string{"sql"})
	})
	inFlight := func() int { // what /admin/endpoints shows
		for _, st := range g.endpointStates() {
			if st.Name == epX.Name {
				return len(st.LoRAInFlight)
			}
		}
		return -1
	}
	if n := inFlight(); n != 1 {
		t.Fatalf("adapters in flight on %s: %d, want 1 (sql)", epX.Name, n)
	}
	if err := g.SetEndpoints([]fleet.Endpoint{epX, epY}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := pr.Metrics(epY.Name); return ok })
	for i := range 3 {
		if home := chat("slot", 3200+10*i); home != epY.Name {
			t.Fatalf("chat %d went to %s, whose batch runs sql with --max-loras 1; %s has a place", i, home, epY.Name)
		}
	}
	stop()
	<-sqlDone
	waitFor(t, func() bool { return inFlight() == 0 })
	if home := chat("back", 3300); home != epX.Name {
		t.Fatalf("with the slot free, chat went to %s, not to its cache on %s", home, epX.Name)
	}
}

// TestKeepLoRASlots: an endpoint without a batch place for the adapter is
// left out only where another endpoint that can do its part has one.
func TestKeepLoRASlots(t *testing.T) {
	type ep struct {
		name     string
		role     fleet.Role
		inFlight []string
	}
	tests := []struct {
		name    string
		eps     []ep
		adapter string
		want    string
	}{
		{"another adapter runs on a, b is free", []ep{{"a", fleet.RoleBoth, []string{"sql"}}, {"b", fleet.RoleBoth, nil}}, "chat", "b"},
		{"its own adapter runs on a", []ep{{"a", fleet.RoleBoth, []string{"chat"}}, {"b", fleet.RoleBoth, []string{"sql"}}}, "chat", "a"},
		{"no place anywhere: all stay", []ep{{"a", fleet.RoleBoth, []string{"sql"}}, {"b", fleet.RoleBoth, []string{"code"}}}, "chat", "a b"},
		{"a place everywhere: all stay", []ep{{"a", fleet.RoleBoth, nil}, {"b", fleet.RoleBoth, []string{"chat", "chat"}}}, "chat", "a b"},
		{"the only prefill endpoint stays", []ep{{"p", fleet.RolePrefill, []string{"sql"}}, {"d1", fleet.RoleDecode, []string{"sql"}}, {"d2", fleet.RoleDecode, nil}}, "chat", "p d2"},
		{"a busy prefill endpoint goes when another is free", []ep{{"p1", fleet.RolePrefill, []string{"sql"}}, {"p2", fleet.RolePrefill, nil}, {"d", fleet.RoleDecode, nil}}, "chat", "p2 d"},
	}
	for _, tt := range tests {
		members := make([]*member, len(tt.eps))
		s := sched.Snapshot{Endpoints: make([]sched.Endpoint, len(tt.eps))}
		for i, e := range tt.eps {
			members[i] = &member{ep: fleet.Endpoint{Name: e.name, Role: e.role}}
			for _, a := range e.inFlight {
				members[i].lora.start(a)
			}
			s.Endpoints[i].Name = e.name
		}
		g := &Gateway{}
		kept, eps := g.keepLoRASlots(tt.adapter, members, make([]*load.Endpoint, len(members)), &s)
		var names []string
		for i, m := range kept {
			if s.Endpoints[i].Name != m.ep.Name {
				t.Fatalf("%s: the snapshot's endpoint %d is %s, the member %s", tt.name, i, s.Endpoints[i].Name, m.ep.Name)
			}
			names = append(names, m.ep.Name)
		}
		if got := strings.Join(names, " "); got != tt.want || len(eps) != len(kept) || len(s.Endpoints) != len(kept) {
			t.Errorf("%s: kept %q, want %q", tt.name, got, tt.want)
		}
	}
	var a adapterFlights
	done := a.start("sql")
	done()
	done() // a second call changes nothing
	if a.counts() != nil || !a.slot("chat", 1) {
		t.Fatalf("after done: %v", a.counts())
	}
}

// TestLoRAListedByEngines: adapters an engine lists on /v1/models (with
// its model as parent) are served without being declared; one whose name
// is a served model's is not.
func TestLoRAListedByEngines(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.LoRAModules = []string{"sql", "other"} })
	o := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.Model = "other" })
	epO := endpointOf(o, fleet.RoleBoth)
	epO.Model = "other"
	pr, err := health.New(health.Config{Interval: 20 * time.Millisecond, Timeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	g, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth), epO}, Policy: "kvgate", BlockSize: 16}, Options{Health: pr})
	waitSubscribed(t, g)
	waitFor(t, func() bool { base, lora := g.resolve("sql"); return base == testModel && lora == "sql" })
	if base, lora := g.resolve("other"); base != "other" || lora != "" {
		t.Fatalf("other resolves to %q, %q: a served model's name is not an adapter", base, lora)
	}
	// The gateway's model list is vLLM's cards: a base model with its
	// root, a null parent and the least max_model_len its engines list,
	// an adapter with its parent and the root its engines list (vLLM's:
	// its path; the emulator's: its name; it had none until 2026-12-04).
	var models struct {
		Data []map[string]any `json:"data"`
	}
	waitFor(t, func() bool { // both engines listed
		getJSON(t, url+"/v1/models", &models)
		for _, m := range models.Data {
			if m["max_model_len"] == nil {
				return false
			}
		}
		return true
	})
	want := map[string][2]any{testModel: {nil, testModel}, "sql": {testModel, "sql"}, "other": {nil, "other"}} // parent, root
	if len(models.Data) != len(want) {
		t.Fatalf("models %v", models.Data)
	}
	for _, m := range models.Data {
		w := want[m["id"].(string)]
		if parent, ok := m["parent"]; !ok || parent != w[0] || m["root"] != w[1] || m["max_model_len"] != 32768.0 {
			t.Errorf("model card %v; want parent %v, root %v, max_model_len 32768", m, w[0], w[1])
		}
	}
	ids := make([]int, 200)
	for i := range ids {
		ids[i] = 500 + i
	}
	for turn := range 2 {
		b, _ := json.Marshal(map[string]any{"model": "sql", "prompt": ids, "max_tokens": 1})
		r := post(t, url+"/v1/completions", string(b), nil)
		found, _ := usageCached([]byte(r.body))
		if r.status != 200 || r.header.Get(hdrPrefill) != e.Addr() || turn == 1 && (found == 0 || r.header.Get(hdrCached) != strconv.Itoa(found)) {
			t.Fatalf("turn %d: %d on %s, claimed %s cached, found %d: %s", turn, r.status, r.header.Get(hdrPrefill), r.header.Get(hdrCached), found, r.body)
		}
	}
}

// TestLoRAGoneOnItsEngine: an engine that answers 404 for an adapter it
// listed (unloaded since) loses it at once, and the request is retried
// on an engine that still serves it (the client got the 404 until
// 2026-12-04); the next requests go there, not to it again until its
// listing says so.
func TestLoRAGoneOnItsEngine(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.LoRAModules = []string{"sql"} })
	var hits atomic.Int64
	gone := withoutAdapter(t, &hits, func() string { // unloaded once a request met its absence
		if hits.Load() == 0 {
			return `,{"id":"sql","parent":"` + testModel + `"}`
		}
		return ""
	})
	pr, err := health.New(health.Config{Interval: 20 * time.Millisecond, Timeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	eps := []fleet.Endpoint{endpointOf(e, fleet.RoleBoth), {Name: "gone", URL: gone.URL, Model: testModel}}
	g, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "round-robin"}, Options{Health: pr})
	waitFor(t, func() bool {
		for _, st := range g.endpointStates() {
			if st.Name == "gone" && len(st.LoRA) == 1 {
				return true
			}
		}
		return false
	})
	notFound := 0
	for range 8 {
		r := post(t, url+"/v1/completions", `{"model":"sql","prompt":"x y z","max_tokens":1}`, nil)
		switch {
		case r.status == 404:
			notFound++
		case r.status != 200 || r.header.Get(hdrPrefill) != e.Addr():
			t.Fatalf("%d on %s: %s", r.status, r.header.Get(hdrPrefill), r.body)
		}
	}
	if notFound != 0 || hits.Load() != 1 {
		t.Fatalf("%d answers 404, %d requests reached the engine without the adapter; want 0 and 1", notFound, hits.Load())
	}
}

// TestLoRADeclaredNotServed: an endpoint that declares an adapter its
// engine does not serve (lora= in the config, never loaded) says so in
// its health (models_error) and its 404s are retried on an endpoint that
// serves the adapter (a walkthrough: 6 of 6 requests got the 404, and
// nothing said why).
func TestLoRADeclaredNotServed(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.LoRAModules = []string{"sql"} })
	var hits atomic.Int64
	without := withoutAdapter(t, &hits, func() string { return "" })
	pr, err := health.New(health.Config{Interval: 20 * time.Millisecond, Timeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	eps := []fleet.Endpoint{endpointOf(e, fleet.RoleBoth), {Name: "without", URL: without.URL, Model: testModel, LoRA: []string{"sql"}}}
	g, url, _ := startGateway(t, Config{Endpoints: eps, Policy: "round-robin"}, Options{Health: pr})
	waitFor(t, func() bool {
		said, listed := false, false
		for _, st := range g.endpointStates() {
			said = said || st.Name == "without" && st.Health != nil && strings.Contains(st.Health.ModelsError, "declared LoRA adapters the engine does not list: sql")
			listed = listed || st.Name == e.Addr() && slices.Contains(st.LoRA, "sql")
		}
		return said && listed
	})
	for i := range 6 {
		if r := post(t, url+"/v1/completions", `{"model":"sql","prompt":"x y z","max_tokens":1}`, nil); r.status != 200 || r.header.Get(hdrPrefill) != e.Addr() {
			t.Fatalf("request %d: %d on %s: %s", i, r.status, r.header.Get(hdrPrefill), r.body)
		}
	}
	if hits.Load() == 0 {
		t.Error("no request went to the endpoint that declares the adapter: the retry went untested")
	}
}

// TestNoLoRASlots: no_lora_slots turns the batch places off: the request
// goes where its cache is, whatever runs there.
func TestNoLoRASlots(t *testing.T) {
	for _, off := range []bool{false, true} {
		mk := func(c *engine.Config) { c.LoRAModules = []string{"sql", "chat"} }
		x, y := startEngine(t, fleet.RoleBoth, mk), startEngine(t, fleet.RoleBoth, mk)
		epX, epY := endpointOf(x, fleet.RoleBoth), endpointOf(y, fleet.RoleBoth)
		epX.LoRA, epY.LoRA = []string{"sql", "chat"}, []string{"sql", "chat"}
		g, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{epX}, Policy: "kvgate", BlockSize: 16, NoLoRASlots: off}, Options{})
		waitSubscribed(t, g)
		chat := func(chars int) string { return chatAdapter(t, url, "noslots", chars, 1) }
		chat(3000)
		if err := g.SetEndpoints([]fleet.Endpoint{epX, epY}); err != nil {
			t.Fatal(err)
		}
		g.mu.RLock()
		done := g.members[epX.Name].lora.start("sql") // as if sql were in flight on x
		g.mu.RUnlock()
		want := epY.Name
		if off {
			want = epX.Name
		}
		if home := chat(3200); home != want {
			t.Errorf("no_lora_slots %v: chat went to %s, want %s", off, home, want)
		}
		done()
	}
}

// chatAdapter sends through the gateway at url a completion for the LoRA
// adapter "chat" of the first chars of prefix(tag), of maxTokens, and
// returns the prefill endpoint it went to (200 required).
func chatAdapter(t *testing.T, url, tag string, chars, maxTokens int) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "chat", "prompt": prefix(tag)[:chars], "max_tokens": maxTokens})
	r := post(t, url+"/v1/completions", string(b), nil)
	if r.status != 200 {
		t.Fatalf("chat: %d %s", r.status, r.body)
	}
	return r.header.Get(hdrPrefill)
}

// TestLoRAListedUnderTwoModels: an adapter one engine lists while another
// base model already serves it is not taken there, and that is said once
// (a walkthrough's adapter of model m vanished in silence behind base's).
func TestLoRAListedUnderTwoModels(t *testing.T) {
	lists := func(model string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/models" {
				w.Write([]byte(`{"data":[{"id":"` + model + `","parent":null},{"id":"sql","parent":"` + model + `"}]}`))
			}
		}))
		t.Cleanup(s.Close)
		return s
	}
	pr, err := health.New(health.Config{Interval: 20 * time.Millisecond, Timeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	var logs discoverytest.LogSink
	eps := []fleet.Endpoint{{Name: "a", URL: lists(testModel).URL, Model: testModel, LoRA: []string{"sql"}}, {Name: "b", URL: lists("m2").URL, Model: "m2"}}
	startGateway(t, Config{Endpoints: eps, NoHealthChecks: false}, Options{Health: pr, Logger: logs.Logger()})
	waitFor(t, func() bool { return logs.Count("another base model already serves") > 0 })
	time.Sleep(100 * time.Millisecond) // several more listings
	if n := logs.Count("another base model already serves"); n != 1 || !strings.Contains(logs.String(), "endpoint=b") {
		t.Errorf("warned %d times:\n%s", n, logs.String())
	}
}

// withoutAdapter is an engine of testModel without the adapter sql: it
// lists the model and listed() more, and answers every completion 404
// "The model `sql` does not exist." as vLLM does, counting them in hits.
func withoutAdapter(t *testing.T, hits *atomic.Int64, listed func() string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			w.Write([]byte(`{"data":[{"id":"` + testModel + `","parent":null}` + listed() + "]}"))
		case "/v1/completions":
			hits.Add(1)
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"message":"The model ` + "`sql`" + ` does not exist.","type":"NotFoundError","code":404}}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s
}
