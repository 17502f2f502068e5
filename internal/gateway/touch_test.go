package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

// touchUpstream holds requests carrying X-Hold (telling inUpstream) until
// their client goes away and answers the others at once, keeping their
// bodies.
type touchUpstream struct {
	mu     sync.Mutex
	bodies []string
}

func (u *touchUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.bodies...)
}

// TestHeldPrefixTouched: the release loop's touch pass (sched.TouchHeld)
// sends a real request for a held request's cached prefix once it is at
// risk. One endpoint (1 000 tokens/s) is kept busy; four requests that fit
// nowhere are held: A and C cached nowhere, B (token ids) and D (text, so
// its ids are the estimating tokenizer's) cached on the endpoint, which
// the index also reports holding 1 984 other tokens: 3 168 in all, a
// turnover of 3.2 s. Within it nothing is touched. Past it, B's prefix
// and one token more go to the endpoint's /v1/completions with
// max_tokens 1; D's is not sent (its ids would find nothing cached) and
// counted as such. Every request is served once the endpoint frees.
func TestHeldPrefixTouched(t *testing.T) {
	up := &touchUpstream{}
	seen, inUpstream := &atomic.Int64{}, make(chan struct{}, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen.Add(1)
		if r.Header.Get("X-Hold") != "" {
			inUpstream <- struct{}{}
			<-r.Context().Done()
			return
		}
		up.mu.Lock()
		up.bodies = append(up.bodies, string(body))
		up.mu.Unlock()
		// As vLLM with --enable-prompt-tokens-details: the touch finds
		// all but its last token cached.
		fmt.Fprint(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens_details":{"cached_tokens":592}}}`)
	}))
	t.Cleanup(srv.Close)
	h := holdGatewayOver(t, srv, seen, inUpstream, HoldConfig{Min: 20, Touch: true, TouchPriority: -1}, Options{})
	g, url, admin, clock := h.g, h.url, h.admin, h.clock
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	occupy(t, ctx, url, 20000, inUpstream) // busy for 20 s and more
	text := strings.Repeat("held text ", 240)
	bodies := []string{tokenPrompt(8, 600, false), tokenPrompt(9, 600, false), tokenPrompt(10, 600, false),
		fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, testModel, text)}
	got := make([]chan result, len(bodies))
	for i, body := range bodies {
		got[i] = make(chan result, 1)
		go func() { got[i] <- post(t, url+"/v1/completions", body, nil) }()
		waitFor(t, func() bool { return g.heldNow() == i+1 })
	}
	ep := g.idx.Endpoints(testModel)
	if len(ep) != 1 {
		t.Fatalf("%d index endpoints, want 1", len(ep))
	}
	for _, in := range []tokens.Input{{TokenIDs: ids(9, 600)}, {TokenIDs: ids(50, 2000)}, {Prompt: &text}} {
		prep, err := g.toks.Prepare(context.Background(), testModel, in, g.cfg.BlockSize)
		if err != nil {
			t.Fatal(err)
		}
		g.idx.Store(ep[0], 0, kvindex.TierGPU, prep.Keys)
	}
	clock.Add(int64(3 * time.Second))
	time.Sleep(3 * holdPoll)
	if s := up.seen(); len(s) != 0 {
		t.Fatalf("touched within the turnover: %q", s)
	}
	clock.Add(int64(time.Second))
	waitFor(t, func() bool { return len(up.seen()) > 0 })
	var touch struct {
		Model     string   `json:"model"`
		Prompt    []uint32 `json:"prompt"`
		MaxTokens int      `json:"max_tokens"`
		Priority  *int     `json:"priority"`
	}
	if err := json.Unmarshal([]byte(up.seen()[0]), &touch); err != nil {
		t.Fatal(err)
	}
	if touch.Model != testModel || touch.MaxTokens != 1 || len(touch.Prompt) != 593 || touch.Prompt[0] != 9 || touch.Prompt[592] != 9 {
		t.Fatalf("touch %q: want B's 592 cached tokens and one more, max_tokens 1", up.seen()[0])
	}
	if touch.Priority == nil || *touch.Priority != -1 {
		t.Fatalf("touch %q: want hold.touch_priority's -1", up.seen()[0])
	}
	waitFor(t, func() bool {
		m := get(t, admin+"/metrics")
		return strings.Contains(m, `kvgate_hold_touches_total{outcome="done"} 1`) &&
			strings.Contains(m, `kvgate_hold_touches_total{outcome="not_engine_ids"} 1`) &&
			strings.Contains(m, `kvgate_hold_touch_tokens_total{kind="cached"} 592`) &&
			strings.Contains(m, `kvgate_hold_touch_tokens_total{kind="computed"} 1`)
	})
	if g.heldNow() != 4 {
		t.Fatalf("held %d, want all 4 still held (the endpoint is busy)", g.heldNow())
	}
	cancel() // the endpoint frees
	for i, ch := range got {
		if r := awaitResult(t, ch); r.status != http.StatusOK {
			t.Fatalf("request %d: %d %q", i, r.status, r.body)
		}
	}
}

// ids is n token ids id.
func ids(id uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = id
	}
	return out
}
