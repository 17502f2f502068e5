package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/bench"
)

// parseBench parses bench flags as the command does.
func parseBench(t *testing.T, args ...string) *benchFlags {
	t.Helper()
	var f benchFlags
	fs, fl := newBenchFlagSet(&f, io.Discard)
	if err := parseFlags(fs, fl, args); err != nil {
		t.Fatal(err)
	}
	return &f
}

// TestBenchChatArrivalsWithinDuration: the chat workload is sent at the
// rate within --duration, as its help says; the arrivals were drawn a
// second time, unrelated to the count (a walkthrough's 4 s run at 5/s
// sent its last request at 6.5 s, another 18 requests within 2.05 s).
func TestBenchChatArrivalsWithinDuration(t *testing.T) {
	for _, arrivals := range []string{"poisson", "constant"} {
		for _, seed := range []string{"2", "3", "5"} {
			f := parseBench(t, "--rate", "5", "--duration", "4", "--seed", seed, "--arrivals", arrivals, "--sessions", "4", "--system-tokens", "4", "--turn-tokens", "4")
			items, err := benchItems(f, 5, 0)
			if err != nil {
				t.Fatal(err)
			}
			last := items[len(items)-1].At
			// Constant arrivals start at 0: rate × duration of them
			// (19, from 0.2 s, until 2026-12-04).
			if last >= 4 || arrivals == "constant" && (len(items) != 20 || items[0].At != 0) {
				t.Errorf("%s, seed %s: %d requests, the last at %.2f s", arrivals, seed, len(items), last)
			}
		}
	}
}

// TestBenchNoRequest: a workload with no request is an error that says
// why, not a run of 0 % attainment (or "no request succeeded").
func TestBenchNoRequest(t *testing.T) {
	err := runBench(context.Background(), []string{"--url", "http://127.0.0.1:1", "--model", "m", "--rate", "0.5", "--duration", "0.01"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "has no request") {
		t.Errorf("got %v", err)
	}
}

// TestBenchRungsDrawTheirOwnWorkload: each rung of a --rates ladder sends
// its own prompts and sessions (rung k: --seed + k; a trace's prompts
// marked as rung k's, each rung's sharing what the trace shares), so
// that no rung finds an earlier one's prompts cached; every rung drew
// the seed's, and three rungs at one rate hit 52 %, 83 % and 78 %. A
// single run (rung 0) keeps its seed's workload.
func TestBenchRungsDrawTheirOwnWorkload(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "t.jsonl")
	lines := `{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}
{"timestamp": 100, "input_length": 700, "output_length": 2, "hash_ids": [1, 3]}
{"timestamp": 200, "input_length": 300, "output_length": 2, "hash_ids": [4]}
`
	if err := os.WriteFile(trace, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	shared := func(a, b string) int {
		x, y := strings.Fields(a), strings.Fields(b)
		n := 0
		for n < len(x) && n < len(y) && x[n] == y[n] {
			n++
		}
		return n
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"chat", []string{"--rates", "5,5", "--duration", "4", "--sessions", "3", "--systems", "2", "--system-tokens", "4", "--turn-tokens", "4"}},
		{"trace", []string{"--rates", "5,5", "--workload", "trace", "--trace", trace}},
	} {
		f := parseBench(t, append(tc.args, "--seed", "7")...)
		rung0, err0 := benchItems(f, 5, 0)
		rung1, err1 := benchItems(f, 5, 1)
		if err0 != nil || err1 != nil {
			t.Fatal(err0, err1)
		}
		for _, a := range rung1 {
			for _, b := range rung0 {
				if shared(a.Prompt, b.Prompt) > 0 {
					t.Fatalf("%s: rung 1's prompt %.30q… starts as rung 0's %.30q…", tc.name, a.Prompt, b.Prompt)
				}
			}
		}
		if tc.name == "trace" {
			// Within a rung, the prompts share what the trace's share.
			for i := range rung0 {
				for j := range i {
					if s0, s1 := shared(rung0[i].Prompt, rung0[j].Prompt), shared(rung1[i].Prompt, rung1[j].Prompt); s0 != s1 || len(strings.Fields(rung1[i].Prompt)) != len(strings.Fields(rung0[i].Prompt)) {
						t.Errorf("trace requests %d and %d share %d words in rung 0, %d in rung 1", j, i, s0, s1)
					}
				}
			}
			continue
		}
		sessions := func(items []bench.Item) (s []int) {
			for _, it := range items {
				s = append(s, it.Session)
			}
			return s
		}
		// Rung 1 is the workload of seed 8; a single run keeps seed 7's.
		next, _ := benchItems(parseBench(t, append(tc.args, "--seed", "8")...), 5, 0)
		single, _ := benchItems(parseBench(t, "--rate", "5", "--duration", "4", "--sessions", "3", "--systems", "2", "--system-tokens", "4", "--turn-tokens", "4", "--seed", "7"), 5, 0)
		if !reflect.DeepEqual(rung1, next) || !reflect.DeepEqual(rung0, single) || reflect.DeepEqual(sessions(rung0), sessions(rung1)) {
			t.Errorf("chat: rung 1 is not seed 8's, rung 0 not the single run's, or both have the same sessions %v", sessions(rung0))
		}
	}
}

