package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// syncBuffer is an io.Writer safe to read while the command writes.
type lineWriter struct{ lines chan string }

func (w *lineWriter) Write(p []byte) (int, error) {
	sc := bufio.NewScanner(strings.NewReader(string(p)))
	for sc.Scan() {
		select {
		case w.lines <- sc.Text():
		default:
		}
	}
	return len(p), nil
}

func TestServeRoutesAndStops(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, `{"choices":[{"text":"hi"}]}`)
	}))
	defer up.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "kvgate.yaml")
	cfg := fmt.Sprintf("endpoints:\n  - {name: up, url: %q, model: m}\nclasses:\n  - {name: standard, priority: 1, ttft: 2}\n", up.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{lines: make(chan string, 16)}
	done := make(chan int, 1)
	go func() {
		errOut := &lineWriter{lines: make(chan string, 64)}
		err := runServe(ctx, []string{"--config", cfgPath, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, out, errOut)
		if err != nil {
			t.Error(err)
		}
		done <- 0
	}()
	var line string
	select {
	case line = <-out.lines:
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not start")
	}
	m := regexp.MustCompile(`http://(\S+), admin on http://(\S+),`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("start line: %q", line)
	}
	resp, err := http.Post("http://"+m[1]+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Kvgate-Prefill-Endpoint") != "up" {
		t.Fatalf("%d %s %v", resp.StatusCode, b, resp.Header)
	}
	resp, err = http.Get("http://" + m[2] + "/admin/endpoints")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"name":"up"`) {
		t.Fatalf("admin: %s", b)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop when cancelled")
	}
}

func TestServeBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("endpoints:\n  - {name: a, model: m, colour: red}\n"), 0o644)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "no endpoints"},
		{[]string{"--engine", "name=a"}, "model is required"},
		{[]string{"--engine", "url=http://h:1,model=m", "--policy", "fastest"}, "unknown policy"},
		{[]string{"--engine", "url=http://h:1,model=m", "--slo-ttft", "NaN"}, "--slo-ttft must be"},
		{[]string{"--engine", "url=http://h:1,model=m", "--slo-ttft", "1e9"}, "--slo-ttft must be"},
		{[]string{"--engine", "url=http://h:1,model=m", "--block-size", "0"}, "--block-size must be in"},
		{[]string{"--engine", "url=http://h:1,model=m", "--max-body-bytes", "10"}, "max_body_bytes"},
		{[]string{"--engine", "url=http://h:1,model=m", "--block-size", "5000"}, "--block-size must be in"},
		{[]string{"--engine", "url=http://h:1,model=m", "--listen", "256.0.0.1:1"}, "listen"},
		{[]string{"--config", bad}, "colour"},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, "no such file"},
	} {
		_, errOut, code := runCmd(t, append([]string{"serve"}, tt.args...)...)
		if code == 0 || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d, %q; want %q", tt.args, code, errOut, tt.want)
		}
	}
}
