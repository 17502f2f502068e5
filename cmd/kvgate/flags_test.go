package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/enginetest"
)

// TestEveryNumericFlagHasARange: no command registers a plain numeric flag;
// every number goes through flagrange, which shows its range in the usage
// and checks it (issue 14 item 12).
func TestEveryNumericFlagHasARange(t *testing.T) {
	var sf simFlags
	simFS, _ := newSimFlagSet(&sf, io.Discard)
	cfg := engine.DefaultConfig()
	var ef engineFlags
	engFS, _ := newEngineFlagSet(&cfg, &ef, io.Discard)
	if plain := kvindexPlainNumericFlags(t); len(plain) > 0 {
		t.Errorf("kvgate kvindex flags %v have no range", plain)
	}
	unbounded := map[string]bool{"kvgate sim/seed": true} // any uint64 is a seed
	for _, fs := range []*flag.FlagSet{simFS, engFS} {
		fs.VisitAll(func(f *flag.Flag) {
			typ := fmt.Sprintf("%T", f.Value)
			switch typ {
			case "*flag.intValue", "*flag.int64Value", "*flag.uintValue", "*flag.uint64Value", "*flag.float64Value", "*flag.durationValue":
				if !unbounded[fs.Name()+"/"+f.Name] {
					t.Errorf("%s --%s is a plain %s with no range", fs.Name(), f.Name, typ)
				}
			}
			if strings.HasPrefix(typ, "*flagrange.value") && !strings.Contains(f.Usage, "in [") {
				t.Errorf("%s --%s: usage %q does not show the range", fs.Name(), f.Name, f.Usage)
			}
		})
	}
}

// kvindexPlainNumericFlags lists the flags of kvgate kvindex's usage that
// print as a plain int, float, duration… (a bounded flag prints as "value"
// followed by its range).
func kvindexPlainNumericFlags(t *testing.T) []string {
	t.Helper()
	var out bytes.Buffer
	if err := runKVIndex(context.Background(), []string{"-h"}, io.Discard, &out); err != flag.ErrHelp {
		t.Fatalf("kvindex -h: %v", err)
	}
	var plain []string
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.HasPrefix(f[0], "-") {
			switch f[1] {
			case "int", "int64", "uint", "uint64", "float", "duration":
				plain = append(plain, f[0])
			}
		}
	}
	if !strings.Contains(out.String(), "--block-size") && !strings.Contains(out.String(), "-block-size value") {
		t.Fatalf("usage does not list --block-size:\n%s", out.String())
	}
	return plain
}