// TestBenchRefusesContradictions: flags that contradict each other are a
// usage error (exit 2) naming them, at once; each was ignored in silence:
// a TPOT target with unstreamed answers (met by every one), trace
// arrivals without a trace (Poisson, and no rate in the JSON), a rate
// with the trace's timestamps (every rung the same run).
func TestBenchRefusesContradictions(t *testing.T) {
	base := []string{"bench", "--url", "http://127.0.0.1:1", "--model", "m", "--duration", "0.2"} // refused before a run; if not, a short one
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--no-stream", "--slo-tpot", "0.05"}, "--slo-tpot: an unstreamed answer (--no-stream) has no TPOT"},
		{[]string{"--arrivals", "trace"}, "--arrivals trace: the trace's timestamps, for --workload trace only"},
		{[]string{"--workload", "trace", "--trace", "t.jsonl", "--arrivals", "trace", "--rates", "1,2"}, "--rate and --rates: not with --arrivals trace"},
		{[]string{"--workload", "trace", "--trace", "t.jsonl", "--arrivals", "trace", "--rate", "3"}, "--rate and --rates: not with --arrivals trace"},
		{[]string{"--timeout", "0"}, "--timeout must be in [0.001, 86400] seconds"},
		{[]string{"--timeout", "1e6"}, "--timeout must be in [0.001, 86400] seconds"},
		// Usage errors as the others (they exited 1; a retest, 2026-12-04).
		{[]string{"--no-stream", "--api", "responses"}, "--no-stream: chat, completions and messages only"},
		{[]string{"--concurrency", "2", "--rate", "3"}, "not with --concurrency"},
	} {
		if _, errOut, code := runCmd(t, append(base, tc.args...)...); code != 2 || !strings.Contains(errOut, tc.msg) {
			t.Errorf("%v: exit %d: %s; want 2 naming %q", tc.args, code, errOut, tc.msg)
		}
	}
}

// hangingServer streams two tokens and then nothing, without ending,
// until its client goes; arrived is told of each request.
func hangingServer(t *testing.T, arrived func()) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n")
		w.(http.Flusher).Flush()
		if arrived != nil {
			arrived()
		}
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestBenchTimeout: --timeout cuts a hung stream (bench waited for it
// forever), its outcome timeout, and a run of nothing else exits 1.
func TestBenchTimeout(t *testing.T) {
	srv := hangingServer(t, nil)
	var out, errOut bytes.Buffer
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // hang guard
	defer cancel()
	err := runBench(ctx, []string{"--url", srv.URL, "--model", "m", "--requests", "2", "--rate", "50", "--duration", "1",
		"--timeout", "0.2", "--format", "json"}, &out, &errOut)
	var res struct {
		Runs []struct {
			Outcomes map[string]int `json:"outcomes"`
		} `json:"runs"`
	}
	if jerr := json.Unmarshal(out.Bytes(), &res); err == nil || !strings.Contains(err.Error(), "no request succeeded") || jerr != nil ||
		len(res.Runs) != 1 || res.Runs[0].Outcomes["timeout"] != 2 || time.Since(start) > 10*time.Second {
		t.Fatalf("%v after %v: %s %s", err, time.Since(start), out.String(), errOut.String())
	}
	if !strings.Contains(errOut.String(), "2 timeout, the first: status 200: timed out: no whole answer within 0.2 s") {
		t.Errorf("stderr: %s", errOut.String())
	}
}

// TestBenchInterrupted: a run stopped by its context (Ctrl-C) is marked
// interrupted (JSON "interrupted": true, a line under the table), and
// with no request served bench exits 1, as the docs say; it exited 0.
func TestBenchInterrupted(t *testing.T) {
	for _, format := range []string{"json", "table"} {
		ctx, cancel := context.WithCancel(context.Background())
		srv := hangingServer(t, cancel)
		var out bytes.Buffer
		err := runBench(ctx, []string{"--url", srv.URL, "--model", "m", "--rates", "50,100", "--duration", "5", "--format", format}, &out, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "interrupted, and no request succeeded") {
			t.Errorf("%s: got %v", format, err)
		}
		var res struct {
			Runs []struct {
				Interrupted bool           `json:"interrupted"`
				Outcomes    map[string]int `json:"outcomes"`
			} `json:"runs"`
		}
		switch {
		case format == "table" && !strings.Contains(out.String(), "interrupted after"):
			t.Errorf("table: %s", out.String())
		// The requests in flight at the stop are "interrupted", not the
		// server's transport failures (a retest walkthrough, 2026-12-04).
		case format == "json" && (json.Unmarshal(out.Bytes(), &res) != nil || len(res.Runs) != 1 || !res.Runs[0].Interrupted || res.Runs[0].Outcomes["not_sent"] == 0 ||
			res.Runs[0].Outcomes["interrupted"] == 0 || res.Runs[0].Outcomes["transport"] != 0):
			t.Errorf("json: %s", out.String())
		}
	}
}
