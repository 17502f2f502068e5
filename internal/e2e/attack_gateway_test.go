//go:build attack && linux

// The HTTP attacks of issue 14 replayed against the gateway (`kvgate
// serve`, built as cmd/kvgate/serve.go builds it: gateway.New, its Handler
// served by httpserve with the config's HTTP protection) in front of two
// in-process engine emulators, on 127.0.0.1:
//
//	go test -tags attack -run TestGatewayAttacks -v -timeout 15m ./internal/e2e/
//
// The gateway runs serve's defaults but a connection limit of 64 (so the
// storms exceed it) and short body and header timeouts (so the slow phases
// are short). After every phase: nothing crashed; the process's peak RSS
// during the phase and the growth of its heap across it stay under
// gatewayBounds; a normal completion through the gateway succeeds, its
// prompt reaches the gateway's index through the KV events (admin lookup),
// and every in-flight counter (gateway /admin/endpoints, the engines)
// returns to zero.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/gateway"
	"github.com/kvgate/kvgate/internal/health"
	"github.com/kvgate/kvgate/internal/httpserve"
)

// gatewayBounds are the stated memory bounds of every gateway phase (the
// whole process: gateway, two engines and the attackers; measured up to
// 33 MiB peak and 4 MiB of heap growth but for the huge bodies,
// docs/attacks.md).
var gatewayBounds = memBounds{PeakRSS: 256 << 20, HeapGrowth: 64 << 20}

// hugeBodiesRSS is the peak RSS bound of the huge-bodies phase, which
// runs serve's default 32 MiB body cap: four large bodies are read and
// parsed at once (--http-max-large-bodies), a 32 MiB prompt of token ids
// is about 104 MiB while parsed (the body, 16 Mi token ids of 4 bytes,
// 1 Mi block keys) and 40 MiB after (body and keys, until its answer), and
// the GC lets the heap grow to twice what is live between collections;
// the test's own 96 MiB of bodies come on top. Measured: 0.75-1.0 GiB.
const hugeBodiesRSS = 1280 << 20

// gatewayHTTP is the gateway's protection in this test: serve's defaults
// (32 MiB bodies) but 64 connections and 5 s / 2 s body and header
// timeouts.
var gatewayHTTP = httpserve.Config{MaxConns: 64, ReadTimeout: 5 * time.Second, ReadHeaderTimeout: 2 * time.Second, MaxBodyBytes: 32 << 20}

type gwTarget struct {
	engines []*engine.Engine
	gw      *gateway.Gateway
	good    []fleet.Endpoint
	addr    string // client API host:port
	admin   string // admin API base URL
	client  *http.Client
	prompts atomic.Int64
}

func TestGatewayAttacks(t *testing.T) {
	raiseFDLimit(t, 8192)
	gt := startGatewayTargets(t)
	gt.check(t, "before the attacks")
	runAttackPhases(t, []attackPhase{
		{name: "slow bodies and headers", run: gt.attackSlow},
		{name: "idle storm", run: gt.attackIdleStorm},
		{name: "huge bodies", run: gt.attackHugeBodies, peakRSS: hugeBodiesRSS},
		{name: "huge numbers and prompts", run: gt.attackHugeNumbers},
		{name: "client kv_transfer_params", run: gt.attackKVTransferParams},
		{name: "client disconnects", run: gt.attackDisconnects},
		{name: "failing engines", run: gt.attackFailingEngines},
	}, gatewayBounds, gt.check)
}

func startGatewayTargets(t *testing.T) *gwTarget {
	gt := &gwTarget{client: &http.Client{Timeout: attackHang, Transport: &http.Transport{DisableKeepAlives: true}}}
	for range 2 {
		e := startEventsEngine(t)
		gt.engines = append(gt.engines, e)
		gt.good = append(gt.good, fleet.Endpoint{Name: e.Addr(), URL: e.URL(), Model: model, Role: fleet.RoleBoth,
			Events: e.KVEventsEndpoint(), Replay: e.KVEventsReplayEndpoint(), PrefillSpeed: 20000 * 100})
	}
	// As cmd/kvgate/serve.go: defaults filled, the same HTTP config for
	// the server and the gateway's body limiter, a health prober with its
	// defaults.
	cfg := gateway.Config{Endpoints: gt.good, HTTP: gatewayHTTP}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	prober, err := health.New(health.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prober.Close() })
	g, err := gateway.New(cfg, gateway.Options{Logger: quiet(), Health: prober})
	if err != nil {
		t.Fatal(err)
	}
	gt.gw = g
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Run(t.Context()) }()
	t.Cleanup(func() { <-done })
	gt.addr = serveHTTP(t, cfg.HTTP, g.Handler())
	gt.admin = serveHTTP(t, httpserve.Config{}, g.AdminHandler())
	gt.admin = "http://" + gt.admin
	gt.primeEvents(t)
	return gt
}

