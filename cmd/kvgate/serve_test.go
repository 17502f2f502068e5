package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// lineWriter passes what the command writes to a channel, a line at a
// time (a line the channel has no room for is dropped).
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
	badSteps := filepath.Join(dir, "steps.yaml")
	os.WriteFile(badSteps, []byte("engine_step_tokens: 99999999999\nendpoints:\n  - {url: 'http://h:1', model: m}\n"), 0o644)
	badPred := filepath.Join(dir, "pred.yaml")
	os.WriteFile(badPred, []byte("predictor: psychic\nendpoints:\n  - {url: 'http://h:1', model: m}\n"), 0o644)
	classes := filepath.Join(dir, "classes.yaml")
	os.WriteFile(classes, []byte("classes: [{name: standard, priority: 1, ttft: 2}]\nendpoints:\n  - {url: 'http://h:1', model: m}\n"), 0o644)
	classesSLO := filepath.Join(dir, "classes-slo.yaml")
	os.WriteFile(classesSLO, []byte("slo_ttft: 1\nclasses: [{name: standard, priority: 1, ttft: 2}]\nendpoints:\n  - {url: 'http://h:1', model: m}\n"), 0o644)
	badHeader := filepath.Join(dir, "header.yaml")
	os.WriteFile(badHeader, []byte("class_header: bad header\nendpoints:\n  - {url: 'http://h:1', model: m}\n"), 0o644)
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
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
		{[]string{"--engine", "url=http://h:1,model=m", "--max-body-bytes", "10"}, "--max-body-bytes must be 0 (built-in) or in [1024, 1073741824] bytes"},
		{[]string{"--engine", "url=http://h:1,model=m", "--block-size", "5000"}, "--block-size must be in"},
		{[]string{"--engine", "url=http://h:1,model=m", "--listen", "256.0.0.1:1"}, "listen"},
		{[]string{"--config", bad}, "colour"},
		{[]string{"--engine", "url=http://h:1,model=m", "--predictor", "oracle"}, `predictor (--predictor): unknown predictor "oracle" (learned or analytic)`},
		{[]string{"--config", badPred}, `unknown predictor "psychic"`},
		{[]string{"--engine", "url=http://h:1,model=m", "--engine-step-tokens", "-1"}, "--engine-step-tokens must be"},
		{[]string{"--config", badSteps}, "engine_step_tokens (--engine-step-tokens) must be"},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, "no such file"},
		{[]string{"--config", dir}, "is not a regular file"},
		{[]string{"--config", fifo}, "is not a regular file"}, // opened first, a FIFO blocked for ever
		{[]string{"--engine", "url=http://h:1,model=m", "--listen", "nonsense"}, "listen (--listen): address nonsense: missing port"},
		// Targets beside classes were ignored in silence; header names
		// that cannot be sent were accepted (walkthrough of 2026-12-04).
		{[]string{"--config", classes, "--slo-ttft", "0.001"}, "give each class its own ttft"},
		{[]string{"--config", classesSLO}, "give each class its own ttft"},
		{[]string{"--config", badHeader}, `class_header: "bad header" is not a header name`},
		{[]string{"--engine", "url=http://h:1,model=m", "--fairness-header", "x:y"}, `fairness_header (--fairness-header): "x:y" is not a header name`},
	} {
		_, errOut, code := runCmd(t, append([]string{"serve"}, tt.args...)...)
		if code == 0 || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d, %q; want %q", tt.args, code, errOut, tt.want)
		}
	}
}

// startServe runs kvgate serve with args and returns its client and admin
// base URLs and a stop function.
func startServe(t *testing.T, args ...string) (string, string, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{lines: make(chan string, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		errOut := &lineWriter{lines: make(chan string, 256)}
		all := append([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, args...)
		if err := runServe(ctx, all, out, errOut); err != nil {
			t.Error(err)
		}
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
	stop := func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop")
		}
	}
	return "http://" + m[1], "http://" + m[2], stop
}

func upstream(t *testing.T) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, `{"choices":[{"text":"hi"}]}`)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

func servedBy(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Header.Get("X-Kvgate-Prefill-Endpoint")
}

