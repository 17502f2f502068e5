package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/sim"
	"github.com/kvgate/kvgate/internal/workload"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// promptIDs turns a trace request into token ids whose chained block keys
// are equal exactly where the trace's keys are: block j's tokens derive
// from its key.
func promptIDs(r *workload.Request, bs, ri int) []int64 {
	ids := make([]int64, 0, r.PromptTokens)
	for _, k := range r.Keys {
		for i := 0; i < bs; i++ {
			ids = append(ids, int64((k>>uint(i%32))&0xffff)+int64(i)*65536)
		}
	}
	for len(ids) < r.PromptTokens {
		ids = append(ids, int64(ri)*7+int64(len(ids))) // the partial tail: this request's own
	}
	return ids
}

// TestGatewayMatchesSimulator drives the gateway and the simulator with
// the same small chat workload on the same fleet (eight instances at
// 20 000 tokens/s) and checks that every policy makes the same choices.
// Requests are spaced so that every queue is empty at each arrival in
// both (no timing noise); the gateway's knowledge of the caches comes from
// its own routing decisions (approximate index entries), the simulator's
// from its caches, and the workload stays below the cache capacity.
// sglang-cache-aware is left out: its low-match branch reads how many
// blocks each endpoint holds in all (HeldTokens), which the gateway's
// index counts from KV events, which this test does not send; its
// variant sglang-least-load, which reads only prefixes and loads, is in.
func TestGatewayMatchesSimulator(t *testing.T) {
	c := workload.ChatConfig{Systems: 3, Sessions: 10, SystemTokens: 640, TurnTokens: 200, OutputTokens: 4,
		Rate: 2, Duration: 25, BlockSize: 64, Seed: 3}
	tr, err := workload.Chat(c)
	if err != nil {
		t.Fatal(err)
	}
	for i := range tr.Requests {
		tr.Requests[i].Arrival = float64(i) * 10
		// Completions carry no conversation structure (only a chat
		// without an assistant message opens a conversation, which
		// TestChatOpensConversation covers): the simulator is not told
		// of openings either.
		tr.Requests[i].Session = -1
	}
	const n = 8
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	start := clk.Now()
	// The engines take exactly the modelled prefill time: each answers at
	// the arrival plus the simulator's TTFT for that request.
	var mu sync.Mutex
	var doneAt time.Time
	ups := make([]fleet.Endpoint, n)
	for i := range ups {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			clk.Set(doneAt)
			mu.Unlock()
			fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
		}))
		t.Cleanup(srv.Close)
		ups[i] = fleet.Endpoint{Name: fmt.Sprintf("p%d", i), URL: srv.URL, Model: testModel, PrefillSpeed: 20000}
	}
	for _, policy := range []string{"kvgate", "predicted-ttft", "cache-only", "least-queue", "llmd-token-aware", "sglang-least-load", "dynamo-kv"} {
		t.Run(policy, func(t *testing.T) {
			var simChoice []int
			var simTTFT []float64
			cfg := sim.Config{Prefill: n, Model: perfmodel.Default(), CacheTokens: 3000 * 64, SLO: sched.SLO{TTFT: 2},
				OnDecision: func(_ int, d sched.Decision) {
					simChoice = append(simChoice, d.Prefill)
					simTTFT = append(simTTFT, d.PredictedTTFT)
				}}
			pol, _ := sched.New(policy, sched.Options{})
			if _, err := sim.Run(context.Background(), cfg, tr, &sched.Scheduler{Policy: pol}); err != nil {
				t.Fatal(err)
			}
			no := false
			gcfg := Config{Endpoints: ups, BlockSize: 64, Policy: policy, EarlyReject: &no}
			_, url, _ := startGateway(t, gcfg, Options{Now: clk.Now})
			start = start.Add(time.Hour) // a fresh gateway, later
			clk.Set(start)
			for ri := range tr.Requests {
				r := &tr.Requests[ri]
				at := start.Add(time.Duration(r.Arrival * float64(time.Second)))
				clk.Set(at)
				mu.Lock()
				doneAt = at.Add(time.Duration(simTTFT[ri] * float64(time.Second)))
				mu.Unlock()
				body, _ := json.Marshal(map[string]any{"model": testModel, "prompt": promptIDs(r, 64, ri), "max_tokens": 4})
				res := post(t, url+"/v1/completions", string(body), nil)
				if res.status != http.StatusOK {
					t.Fatalf("request %d: %d %s", ri, res.status, res.body)
				}
				got := res.header.Get(hdrPrefill)
				if want := fmt.Sprintf("p%d", simChoice[ri]); got != want {
					t.Fatalf("request %d: gateway chose %s, simulator %s (reason %q)", ri, got, want, res.header.Get(hdrReason))
				}
			}
			if strings.Count(fmt.Sprint(simChoice), " ") < 5 {
				t.Fatal("too few requests to compare")
			}
		})
	}
}
