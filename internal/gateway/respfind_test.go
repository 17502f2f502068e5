package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestLookupBudget: the response ids asked for are bounded (each asks
// every engine): a burst of 100, then 50 a second.
func TestLookupBudget(t *testing.T) {
	var b lookupBudget
	t0 := time.Unix(1000, 0)
	for i := range 100 {
		if !b.take(t0) {
			t.Fatalf("lookup %d of the burst refused", i)
		}
	}
	if b.take(t0) {
		t.Fatal("a lookup past the burst was allowed")
	}
	n := 0
	for b.take(t0.Add(time.Second)) {
		n++
	}
	if n != 50 {
		t.Errorf("%d lookups a second later, want 50", n)
	}
}

// TestResponseMissesBounded: the ids remembered as kept nowhere stay
// within their bound, the aged going first.
func TestResponseMissesBounded(t *testing.T) {
	var m responseMisses
	t0 := time.Unix(1000, 0)
	for i := range maxResponseMisses + 10 {
		m.miss(string(rune('a'+i%26))+time.Duration(i).String(), t0)
	}
	if len(m.at) > maxResponseMisses {
		t.Fatalf("%d misses kept, bound %d", len(m.at), maxResponseMisses)
	}
	if m.ask("fresh", t0) != true {
		t.Error("an id never missed is not asked for")
	}
	m.miss("x", t0)
	if m.ask("x", t0.Add(time.Second)) || !m.ask("x", t0.Add(responseMissMemory)) {
		t.Error("a miss is not remembered for responseMissMemory, or remembered longer")
	}
}

// TestLookupFollowsNoRedirect: asking an engine for an id is one request:
// an engine that redirects it (FastAPI answers 307 to a path it
// normalizes, as for an id of "..") is not asked again at the new place
// (the retest counted two requests an engine).
func TestLookupFollowsNoRedirect(t *testing.T) {
	var gets atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			gets.Add(1)
			if strings.HasPrefix(r.URL.Path, "/v1/responses/") {
				http.Redirect(w, r, "/v1", http.StatusTemporaryRedirect)
				return
			}
			http.NotFound(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, `{"id":"resp_1","object":"response","output":[]}`)
	}))
	t.Cleanup(up.Close)
	_, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{{Name: "e", URL: up.URL, Model: testModel}}, NoHealthChecks: true}, Options{})
	post(t, url+"/v1/responses", `{"model":"`+testModel+`","input":"x","previous_response_id":".."}`, nil)
	if n := gets.Load(); n != 1 {
		t.Errorf("the engine was asked %d times for one id, want 1", n)
	}
}
