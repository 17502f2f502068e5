package gateway

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
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
		found, _ = openai.ResponseCachedTokens([]byte(r.body))
		e := byName[home]
		// Quiet: the engine's events reached the index.
		waitFor(t, func() bool {
			for _, st := range g.sub.Stats() {
				if st.Endpoint == home {
					next := e.KVEventsSeq()
					return next == 0 || st.LastSeq != nil && *st.LastSeq+1 >= next
				}
			}
			return false
		})
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
