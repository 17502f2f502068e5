package gateway

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
)

// TestIndexExactOnAQuietEngine: with nothing else running, the cached
// tokens the gateway's index claims for a request (from the engine's KV
// events, 16-token engine blocks bridged to 64-token router blocks)
// equal what the engine reports it found cached, request after request,
// while conversations grow and evict one another from a cache that
// holds about a fifth of them. (Under load the two part: the running
// prefills evict blocks between the claim and the request's own step,
// docs/policies.md, "Touches ahead of the queue".)
func TestIndexExactOnAQuietEngine(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.NumGPUBlocks, c.TimeScale = 400, 200 })
	g, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}, Policy: "kvgate", BlockSize: 64}, Options{})
	waitSubscribed(t, g)
	rng := rand.New(rand.NewPCG(3, 3))
	ids := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = 1000 + rng.IntN(29000)
		}
		return out
	}
	convs := make([][]int, 10)
	for i := range convs {
		convs[i] = ids(600)
	}
	evicted := 0
	for turn := range 120 {
		c := rng.IntN(len(convs))
		convs[c] = append(convs[c], ids(300)...)
		if len(convs[c]) > 4000 {
			convs[c] = append(convs[c][:600:600], ids(300)...)
		}
		// Quiet: every batch the engine published has reached the index.
		waitIndexed(t, g, e)
		b, _ := json.Marshal(map[string]any{"model": testModel, "prompt": convs[c], "max_tokens": 1})
		r := post(t, url+"/v1/completions", string(b), nil)
		if r.status != 200 {
			t.Fatalf("turn %d: %d %s", turn, r.status, r.body)
		}
		claimed, _ := strconv.Atoi(r.header.Get(hdrCached))
		found, ok := usageCached([]byte(r.body))
		if !ok {
			t.Fatalf("turn %d: no cached tokens in the answer %s", turn, r.body)
		}
		// The engine hits whole 16-token blocks, the index whole 64-token
		// ones: they agree to within one router block.
		if claimed > found || found-claimed >= 64 {
			t.Fatalf("turn %d (conversation %d, %d tokens): the index claimed %d cached, the engine found %d", turn, c, len(convs[c]), claimed, found)
		}
		if found < len(convs[c])-300-64 {
			evicted++ // the conversation's history was (partly) evicted
		}
	}
	if evicted == 0 {
		t.Fatal("no conversation lost any history: the test did not evict")
	}
}

// usageCached is the prompt tokens an answer's usage says were cached; a
// usage without them is 0, as vLLM's chat leaves them out when none were
// (and kvgate's emulator since 2026-12-04); ok false without a usage.
func usageCached(body []byte) (int, bool) {
	if n, ok := openai.ResponseCachedTokens(body); ok {
		return n, true
	}
	return 0, bytes.Contains(body, []byte(`"usage":{`)) || bytes.Contains(body, []byte(`"usage": {`))
}
