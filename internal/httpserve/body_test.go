package httpserve

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// bodyServer answers with the body length, or the limiter's error; a body
// starting with "hold" keeps its slot until release is closed.
func bodyServer(t *testing.T, bl *BodyLimiter, release chan struct{}, held chan struct{}) string {
	addr, _ := serve(t, Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, done, err := bl.Read(w, r)
		defer done()
		if err != nil {
			openai.WriteError(w, err)
			return
		}
		if bytes.HasPrefix(body, []byte("hold")) {
			held <- struct{}{}
			<-release
		}
		json.NewEncoder(w).Encode(len(body))
	}))
	return "http://" + addr + "/"
}

// unsized hides a reader's length so the client sends the body chunked.
type unsized struct{ io.Reader }

func TestBodyLimits(t *testing.T) {
	bl := NewBodyLimiter(1000, 100, 1, 200*time.Millisecond)
	release, held := make(chan struct{}), make(chan struct{}, 1)
	url := bodyServer(t, bl, release, held)
	client := &http.Client{Timeout: hang}
	post := func(body io.Reader) (int, string) {
		t.Helper()
		resp, err := client.Post(url, "application/json", body)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name   string
		body   io.Reader
		status int
		want   string
	}{
		{"small", strings.NewReader("abc"), 200, "3"},
		{"empty", strings.NewReader(""), 200, "0"},
		{"exactly the cap", strings.NewReader(strings.Repeat("a", 1000)), 200, "1000"},
		{"over the cap", strings.NewReader(strings.Repeat("a", 1001)), 413, "RequestTooLargeError"},
		{"chunked small", unsized{strings.NewReader("abcd")}, 200, "4"},
		{"chunked large", unsized{strings.NewReader(strings.Repeat("a", 900))}, 200, "900"},
		{"chunked over the cap", unsized{strings.NewReader(strings.Repeat("a", 5000))}, 413, "limit of 1000 bytes"},
	}
	for _, tt := range tests {
		if status, out := post(tt.body); status != tt.status || !strings.Contains(out, tt.want) {
			t.Errorf("%s: %d %q, want %d containing %q", tt.name, status, out, tt.status, tt.want)
		}
	}
	if bl.InUse() != 0 {
		t.Errorf("%d slots still in use", bl.InUse())
	}

	// One large body holds the only slot: another large one waits, then
	// gets 503 with Retry-After; a small one passes.
	holder := make(chan error, 1)
	go func() {
		resp, err := client.Post(url, "application/json", strings.NewReader("hold"+strings.Repeat("a", 200)))
		if err == nil {
			resp.Body.Close()
		}
		holder <- err
	}()
	<-held
	resp, err := client.Post(url, "application/json", strings.NewReader(strings.Repeat("b", 300)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("second large body: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if status, _ := post(strings.NewReader("small")); status != 200 {
		t.Errorf("small body while the slot is held: %d", status)
	}
	close(release)
	if err := <-holder; err != nil {
		t.Errorf("holder: %v", err)
	}
	if status, out := post(strings.NewReader(strings.Repeat("c", 300))); status != 200 || !strings.Contains(out, "300") {
		t.Errorf("large body after release: %d %q", status, out)
	}
}

func TestConfigBodyLimiter(t *testing.T) {
	if got := (Config{}).BodyLimiter(5 << 20).Max(); got != 5<<20 {
		t.Errorf("default cap %d", got)
	}
	if got := (Config{MaxBodyBytes: 77}).BodyLimiter(5 << 20); got.Max() != 77 || got.large != 77 {
		t.Errorf("explicit cap %d, large %d", got.Max(), got.large)
	}
}
