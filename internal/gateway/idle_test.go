package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/health"
)

// TestStreamIdleTimeout: an engine that freezes in the middle of an
// answer (five words, then silence, its connection open) breaks the
// attempt after --stream-idle-timeout: with --migration-limit the answer,
// streamed or assembled whole, is continued on the other engine, and the
// frozen engine is reported to health. Without the bound the client
// waited as long as it would.
func TestStreamIdleTimeout(t *testing.T) {
	chat := func(stream bool) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"tell me"}],"max_tokens":20,"stream":%v}`, testModel, stream)
	}
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			b := &breaker{words: 5, fail: "freeze"}
			srv := b.server(t)
			e := startEngine(t, fleet.RoleBoth, nil)
			pr, err := health.New(health.Config{Interval: time.Hour, EjectAfter: 100, NoMetrics: true, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pr.Close() })
			eps := []fleet.Endpoint{{Name: "breaker", URL: srv.URL, Model: testModel, Role: fleet.RoleBoth, PrefillSpeed: 20000 * 50},
				endpointOf(e, fleet.RoleBoth)}
			_, url, admin := startGateway(t, Config{Endpoints: eps, Policy: "round-robin", MigrationLimit: 1,
				StreamIdleTimeout: 500 * time.Millisecond}, Options{Health: pr})
			start := time.Now()
			var text string
			if stream {
				s := viaBreakerStream(t, url+"/v1/chat/completions", chat(true), b)
				if s.status != 200 || s.readErr != nil || s.done != 1 || s.finish == "" {
					t.Fatalf("status %d, read %v, %d [DONE], finish %q:\n%s", s.status, s.readErr, s.done, s.finish, s.raw)
				}
				text = s.text
			} else {
				r := viaBreaker(t, url+"/v1/chat/completions", chat(false), b)
				if r.status != 200 {
					t.Fatalf("%d %s", r.status, r.body)
				}
				text, _, _ = wholeChat(t, r.body)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Fatalf("took %v", took)
			}
			if !strings.HasPrefix(text, "w0 w1 w2 w3 w4 ") || len(strings.Fields(text)) != 20 {
				t.Errorf("want the frozen engine's five words continued to 20: %q", text)
			}
			if st, _ := pr.State("breaker"); st.PassiveFailures != 1 {
				t.Errorf("the frozen engine: %d passive failures, want 1", st.PassiveFailures)
			}
			want := `kvgate_migrations_total{result="ok"} 1`
			if m := get(t, admin+"/metrics"); !strings.Contains(m, want) {
				t.Errorf("no %s:\n%s", want, grepLines(m, "kvgate_"))
			}
		})
	}
}

// TestStreamIdleTimeoutWaitsForTheFirstByte: the bound starts with the
// answer's first bytes; before them the engine may be computing a long
// prompt, which only --upstream-timeout bounds.
func TestStreamIdleTimeoutWaitsForTheFirstByte(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return
		}
		time.Sleep(600 * time.Millisecond) // a long prefill: no byte
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`, testModel)
	}))
	t.Cleanup(slow.Close)
	eps := []fleet.Endpoint{{Name: "slow", URL: slow.URL, Model: testModel}}
	_, url, _ := startGateway(t, Config{Endpoints: eps, NoHealthChecks: true, NoStreamUpstream: true, StreamIdleTimeout: 100 * time.Millisecond}, Options{})
	if r := post(t, url+"/v1/completions", completion("hi", false, 2), nil); r.status != 200 || !strings.Contains(r.body, `"ok"`) {
		t.Fatalf("%d %s", r.status, r.body)
	}
}
