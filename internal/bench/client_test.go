package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestPrefillCachedHeader: behind kvgate's gateway in front of a P/D
// fleet, the answer's usage is the decode engine's; the prefill engine's
// own count comes in x-kvgate-prefill-cached-tokens, and the record takes
// it (bounded by the prompt). Without the header, the usage counts.
func TestPrefillCachedHeader(t *testing.T) {
	tests := []struct {
		header string
		want   int
	}{
		{"", 3},      // the usage's
		{"80", 80},   // the prefill engine's
		{"500", 100}, // at most the prompt
		{"-1", 3},    // not a count
		{"many", 3},  // not a count
		{"0", 0},     // a miss on the prefill side
	}
	for _, tc := range tests {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if tc.header != "" {
				w.Header().Set("X-Kvgate-Prefill-Cached-Tokens", tc.header)
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
		}))
		c := &Client{URL: srv.URL, Model: "m", HTTP: srv.Client()}
		rec := c.Do(context.Background(), &Item{Prompt: "hi", MaxTokens: 1}, 0, time.Now())
		srv.Close()
		if rec.Outcome != "ok" || rec.CachedTokens != tc.want {
			t.Errorf("header %q: %s %s, cached %d, want %d", tc.header, rec.Outcome, rec.Error, rec.CachedTokens, tc.want)
		}
	}
}
