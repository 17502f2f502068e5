package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestEnqueueByPriority: with priority scheduling a new request waits
// behind every request of its priority or lower, so the queue runs by
// priority, lower first, then by arrival; a preempted request goes back
// ahead of the later arrivals of its priority (vLLM's priority queue).
func TestEnqueueByPriority(t *testing.T) {
	s := &scheduler{cfg: Config{PriorityScheduling: true}}
	t0 := time.Unix(1000, 0)
	for i, p := range []int{0, 0, -1, 0, 1, -1, 0} {
		s.enqueueByPriority(&request{id: fmt.Sprint(i), priority: p, arrival: t0.Add(time.Duration(i) * time.Second)})
	}
	s.enqueueByPriority(&request{id: "preempted", priority: 0, arrival: t0.Add(time.Second / 2)})
	var got []string
	for _, r := range s.waiting {
		got = append(got, fmt.Sprintf("%s:%d", r.id, r.priority))
	}
	want := []string{"2:-1", "5:-1", "0:0", "preempted:0", "1:0", "3:0", "6:0", "4:1"}
	if !slices.Equal(got, want) {
		t.Fatalf("waiting %v, want %v", got, want)
	}
}

// TestPreemptsLowestPriority: short of blocks, an engine preempts the
// request served last: the newest running one (FCFS), or with priority
// scheduling the one of the highest priority value, then the newest, as
// vLLM does, even if it was scheduled earlier in the same step (its
// tokens then leave the step); it goes back to the waiting queue's head,
// or with priority scheduling to its place by priority and arrival. Ten blocks of 16 tokens: a runs alone,
// then b and c join (three blocks each) and take the last free ones; in
// the third step b and c each need a fourth block.
func TestPreemptsLowestPriority(t *testing.T) {
	for _, tt := range []struct {
		name     string
		priority bool
		prios    [3]int   // a, b, c
		waiting  []string // after the step: the preempted one and d
		planned  []string
	}{
		{"fcfs: the newest, to the head", false, [3]int{0, 0, 0}, []string{"c", "d"}, []string{"a", "b"}},
		{"priority, all equal: the newest, ahead of a later arrival", true, [3]int{0, 0, 0}, []string{"c", "d"}, []string{"a", "b"}},
		{"priority: the one asking, behind a higher priority", true, [3]int{0, 1, 0}, []string{"d", "b"}, []string{"a"}},
		{"priority: one scheduled earlier in the step", true, [3]int{1, 0, 0}, []string{"d", "a"}, []string{"b", "c"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.NumGPUBlocks, cfg.BlockSize, cfg.PriorityScheduling = 10, 16, tt.priority
			s := newScheduler(cfg, cfg.Logger, newMetrics(cfg), nil)
			t0 := time.Unix(1000, 0)
			reqs := map[string]*request{}
			for k, name := range []string{"a", "b", "c"} {
				reqs[name] = &request{id: name, arrival: t0.Add(time.Duration(k) * time.Second), priority: tt.prios[k],
					tokens: seqTokens(48, uint32(1000*(k+1))), promptLen: 48, maxTokens: 10, notify: make(chan struct{}, 1)}
			}
			s.waiting = []*request{reqs["a"]}
			s.commit(s.schedule(t0), t0)
			s.waiting = []*request{reqs["b"], reqs["c"]}
			s.commit(s.schedule(t0), t0)
			if len(s.running) != 3 || s.pool.numFree != 0 {
				t.Fatalf("%d running, %d blocks free; want 3 and 0", len(s.running), s.pool.numFree)
			}
			// d waits (a step that preempts admits nothing new).
			s.waiting = []*request{{id: "d", arrival: t0.Add(3 * time.Second), tokens: seqTokens(48, 9000), promptLen: 48, maxTokens: 10, notify: make(chan struct{}, 1)}}
			p := s.schedule(t0)
			var planned []string
			context := 0
			for _, it := range p.items {
				planned = append(planned, it.r.id)
				context += it.r.numComputed + 1
			}
			if !slices.Equal(ids(s.waiting), tt.waiting) {
				t.Fatalf("waiting %v, want %v", ids(s.waiting), tt.waiting)
			}
			if !slices.Equal(planned, tt.planned) || p.decodes != len(planned) || p.prefillTokens != 0 || p.decodeContext != context {
				t.Fatalf("planned %v (decodes %d, prefill tokens %d, context %d), want %v decoding (context %d)",
					planned, p.decodes, p.prefillTokens, p.decodeContext, tt.planned, context)
			}
			held := 0
			for _, r := range s.running {
				held += len(r.blocks)
			}
			if held+s.pool.numFree != cfg.NumGPUBlocks {
				t.Fatalf("running requests hold %d blocks and %d are free, of %d", held, s.pool.numFree, cfg.NumGPUBlocks)
			}
		})
	}
}

func ids(rs []*request) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.id)
	}
	return out
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