func TestSimFlagRanges(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [1, 2, 3, 5]}
{"timestamp": 1e-300, "input_length": 2000, "output_length": 5, "hash_ids": [1, 2, 4, 6]}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"--duration", "1e12"}, "--duration must be in [0.001, 86400] seconds, got 1e+12"},
		{[]string{"--duration", "NaN"}, "--duration must be in [0.001, 86400] seconds, got NaN"},
		{[]string{"--rates", "1e9"}, "--rates must be in [0.001, 1e+06] req/s, got 1e+09"},
		{[]string{"--rates", "Inf"}, "--rates must be"},
		{[]string{"--rates", "1e6", "--duration", "86400"}, "8.64e+10 expected requests"},
		{[]string{"--rates", strings.Repeat("1,", 65) + "1"}, "at most 64"},
		{[]string{"--sessions", "2e9"}, "--sessions must be in [1, 1048576], got 2000000000"},
		{[]string{"--systems", "0"}, "--systems"},
		{[]string{"--system-tokens", "-1"}, "--system-tokens"},
		{[]string{"--turn-tokens", "1e9"}, "--turn-tokens"},
		{[]string{"--output-tokens", "9223372036854775807"}, "--output-tokens must be in [0, 524288] tokens"},
		{[]string{"--instances", "1e8"}, "--instances must be in [1, 4096], got 100000000"},
		{[]string{"--decode-instances", "-1"}, "--decode-instances"},
		{[]string{"--decode-kv-tokens", "0"}, "--decode-kv-tokens"},
		{[]string{"--cache-blocks", "0"}, "--cache-blocks must be in [1, 8388608] blocks, got 0"},
		{[]string{"--instances", "4096", "--cache-blocks", "3000"}, "cache blocks in the fleet, more than 8388608"},
		{[]string{"--trace", trace, "--cache-blocks", "7", "--block-size", "64"}, "448 tokens holds no 512-token trace block"},
		{[]string{"--slo-ttft", "-1"}, "--slo-ttft must be 0 (none) or in [0.001, 86400] seconds, got -1"},
		{[]string{"--slo-ttft", "NaN"}, "--slo-ttft"},
		{[]string{"--slo-tpot", "-0.5"}, "--slo-tpot"},
		{[]string{"--slo-tpot", "Inf"}, "--slo-tpot"},
		{[]string{"--time-scale", "1e-320", "--trace", trace, "--format", "json"}, "--time-scale must be in [1e-06, 1e+06], got 1e-320"},
		{[]string{"--prefill-speed", "0"}, "--prefill-speed"},
		{[]string{"--block-size", "0"}, "--block-size"},
		{[]string{"--seeds", "1e6"}, "--seeds"},
		{[]string{"--duration", "0", "--instances", "0"}, "--instances"}, // every bad flag is named
		// Flags nothing would read are refused, not ignored.
		{[]string{"--trace", trace, "--rates", "5"}, "--rates: a trace is replayed at its own rate"},
		{[]string{"--time-scale", "0.1"}, "--time-scale scales a --trace"},
		{[]string{"--slo-tpot", "0.01"}, "--slo-tpot needs --decode-instances"},
	}
	for _, tt := range tests {
		_, errOut, code := runCmd(t, append([]string{"sim", "--policies", "kvgate"}, tt.args...)...)
		if code == 0 || !strings.Contains(errOut, tt.msg) {
			t.Errorf("%.80v: exit %d, stderr %q; want an error mentioning %q", tt.args, code, errOut, tt.msg)
		}
	}

	// Arrivals 1e-300 ms apart at the smallest time scale: JSON output, and
	// every number in it finite.
	out, errOut, code := runCmd(t, "sim", "--trace", trace, "--time-scale", "1e-6", "--policies", "kvgate", "--early-reject", "off", "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Runs) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	for k, v := range doc.Runs[0] {
		if f, ok := v.(float64); ok && (math.IsInf(f, 0) || math.IsNaN(f) || f < 0) {
			t.Errorf("%s = %v", k, f)
		}
	}

	// --slo-ttft 0 means no TTFT SLO, and is accepted.
	if _, errOut, code := runCmd(t, "sim", "--rates", "5", "--duration", "2", "--policies", "kvgate", "--early-reject", "off", "--slo-ttft", "0"); code != 0 {
		t.Errorf("--slo-ttft 0: exit %d: %s", code, errOut)
	}
}

func TestEngineFlagRanges(t *testing.T) {
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"--num-gpu-blocks", "4611686018427387904"}, "--num-gpu-blocks must be in [1, 4194304] blocks, got 4611686018427387904"},
		{[]string{"--time-scale", "1e-300"}, "--time-scale must be in [0.001, 1e+06], got 1e-300"},
		{[]string{"--time-scale", "Inf"}, "--time-scale"},
		{[]string{"--max-model-len", "0"}, "--max-model-len"},
		{[]string{"--max-num-seqs", "1e9"}, "--max-num-seqs"},
		{[]string{"--max-num-batched-tokens", "-5"}, "--max-num-batched-tokens"},
		{[]string{"--block-size", "1e6"}, "--block-size"},
		{[]string{"--port", "70000"}, "--port must be in [0, 65535], got 70000"},
		{[]string{"--prefill-speed", "NaN"}, "--prefill-speed"},
		{[]string{"--decode-step-base", "1e9"}, "--decode-step-base"},
		{[]string{"--decode-step-per-seq", "-1"}, "--decode-step-per-seq"},
		{[]string{"--decode-step-per-kctx", "Inf"}, "--decode-step-per-kctx"},
		{[]string{"--kv-transfer-speed", "1e-300"}, "--kv-transfer-speed must be 0 (free) or in [1, 1e+12] tokens/s"},
		{[]string{"--stream-interval", "-1"}, "--stream-interval"},
		{[]string{"--kv-events-buffer-steps", "1e9"}, "--kv-events-buffer-steps"},
		{[]string{"--role-switch-warmup", "-1s"}, "--role-switch-warmup"},
		{[]string{"--kv-hold-timeout", "1000h"}, "--kv-hold-timeout must be in [0s, 24h0m0s], got 1000h0m0s"},
		{[]string{"--role", "sideways"}, `role must be both, prefill or decode, got "sideways"`},
		{[]string{"--role", ""}, `role must be both, prefill or decode, got ""`},
		{[]string{"--scheduling-policy", "lifo"}, `scheduling-policy must be fcfs or priority, got "lifo"`},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // hang guard
		var out, errb bytes.Buffer
		err := runEngine(ctx, append([]string{"--port", "0"}, tt.args...), &out, &errb)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%v: got %v; want an error mentioning %q", tt.args, err, tt.msg)
		}
		if out.Len() > 0 {
			t.Errorf("%v: the engine started: %s", tt.args, out.String())
		}
	}
}

