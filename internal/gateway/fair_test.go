package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

func TestFairShare(t *testing.T) {
	var f fairShare
	const m = "m"
	if f.room(m, "a", 1, 0) != 0 {
		t.Fatal("room kept with nobody turned away")
	}
	relA := f.admitted(m, "a", 9000)
	relB := f.admitted(m, "b", 1000)
	f.deny(m, "b", 1, 10, 0.3)
	f.deny(m, "b", 1, 10.2, 0.1) // the window's largest miss counts
	cases := []struct {
		tenant string
		prio   int
		now    float64
		want   float64
	}{
		{"a", 1, 10.5, 0.3},            // more in flight than b, turned away
		{"b", 1, 10.5, 0},              // its own rejection holds no one of its own back
		{"c", 1, 10.5, 0},              // nothing in flight: less than b
		{"a", 2, 10.5, 0},              // a higher priority gives way to no lower one
		{"a", 0, 10.5, 0.3},            // a lower one does
		{"a", 1, 10.2 + shedWindow, 0}, // the window is over
	}
	for _, c := range cases {
		if got := f.room(m, c.tenant, c.prio, c.now); got != c.want {
			t.Errorf("%s prio %d at %v: %v, want %v", c.tenant, c.prio, c.now, got, c.want)
		}
	}
	if f.room("other-model", "a", 1, 10.5) != 0 {
		t.Error("a rejection on one model held another's tenants back")
	}
	f.deny(m, "b", 1, 20, 0.05) // a new window forgets the old miss
	if got := f.room(m, "a", 1, 20.5); got != 0.05 {
		t.Errorf("a new window: room %v, want 0.05", got)
	}
	relA()
	relA() // once
	relB()
	f.room(m, "a", 1, 100) // the windows are over: the denied go
	if len(f.tenants) != 0 || len(f.denied) != 0 {
		t.Errorf("left behind: %d tenants, %d denied", len(f.tenants), len(f.denied))
	}
	// Beyond maxTenants, tenants share one overflow entry: bounded.
	var rels []func()
	for i := range maxTenants + 100 {
		rels = append(rels, f.admitted(m, fmt.Sprint("t", i), 10))
	}
	if len(f.tenants) > maxTenants+1 {
		t.Errorf("%d tenants tracked", len(f.tenants))
	}
	for _, r := range rels {
		r()
	}
	if len(f.tenants) != 0 {
		t.Errorf("%d tenants left", len(f.tenants))
	}
}

// The gateway reads the tenant from the fairness header: while a tenant
// with less in flight was just rejected for the load, missing its SLO by
// all of it, a tenant with more gets 429 at once, the other not;
// --no-fairness turns it off.
func TestFairnessRejects(t *testing.T) {
	for _, off := range []bool{false, true} {
		e := startEngine(t, fleet.RoleBoth, nil)
		early := true
		g, url, admin := startGateway(t, Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}, EarlyReject: &early, NoFairness: off}, Options{})
		defer g.fair.admitted(testModel, "heavy", 50000)()
		g.fair.deny(testModel, "light", 1, g.clock(), 2) // missed by the whole SLO: others keep it all free
		heavy := post(t, url+"/v1/completions", completion("x", false, 2), map[string]string{DefaultFairnessHeader: "heavy"})
		light := post(t, url+"/v1/completions", completion("y", false, 2), map[string]string{DefaultFairnessHeader: "light"})
		if light.status != 200 {
			t.Fatalf("no-fairness %v: the light tenant got %d %s", off, light.status, light.body)
		}
		if off {
			if heavy.status != 200 {
				t.Fatalf("--no-fairness: the heavy tenant got %d %s", heavy.status, heavy.body)
			}
			continue
		}
		if heavy.status != 429 || !strings.Contains(heavy.body, "tenant with less in flight was rejected") {
			t.Fatalf("the heavy tenant got %d %s, want a 429 for its share", heavy.status, heavy.body)
		}
		if m := get(t, admin+"/metrics"); !strings.Contains(m, "kvgate_fairness_rejections_total 1") {
			t.Error("want the fairness rejection counted")
		}
	}
}

// TestFairnessAfterLoadRejection: the gateway records a tenant's load
// rejection itself. The heavy tenant's 900-token prompt waits on the
// only engine (100 tokens/s: 9 s of queue, the target 20 s); the light
// tenant's 1 000 tokens would wait past the target (rejected for the
// load, by several seconds); the heavy tenant's next 100 tokens would fit
// the target but not leave that room: rejected, unless --no-fairness.
func TestFairnessAfterLoadRejection(t *testing.T) {
	for _, off := range []bool{false, true} {
		release := make(chan struct{})
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if strings.Contains(string(body), "hold") {
				<-release
			}
			fmt.Fprint(w, `{"choices":[{"text":"ok"}]}`)
		}))
		early := true
		g, url, _ := startGateway(t, Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 100}},
			EarlyReject: &early, SLOTTFT: 20, NoFairness: off, Predictor: PredictorAnalytic, Hold: HoldConfig{Mode: "off"}}, Options{})
		held := make(chan struct{})
		go func() {
			defer close(held)
			// streamed: its prefill ends at its first byte, which waits
			// for release
			post(t, url+"/v1/completions", completion("hold "+strings.Repeat("abcd", 900), true, 2), map[string]string{DefaultFairnessHeader: "heavy"})
		}()
		waitFor(t, func() bool { // routed and waiting
			st := g.endpointStates()
			return len(st) == 1 && st[0].Load.InflightRequests == 1
		})
		light := post(t, url+"/v1/completions", completion("light "+strings.Repeat("wxyz", 1000), false, 2), map[string]string{DefaultFairnessHeader: "light"})
		heavy := post(t, url+"/v1/completions", completion("more "+strings.Repeat("efgh", 100), false, 2), map[string]string{DefaultFairnessHeader: "heavy"})
		close(release)
		<-held
		up.Close()
		if light.status != 429 || !strings.Contains(light.body, "exceeds SLO") {
			t.Fatalf("no-fairness %v: the light tenant got %d %s, want a load rejection", off, light.status, light.body)
		}
		if want := map[bool]int{false: 429, true: 200}[off]; heavy.status != want {
			t.Fatalf("no-fairness %v: the heavy tenant's small request got %d %s, want %d", off, heavy.status, heavy.body, want)
		}
		if !off && !strings.Contains(heavy.body, "tenant with less in flight") {
			t.Fatalf("the heavy tenant's 429 is not fairness's: %s", heavy.body)
		}
	}
}
