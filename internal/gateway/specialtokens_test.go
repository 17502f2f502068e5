package gateway

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
)

// TestCompletionKeyedWithBOS: an engine whose tokenizer starts a text
// prompt with a BOS token (a Llama-family model in vLLM: completions add
// special tokens by default) caches the BOS first, so the gateway keys a
// completion's prompt with it too, or with none when the request says
// add_special_tokens: false: what the gateway claims cached is what the
// engine finds, for blocks the engine's own KV events reported (the first
// turn goes to the engine directly, so the gateway has no routed entries
// of its own to match).
func TestCompletionKeyedWithBOS(t *testing.T) {
	for _, special := range []bool{true, false} {
		t.Run("add_special_tokens="+strconv.FormatBool(special), func(t *testing.T) {
			e := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.BOS = true })
			cfg := Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}, Tokenizers: []string{"model=" + testModel + ",source=engine"}, Policy: "kvgate"}
			g, url, _ := startGateway(t, cfg, Options{})
			waitSubscribed(t, g)
			body := func(prompt string) string {
				m := map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 1}
				if !special {
					m["add_special_tokens"] = false
				}
				b, _ := json.Marshal(m)
				return string(b)
			}
			first := prefix("bos")
			r := post(t, e.URL()+"/v1/completions", body(first), nil)
			var usage struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
				}
			}
			if err := json.Unmarshal([]byte(r.body), &usage); r.status != 200 || err != nil {
				t.Fatalf("first turn: %d %s", r.status, r.body)
			}
			waitFor(t, func() bool { // its full blocks reported
				st := g.idx.Stats()
				return len(st) > 0 && st[0].GPUBlocks >= int64(usage.Usage.PromptTokens/16)
			})
			r = post(t, url+"/v1/completions", body(first+" and a question that follows"), nil)
			found, _ := usageCached([]byte(r.body))
			if r.status != 200 || found == 0 || r.header.Get(hdrCached) != strconv.Itoa(found) {
				t.Fatalf("second turn: %d, claimed %s cached, the engine found %d: %s", r.status, r.header.Get(hdrCached), found, r.body)
			}
		})
	}
}
