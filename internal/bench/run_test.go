package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestOpenLoopCountsFromDue: an open-loop item due while the in-flight
// bound is reached waits, and its latencies count from when it was due,
// as Mode.MaxInflight says; they counted from its sending, which left the
// wait out (coordinated omission: with one in flight and a 0.3 s server,
// an item due at 0.1 s and sent at 0.3 s reported a TTFT of 0.3 s, not
// 0.5 s). A closed loop counts from each sending.
func TestOpenLoopCountsFromDue(t *testing.T) {
	const delay = 300 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(delay)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	c := &Client{URL: srv.URL, Model: "m", HTTP: srv.Client()}
	items := []Item{{At: 0, Prompt: "a", MaxTokens: 1}, {At: 0.1, Prompt: "b", MaxTokens: 1}}
	for _, m := range []Mode{{MaxInflight: 1}, {Concurrency: 1}} {
		recs, _, err := Run(context.Background(), c, items, m, nil)
		if err != nil {
			t.Fatal(err)
		}
		first, second := recs[0], recs[1]
		if first.Outcome != "ok" || second.Outcome != "ok" || first.TTFT < 0.29 || first.TTFT > 0.45 {
			t.Fatalf("%+v: %+v %+v", m, first, second)
		}
		if m.Concurrency == 0 && (second.Late < 0.17 || second.TTFT < 0.47 || second.E2E < second.TTFT || second.TTFT-second.Late < 0.29) {
			t.Errorf("open loop: second sent %.3f s late, TTFT %.3f s, E2E %.3f s; want about 0.2, 0.5, 0.5", second.Late, second.TTFT, second.E2E)
		}
		if m.Concurrency > 0 && (second.Late != 0 || second.TTFT > 0.45) {
			t.Errorf("closed loop: second %.3f s late, TTFT %.3f s; want 0, 0.3", second.Late, second.TTFT)
		}
	}
}