// TestServeFileDiscovery: endpoints added to and removed from a watched
// file are routed to without a restart.
func TestServeFileDiscovery(t *testing.T) {
	a, b := upstream(t), upstream(t)
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	write := func(body string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil { // as editors and ConfigMaps do
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("endpoints:\n  - {name: a, url: %q, model: m}\n", a))
	url, _, stop := startServe(t, "--endpoints-file", path, "--no-health-checks")
	defer stop()
	eventually := func(want string) {
		deadline := time.Now().Add(10 * time.Second)
		for servedBy(t, url) != want {
			if time.Now().After(deadline) {
				t.Fatalf("never served by %s", want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	eventually("a")
	write(fmt.Sprintf("endpoints:\n  - {name: b, url: %q, model: m}\n", b))
	eventually("b")
	write("endpoints: [{name: oops") // bad: the running fleet stays
	time.Sleep(300 * time.Millisecond)
	if got := servedBy(t, url); got != "b" {
		t.Fatalf("after a bad file: served by %q", got)
	}
}

// TestServeReloadKeepsConfigOnError: SIGHUP with a bad config file keeps
// the running config; a good one applies.
func TestServeReloadKeepsConfigOnError(t *testing.T) {
	a, b := upstream(t), upstream(t)
	path := filepath.Join(t.TempDir(), "kvgate.yaml")
	cfg := func(name, url string) string {
		return fmt.Sprintf("endpoints:\n  - {name: %s, url: %q, model: m}\nno_health_checks: true\n", name, url)
	}
	os.WriteFile(path, []byte(cfg("a", a)), 0o644)
	url, admin, stop := startServe(t, "--config", path)
	defer stop()
	if got := servedBy(t, url); got != "a" {
		t.Fatalf("served by %q", got)
	}
	// A bad file, and files a start refuses that a reload once applied
	// (it logged "config reloaded", and the next start failed), each
	// with b's endpoint, which a reload applied would route to.
	for _, bad := range []string{
		"endpoints:\n  - {name: b, url: \"ftp://x\", model: m}\n",
		cfg("b", b) + "tokenizers: [\"source=nope\"]\n",
		cfg("b", b) + "health: {interval: -1s}\n",
		cfg("b", b) + "connect_timeout: 5\n", // listen: is the test's flag here (flags win)
		cfg("b", b) + "bind_events: \"foo://x\"\n",
		cfg("b", b) + "max_inflight: 1.9\n",
	} {
		os.WriteFile(path, []byte(bad), 0o644)
		syscall.Kill(os.Getpid(), syscall.SIGHUP)
		time.Sleep(300 * time.Millisecond)
		if got := servedBy(t, url); got != "a" {
			t.Fatalf("a bad reload changed the fleet (served by %q):\n%s", got, bad)
		}
	}
	if m := get(t, admin+"/metrics"); !strings.Contains(m, `kvgate_config_reloads_total{result="refused"} 6`) {
		t.Errorf("refused reloads not counted: %q", regexp.MustCompile(`(?m)^kvgate_config.*$`).FindAllString(m, -1))
	}
	os.WriteFile(path, []byte(cfg("b", b)), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for servedBy(t, url) != "b" {
		if time.Now().After(deadline) {
			t.Fatal("a good reload was not applied")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// GET /admin/config shows what runs now.
	if c := get(t, admin+"/admin/config"); !strings.Contains(c, "name: b") || strings.Contains(c, "name: a\n") || !strings.Contains(c, "# the configuration running") {
		t.Errorf("/admin/config after the reload:\n%s", c)
	}
}

// TestServePlannerDryRun: with planner: in the config the planner runs in
// the background, fed by the gateway's traffic, and shows in
// /admin/planner and /metrics.
func TestServePlannerDryRun(t *testing.T) {
	a, b := upstream(t), upstream(t)
	path := filepath.Join(t.TempDir(), "kvgate.yaml")
	cfg := fmt.Sprintf("endpoints:\n  - {name: a, url: %q, model: m, role: prefill}\n  - {name: b, url: %q, model: m, role: decode}\n"+
		"no_health_checks: true\nplanner: {actuator: dry-run, interval: 0.2}\n", a, b)
	os.WriteFile(path, []byte(cfg), 0o644)
	url, admin, stop := startServe(t, "--config", path)
	defer stop()
	servedBy(t, url) // traffic for the recorder (the prefill leg fails against this upstream: fine)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(admin + "/admin/planner")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Actuator  string           `json:"actuator"`
			Instances []map[string]any `json:"instances"`
			Actions   map[string]int   `json:"actions"`
		}
		json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if st.Actuator == "dry-run" && len(st.Instances) == 2 && len(st.Actions) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("planner status never showed a decision: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	m := get(t, admin+"/metrics")
	if !strings.Contains(m, "kvgate_planner") {
		t.Fatal("/metrics has no planner metrics")
	}
	// Prometheus' own linter (promtool check metrics' rules), over the
	// whole of serve's /metrics: the gateway's, health's, the index's
	// and the planner's.
	problems, err := promlint.New(strings.NewReader(m)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// plannerStatus reads /admin/planner.
type plannerStatus struct {
	Actuator  string           `json:"actuator"`
	Instances []map[string]any `json:"instances"`
	Actions   map[string]int   `json:"actions"`
	Last      *struct {
		Capacity struct{ Prefill, Decode float64 } `json:"capacity"`
	} `json:"last"`
}

func readPlanner(t *testing.T, admin string) plannerStatus {
	t.Helper()
	var st plannerStatus
	if err := json.Unmarshal([]byte(get(t, admin+"/admin/planner")), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestServePlannerSeesDiscovered: the planner plans the fleet the gateway
// routes to, its discovered endpoints included (it saw only the
// configured ones: "instances": null and "budget 0" for ever), with the
// prefill capacity the endpoints are configured with (it was 20 000
// whatever their prefill_speed).
func TestServePlannerSeesDiscovered(t *testing.T) {
	a, b, c := upstream(t), upstream(t), upstream(t)
	dir := t.TempDir()
	eps := filepath.Join(dir, "endpoints.yaml")
	os.WriteFile(eps, []byte(fmt.Sprintf("endpoints:\n  - {name: p, url: %q, model: m, role: prefill, prefill_speed: 6000}\n"+
		"  - {name: d1, url: %q, model: m, role: decode}\n  - {name: d2, url: %q, model: m, role: decode}\n", a, b, c)), 0o644)
	path := filepath.Join(dir, "kvgate.yaml")
	os.WriteFile(path, []byte(fmt.Sprintf("discovery: {file: %q}\nno_health_checks: true\nplanner: {actuator: dry-run, interval: 0.2}\n", eps)), 0o644)
	_, admin, stop := startServe(t, "--config", path)
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := readPlanner(t, admin)
		if len(st.Instances) == 3 && st.Last != nil {
			// One endpoint says 6 000 tokens/s, two nothing (the
			// gateway's --prefill-speed, 20 000): their mean.
			if want := (6000 + 2*20000) / 3.0; math.Abs(st.Last.Capacity.Prefill-want) > 1 {
				t.Fatalf("prefill capacity %v, want %v", st.Last.Capacity.Prefill, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the planner never saw the discovered fleet: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestServePlannerRefusesWhatTheFleetCannotHold: with a fleet that is
// only configured, a planner that cannot plan it is a start-up error (it
// started and held for ever, saying why only in /admin/planner).
func TestServePlannerRefusesWhatTheFleetCannotHold(t *testing.T) {
	a, b := upstream(t), upstream(t)
	for _, tc := range []struct{ roles, planner, want string }{
		{"prefill decode", "{total: 10}", "planner.total is 10"},
		{"prefill decode", "{min_prefill: 2}", "do not fit"},
		{"both both", "{}", "no prefill or decode endpoints"},
		{"prefill decode", "{grace: -1}", "planner.grace"},
		{"prefill decode", "{prefill_capacity: -5}", "planner.prefill_capacity"},
	} {
		r := strings.Fields(tc.roles)
		path := filepath.Join(t.TempDir(), "kvgate.yaml")
		os.WriteFile(path, []byte(fmt.Sprintf("endpoints:\n  - {name: a, url: %q, model: m, role: %s}\n  - {name: b, url: %q, model: m, role: %s}\n"+
			"no_health_checks: true\nplanner: %s\n", a, r[0], b, r[1], tc.planner)), 0o644)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := runServe(ctx, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, io.Discard, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: %v, want an error with %q", tc.roles, tc.planner, err, tc.want)
		}
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestK8sFlagsOverFileFields: --k8s-* flags override the config's
// discovery.kubernetes field by field (its other fields kept); flags that
// would make a section alone need --k8s-selector.
func TestK8sFlagsOverFileFields(t *testing.T) {
	flags := func(set ...string) *serveFlags {
		f := &serveFlags{set: map[string]bool{}}
		f.k8s = k8sConfig{Selector: "app=other", Namespace: "default", Port: 9000, Kubeconfig: "kc.yaml"}
		for _, s := range set {
			f.set[s] = true
		}
		return f
	}
	file := func() *discoveryConfig {
		return &discoveryConfig{Kubernetes: &k8sConfig{Namespace: "x", Selector: "app=vllm", Port: 8000, RoleLabel: "r", Scheme: "https", NameFromPod: true}}
	}
	d := file()
	if err := flags("k8s-selector", "kubeconfig").overK8s(d); err != nil {
		t.Fatal(err)
	}
	if want := (k8sConfig{Namespace: "x", Selector: "app=other", Port: 8000, RoleLabel: "r", Scheme: "https", NameFromPod: true, Kubeconfig: "kc.yaml"}); *d.Kubernetes != want {
		t.Fatalf("got %+v, want %+v", *d.Kubernetes, want)
	}
	d = &discoveryConfig{}
	if err := flags("k8s-selector", "k8s-port").overK8s(d); err != nil || *d.Kubernetes != (k8sConfig{Namespace: "default", Selector: "app=other", Port: 9000}) {
		t.Fatalf("from flags alone: %v %+v", err, d.Kubernetes)
	}
	if err := flags("k8s-port", "kubeconfig").overK8s(&discoveryConfig{}); err == nil || !strings.Contains(err.Error(), "--k8s-port, --kubeconfig: Kubernetes discovery needs --k8s-selector") {
		t.Fatalf("flags without a selector or a section: %v", err)
	}
	if d := file(); flags().overK8s(d) != nil || *d.Kubernetes != *file().Kubernetes {
		t.Fatal("no flag changed the file's section")
	}
}

// TestServeDrainsAtSignal: at the signal (the context's end) kvgate serve
// accepts no new connection, and a stream in flight runs to its end
// within --shutdown-grace (it was cut after 5 s, the gateway's loops
// stopped at once: walkthrough, 2026-12-05); past the grace it is cut.
func TestServeDrainsAtSignal(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 12 { // 6 s: longer than the 5 s the drain was
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"%d\"}]}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(500 * time.Millisecond)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(slow.Close)
	for _, c := range []struct {
		grace string
		whole bool
	}{{"30s", true}, {"200ms", false}} {
		t.Run(c.grace, func(t *testing.T) {
			url, _, stop := startServe(t, "--engine", "name=e,url="+slow.URL+",model=m", "--no-health-checks", "--shutdown-grace", c.grace)
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			first, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || !strings.HasPrefix(first, "data: ") {
				t.Fatalf("first line %q, %v", first, err)
			}
			stopped := make(chan struct{})
			go func() { stop(); close(stopped) }()
			time.Sleep(100 * time.Millisecond)
			if r, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`)); err == nil {
				r.Body.Close()
				t.Error("a new connection was accepted after the signal")
			}
			rest, _ := io.ReadAll(resp.Body)
			if got := strings.Contains(string(rest), "data: [DONE]"); got != c.whole {
				t.Errorf("stream ended whole %v, want %v: %q", got, c.whole, rest)
			}
			<-stopped
		})
	}
}

// TestServeSyncBindFailsBeforeReady: a --sync-bind address in use is an
// error before the ready line (it was printed first, and the gateway then
// exited: a script waiting for the line took it for started).
func TestServeSyncBindFailsBeforeReady(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	out, errOut, code := runCmd(t, "serve", "--engine", "url="+upstream(t)+",model=m", "--no-health-checks",
		"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--sync-bind", "tcp://"+ln.Addr().String())
	if code == 0 || strings.Contains(out, "OpenAI API on") || !strings.Contains(errOut, "sync.bind") {
		t.Errorf("exit %d, stdout %q, stderr %q: want an error about sync.bind and no ready line", code, out, errOut)
	}
}
