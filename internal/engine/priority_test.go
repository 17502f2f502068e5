package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestEnqueueByPriority: with priority scheduling a new request waits
// behind every request of its priority or lower, so the queue runs by
// priority, lower first, then by arrival.
func TestEnqueueByPriority(t *testing.T) {
	s := &scheduler{cfg: Config{PriorityScheduling: true}}
	for i, p := range []int{0, 0, -1, 0, 1, -1, 0} {
		s.enqueueByPriority(&request{id: fmt.Sprint(i), priority: p})
	}
	var got []string
	for _, r := range s.waiting {
		got = append(got, fmt.Sprintf("%s:%d", r.id, r.priority))
	}
	want := []string{"2:-1", "5:-1", "0:0", "1:0", "3:0", "6:0", "4:1"}
	if !slices.Equal(got, want) {
		t.Fatalf("waiting %v, want %v", got, want)
	}
}

// TestPriorityServedFirst: on an engine that runs one sequence at a time
// with priority scheduling, a request of priority -1 sent behind two of
// priority 0 (all waiting for the running one) is served before them; a
// first-come-first-served engine refuses its priority (TestErrors) and
// accepts 0. Out of the 32-bit range a priority is refused.
func TestPriorityServedFirst(t *testing.T) {
	e := startEngine(t, func(c *Config) {
		c.PriorityScheduling, c.MaxNumSeqs, c.TimeScale = true, 1, 1
	})
	// The running request: 100 output tokens, about a second.
	done := make(chan struct{})
	go func() {
		defer close(done)
		complete(t, e, map[string]any{"prompt": "the running one", "max_tokens": 100, "ignore_eos": true})
	}()
	waitFor(t, "the first request running", func() bool {
		var n int
		onScheduler(t, e, func(s *scheduler) { n = len(s.running) })
		return n == 1
	})
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	// Each waiting prompt takes about 0.1 s to prefill, so the order the
	// answers come back in is the order they were served.
	rng := rand.New(rand.NewPCG(7, 7))
	prompts := map[string]string{"a": words(rng, 2000), "b": words(rng, 2000), "touch": words(rng, 2000)}
	send := func(name string, prio int) {
		defer wg.Done()
		complete(t, e, map[string]any{"prompt": prompts[name], "max_tokens": 1, "priority": prio})
		mu.Lock()
		order = append(order, name)
		mu.Unlock()
	}
	for k, r := range []struct {
		name string
		prio int
	}{{"a", 0}, {"b", 0}, {"touch", -1}} {
		wg.Add(1)
		go send(r.name, r.prio)
		waitFor(t, r.name+" waiting", func() bool {
			var waiting, running int
			onScheduler(t, e, func(s *scheduler) { waiting, running = len(s.waiting), len(s.running) })
			if running == 0 || waiting < k {
				t.Fatalf("the running request ended, or a queued one ran, before %s was queued: running %d, waiting %d", r.name, running, waiting)
			}
			return waiting == k+1
		})
	}
	wg.Wait()
	<-done
	if len(order) != 3 || order[0] != "touch" {
		t.Fatalf("served in the order %v, want the priority -1 request first", order)
	}
	resp, body := postJSON(t, e.URL()+"/v1/completions", map[string]any{"prompt": "x", "priority": int64(1) << 40})
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "priority must be in") {
		t.Fatalf("priority 2^40: %d %s", resp.StatusCode, body)
	}
}
