package kvindex

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/tokens"
)

func TestRemoveEndpoint(t *testing.T) {
	x := New(Config{BlockSize: 16})
	a := mustAdd(t, x, "a:1", "m")
	b := mustAdd(t, x, "b:1", "m")
	c := mustAdd(t, x, "c:1", "m")
	keys := chain(8, 1)
	x.Store(a, 0, TierGPU, keys[:2])
	x.Store(b, 0, TierGPU, keys)
	x.Store(b, 0, TierCPU, keys)
	x.Routed(b, chain(8, 2))
	x.Store(c, 0, TierGPU, keys[:5])

	if err := x.RemoveEndpoint(b); err != nil {
		t.Fatal(err)
	}
	if err := x.RemoveEndpoint(b); err == nil {
		t.Error("removing twice succeeded")
	}
	if _, _, ok := x.Endpoint(b); ok {
		t.Error("removed endpoint still named")
	}
	if got := x.Endpoints("m"); !slices.Equal(got, []EndpointID{a, c}) {
		t.Errorf("endpoints %v", got)
	}
	ms := x.Lookup("m", keys, nil)
	if len(ms) != 2 || ms[0].Endpoint != a || ms[0].Blocks != 2 || ms[1].Endpoint != c || ms[1].Blocks != 5 {
		t.Errorf("lookup after remove: %+v", ms)
	}
	if st := x.Stats(); len(st) != 2 || st[0].Endpoint != "a:1" || st[1].Endpoint != "c:1" {
		t.Errorf("stats %+v", st)
	}

	// The next registration reuses b's id and slot and sees none of b's
	// entries, precise, other-group or approximate.
	d := mustAdd(t, x, "d:1", "m")
	if d != b {
		t.Errorf("id %d not reused (removed %d)", d, b)
	}
	if got := x.Endpoints("m"); !slices.Equal(got, []EndpointID{a, d, c}) {
		t.Errorf("endpoints after reuse %v (slot order)", got)
	}
	for _, k := range [][]tokens.BlockKey{keys, chain(8, 2)} {
		for _, m := range x.Lookup("m", k, nil) {
			if m.Endpoint == d && (m.Blocks != 0 || m.Approx) {
				t.Errorf("new endpoint inherited entries: %+v", m)
			}
		}
	}
	if st := x.Stats(); st[1].Endpoint != "d:1" || st[1].GPUBlocks != 0 || st[1].CPUBlocks != 0 {
		t.Errorf("stats of the reused id %+v", st[1])
	}
	x.Store(d, 0, TierGPU, keys[:3])
	if ms := x.Lookup("m", keys, nil); ms[1].Endpoint != d || ms[1].Blocks != 3 {
		t.Errorf("new endpoint's own entries: %+v", ms)
	}
}

// TestEndpointChurnDoesNotLeak registers and removes thousands of
// endpoints, each of its own model (pods coming and going): ids, slots,
// models and tables are all given back.
func TestEndpointChurnDoesNotLeak(t *testing.T) {
	x := New(Config{BlockSize: 16})
	stable := mustAdd(t, x, "stable:1", "m")
	x.Store(stable, 0, TierGPU, chain(4, 9))
	keys := chain(16, 3)
	for i := 0; i < 3000; i++ {
		own := mustAdd(t, x, fmt.Sprintf("pod-%d:8000", i), fmt.Sprintf("model-%d", i))
		same := mustAdd(t, x, fmt.Sprintf("pod-%d:8000", i), "m")
		x.Store(own, 0, TierGPU, keys)
		x.Store(same, 0, TierGPU, keys)
		x.Routed(same, keys)
		if err := x.RemoveEndpoint(own); err != nil {
			t.Fatal(err)
		}
		if err := x.RemoveEndpoint(same); err != nil {
			t.Fatal(err)
		}
	}
	if n := x.NumEndpoints(); n != 1 {
		t.Errorf("%d endpoints left", n)
	}
	if ms := x.Models(); len(ms) != 1 || ms[0] != "m" {
		t.Errorf("models left: %d", len(ms))
	}
	if hi := x.idsHi.Load(); hi > 3 {
		t.Errorf("ids handed out: %d (not reused)", hi)
	}
	if v := x.model("m").view.Load(); len(v.eps) > 2 {
		t.Errorf("model m has %d slots (not reused)", len(v.eps))
	}
	if ms := x.Lookup("m", keys, nil); len(ms) != 1 || ms[0].Blocks != 0 {
		t.Errorf("stale entries: %+v", ms)
	}
	if ms := x.Lookup("m", chain(4, 9), nil); ms[0].Blocks != 4 {
		t.Errorf("stable endpoint lost its entries: %+v", ms)
	}
	if mem := x.Mem(); mem.Keys != 4 {
		t.Errorf("index keys %d, want the stable endpoint's 4", mem.Keys)
	}
}