func TestKVIndexFlagRanges(t *testing.T) {
	eng := "name=127.0.0.1:8001,model=m"
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"--block-size", "1e9"}, "--block-size must be in [1, 4096] tokens, got 1000000000"},
		{[]string{"--max-keys", "0"}, "--max-keys"},
		{[]string{"--max-keys", "1e12"}, "--max-keys"},
		{[]string{"--approx-ttl", "0s"}, "--approx-ttl must be in [1s, 24h0m0s], got 0s"},
		{[]string{"--replay-timeout", "-1s"}, "--replay-timeout"},
		{[]string{"--replay-timeout", "1000h"}, "--replay-timeout"},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // hang guard
		err := runKVIndex(ctx, append([]string{"--engine", eng, "--admin", "127.0.0.1:0"}, tt.args...), io.Discard, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%v: got %v; want an error mentioning %q", tt.args, err, tt.msg)
		}
	}
}

// TestBenchNoStream: kvgate bench --no-stream sends unstreamed requests
// and its JSON says so; the Responses API is streamed only.
func TestBenchNoStream(t *testing.T) {
	if _, errOut, code := runCmd(t, "bench", "--url", "http://127.0.0.1:1", "--model", "m", "--no-stream", "--api", "responses"); code == 0 || !strings.Contains(errOut, "--no-stream") {
		t.Fatalf("--no-stream with --api responses: exit %d: %s", code, errOut)
	}
	e := enginetest.Start(t, 50)
	out, errOut, code := runCmd(t, "bench", "--url", e.URL(), "--model", enginetest.Model, "--no-stream", "--api", "chat", "--requests", "3", "--rate", "50", "--duration", "1", "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res struct {
		Runs []struct {
			Unstreamed bool           `json:"unstreamed"`
			Outcomes   map[string]int `json:"outcomes"`
			TPOT       struct{ P50 float64 }
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Runs) != 1 || !res.Runs[0].Unstreamed || res.Runs[0].Outcomes["ok"] != 3 || res.Runs[0].TPOT.P50 != 0 {
		t.Fatalf("%v: %s", err, out)
	}
}

// TestBenchMessages: kvgate bench speaks Anthropic's Messages API,
// streamed and not, to the emulator: every request served with the
// output length asked for (ignore_eos), the hit rate shown as unknown
// ("-", -1 in JSON: vLLM's Messages API reports no cache hits), and a
// streamed run's TPOT measured.
func TestBenchMessages(t *testing.T) {
	e := enginetest.Start(t, 50)
	for _, unstreamed := range []bool{false, true} {
		args := []string{"bench", "--url", e.URL(), "--model", enginetest.Model, "--api", "messages", "--requests", "4", "--rate", "50", "--duration", "1",
			"--output-tokens", "7", "--format", "json", "--csv", t.TempDir() + "/r.csv"}
		if unstreamed {
			args = append(args, "--no-stream")
		}
		out, errOut, code := runCmd(t, args...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var res struct {
			Runs []struct {
				Outcomes     map[string]int `json:"outcomes"`
				HitRate      float64        `json:"hit_rate"`
				TokensPerSec float64        `json:"tokens_per_sec"`
				TPOT         struct{ P50 float64 }
			} `json:"runs"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Runs) != 1 || res.Runs[0].Outcomes["ok"] != 4 || res.Runs[0].HitRate != -1 ||
			(res.Runs[0].TPOT.P50 > 0) == unstreamed {
			t.Fatalf("unstreamed %v: %v: %s", unstreamed, err, out)
		}
	}
	out, errOut, code := runCmd(t, "bench", "--url", e.URL(), "--model", enginetest.Model, "--api", "messages", "--requests", "2", "--rate", "50", "--duration", "1")
	if code != 0 || !strings.Contains(out, " - ") {
		t.Fatalf("table: exit %d: %s %s", code, out, errOut)
	}
}

// TestBenchAsUsersMeetIt: what a first run of kvgate bench meets. A
// closed loop sends --requests requests (it sent --rate × --duration);
// an output path in no folder is refused before the run, not after it;
// a base URL ending in /v1 (an OpenAI SDK's) is the server's; a run
// whose every request failed says why on stderr, shows its latencies as
// unknown and exits non-zero; an unknown --format or --arrivals, or
// --rates with a closed loop, is refused at once.
func TestBenchAsUsersMeetIt(t *testing.T) {
	e := enginetest.Start(t, 50)
	base := []string{"bench", "--model", enginetest.Model, "--output-tokens", "2", "--turn-tokens", "8", "--system-tokens", "8"}
	run := func(args ...string) (string, string, int) {
		return runCmd(t, append(append([]string(nil), base...), args...)...)
	}

	out, errOut, code := run("--url", e.URL()+"/v1/", "--concurrency", "4", "--requests", "30", "--duration", "1", "--format", "json")
	var res struct {
		Runs []struct {
			Requests int            `json:"requests"`
			Outcomes map[string]int `json:"outcomes"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || len(res.Runs) != 1 || res.Runs[0].Requests != 30 || res.Runs[0].Outcomes["ok"] != 30 {
		t.Fatalf("closed loop of 30 through a /v1 base URL: exit %d %v: %s %s", code, err, out, errOut)
	}
	if !strings.Contains(errOut, "base URL is "+e.URL()) {
		t.Errorf("the /v1 base URL not explained: %s", errOut)
	}

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--url", e.URL(), "--csv", "/nonexistent-dir/r.csv"}, "--csv"},
		{[]string{"--url", e.URL(), "--html", "/nonexistent-dir/r.html"}, "--html"},
		{[]string{"--url", e.URL(), "--format", "xml"}, "--format"},
		{[]string{"--url", e.URL(), "--arrivals", "foo"}, "poisson, constant or trace"},
		{[]string{"--url", e.URL(), "--concurrency", "2", "--rates", "1,50"}, "--rates"},
		{[]string{"--url", e.URL(), "--concurrency", "2", "--arrivals", "constant"}, "not with --concurrency"},
	} {
		start := time.Now()
		if _, errOut, code := run(append(tc.args, "--duration", "30")...); code == 0 || !strings.Contains(errOut, tc.msg) || time.Since(start) > 20*time.Second {
			t.Errorf("%v: exit %d after %v: %s; want refused at once, naming %s", tc.args, code, time.Since(start), errOut, tc.msg)
		}
	}

	out, errOut, code = run("--url", e.URL(), "--model", "nosuch", "--rate", "20", "--duration", "0.3")
	if code == 0 || !strings.Contains(errOut, "does not exist") || !strings.Contains(errOut, "no request succeeded") {
		t.Fatalf("every request failed: exit %d: %s", code, errOut)
	}
	if fields := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[1]); len(fields) < 10 || fields[7] != "-" || fields[9] != "-" {
		t.Fatalf("latencies of no answer: %q", out)
	}
}

// TestBenchHeaders: --header is repeatable and every one reaches the
// server.
func TestBenchHeaders(t *testing.T) {
	var mu sync.Mutex
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Clone()
		mu.Unlock()
		http.Error(w, "no", http.StatusTeapot)
	}))
	defer srv.Close()
	runCmd(t, "bench", "--url", srv.URL, "--model", "m", "--requests", "1", "--rate", "50", "--duration", "1",
		"--header", "X-Kvgate-Class: batch", "--header", "Authorization:Bearer k")
	mu.Lock()
	defer mu.Unlock()
	if got.Get("X-Kvgate-Class") != "batch" || got.Get("Authorization") != "Bearer k" {
		t.Fatalf("headers the server got: %v", got)
	}
}
