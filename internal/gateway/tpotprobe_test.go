package gateway

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/load"
)

// TestTPOTProbeTrainsMidStream: a stream's event load.TPOTProbeTokens past
// its first trains its endpoint's TPOT model while the stream still runs,
// and the stream's end does not train it again. The upstream sends each
// event only once the client has the one before, so the probe comes
// before the stream's end however the machine schedules it.
func TestTPOTProbeTrainsMidStream(t *testing.T) {
	const chunks = load.TPOTProbeTokens + 8
	ack := make(chan struct{}, 1)
	sent, release := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for range chunks {
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-ack:
			case <-time.After(10 * time.Second):
				return
			}
		}
		close(sent)
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}}}
	_, url, admin := startGateway(t, cfg, Options{})
	samples := func() int {
		d := adminEndpoints(t, admin)[0].DecodePredictor
		if d == nil {
			t.Fatal("no decode predictor state: the learned predictor is the default")
		}
		return d.Samples
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(tokenPrompt(8, 10, true)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	done := make(chan int)
	go func() {
		n := 0
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: {") {
				n++
				ack <- struct{}{}
			}
		}
		done <- n
	}()
	select {
	case <-sent:
	case <-ctx.Done():
		t.Fatal("the stream stalled")
	}
	if got := samples(); got != 1 {
		t.Fatalf("%d TPOT samples with the stream %d chunks in and still open, want 1", got, chunks)
	}
	close(release)
	if n := <-done; n != chunks {
		t.Fatalf("client read %d chunks, want %d", n, chunks)
	}
	// The end's Finished runs after the last byte; it ends the flight.
	waitFor(t, func() bool { return adminEndpoints(t, admin)[0].Load.InflightRequests == 0 })
	if got := samples(); got != 1 {
		t.Fatalf("%d TPOT samples after the stream ended, want 1: its end trained again", got)
	}
}

// TestTPOTCountsEvents: an engine whose writes each bring two tokens
// (two SSE events) is measured per token: the observed TPOT is the time
// from the first event to the last over the events less one, not over
// the reads, which would double it.
func TestTPOTCountsEvents(t *testing.T) {
	const writes = 21
	var span atomic.Int64 // nanoseconds from the first write to the last
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		start := time.Now()
		for i := range writes {
			if i > 0 {
				time.Sleep(10 * time.Millisecond)
			}
			if i == writes-1 {
				span.Store(int64(time.Since(start)))
			}
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n")
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}}}
	_, url, admin := startGateway(t, cfg, Options{})
	if r := post(t, url+"/v1/completions", tokenPrompt(8, 10, true), nil); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	waitFor(t, func() bool { return adminEndpoints(t, admin)[0].TPOT > 0 })
	// The first read brings the first two events; the span runs from
	// the first write to the last, 2 × writes − 1 events after the first.
	d := time.Duration(span.Load())
	want := d.Seconds() / float64(2*writes-1)
	if got := adminEndpoints(t, admin)[0].TPOT; got < 0.7*want || got > 1.4*want {
		t.Fatalf("observed TPOT %.4f s, want about %.4f s (%d events in %v): counted per read it is twice that", got, want, 2*writes, d)
	}
}
