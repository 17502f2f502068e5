package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/gateway"
)

// TestPlannerSwitchesEngineThroughGatewayWithoutLoss runs a gateway in
// front of one prefill and two decode kvgate engines, with prompt-heavy
// traffic flowing. The planner, fed by what the clients observe, moves a
// decode engine to prefill through its POST /admin/role; the gateway
// learns the new role from its endpoint list (SetEndpoints, as the planner
// tells it). No request may fail, and requests must then be prefilled on
// the switched engine.
func TestPlannerSwitchesEngineThroughGatewayWithoutLoss(t *testing.T) {
	p1 := startEngine(t, fleet.RolePrefill)
	d1 := startEngine(t, fleet.RoleDecode)
	d2 := startEngine(t, fleet.RoleDecode)
	eps := []fleet.Endpoint{endpointOf(p1, fleet.RolePrefill), endpointOf(d1, fleet.RoleDecode), endpointOf(d2, fleet.RoleDecode)}
	off := false
	g, err := gateway.New(gateway.Config{Endpoints: eps, EarlyReject: &off,
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + p1.URL()}}, gateway.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gwDone := make(chan struct{})
	go func() { defer close(gwDone); _ = g.Run(ctx) }()
	srv := httptest.NewServer(g.Handler())
	defer func() { srv.Close(); cancel(); <-gwDone }()

	start := time.Now()
	clock := func() float64 { return time.Since(start).Seconds() }
	rec, err := NewRecorder(60, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	// Traffic: clients send long prompts with short outputs (prefill
	// heavy) until stopped, recording what they see.
	var ok, failed atomic.Int64
	var mu sync.Mutex
	prefilledOn := map[string]int{}
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				prompt := fmt.Sprintf("client %d request %d: ", c, i) + strings.Repeat("summarise this long document please ", 120)
				body, _ := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 4})
				at := clock()
				resp, err := http.Post(srv.URL+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					failed.Add(1)
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
					continue
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				rec.Arrived(Arrival{At: at, PromptTokens: 1000, OutputTokens: 4})
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%d %s", resp.StatusCode, data))
					mu.Unlock()
					continue
				}
				ok.Add(1)
				rec.Completed(Completion{At: clock(), TTFT: clock() - at})
				mu.Lock()
				prefilledOn[resp.Header.Get("X-Kvgate-Prefill-Endpoint")]++
				mu.Unlock()
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	act, err := NewEngineActuator(eps, EngineOptions{Router: g, Grace: 50 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	// Prefill capacity far below the load, decode capacity far above it:
	// the planner wants as many prefill engines as the budget allows.
	pl, err := New(Config{Total: 3, Capacity: StaticCapacity{Prefill: 1000, Decode: 1e9}, Confirm: 1, MinWindows: 1, Margin: 0.001,
		Interval: 0.1, Warmup: 0.05, Cooldown: 0.1, Horizon: 60, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	loop, err := NewLoop(LoopConfig{Planner: pl, Source: rec, Actuator: act, Name: "engine", Window: 0.5, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "traffic", func() bool { return ok.Load() >= 20 })
	var moved string
	deadline := time.Now().Add(30 * time.Second)
	for moved == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no switch decided; last: %+v", loop.Status().Last)
		}
		d, err := loop.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if d.Action == ActionSwitch {
			if len(d.ToPrefill) != 1 || len(d.ToDecode) != 0 {
				t.Fatalf("switch %+v", d)
			}
			moved = d.ToPrefill[0]
			t.Logf("planner: %s", d.Reason)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if moved != d1.Addr() && moved != d2.Addr() {
		t.Fatalf("moved %s, not a decode engine", moved)
	}
	waitUntil(t, "the switched engine to serve as prefill", func() bool {
		if _, err := loop.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
		st := loop.Status()
		return st.Switching == 0 && st.Prefill == 2
	})
	before := ok.Load()
	waitUntil(t, "requests prefilled on the switched engine", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return prefilledOn[moved] >= 5 && ok.Load() >= before+20
	})
	close(stop)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d requests failed: %q", n, n+ok.Load(), failures)
	}
	st := loop.Status()
	if st.Changes != 1 || st.Switched != 1 || st.Failed != 0 || len(st.Switches) != 1 || st.Switches[0].Reason == "" {
		t.Errorf("status %+v", st)
	}
	var sw fleet.Role
	for _, e := range []*engine.Engine{d1, d2} {
		if e.Addr() == moved {
			sw = e.RoleStatus().Role
		}
	}
	if sw != fleet.RolePrefill {
		t.Errorf("engine %s is %s", moved, sw)
	}
	t.Logf("%d requests, none lost; prefill endpoints: %v", ok.Load(), prefilledOn)
}