func TestMaxEndpoints(t *testing.T) {
	x := New(Config{MaxEndpoints: 3})
	ids := []EndpointID{mustAdd(t, x, "a", "m1"), mustAdd(t, x, "b", "m2"), mustAdd(t, x, "c", "m3")}
	if _, err := x.AddEndpoint("d", "m4"); !errors.Is(err, ErrTooManyEndpoints) {
		t.Fatalf("4th endpoint: %v", err)
	}
	if id, err := x.AddEndpoint("a", "m1"); err != nil || id != ids[0] {
		t.Errorf("re-adding a known endpoint at the limit: %d %v", id, err)
	}
	if err := x.RemoveEndpoint(ids[1]); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, x, "d", "m4")
	if New(Config{MaxEndpoints: 1 << 30}).cfg.MaxEndpoints != MaxEndpoints {
		t.Error("MaxEndpoints not clamped")
	}
}

// TestRegistryConcurrent runs lookups and stores while endpoints come and
// go (for the race detector), then checks the survivors.
func TestRegistryConcurrent(t *testing.T) {
	x := New(Config{BlockSize: 16})
	keys := chain(32, 5)
	a := mustAdd(t, x, "a", "m")
	x.Store(a, 0, TierGPU, keys)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ms []Match
			for {
				select {
				case <-stop:
					return
				default:
				}
				ms = x.Lookup("m", keys, ms)
				for _, m := range ms {
					if m.Endpoint == a && m.Blocks != 32 {
						t.Errorf("endpoint a: %+v", m)
						return
					}
				}
				x.Stats()
				x.Mem()
			}
		}()
	}
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				id, err := x.AddEndpoint(fmt.Sprintf("w%d-%d", w, i), []string{"m", "other"}[i%2])
				if err != nil {
					t.Error(err)
					return
				}
				x.Store(id, 0, TierGPU, keys[:i%32])
				if err := x.RemoveEndpoint(id); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	// The writers finish on their own; then the readers are stopped.
	done := make(chan struct{})
	go func() {
		for x.NumEndpoints() != 1 {
			time.Sleep(time.Millisecond)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("writers did not finish")
	}
	close(stop)
	wg.Wait()
	if ms := x.Lookup("m", keys, nil); len(ms) != 1 || ms[0].Endpoint != a || ms[0].Blocks != 32 {
		t.Errorf("after churn: %+v", ms)
	}
}

// BenchmarkRegister registers 20 000 endpoints into a fresh index, each
// with its own model (what /admin/kv/routed with 20 000 model names or
// central mode with 20 000 topics did) or all in one model, and reports
// the cost of the first and the last 1 000 registrations: equal when
// registration cost is constant.
func BenchmarkRegister(b *testing.B) {
	const n, window = 20000, 1000
	for _, sameModel := range []bool{false, true} {
		name := "model-per-endpoint"
		if sameModel {
			name = "one-model"
		}
		b.Run(name, func(b *testing.B) {
			var first, last time.Duration
			var heap uint64
			for b.Loop() {
				runtime.GC()
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				x := New(Config{MaxEndpoints: n})
				for i := 0; i < n; i++ {
					model := "m"
					if !sameModel {
						model = fmt.Sprintf("model-%d", i)
					}
					start := time.Now()
					if _, err := x.AddEndpoint(fmt.Sprintf("10.%d.%d.%d:8000", i>>16, i>>8&255, i&255), model); err != nil {
						b.Fatal(err)
					}
					switch d := time.Since(start); {
					case i < window:
						first += d
					case i >= n-window:
						last += d
					}
				}
				runtime.ReadMemStats(&m1)
				heap += m1.HeapAlloc - m0.HeapAlloc
				runtime.KeepAlive(x)
			}
			runs := float64(b.N)
			b.ReportMetric(float64(first.Nanoseconds())/runs/window, "ns/first-1k-reg")
			b.ReportMetric(float64(last.Nanoseconds())/runs/window, "ns/last-1k-reg")
			b.ReportMetric(float64(heap)/runs/n, "B/reg")
		})
	}
}
