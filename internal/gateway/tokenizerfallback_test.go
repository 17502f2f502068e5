package gateway

import (
	"fmt"
	"strings"
	"testing"
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
