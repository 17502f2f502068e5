package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/syncbuf"
)

var adminLine = regexp.MustCompile(`admin on http://(\S+),`)

// TestKVIndexServes runs the command on an ephemeral admin port with one
// engine that publishes no events (approximate entries only), records a
// routed request, looks it up, reads the stats, and stops it by cancelling
// the context.
func TestKVIndexServes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runKVIndex(ctx, []string{
			"--admin", "127.0.0.1:0", "--engine", "name=127.0.0.1:8001,model=m",
			"--engine", "name=127.0.0.1:8002,model=m,events=127.0.0.1:1",
			"--block-size", "4", "--log-level", "warn",
		}, &stdout, &stderr)
	}()
	var base string
	for deadline := time.Now().Add(10 * time.Second); base == ""; {
		if m := adminLine.FindStringSubmatch(stdout.String()); m != nil {
			base = "http://" + m[1]
			break
		}
		select {
		case err := <-done:
			t.Fatalf("kvindex exited early: %v\nstderr: %s", err, stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no admin address printed; stdout %q, stderr %q", stdout.String(), stderr.String())
		}
	}
	client := &http.Client{Timeout: 5 * time.Second}
	post := func(path, body string) (int, map[string]any) {
		t.Helper()
		resp, err := client.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return resp.StatusCode, v
	}

	ids := `[1,2,3,4,5,6,7,8,9,10]` // two full blocks of 4
	if code, v := post("/admin/kv/routed", `{"model":"m","endpoint":"127.0.0.1:8001","token_ids":`+ids+`}`); code != http.StatusOK {
		t.Fatalf("routed: %d %v", code, v)
	}
	code, v := post("/admin/kv/lookup", `{"model":"m","token_ids":`+ids+`}`)
	if code != http.StatusOK {
		t.Fatalf("lookup: %d %v", code, v)
	}
	eps, _ := v["endpoints"].([]any)
	if v["block_size"] != 4.0 || v["prompt_blocks"] != 2.0 || len(eps) != 2 {
		t.Fatalf("lookup: %v", v)
	}
	if e := eps[0].(map[string]any); e["endpoint"] != "127.0.0.1:8001" || e["matched_tokens"] != 8.0 || e["tier"] != "gpu" || e["approx"] != true {
		t.Errorf("lookup endpoint: %v", e)
	}
	if code, v := post("/admin/kv/lookup", `{"model":"nope","token_ids":[1]}`); code != http.StatusNotFound {
		t.Errorf("unknown model: %d %v", code, v)
	}

	resp, err := client.Get(base + "/admin/kv/stats")
	if err != nil {
		t.Fatal(err)
	}
	body := new(bytes.Buffer)
	_, _ = body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(body.String(), "127.0.0.1:8001") || !json.Valid(body.Bytes()) {
		t.Errorf("stats: %d %s", resp.StatusCode, body)
	}
	// An engine with events behind the byte estimate: warned of at start.
	if !strings.Contains(stderr.String(), "tokenizer is the byte estimate") {
		t.Errorf("no warning of the estimate tokenizer: %s", stderr.String())
	}
	for _, c := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{http.MethodGet, "/health", 200, ""},
		{http.MethodHead, "/health", 200, ""},
		{http.MethodPost, "/health", 405, "GET, HEAD"},
		{http.MethodGet, "/metrics", 404, ""},
		{http.MethodGet, "/admin/kv/lookup", 405, "POST"},
		{http.MethodPost, "/admin/kv/stats", 405, "GET"},
	} {
		req, _ := http.NewRequest(c.method, base+c.path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.code || resp.Header.Get("Allow") != c.allow || c.code == 404 && resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d, Allow %q, %s", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), resp.Header.Get("Content-Type"))
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kvindex did not return after cancel")
	}
}

// TestKVIndexBadFlags checks that bad flag values fail fast with an error
// naming the problem (none of them gets as far as listening).
func TestKVIndexBadFlags(t *testing.T) {
	dir := t.TempDir()
	badYAML := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badYAML, []byte("engines:\n  - name: a:1\n    model: m\n    colour: red\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noModel := filepath.Join(dir, "nomodel.yaml")
	if err := os.WriteFile(noModel, []byte("engines:\n  - name: a:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eng := "name=127.0.0.1:8001,model=m"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "nothing to subscribe to"},
		{[]string{"--engine", eng, "--block-size", "0"}, "--block-size must be in [1, 4096] tokens, got 0"},
		{[]string{"--engine", eng, "--block-size", "x"}, "invalid value"},
		{[]string{"--engine", eng, "--log-level", "loud"}, "--log-level"},
		{[]string{"--engine", eng, "--approx-ttl", "soon"}, "invalid value"},
		{[]string{"--engine", "name=127.0.0.1:8001"}, "model is required"},
		{[]string{"--engine", "name=a:1,model=m,colour=red"}, `unknown key "colour"`},
		{[]string{"--engine", "a:1"}, "is not key=value"},
		{[]string{"--engines", filepath.Join(dir, "missing.yaml")}, "--engines"},
		{[]string{"--engines", badYAML}, "colour"},
		{[]string{"--engines", noModel}, "model is required"},
		{[]string{"--engine", eng, "--tokenizer", "estimate"}, "is not key=value"},
		{[]string{"--engine", eng, "--tokenizer", "source=estimate,colour=red"}, `unknown key "colour"`},
		{[]string{"--engine", eng, "--admin", "127.0.0.1:notaport"}, "--admin"},
		{[]string{"--engine", eng, "stray"}, "unexpected arguments"},
		{[]string{"--engine", eng, "--max-central-engines", "0"}, "--max-central-engines must be in"},
		{[]string{"--engine", eng, "--zmq-max-msg-bytes", "1073741825"}, "--zmq-max-msg-bytes must be in"},
		{[]string{"--engine", eng, "--replay-budget", "0s"}, "--replay-budget must be in"},
		{[]string{"--no-such-flag"}, "not defined"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var stdout, stderr syncbuf.Buffer
			err := runKVIndex(ctx, tc.args, &stdout, &stderr)
			if err == nil {
				t.Fatalf("no error; stdout %q", stdout.String())
			}
			if msg := fmt.Sprint(err); !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not mention %q", msg, tc.want)
			}
		})
	}
}

// TestKVIndexSendsTheEnginesKey: kvindex's source=engine tokenizer sends
// KVGATE_ENGINE_API_KEY as kvgate serve does (an engine with a key may
// refuse /tokenize without it), and refuses a key that cannot be sent.
func TestKVIndexSendsTheEnginesKey(t *testing.T) {
	var got atomic.Value
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Authorization"))
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": []int{1, 2, 3}, "count": 3})
	}))
	defer engine.Close()
	t.Setenv("KVGATE_ENGINE_API_KEY", "sk-idx")
	toks, _, err := tokenizerSet([]string{"model=m,source=engine,url=" + engine.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := toks.For("m").PromptAs(context.Background(), "hello", false); err != nil {
		t.Fatal(err)
	}
	if a, _ := got.Load().(string); a != "Bearer sk-idx" {
		t.Errorf("the engine got Authorization %q", a)
	}
	t.Setenv("KVGATE_ENGINE_API_KEY", "sk idx\n")
	if _, _, err := tokenizerSet(nil); err == nil || strings.Contains(err.Error(), "sk idx") {
		t.Errorf("a bad key: %v", err)
	}
}
