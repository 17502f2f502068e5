//go:build attack && linux

// The HTTP attacks of issue 14 replayed against an in-process engine
// emulator and kvindex admin API on 127.0.0.1:
//
//	go test -tags attack -run TestHTTPAttacks -v -timeout 10m ./internal/e2e/
//
// The process runs with RLIMIT_NOFILE lowered to 1024 (clients and servers
// share it, as on a default Linux machine). Each phase checks that the
// servers survive and that a normal request still succeeds; at the end the
// process's peak resident memory (VmHWM) must stay under attackRSSBound.
package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/enginetest"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/kvindex"
)

// attackRSSBound is the stated bound on the peak resident memory of the
// whole test process (attackers included) through every phase. Before the
// fixes, four 60 MB /tokenize requests peaked at 2.9 GB and eight 60 MB
// lookups at 4.6 GB.
const attackRSSBound = 768 << 20

// attackHang guards every wait; nothing here asserts on speed.
const attackHang = 60 * time.Second

// attackHTTP is both servers' protection: defaults but a 256-connection
// limit (so that clients and servers fit in 1024 descriptors) and 10 s
// body and 2 s header timeouts (so that the slow-body phase is short).
var attackHTTP = httpserve.Config{MaxConns: 256, ReadTimeout: 10 * time.Second, ReadHeaderTimeout: 2 * time.Second}

type attackTarget struct {
	engine  *engine.Engine
	kvAddr  string
	kvIndex *kvindex.Index
	client  *http.Client
}

func TestHTTPAttacks(t *testing.T) {
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = min(old.Cur, 1024)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })

	at := startAttackTargets(t)
	at.normal(t, "before the attacks")
	phases := []struct {
		name string
		run  func(*testing.T, *attackTarget)
	}{
		{"slow bodies", attackSlowBodies},
		{"idle storm", attackIdleStorm},
		{"huge bodies", attackHugeBodies},
		{"max_tokens overflow", attackMaxTokens},
		{"routed registrations", attackRegistrations},
	}
	for _, p := range phases {
		t.Run(p.name, func(t *testing.T) {
			p.run(t, at)
			at.normal(t, "after "+p.name)
		})
	}
	hwm := procStatus(t, "VmHWM")
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("peak RSS %d MiB (bound %d MiB); heap in use after GC %d MiB; %d descriptors open",
		hwm>>20, attackRSSBound>>20, ms.HeapInuse>>20, openFDs(t))
	if hwm > attackRSSBound {
		t.Errorf("peak RSS %d MiB above the bound of %d MiB", hwm>>20, attackRSSBound>>20)
	}
}

func startAttackTargets(t *testing.T) *attackTarget {
	e := enginetest.Start(t, 100, func(c *engine.Config) { c.Model, c.HTTP = model, attackHTTP })

	idx := kvindex.New(kvindex.Config{BlockSize: 16})
	if _, err := idx.AddEndpoint(e.Addr(), model); err != nil {
		t.Fatal(err)
	}
	adm := &kvindex.Admin{Index: idx, Bodies: attackHTTP.BodyLimiter(kvindex.DefaultMaxBodyBytes)}
	return &attackTarget{engine: e, kvAddr: serveHTTP(t, attackHTTP, adm.Handler()), kvIndex: idx,
		client: &http.Client{Timeout: attackHang, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
}

// normal requires a completion from the engine and a lookup from kvindex.
func (at *attackTarget) normal(t *testing.T, when string) {
	t.Helper()
	for _, r := range []struct{ url, body string }{
		{at.engine.URL() + "/v1/completions", `{"model":"` + model + `","prompt":"a normal request","max_tokens":4}`},
		{"http://" + at.kvAddr + "/admin/kv/lookup", `{"model":"` + model + `","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`},
	} {
		code, body, err := at.post(r.url, strings.NewReader(r.body))
		if err != nil || code != 200 {
			t.Fatalf("normal request %s: %d %v %s", when, code, err, body)
		}
	}
}

func (at *attackTarget) post(url string, body io.Reader) (int, string, error) {
	resp, err := at.client.Post(url, "application/json", body)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), nil
}

// attackSlowBodies: 150 connections per server announce a 1 MiB body,
// send 10 bytes and stall. Every one must be cut. (More would make the
// attackers' own descriptors and the servers' exceed 1024 together.)
func attackSlowBodies(t *testing.T, at *attackTarget) {
	const n = 150
	var held atomic.Int64
	var wg sync.WaitGroup
	for _, tg := range []struct{ addr, path string }{{at.engine.Addr(), "/v1/completions"}, {at.kvAddr, "/admin/kv/lookup"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			held.Add(int64(slowClients(t, tg.addr, n, func(c net.Conn, _ int) {
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"prompt\":", tg.path, 1<<20)
			})))
		}()
	}
	wg.Wait()
	if held := held.Load(); held > 0 {
		t.Errorf("%d slow connections still held after %v", held, attackHang)
	}
}

