package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// chatBodies are n distinct chat requests of about 4 000 estimate tokens.
func chatBodies(n int) [][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	words := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot"}
	out := make([][]byte, n)
	for i := range out {
		var b strings.Builder
		for j := 0; j < 2600; j++ {
			fmt.Fprintf(&b, "%s%d ", words[rng.IntN(len(words))], rng.IntN(1000))
		}
		out[i], _ = json.Marshal(map[string]any{"model": testModel, "max_tokens": 1, "messages": []map[string]string{
			{"role": "system", "content": fmt.Sprintf("You are helpful. Conversation %d.", i)},
			{"role": "user", "content": b.String()}}})
	}
	return out
}

// BenchmarkGatewayHandler measures the gateway's own work per request
// (parse, tokens from a warm cache, block keys, snapshot, decision, proxy)
// in front of an upstream that answers at once, with the bare handler of
// that upstream as the baseline in the same run.
func BenchmarkGatewayHandler(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"choices":[{"text":"x"}]}`))
	}))
	defer up.Close()
	eps := make([]fleet.Endpoint, 8)
	for i := range eps {
		eps[i] = fleet.Endpoint{Name: fmt.Sprintf("e%d", i), URL: up.URL, Model: testModel}
	}
	no := false
	g, err := New(Config{Endpoints: eps, EarlyReject: &no}, Options{Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	h := g.Handler()
	bodies := chatBodies(64)
	for _, body := range bodies { // warm the tokenizer cache
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body)))
		if rec.Code != 200 {
			b.Fatal(rec.Code, rec.Body.String())
		}
	}
	b.Run("chat4k/kvgate", func(b *testing.B) {
		i := 0
		for b.Loop() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(bodies[i%len(bodies)])))
			i++
		}
	})
	small := []byte(`{"model":"gw-model","prompt":"hi","max_tokens":1}`)
	b.Run("small/kvgate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(small)))
		}
	})
	b.Run("small/direct-upstream-post", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := http.Post(up.URL+"/v1/completions", "application/json", bytes.NewReader(small))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	b.Run("chat4k/direct-upstream-post", func(b *testing.B) {
		i := 0
		for b.Loop() {
			resp, err := http.Post(up.URL+"/v1/chat/completions", "application/json", bytes.NewReader(bodies[i%len(bodies)]))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			i++
		}
	})
}