// primeEvents sends completions straight to each engine until the
// gateway's subscriber has applied a batch from it: its subscription has
// reached the engine (ZMQ's slow joiner), so no later event is missed.
func (gt *gwTarget) primeEvents(t *testing.T) {
	for _, e := range gt.engines {
		waitUntil(t, "the gateway subscribed to "+e.Addr(), func() bool {
			if code, _, body, err := gt.post(e.URL()+"/v1/completions", completionBody(gt.prompt(), 1, false, "")); err != nil || code != 200 {
				t.Fatalf("priming %s: %d %v %.200s", e.Addr(), code, err, body)
			}
			time.Sleep(50 * time.Millisecond)
			resp, err := gt.client.Get(gt.admin + "/admin/kv/stats")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out struct {
				Endpoints []struct {
					Endpoint string `json:"endpoint"`
					Events   struct {
						LastSeq *uint64 `json:"last_seq"`
					} `json:"events"`
				} `json:"endpoints"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
			for _, s := range out.Endpoints {
				if s.Endpoint == e.Addr() && s.Events.LastSeq != nil {
					return true
				}
			}
			return false
		})
	}
}

func (gt *gwTarget) url(path string) string { return "http://" + gt.addr + path }

func (gt *gwTarget) post(url, body string) (int, http.Header, string, error) {
	resp, err := gt.client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, string(b), err
}

// endpoints is the gateway's /admin/endpoints.
func (gt *gwTarget) endpoints(t *testing.T) []gateway.EndpointState {
	t.Helper()
	resp, err := gt.client.Get(gt.admin + "/admin/endpoints")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Endpoints []gateway.EndpointState `json:"endpoints"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Endpoints
}

// metric reads an unlabelled counter from the gateway's /metrics.
func (gt *gwTarget) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := gt.client.Get(gt.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

func (gt *gwTarget) prompt() string {
	n := gt.prompts.Add(1)
	var b strings.Builder
	for i := range 64 {
		fmt.Fprintf(&b, "g%dw%d ", n, i)
	}
	return b.String()
}

func completionBody(prompt string, maxTokens int, stream bool, extra string) string {
	p, _ := json.Marshal(prompt)
	return fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":%d,"stream":%v%s}`, model, p, maxTokens, stream, extra)
}

// check: a normal completion through the gateway succeeds; the engine
// that served it has its prompt in the gateway's index (KV events, admin
// lookup); every in-flight counter is back to zero.
func (gt *gwTarget) check(t *testing.T, when string) {
	t.Helper()
	prompt := gt.prompt()
	code, hdr, body, err := gt.post(gt.url("/v1/completions"), completionBody(prompt, 4, false, ""))
	if err != nil || code != 200 || !strings.Contains(body, `"choices"`) {
		t.Fatalf("%s: normal completion through the gateway: %d %v %.300s", when, code, err, body)
	}
	served := hdr.Get("X-Kvgate-Prefill-Endpoint")
	var e *engine.Engine
	for _, x := range gt.engines {
		if x.Addr() == served {
			e = x
		}
	}
	if e == nil {
		t.Fatalf("%s: served by %q, not one of the engines", when, served)
	}
	code, _, body, err = gt.post(e.URL()+"/tokenize", fmt.Sprintf(`{"model":%q,"prompt":%q}`, model, prompt))
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err != nil || code != 200 || json.Unmarshal([]byte(body), &tok) != nil {
		t.Fatalf("tokenize: %d %v %.200s", code, err, body)
	}
	ids, _ := json.Marshal(tok.Tokens)
	waitUntil(t, when+": the completion's prompt in the gateway's index", func() bool {
		code, _, body, err := gt.post(gt.admin+"/admin/kv/lookup", fmt.Sprintf(`{"model":%q,"token_ids":%s}`, model, ids))
		var out struct {
			BlockSize int `json:"block_size"`
			Endpoints []struct {
				Endpoint string `json:"endpoint"`
				Matched  int    `json:"matched_tokens"`
			} `json:"endpoints"`
		}
		if err != nil || code != 200 || json.Unmarshal([]byte(body), &out) != nil {
			t.Fatalf("%s: gateway admin lookup: %d %v %.200s", when, code, err, body)
		}
		for _, m := range out.Endpoints {
			if m.Endpoint == served && out.BlockSize > 0 && m.Matched >= len(tok.Tokens)/out.BlockSize*out.BlockSize {
				return true
			}
		}
		return false
	})
	gt.idle(t, when)
}

// idle waits until the gateway's /admin/endpoints and the engines show
// nothing in flight.
func (gt *gwTarget) idle(t *testing.T, when string) {
	t.Helper()
	var last string
	ok := func() bool {
		for _, e := range gt.engines {
			if n := e.InFlight(); n != 0 {
				last = fmt.Sprintf("engine %s: %d in flight", e.Addr(), n)
				return false
			}
		}
		resp, err := gt.client.Get(gt.admin + "/admin/endpoints")
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		var out struct {
			Endpoints []struct {
				Name string `json:"name"`
				Load struct {
					Requests int `json:"inflight_requests"`
					Uncached int `json:"inflight_uncached_tokens"`
					Streams  int `json:"decode_streams"`
				} `json:"load"`
			} `json:"endpoints"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			last = err.Error()
			return false
		}
		for _, s := range out.Endpoints {
			if s.Load.Requests != 0 || s.Load.Uncached != 0 || s.Load.Streams != 0 {
				last = fmt.Sprintf("gateway /admin/endpoints: %+v", s)
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(attackHang)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: in-flight counters not back to zero: %s", when, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// attackSlow: 100 connections (more than the gateway's 64) announce a
// 1 MiB body, send 10 bytes and stall; 50 more send half their headers and
// stall. Every one must be cut (the ones past the limit once they get a
// slot).
func (gt *gwTarget) attackSlow(t *testing.T) {
	held := slowClients(t, gt.addr, 150, func(c net.Conn, i int) {
		if i < 100 {
			fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":", 1<<20)
		} else {
			fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-")
		}
	})
	if held > 0 {
		t.Errorf("%d slow connections still held after %v", held, attackHang)
	}
}

// attackIdleStorm: 300 clients (more than the gateway's 64 connections)
// each make a request with keep-alive and hold the connection idle. Every
// one is answered (idle ones are shed to make room), descriptors stay
// bounded, and a normal completion gets through while the storm holds.
func (gt *gwTarget) attackIdleStorm(t *testing.T) {
	const n = 300
	failed, growth := idleStorm(t, gt.addr, "/v1/models", n)
	// n client sockets, at most MaxConns server ones, a few for the runtime.
	if limit := n + gatewayHTTP.MaxConns + 16; growth > limit {
		t.Errorf("descriptors grew by %d during the storm, want at most %d", growth, limit)
	}
	t.Logf("idle storm: %d clients answered (%d failed), descriptors grew by at most %d", n-failed, failed, growth)
	gt.check(t, "during the idle storm")
}

// attackHugeBodies: eight concurrent 64 MiB bodies with a Content-Length
// and four sent chunked must get 413 (or be cut while sending); eight
// prompts of 16 Mi token ids, just under the 32 MiB cap, come from clients
// that wait for 100 Continue and must get an answer (4xx: no engine takes
// such a prompt; 503: no large-body slot in time), never hang.
func (gt *gwTarget) attackHugeBodies(t *testing.T) {
	huge := bytes.Repeat([]byte("a "), 32<<20)
	copy(huge, `{"model":"`+model+`","prompt":"`)
	huge[len(huge)-2], huge[len(huge)-1] = '"', '}'
	var ids bytes.Buffer
	ids.WriteString(`{"model":"` + model + `","max_tokens":1,"prompt":[`)
	for ids.Len() < int(gatewayHTTP.MaxBodyBytes)-64 {
		ids.WriteString("7,")
	}
	ids.WriteString("7]}")
	polite := &http.Client{Timeout: 2 * attackHang, Transport: &http.Transport{ExpectContinueTimeout: attackHang, DisableKeepAlives: true}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string][]int{}
	record := func(kind string, code int) {
		mu.Lock()
		codes[kind] = append(codes[kind], code)
		mu.Unlock()
	}
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var req *http.Request
			kind := "64 MiB"
			switch {
			case i < 8:
				req, _ = http.NewRequest(http.MethodPost, gt.url("/v1/completions"), bytes.NewReader(huge))
			case i < 12:
				kind = "64 MiB chunked"
				req, _ = http.NewRequest(http.MethodPost, gt.url("/v1/completions"), io.MultiReader(bytes.NewReader(huge)))
			default:
				kind = "16 Mi token ids"
				req, _ = http.NewRequest(http.MethodPost, gt.url("/v1/completions"), bytes.NewReader(ids.Bytes()))
				req.Header.Set("Expect", "100-continue")
			}
			req.Header.Set("Content-Type", "application/json")
			c := gt.client
			if kind == "16 Mi token ids" {
				c = polite
			}
			resp, err := c.Do(req)
			if err != nil {
				if kind == "16 Mi token ids" {
					t.Errorf("%s: %v", kind, err)
				} else {
					record(kind, 0) // cut while still sending: fine
				}
				return
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			record(kind, resp.StatusCode)
			ok := resp.StatusCode == 413
			if kind == "16 Mi token ids" {
				ok = resp.StatusCode >= 400 && resp.StatusCode < 500 || resp.StatusCode == 503
			}
			if !ok {
				t.Errorf("%s: %d %.300s", kind, resp.StatusCode, b)
			}
		}()
	}
	wg.Wait()
	t.Logf("huge bodies: status codes %v (0: cut while sending)", codes)
}

// attackHugeNumbers: numbers and prompts no engine can serve, each sent
// ten times: max_tokens, min_tokens, max_completion_tokens and n of
// 2^63-1, 1e300 or negative; prompts of 100 000 token ids, of token ids
// out of range, and of 10 000 token lists. Every answer is a 4xx, never a
// 5xx nor a hang, and nothing stays in flight.
func (gt *gwTarget) attackHugeNumbers(t *testing.T) {
	const big = "9223372036854775807"
	many := strings.Repeat("7,", 100000)
	lists := strings.Repeat("[1,2,3,4,5,6,7,8],", 10000)
	cases := []struct{ path, body string }{
		{"/v1/completions", `{"model":"` + model + `","prompt":"x","max_tokens":` + big + `}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":"x","max_tokens":` + big + `,"stream":true}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":"x","min_tokens":` + big + `}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":"x","max_tokens":1e300}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":"x","max_tokens":-9223372036854775808}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":"x","max_tokens":4,"n":` + big + `}`},
		{"/v1/chat/completions", `{"model":"` + model + `","messages":[{"role":"user","content":"x"}],"max_completion_tokens":` + big + `}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":[` + many + `7],"max_tokens":` + big + `}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":[` + many + `7],"max_tokens":4}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":[4294967296,1],"max_tokens":4}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":[-1,1],"max_tokens":4}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":[` + big + `],"max_tokens":4}`},
		{"/v1/completions", `{"model":"` + model + `","prompt":[` + lists + `[1]],"max_tokens":` + big + `}`},
	}
	for _, c := range cases {
		for range 10 {
			code, _, body, err := gt.post(gt.url(c.path), c.body)
			if err != nil || code < 400 || code >= 500 {
				t.Fatalf("%.120s: %d %v %.300s", c.body, code, err, body)
			}
		}
	}
	gt.idle(t, "after huge numbers")
}

// kvSink is a listener the test controls that a client names as
// remote_host:remote_port; it records the request_id of every release
// notification that reaches it.
type kvSink struct {
	ln   net.Listener
	mu   sync.Mutex
	seen []string
	srv  *http.Server
}

func newKVSink(t *testing.T) *kvSink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &kvSink{ln: ln}
	s.srv = &http.Server{ReadHeaderTimeout: attackHang, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			RequestID string `json:"request_id"`
		}
		_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body)
		s.mu.Lock()
		s.seen = append(s.seen, r.URL.Path+" "+body.RequestID)
		s.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})}
	s.srv.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.mu.Lock()
			s.seen = append(s.seen, "connection")
			s.mu.Unlock()
		}
	}
	go s.srv.Serve(ln)
	t.Cleanup(func() { s.srv.Close() })
	return s
}

