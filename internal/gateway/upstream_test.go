package gateway

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestFailedEngineIs502: when the engines refuse the connection or answer
// 5xx (the first choice and the retry), the client gets 502 Bad Gateway
// with an OpenAI error body, not a 500 as if the gateway itself had
// failed.
func TestFailedEngineIs502(t *testing.T) {
	fivexx := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "engine on fire", http.StatusInternalServerError)
	}))
	t.Cleanup(fivexx.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()
	// Two endpoints, so that the retry goes to the other one and fails
	// too.
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "fivexx", URL: fivexx.URL, Model: testModel}, {Name: "refused", URL: refused, Model: testModel}}}
	_, url, _ := startGateway(t, cfg, Options{})
	for range 4 {
		r := post(t, url+"/v1/completions", completion("hi", false, 2), nil)
		if r.status != http.StatusBadGateway || !containsAll(r.body, `"error"`, `"code":502`) {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