// attackIdleStorm: 600 clients each make a request with keep-alive and
// then hold their connection idle. The engine keeps at most 256 open (so
// the process stays within 1024 descriptors), every client is answered,
// and a normal request gets through while the storm holds.
func attackIdleStorm(t *testing.T, at *attackTarget) {
	const n = 600
	failed, peak := idleStorm(t, at.engine.Addr(), "/health", n)
	// n client sockets plus at most attackHTTP.MaxConns server ones (and a
	// few for the runtime).
	if limit := n + attackHTTP.MaxConns + 16; peak > limit {
		t.Errorf("descriptors grew by %d during the storm, want at most %d", peak, limit)
	}
	t.Logf("idle storm: %d clients answered, descriptors grew by at most %d", n-failed, peak)
	at.normal(t, "during the idle storm")
}

// attackHugeBodies: eight concurrent 60 MB /tokenize requests and eight
// 60 MB lookups (413 at once), and eight lookups just under kvindex's
// 16 MiB cap (processed four at a time).
func attackHugeBodies(t *testing.T, at *attackTarget) {
	huge := bytes.Repeat([]byte("a "), 30<<20)
	copy(huge, `{"prompt":"`)
	huge[len(huge)-2], huge[len(huge)-1] = '"', '}'
	var ids bytes.Buffer
	ids.WriteString(`{"model":"` + model + `","token_ids":[`)
	for ids.Len() < kvindex.DefaultMaxBodyBytes-64 {
		ids.WriteString("7,")
	}
	ids.WriteString(`7]}`)
	type shot struct {
		url  string
		body []byte
		want []int
	}
	var shots []shot
	for i := 0; i < 8; i++ {
		shots = append(shots,
			shot{at.engine.URL() + "/tokenize", huge, []int{413}},
			shot{"http://" + at.kvAddr + "/admin/kv/lookup", huge, []int{413}},
			shot{"http://" + at.kvAddr + "/admin/kv/lookup", ids.Bytes(), []int{200, 503}})
	}
	// The lookups under the cap come from a well-behaved client that waits
	// for 100 Continue, so a 503 (no slot in time) reaches it before it
	// sends 16 MiB; the attackers just send.
	polite := &http.Client{Timeout: attackHang, Transport: &http.Transport{ExpectContinueTimeout: attackHang}}
	var wg sync.WaitGroup
	codes := make([]int, len(shots))
	for i, s := range shots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var code int
			var body string
			var err error
			if s.want[0] == 413 {
				code, body, err = at.post(s.url, bytes.NewReader(s.body))
			} else {
				code, body, err = postExpect(polite, s.url, s.body)
			}
			if err != nil && s.want[0] == 413 {
				return // cut while still sending 60 MB: fine
			}
			codes[i] = code
			ok := false
			for _, w := range s.want {
				ok = ok || code == w
			}
			if !ok {
				t.Errorf("%s with %d bytes: %d %v %.200s", s.url, len(s.body), code, err, body)
			}
		}()
	}
	wg.Wait()
	t.Logf("huge bodies: status codes %v", codes)
}

// attackMaxTokens: max_tokens 2^63-1 in every form must be refused and
// must not wedge the engine.
func attackMaxTokens(t *testing.T, at *attackTarget) {
	for _, body := range []string{
		`{"prompt":"x","max_tokens":9223372036854775807}`,
		`{"prompt":"x","max_tokens":9223372036854775807,"stream":true}`,
		`{"prompt":"x","min_tokens":9223372036854775807}`,
		`{"prompt":"x","max_tokens":1e300}`,
		`{"prompt":"x","max_tokens":-9223372036854775808}`,
	} {
		for i := 0; i < 10; i++ {
			code, out, err := at.post(at.engine.URL()+"/v1/completions", strings.NewReader(body))
			if err != nil || code != 400 {
				t.Fatalf("%s: %d %v %s", body, code, err, out)
			}
		}
	}
	chat := `{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":9223372036854775807}`
	if code, out, err := at.post(at.engine.URL()+"/v1/chat/completions", strings.NewReader(chat)); err != nil || code != 400 {
		t.Fatalf("chat: %d %v %s", code, err, out)
	}
}

// attackRegistrations: /admin/kv/routed with 3 000 model names registers
// at most DefaultMaxRoutedEndpoints endpoints and refuses the rest.
func attackRegistrations(t *testing.T, at *attackTarget) {
	refused := 0
	for i := 0; i < 3000; i++ {
		body := fmt.Sprintf(`{"model":"model-%d","endpoint":"10.0.%d.%d:8000","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}`, i, i>>8, i&255)
		code, out, err := at.post("http://"+at.kvAddr+"/admin/kv/routed", strings.NewReader(body))
		switch {
		case err != nil:
			t.Fatal(err)
		case code == 403:
			refused++
		case code != 200:
			t.Fatalf("routed %d: %d %s", i, code, out)
		}
	}
	if n := at.kvIndex.NumEndpoints(); n > kvindex.DefaultMaxRoutedEndpoints {
		t.Errorf("%d endpoints registered, limit %d", n, kvindex.DefaultMaxRoutedEndpoints)
	}
	t.Logf("registrations: %d refused, %d endpoints registered", refused, at.kvIndex.NumEndpoints())
}

func postExpect(c *http.Client, url string, body []byte) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// procStatus reads a "kB" field of /proc/self/status, in bytes.
func procStatus(t *testing.T, field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