func (s *kvSink) contacts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// attackKVTransferParams: clients send kv_transfer_params naming a
// listener the test controls, as a decode leg would (do_remote_prefill)
// and as a prefill leg would (do_remote_decode), streamed or not, to
// completions and chat, aggregated and with the gateway running the two
// P/D legs itself. The listener must never be contacted. The same body
// sent straight to an engine does make it contact the listener (the
// control, sent last: once it has arrived, any notification the gateway's
// requests caused would have arrived before it).
func (gt *gwTarget) attackKVTransferParams(t *testing.T) {
	sink := newKVSink(t)
	host, port, _ := net.SplitHostPort(sink.ln.Addr().String())
	params := func(id string, prefill bool) string {
		return fmt.Sprintf(`,"kv_transfer_params":{"do_remote_prefill":%v,"do_remote_decode":%v,"remote_engine_id":%q,"remote_block_ids":[0,1,2],"remote_host":%q,"remote_port":%s,"remote_request_id":%q,"tp_size":1}`,
			prefill, !prefill, gt.engines[0].Config().EngineID, host, port, id)
	}
	send := func(mode string) {
		for i := range 8 {
			id := fmt.Sprintf("gateway-%s-%d", mode, i)
			extra := params(id, i%2 == 0)
			body := completionBody(gt.prompt(), 4, i%4 < 2, extra)
			path := "/v1/completions"
			if i%3 == 2 {
				path = "/v1/chat/completions"
				body = fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":4,"stream":%v%s}`, model, gt.prompt(), i%4 < 2, extra)
			}
			code, _, out, err := gt.post(gt.url(path), body)
			if err != nil || code != 200 {
				t.Errorf("%s: %d %v %.300s", mode, code, err, out)
			}
		}
	}
	send("aggregated")
	pd := append([]fleet.Endpoint(nil), gt.good...)
	pd[0].Role, pd[1].Role = fleet.RolePrefill, fleet.RoleDecode
	if err := gt.gw.SetEndpoints(pd); err != nil {
		t.Fatal(err)
	}
	send("pd")
	if err := gt.gw.SetEndpoints(gt.good); err != nil {
		t.Fatal(err)
	}
	gt.idle(t, "after the kv_transfer_params requests")
	// The control: straight to the engine.
	code, _, out, err := gt.post(gt.engines[1].URL()+"/v1/completions", completionBody(gt.prompt(), 4, false, params("control", true)))
	if err != nil || code != 200 {
		t.Fatalf("control request straight to the engine: %d %v %.300s", code, err, out)
	}
	waitUntil(t, "the control's release notification at the listener", func() bool {
		for _, c := range sink.contacts() {
			if strings.HasSuffix(c, " control") {
				return true
			}
		}
		return false
	})
	for _, c := range sink.contacts() {
		if c != "connection" && !strings.HasSuffix(c, " control") {
			t.Errorf("client kv_transfer_params reached an engine through the gateway: the listener got %q", c)
		}
	}
	t.Logf("listener contacts: %q (only the control's)", sink.contacts())
}

