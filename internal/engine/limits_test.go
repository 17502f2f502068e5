package engine

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/openai"
)

// hangGuard bounds waits that would otherwise hang a broken test; nothing
// asserts on speed.
const hangGuard = 30 * time.Second

func postRaw(t *testing.T, url, body string, chunked bool) (int, openai.ErrorBody, http.Header) {
	t.Helper()
	var rd io.Reader = strings.NewReader(body)
	if chunked {
		rd = struct{ io.Reader }{rd} // no length: sent chunked
	}
	client := &http.Client{Timeout: hangGuard}
	resp, err := client.Post(url, "application/json", rd)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb openai.ErrorBody
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &eb)
	return resp.StatusCode, eb, resp.Header
}

// TestBodyCap: bodies above the cap derived from max_model_len get 413
// with an OpenAI error body, not 400 "unexpected end of JSON input".
func TestBodyCap(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.MaxModelLen = 100 })
	limit := defaultBodyCap(100)
	if limit != 1<<20+100*bodyBytesPerToken {
		t.Fatalf("derived cap %d", limit)
	}
	over := `{"prompt":"` + strings.Repeat("a ", int(limit/2)+100<<10) + `"}` // 200 KiB over
	for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/tokenize", "/admin/role", "/internal/kv/release"} {
		for _, chunked := range []bool{false, true} {
			status, eb, _ := postRaw(t, e.URL()+path, over, chunked)
			if status != 413 || eb.Error.Code != 413 || eb.Error.Type != "RequestTooLargeError" || !strings.Contains(eb.Error.Message, fmt.Sprint(limit)) {
				t.Errorf("%s chunked=%v: %d %+v", path, chunked, status, eb.Error)
			}
		}
	}
	// Far over the cap the connection is cut after the answer (or while
	// the client still writes); either way the engine holds.
	huge := strings.Repeat("x", 16<<20)
	client := &http.Client{Timeout: hangGuard}
	if resp, err := client.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(huge)); err == nil {
		resp.Body.Close()
		if resp.StatusCode != 413 {
			t.Errorf("16 MiB body: %d", resp.StatusCode)
		}
	}
	// Under the cap, a prompt longer than the model is the usual 400.
	long := `{"prompt":"` + strings.Repeat("a ", 200) + `"}`
	if status, eb, _ := postRaw(t, e.URL()+"/v1/completions", long, false); status != 400 || !strings.Contains(eb.Error.Message, "maximum context length") {
		t.Errorf("long prompt: %d %+v", status, eb.Error)
	}
	complete(t, e, map[string]any{"prompt": "still serving", "max_tokens": 2})

	// An explicit cap replaces the derived one.
	small := startEngine(t, func(c *Config) { c.HTTP.MaxBodyBytes = 64 })
	if status, _, _ := postRaw(t, small.URL()+"/v1/completions", `{"prompt":"`+strings.Repeat("b", 64)+`"}`, false); status != 413 {
		t.Errorf("explicit cap: %d", status)
	}
}

// TestLargeTokenizeBounded holds the only large-body slot with a body that
// arrives slowly: another large /tokenize waits, then gets 503 with
// Retry-After, while small requests pass.
func TestLargeTokenizeBounded(t *testing.T) {
	e := startEngine(t, func(c *Config) {
		c.HTTP = httpserve.Config{LargeBodyBytes: 1000, MaxLargeBodies: 1, LargeBodyWait: 100 * time.Millisecond}
	})
	big := `{"prompt":"` + strings.Repeat("w ", 1000) + `"}`
	conn, err := net.DialTimeout("tcp", e.Addr(), hangGuard)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(big), big[:100])
	waitFor(t, "slot taken", func() bool { return e.bodies.InUse() == 1 })

	status, eb, hdr := postRaw(t, e.URL()+"/tokenize", big, false)
	if status != 503 || hdr.Get("Retry-After") != "1" || !strings.Contains(eb.Error.Message, "large requests") {
		t.Errorf("second large body: %d %+v Retry-After %q", status, eb.Error, hdr.Get("Retry-After"))
	}
	if status, _, _ := postRaw(t, e.URL()+"/tokenize", `{"prompt":"small"}`, false); status != 200 {
		t.Errorf("small body: %d", status)
	}
	// The slow body completes: its answer comes and the slot frees.
	io.WriteString(conn, big[100:])
	conn.SetReadDeadline(time.Now().Add(hangGuard))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("slow body: %v %v", resp, err)
	}
	resp.Body.Close()
	waitFor(t, "slot freed", func() bool { return e.bodies.InUse() == 0 })
	if status, _, _ := postRaw(t, e.URL()+"/tokenize", big, false); status != 200 {
		t.Errorf("large body after release: %d", status)
	}
}

// TestMaxTokensOverflowDoesNotWedge sends max_tokens 2^63-1 several ways
// and requires a normal request to complete afterwards.
func TestMaxTokensOverflowDoesNotWedge(t *testing.T) {
	e := startEngine(t)
	for _, body := range []string{
		`{"prompt":"x","max_tokens":9223372036854775807}`,
		`{"prompt":"x","max_tokens":9223372036854775807,"min_tokens":9223372036854775807}`,
		`{"prompt":"x","max_tokens":9223372036854775807,"stream":true}`,
		`{"prompt":"x","max_tokens":9223372036854775807,"kv_transfer_params":{"do_remote_decode":true}}`,
	} {
		status, eb, _ := postRaw(t, e.URL()+"/v1/completions", body, false)
		if body == `{"prompt":"x","max_tokens":9223372036854775807,"kv_transfer_params":{"do_remote_decode":true}}` {
			// A prefill leg ignores max_tokens (it samples one token).
			if status != 200 {
				t.Errorf("%s: %d %+v", body, status, eb.Error)
			}
			continue
		}
		if status != 400 {
			t.Errorf("%s: %d %+v", body, status, eb.Error)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		complete(t, e, map[string]any{"prompt": "after the attack", "max_tokens": 3})
	}()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatal("engine wedged")
	}
}
