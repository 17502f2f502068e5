package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
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
				// Its headers go with the whole answer: they name the
				// engine that finished it (they named the frozen one).
				if got := r.header.Get(hdrDecode); got != e.Addr() {
					t.Errorf("decode endpoint %q, want %q", got, e.Addr())
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

// TestEngineOutBeforeItAnswers: a request waiting on an engine that
// freezes before its first byte (it takes the request, then answers
// nothing, /health included) is sent to another engine once the health
// checks take the frozen one out; it waited as long as its client did.
func TestEngineOutBeforeItAnswers(t *testing.T) {
	var frozen atomic.Bool
	freezer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && !frozen.Load() {
			return // healthy until a request comes
		}
		frozen.Store(true)
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(freezer.Close)
	e := startEngine(t, fleet.RoleBoth, nil)
	pr, err := health.New(health.Config{Interval: 100 * time.Millisecond, Timeout: 100 * time.Millisecond, FailAfter: 2,
		NoMetrics: true, NoModels: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	eps := []fleet.Endpoint{{Name: "freezer", URL: freezer.URL, Model: testModel, PrefillSpeed: 20000 * 50}, endpointOf(e, fleet.RoleBoth)}
	g, url, admin := startGateway(t, Config{Endpoints: eps, Policy: "round-robin"}, Options{Health: pr})
	for stream := range 2 {
		frozen.Store(false)
		waitUntilIn(t, g, "freezer")
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"x"}],"max_tokens":5,"stream":%v}`, testModel, stream == 1)
		for range 2 { // round-robin: one of two goes to the freezer
			start := time.Now()
			r := post(t, url+"/v1/chat/completions", body, nil)
			if r.status != 200 || r.header.Get(hdrPrefill) != e.Addr() {
				t.Fatalf("stream=%v: %d from %q after %v: %s", stream == 1, r.status, r.header.Get(hdrPrefill), time.Since(start), r.body)
			}
			// Held is until the first send: the time on the frozen
			// engine (at least two probes of 100 ms) is not.
			if held, _ := strconv.ParseFloat(r.header.Get(hdrHeld), 64); held > 100 {
				t.Errorf("held %v ms: the time on the frozen engine counted", held)
			}
		}
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, "kvgate_retries_total 2") {
		t.Errorf("want two retries:\n%s", grepLines(m, "kvgate_re"))
	}
}

// waitUntilIn waits until g routes to name again.
func waitUntilIn(t *testing.T, g *Gateway, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !g.Eligible()[name] {
		if time.Now().After(deadline) {
			t.Fatalf("%s never came back", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMemberOutAndBack: a member's gone context ends when health takes
// it out, a new one waits once it is back, and only the return reports
// back (refresh then asks a central-mode engine's replay whether it
// restarted: kvevents.Subscriber.Resync).
func TestMemberOutAndBack(t *testing.T) {
	var m member
	first := m.goneContext().Done()
	for _, step := range []struct {
		out, back, left bool
	}{{false, false, false}, {true, false, true}, {true, false, false}, {false, true, false}, {false, false, false}} {
		if back, left := m.setOut(step.out); back != step.back || left != step.left {
			t.Fatalf("setOut(%v): back %v, left %v, want %v, %v", step.out, back, left, step.back, step.left)
		}
	}
	select {
	case <-first:
	default:
		t.Fatal("the gone context did not end when the member went out")
	}
	select {
	case <-m.goneContext().Done():
		t.Fatal("a member back in is gone")
	default:
	}
}