// attackDisconnects: 40 streams of 16 000 tokens whose clients go away
// after the first chunk, and 20 non-streamed requests whose clients give
// up after 50 ms. Every in-flight counter must return to zero.
func (gt *gwTarget) attackDisconnects(t *testing.T) {
	var wg sync.WaitGroup
	var chunks atomic.Int64
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := i < 40
			ctx, cancel := context.WithTimeout(context.Background(), attackHang)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gt.url("/v1/completions"),
				strings.NewReader(completionBody(gt.prompt(), 16000, stream, "")))
			req.Header.Set("Content-Type", "application/json")
			if !stream {
				time.AfterFunc(50*time.Millisecond, cancel)
			}
			resp, err := gt.client.Do(req)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					t.Errorf("request %d: %v", i, err)
				}
				return
			}
			defer resp.Body.Close()
			if stream {
				buf := make([]byte, 512)
				if n, err := resp.Body.Read(buf); n > 0 && resp.StatusCode == 200 {
					chunks.Add(1)
				} else {
					t.Errorf("stream %d: %d %v", i, resp.StatusCode, err)
				}
				cancel() // and go away mid-stream
			}
		}()
	}
	wg.Wait()
	t.Logf("%d streams cut after their first chunk", chunks.Load())
	gt.idle(t, "after the disconnects")
}

