package gateway

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("endpoints:\n  - {name: a, url: \"http://h:1\", model: m, role: prefill}\nclasses:\n  - {name: standard, priority: 1, ttft: 2}\n"))
	f.Add([]byte("policy: kvgate\nslo_ttft: 1e308\nblock_size: -1\nhttp: {max_conns: 3}\n"))
	f.Add([]byte("classes: [{name: x, ttft_per_1k_tokens: .nan}]\ndefault_class: x\n"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		c.Defaults()
		if c.Validate() != nil {
			return
		}
		// A config that validates builds a gateway.
		g, err := New(c, Options{Logger: quiet()})
		if err != nil && !strings.Contains(err.Error(), "endpoint") {
			t.Fatalf("valid config refused by New: %v", err)
		}
		_ = g
	})
}

// FuzzGatewayRequest sends arbitrary bodies through the whole request
// path: nothing crashes, and no in-flight slot or counter leaks.
func FuzzGatewayRequest(f *testing.F) {
	c := &capture{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.bodies = append(c.bodies[:0], "")
		c.mu.Unlock()
		w.Write([]byte(`{"choices":[{"text":"ok"}]}`))
	}))
	defer srv.Close()
	no := false
	g, err := New(Config{Endpoints: []fleet.Endpoint{{Name: "a", URL: srv.URL, Model: testModel}, {Name: "b", URL: srv.URL, Model: testModel, Role: fleet.RoleDecode},
		{Name: "p", URL: srv.URL, Model: testModel, Role: fleet.RolePrefill}}, EarlyReject: &no}, Options{Logger: quiet()})
	if err != nil {
		f.Fatal(err)
	}
	h := g.Handler()
	for _, s := range []string{
		`{"model":"gw-model","prompt":"hello","max_tokens":3}`,
		`{"model":"gw-model","prompt":[1,2,3],"max_tokens":9223372036854775807}`,
		`{"model":"gw-model","prompt":[[1],[2,3]],"stream":true}`,
		`{"model":"gw-model","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"model":"gw-model","prompt":"a","kv_transfer_params":{"do_remote_prefill":true}}`,
		`{"model":"gw-model","prompt":"a"}{"x":1}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		if rec.Code == 0 || rec.Code >= 500 && rec.Code != 502 && rec.Code != 503 {
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body.String())
		}
		if n := g.inflight.Load(); n != 0 {
			t.Fatalf("in-flight slots leaked: %d", n)
		}
		for _, st := range g.endpointStates() {
			if st.Load.InflightRequests != 0 || st.Load.InflightUncached != 0 || st.Load.DecodeStreams != 0 {
				t.Fatalf("load leaked after %q: %+v", body, st)
			}
		}
	})
}

// FuzzStreamEnd: however the upstream's reads cut a stream, its end and
// its token events are found as in one read, and nothing panics.
func FuzzStreamEnd(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: {\"choices\": [], \"usage\": {}}\n\ndata: [DONE]\n\n"), []byte{3, 40, 7})
	f.Add([]byte("data:[DONE]\r"), []byte{1})
	f.Add([]byte(": ping\ndata: x:\"\"\ndata: \"text\" :  \"\"\n"), []byte{0, 2, 250})
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		whole := &streamEnd{}
		whole.scan(data)
		pieces := &streamEnd{}
		rest := data
		for _, c := range cuts {
			n := min(int(c), len(rest))
			pieces.scan(rest[:n])
			rest = rest[n:]
		}
		pieces.scan(rest)
		if whole.done() != pieces.done() || whole.events != pieces.events {
			t.Fatalf("in one read: done %v, %d events; in pieces %v: done %v, %d events", whole.done(), whole.events, cuts, pieces.done(), pieces.events)
		}
	})
}
