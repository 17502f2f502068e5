package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestFailuresNamed: a 200 that then fails is a server_error with the
// server's message (an error event in the stream, vLLM's older error
// object, an error body), and a whole JSON answer to a streamed request
// says so; before the walkthrough of 2026-12-04 the first was
// "transport: no token in the answer" and the second "stream ended
// without [DONE]".
func TestFailuresNamed(t *testing.T) {
	cases := []struct {
		name, ctype, body, outcome, msg string
	}{
		{"error event", "text/event-stream", "data: {\"error\":{\"message\":\"engine died\",\"code\":500}}\n\n", "server_error", "engine died"},
		{"vLLM's older error event", "text/event-stream", "data: {\"object\":\"error\",\"message\":\"out of blocks\"}\n\n", "server_error", "out of blocks"},
		{"error body", "application/json", `{"error":{"message":"engine on fire"}}`, "server_error", "engine on fire"},
		{"whole answer", "application/json", `{"choices":[{"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`, "transport", `ignored "stream": true`},
	}
	for _, c := range cases {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", c.ctype)
			fmt.Fprint(w, c.body)
		}))
		cl := &Client{URL: srv.URL, Model: "m", HTTP: srv.Client()}
		rec := cl.Do(context.Background(), &Item{Prompt: "hi", MaxTokens: 1}, 0, time.Now())
		srv.Close()
		if rec.Outcome != c.outcome || !strings.Contains(rec.Error, c.msg) {
			t.Errorf("%s: %s %q, want %s naming %q", c.name, rec.Outcome, rec.Error, c.outcome, c.msg)
		}
	}
}

// TestSummaryWithoutAnswers: a run that served nothing reports no
// latency (null, not 0 s) and no hit rate (-1), and counts every outcome,
// zeros included.
func TestSummaryWithoutAnswers(t *testing.T) {
	s := Summarize("r", []Record{{Outcome: "transport"}, {Outcome: "rejected"}}, 1, SLO{})
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	_ = json.Unmarshal(b, &got)
	if got["ttft"] != nil || got["tpot"] != nil || got["e2e"] != nil || got["hit_rate"] != -1.0 {
		t.Errorf("latencies and hit rate of no answer: %s", b)
	}
	outs, _ := got["outcomes"].(map[string]any)
	for _, o := range Outcomes {
		if _, ok := outs[o]; !ok {
			t.Errorf("outcome %s missing: %s", o, b)
		}
	}
	served := Summarize("r", []Record{{Outcome: "ok", TTFT: 0.5, E2E: 1, OutputTokens: 1, PromptTokens: 10, CachedTokens: 5}}, 1, SLO{})
	if b, _ := json.Marshal(served); !bytes.Contains(b, []byte(`"ttft":{"n":1,"p50":0.5`)) || !bytes.Contains(b, []byte(`"tpot":null`)) {
		t.Errorf("one answer of one token: %s", b)
	}
}

// TestCSVOneHeader: a ladder's runs share one CSV header (it was written
// again for each run, which turned every column to text in a reader).
func TestCSVOneHeader(t *testing.T) {
	runs := []RunResult{
		{Summary: Summary{Label: "@1"}, Records: []Record{{Outcome: "ok"}}},
		{Summary: Summary{Label: "@2"}, Records: []Record{{Outcome: "ok"}, {Outcome: "rejected"}}},
	}
	var buf bytes.Buffer
	if err := WriteCSV(&buf, runs); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 || rows[0][0] != "run" || rows[1][0] != "@1" || rows[3][0] != "@2" {
		t.Errorf("rows %v", rows)
	}
}

// TestChatArrivalsWithinDuration: the chat workload's arrivals are its
// own, at the rate and within the duration, Poisson or evenly spaced
// (bench drew them again, so a 4 s run sent until 6.5 s).
func TestChatArrivalsWithinDuration(t *testing.T) {
	for _, constant := range []bool{false, true} {
		for seed := range uint64(20) {
			items, err := Chat(ChatConfig{Systems: 2, Sessions: 4, SystemTokens: 4, TurnTokens: 4, OutputTokens: 1,
				Rate: 5, Duration: 4, Seed: seed, Constant: constant})
			if err != nil {
				t.Fatal(err)
			}
			for i, it := range items {
				if it.At >= 4 || i > 0 && it.At < items[i-1].At {
					t.Fatalf("constant %v, seed %d: arrival %d at %.2f s", constant, seed, i, it.At)
				}
			}
			if constant && (len(items) != 20 || items[0].At != 0 || items[1].At-items[0].At != 0.2) {
				t.Errorf("constant: %d requests, the first at %v, first gap %v; want 20, at 0, 0.2 s", len(items), items[0].At, items[1].At-items[0].At)
			}
		}
	}
}