// attackFailingEngines: the fleet gets an engine that answers 500 to
// everything and one whose port refuses connections, beside the two good
// ones; 80 streamed requests from 8 clients must each end with 200 or a
// clean 502/503 error, or the failing engine's own 500 when there was
// nowhere left to retry (passed through since 2026-12-04; the gateway
// retries once elsewhere); then the
// health prober takes both out and 40 requests all succeed. Then an engine that accepts and never
// answers: clients that give up after 2 s (or get a 5xx once the health
// prober has taken it out) leave nothing in flight. Then
// the good fleet again.
func (gt *gwTarget) attackFailingEngines(t *testing.T) {
	var fivexxHits atomic.Int64
	fivexx := &http.Server{ReadHeaderTimeout: attackHang, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fivexxHits.Add(1)
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		http.Error(w, `{"error":{"message":"engine on fire"}}`, http.StatusInternalServerError)
	})}
	fln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go fivexx.Serve(fln)
	defer fivexx.Close()
	rln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := rln.Addr().String()
	rln.Close()
	bad := append(append([]fleet.Endpoint(nil), gt.good...),
		fleet.Endpoint{Name: fln.Addr().String(), URL: "http://" + fln.Addr().String(), Model: model, Role: fleet.RoleBoth, PrefillSpeed: gt.good[0].PrefillSpeed},
		fleet.Endpoint{Name: refused, URL: "http://" + refused, Model: model, Role: fleet.RoleBoth, PrefillSpeed: gt.good[0].PrefillSpeed})
	if err := gt.gw.SetEndpoints(bad); err != nil {
		t.Fatal(err)
	}
	// Concurrent clients, so that in-flight load on the good engines
	// makes the (idle-looking) bad ones the policy's choice.
	retries0 := gt.metric(t, "kvgate_retries_total")
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				code, _, body, err := gt.post(gt.url("/v1/completions"), completionBody(gt.prompt(), 64, true, ""))
				if err != nil || code != 200 && code != 500 && code != 502 && code != 503 {
					t.Errorf("with failing engines: %d %v %.300s", code, err, body)
					return
				}
				if code != 200 && !strings.Contains(body, `"error"`) {
					t.Errorf("an error without an error body: %d %.300s", code, body)
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	retries := gt.metric(t, "kvgate_retries_total") - retries0
	t.Logf("with a 5xx engine and a refusing one: status codes %v; the 5xx engine was asked %d times; %v retries elsewhere",
		codes, fivexxHits.Load(), retries)
	if fivexxHits.Load() == 0 || retries == 0 {
		t.Errorf("the failing engines were never tried (5xx asked %d times, %v retries): the phase tested nothing", fivexxHits.Load(), retries)
	}
	// The health prober takes both out (probes and passive ejection);
	// then every request succeeds.
	waitUntil(t, "the failing engines taken out of the fleet", func() bool {
		out := 0
		for _, e := range gt.endpoints(t) {
			if (e.Name == fln.Addr().String() || e.Name == refused) && !e.Eligible {
				out++
			}
		}
		return out == 2
	})
	for range 40 {
		if code, _, body, err := gt.post(gt.url("/v1/completions"), completionBody(gt.prompt(), 4, false, "")); err != nil || code != 200 {
			t.Fatalf("with the failing engines out: %d %v %.300s", code, err, body)
		}
	}
	gt.idle(t, "with failing engines")

	// An engine that accepts and never answers.
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var holes sync.WaitGroup
	defer holes.Wait()
	defer hln.Close()
	holes.Add(1)
	go func() {
		defer holes.Done()
		for {
			c, err := hln.Accept()
			if err != nil {
				return
			}
			holes.Add(1)
			go func() {
				defer holes.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(2 * attackHang))
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	hole := fleet.Endpoint{Name: hln.Addr().String(), URL: "http://" + hln.Addr().String(), Model: model, Role: fleet.RoleBoth, PrefillSpeed: gt.good[0].PrefillSpeed}
	if err := gt.gw.SetEndpoints([]fleet.Endpoint{hole}); err != nil {
		t.Fatal(err)
	}
	impatient := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := impatient.Post(gt.url("/v1/completions"), "application/json", strings.NewReader(completionBody(gt.prompt(), 4, true, "")))
			if err == nil {
				// Once the prober has taken it out: 503 at once.
				resp.Body.Close()
				if resp.StatusCode < 500 {
					t.Errorf("an engine that never answers: got %d", resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	gt.idle(t, "after clients gave up on an engine that never answers")
	if err := gt.gw.SetEndpoints(gt.good); err != nil {
		t.Fatal(err)
	}
}
