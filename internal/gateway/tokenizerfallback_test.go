package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/health"
)

// TestTokenizerEngineFallback: a model's source=engine tokenizer is not
// one engine's: with the engine named by url= gone, the model's chats are
// tokenized by another of its engines and served; without url= the
// model's engines tokenize from the start.
func TestTokenizerEngineFallback(t *testing.T) {
	for _, named := range []bool{true, false} {
		t.Run(fmt.Sprintf("url=%v", named), func(t *testing.T) {
			e1, _, eps := twoAggregated(t)
			tok := "model=" + testModel + ",source=engine"
			if named {
				tok += ",url=" + e1.URL()
			}
			_, url, _ := startGateway(t, Config{Endpoints: eps, Tokenizers: []string{tok}, Policy: "kvgate"}, Options{})
			chat := func(i int) result {
				return post(t, url+"/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"question %d %s"}],"max_tokens":2}`,
					testModel, i, strings.Repeat("words ", 50)), nil)
			}
			if r := chat(0); r.status != 200 {
				t.Fatalf("both engines up: %d %s", r.status, r.body)
			}
			if err := e1.Close(); err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 3; i++ {
				if r := chat(i); r.status != 200 {
					t.Fatalf("request %d with the tokenizer's engine gone: %d %s", i, r.status, r.body)
				}
			}
		})
	}
}

// TestNoEngineUpIsUnavailable: with every engine of a model down, a text
// request is an outage (503 with Retry-After, outcome unavailable, its
// X-Request-Id), not a tokenizer's fault (502), though its tokenizer is
// those engines' /tokenize.
func TestNoEngineUpIsUnavailable(t *testing.T) {
	e1, e2, eps := twoAggregated(t)
	pr, err := health.New(health.Config{Interval: 20 * time.Millisecond, Timeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	_, url, admin := startGateway(t, Config{Endpoints: eps, Tokenizers: []string{"model=" + testModel + ",source=engine"}}, Options{Health: pr})
	e1.Close()
	e2.Close()
	waitFor(t, func() bool {
		resp, err := http.Get(url + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 503
	})
	r := post(t, url+"/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, nil)
	if r.status != 503 || r.header.Get("Retry-After") == "" || r.header.Get("X-Request-Id") == "" {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	if m := get(t, admin+"/metrics"); !counted(m, "unavailable") || counted(m, "tokenizer_error") {
		t.Error("not counted unavailable")
	}
}
