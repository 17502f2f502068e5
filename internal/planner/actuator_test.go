package planner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/enginetest"
	"github.com/kvgate/kvgate/internal/fleet"
)

const testModel = "planner-model"

// startEngine runs an in-process engine emulator on 127.0.0.1 with a
// short warm-up (modelled 2 s at 50× speed: 40 ms).
func startEngine(t *testing.T, role fleet.Role) *engine.Engine {
	t.Helper()
	return enginetest.Start(t, 50, func(c *engine.Config) {
		c.Model, c.Role = testModel, role
		c.RoleSwitchWarmup = 2 * time.Second
	})
}

func endpointOf(e *engine.Engine, role fleet.Role) fleet.Endpoint {
	return fleet.Endpoint{Name: e.Addr(), URL: e.URL(), Model: testModel, Role: role, PrefillSpeed: 20000 * 50}
}

// routerLog records what an actuator tells its router.
type routerLog struct {
	mu    sync.Mutex
	lists [][]fleet.Endpoint
}

func (r *routerLog) SetEndpoints(eps []fleet.Endpoint) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists = append(r.lists, append([]fleet.Endpoint(nil), eps...))
	return nil
}

func (r *routerLog) last() []fleet.Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lists) == 0 {
		return nil
	}
	return r.lists[len(r.lists)-1]
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func instance(t *testing.T, a Actuator, name string) Instance {
	t.Helper()
	inst, err := a.Instances(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range inst {
		if in.Name == name {
			return in
		}
	}
	t.Fatalf("no instance %s in %+v", name, inst)
	return Instance{}
}

// TestEngineActuatorSwitchesThroughAdminRole: the engine leaves the router,
// switches (drain, warm-up) and comes back in its new role.
func TestEngineActuatorSwitchesThroughAdminRole(t *testing.T) {
	p := startEngine(t, fleet.RolePrefill)
	d := startEngine(t, fleet.RoleDecode)
	rl := &routerLog{}
	a, err := NewEngineActuator([]fleet.Endpoint{endpointOf(p, fleet.RolePrefill), endpointOf(d, fleet.RoleDecode)},
		EngineOptions{Router: rl, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if in := instance(t, a, d.Addr()); in.Role != fleet.RoleDecode || in.Switching {
		t.Fatalf("before: %+v", in)
	}
	if err := a.Switch(context.Background(), d.Addr(), fleet.RolePrefill); err != nil {
		t.Fatal(err)
	}
	if eps := rl.last(); len(eps) != 1 || eps[0].Name != p.Addr() {
		t.Fatalf("the switching engine is still routed to: %+v", eps)
	}
	if err := a.Switch(context.Background(), d.Addr(), fleet.RolePrefill); err == nil {
		t.Error("a second switch of the same engine was accepted")
	}
	waitUntil(t, "the switch to finish", func() bool { return !instance(t, a, d.Addr()).Switching })
	if in := instance(t, a, d.Addr()); in.Role != fleet.RolePrefill {
		t.Fatalf("after: %+v", in)
	}
	if st := d.RoleStatus(); st.Role != fleet.RolePrefill || st.State != "serving" {
		t.Fatalf("engine: %+v", st)
	}
	eps := rl.last()
	if len(eps) != 2 || eps[0].Role != fleet.RolePrefill || eps[1].Role != fleet.RolePrefill {
		t.Fatalf("router after the switch: %+v", eps)
	}
}

// TestEngineActuatorFollowsTheFleet: with Fleet, the engines the
// actuator manages are the fleet's now (a gateway's discovered engines):
// one that joins is reported and can be switched, one that leaves is not
// reported, and an engine it switched keeps its new role whatever the
// fleet lists.
func TestEngineActuatorFollowsTheFleet(t *testing.T) {
	p, d, d2 := startEngine(t, fleet.RolePrefill), startEngine(t, fleet.RoleDecode), startEngine(t, fleet.RoleDecode)
	var mu sync.Mutex
	fl := []fleet.Endpoint{endpointOf(p, fleet.RolePrefill), endpointOf(d, fleet.RoleDecode)}
	a, err := NewEngineActuator(nil, EngineOptions{Router: &routerLog{}, Logger: quiet(), Fleet: func() []fleet.Endpoint {
		mu.Lock()
		defer mu.Unlock()
		return append([]fleet.Endpoint(nil), fl...)
	}})
	if err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		inst, err := a.Instances(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, in := range inst {
			out = append(out, in.Name+"="+in.Role.String())
		}
		return out
	}
	if got := names(); len(got) != 2 {
		t.Fatalf("instances %v", got)
	}
	mu.Lock()
	fl = append(fl, endpointOf(d2, fleet.RoleDecode))
	mu.Unlock()
	if got := names(); len(got) != 3 || got[2] != d2.Addr()+"=decode" {
		t.Fatalf("a joining engine: instances %v", got)
	}
	if err := a.Switch(context.Background(), d2.Addr(), fleet.RolePrefill); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the switch to finish", func() bool { return !instance(t, a, d2.Addr()).Switching })
	if in := instance(t, a, d2.Addr()); in.Role != fleet.RolePrefill {
		t.Fatalf("the fleet's listed role undid the switch: %+v", in)
	}
	mu.Lock()
	fl = fl[:2]
	mu.Unlock()
	if got := names(); len(got) != 2 {
		t.Fatalf("a leaving engine is still managed: %v", got)
	}
}

// TestEngineActuatorRestoresOnFailure: an engine that refuses the switch
// goes back into the router as it was.
func TestEngineActuatorRestoresOnFailure(t *testing.T) {
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			http.Error(w, `{"error":{"message":"no"}}`, http.StatusConflict)
			return
		}
		io.WriteString(w, `{"role":"decode","state":"serving","in_flight":0}`)
	}))
	defer refuse.Close()
	rl := &routerLog{}
	ep := fleet.Endpoint{Name: "e", URL: refuse.URL, Model: testModel, Role: fleet.RoleDecode}
	a, err := NewEngineActuator([]fleet.Endpoint{ep}, EngineOptions{Router: rl, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Switch(context.Background(), "e", fleet.RolePrefill); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("want the engine's refusal, got %v", err)
	}
	if eps := rl.last(); len(eps) != 1 || eps[0].Role != fleet.RoleDecode {
		t.Fatalf("not restored: %+v", eps)
	}
	if in := instance(t, a, "e"); in.Switching {
		t.Fatalf("still switching: %+v", in)
	}
	for _, bad := range []struct {
		name string
		to   fleet.Role
	}{{"e", fleet.RoleBoth}, {"e", fleet.RoleDecode}, {"nope", fleet.RolePrefill}} {
		if err := a.Switch(context.Background(), bad.name, bad.to); err == nil {
			t.Errorf("switch %s to %s accepted", bad.name, bad.to)
		}
	}
	if _, err := NewEngineActuator([]fleet.Endpoint{{Name: "x", Model: "m"}}, EngineOptions{}); err == nil {
		t.Error("an endpoint without a url was accepted")
	}
	if _, err := NewEngineActuator([]fleet.Endpoint{{Name: "x", URL: "http://x:1", Model: "m", DPSize: 2}}, EngineOptions{}); err == nil || !strings.Contains(err.Error(), "data-parallel rank") {
		t.Errorf("an engine of data-parallel ranks: %v", err)
	}
	if _, err := NewEngineActuator(nil, EngineOptions{Grace: -time.Second}); err == nil {
		t.Error("a negative grace was accepted")
	}
}

// scriptedEngine answers /admin/role with the status its test sets, and
// takes a POST as a switch started (warming up to the role asked).
type scriptedEngine struct {
	mu sync.Mutex
	st string // GET /admin/role's body
}

func (e *scriptedEngine) set(st string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.st = st
}

func (e *scriptedEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.Method == http.MethodPost {
		var body struct{ Role string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		e.st = `{"role":"decode","state":"warming_up","target_role":"` + body.Role + `"}`
		w.WriteHeader(http.StatusAccepted)
		return
	}
	io.WriteString(w, e.st)
}

// TestEngineActuatorWhatTheEnginesSay (walkthrough, 2026-12-04): an engine
// that does not answer is planned without (one dead engine failed every
// step); a switch whose engine comes back serving its old role (killed
// mid-switch and restarted) ends, failed, with the engine back in routing
// (it stayed "switching" for ever, out of routing); an engine switched by
// someone else is routed in the role it serves (the router kept the old
// one and clients got 400s), and out of routing while it switches.
func TestEngineActuatorWhatTheEnginesSay(t *testing.T) {
	se := &scriptedEngine{st: `{"role":"decode","state":"serving"}`}
	srv := httptest.NewServer(se)
	defer srv.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	rl := &routerLog{}
	a, err := NewEngineActuator([]fleet.Endpoint{
		{Name: "e", URL: srv.URL, Model: testModel, Role: fleet.RoleDecode},
		{Name: "dead", URL: dead.URL, Model: testModel, Role: fleet.RolePrefill},
	}, EngineOptions{Router: rl, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	// A dead engine is planned as it last served for unreadableGrace
	// reads (a blip of its admin port made the planner move another
	// engine to stand in for it), then left out.
	for read := 1; read <= unreadableGrace+1; read++ {
		inst, err := a.Instances(context.Background())
		want := 2
		if read > unreadableGrace {
			want = 1
		}
		if err != nil || len(inst) != want || inst[0].Name != "e" || want == 2 && (inst[1].Role != fleet.RolePrefill || inst[1].Switching) {
			t.Fatalf("read %d of a dead engine beside a live one: %+v, %v; want %d instances", read, inst, err, want)
		}
	}
	routed := func() map[string]fleet.Role {
		m := map[string]fleet.Role{}
		for _, e := range rl.last() {
			m[e.Name] = e.Role
		}
		return m
	}

	if err := a.Switch(context.Background(), "e", fleet.RolePrefill); err != nil {
		t.Fatal(err)
	}
	if in := instance(t, a, "e"); !in.Switching || in.Target != fleet.RolePrefill {
		t.Fatalf("switching: %+v", in)
	}
	se.set(`{"role":"decode","state":"serving"}`) // restarted in its old role
	if in := instance(t, a, "e"); in.Switching || in.Role != fleet.RoleDecode {
		t.Fatalf("back in its old role: %+v", in)
	}
	if r, ok := routed()["e"]; !ok || r != fleet.RoleDecode || a.TakeFailures() != 1 || a.TakeFailures() != 0 {
		t.Fatalf("undone switch: routed %v, want e as decode and one failure taken once", routed())
	}

	se.set(`{"role":"prefill","state":"serving"}`) // switched by someone else
	if in := instance(t, a, "e"); in.Role != fleet.RolePrefill {
		t.Fatalf("switched by someone else: %+v", in)
	}
	if r := routed()["e"]; r != fleet.RolePrefill {
		t.Fatalf("routed %v, want e as prefill", routed())
	}
	se.set(`{"role":"prefill","state":"draining","target_role":"decode"}`)
	if in := instance(t, a, "e"); !in.Switching || in.Target != fleet.RoleDecode {
		t.Fatalf("switching on someone else's word: %+v", in)
	}
	if _, ok := routed()["e"]; ok {
		t.Fatalf("routed %v while it switches", routed())
	}
	se.set(`{"role":"decode","state":"serving"}`)
	if in := instance(t, a, "e"); in.Switching || routed()["e"] != fleet.RoleDecode || a.TakeFailures() != 0 {
		t.Fatalf("after someone else's switch: %+v, routed %v", in, routed())
	}
	// Two quick switches by hand, the second seen before the first was:
	// no failure of the planner's (one was counted).
	se.set(`{"role":"decode","state":"warming_up","target_role":"prefill"}`)
	instance(t, a, "e")
	se.set(`{"role":"prefill","state":"draining","target_role":"decode"}`)
	instance(t, a, "e")
	se.set(`{"role":"decode","state":"serving"}`)
	if in := instance(t, a, "e"); in.Switching || routed()["e"] != fleet.RoleDecode || a.TakeFailures() != 0 {
		t.Fatalf("after two switches by hand: %+v, routed %v, want decode and no failure", in, routed())
	}
	// A state it cannot understand (no target) is an unreadable role, not
	// a switch in flight for ever (it froze every decision).
	se.set(`{"role":"prefill","state":"ready"}`)
	if in := instance(t, a, "e"); in.Switching || in.Role != fleet.RoleDecode {
		t.Fatalf("a state without a target: %+v, want e as it last served", in)
	}

	a2, err := NewEngineActuator([]fleet.Endpoint{{Name: "dead", URL: dead.URL, Model: testModel, Role: fleet.RolePrefill}}, EngineOptions{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	for range unreadableGrace {
		if inst, err := a2.Instances(context.Background()); err != nil || len(inst) != 1 {
			t.Fatalf("within its grace: %+v, %v", inst, err)
		}
	}
	if _, err := a2.Instances(context.Background()); err == nil {
		t.Error("no engine answered, and no error")
	}
	// Such a step is counted (nothing but the status's error said so).
	p, err := New(Config{Total: 2, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	src := &shapeSource{shape: func(float64) Shape { return SeedPhases()[0].Shape }, rng: rand.New(rand.NewPCG(1, 1))}
	l, err := NewLoop(LoopConfig{Planner: p, Source: src, Actuator: a2, Name: "engine"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Step(context.Background()); err == nil || l.Status().StepErrors != 1 {
		t.Errorf("a step with no engine: %v, %d step errors", err, l.Status().StepErrors)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(l))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "kvgate_planner_step_errors_total" {
			found = mf.GetMetric()[0].GetCounter().GetValue() == 1
		}
	}
	if !found {
		t.Error("kvgate_planner_step_errors_total is not 1")
	}
}

// scriptedFleet is an actuator over one scripted engine "e", serving
// decode, configured in role, and the log of what it tells its router.
func scriptedFleet(t *testing.T, role fleet.Role) (*scriptedEngine, *routerLog, *EngineActuator) {
	t.Helper()
	se := &scriptedEngine{st: `{"role":"decode","state":"serving"}`}
	srv := httptest.NewServer(se)
	t.Cleanup(srv.Close)
	rl := &routerLog{}
	a, err := NewEngineActuator([]fleet.Endpoint{{Name: "e", URL: srv.URL, Model: testModel, Role: role}}, EngineOptions{Router: rl, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return se, rl, a
}

// TestEngineActuatorWatchesTheSwitch: an engine that finishes its switch
// is back in the router at once, not at the next planner step (an
// interval later: the only decode engine sat idle and clients got 503s;
// walkthrough, 2026-12-04).
func TestEngineActuatorWatchesTheSwitch(t *testing.T) {
	se, rl, a := scriptedFleet(t, fleet.RoleDecode)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := a.Switch(ctx, "e", fleet.RolePrefill); err != nil {
		t.Fatal(err)
	}
	if eps := rl.last(); len(eps) != 0 {
		t.Fatalf("routed while switching: %+v", eps)
	}
	se.set(`{"role":"prefill","state":"serving"}`)
	waitUntil(t, "the switched engine back in the router", func() bool {
		eps := rl.last()
		return len(eps) == 1 && eps[0].Role == fleet.RolePrefill
	})
	if in := instance(t, a, "e"); in.Switching || in.Role != fleet.RolePrefill || a.TakeFailures() != 0 {
		t.Errorf("after the switch: %+v", in)
	}
}

// TestLoopReadsTheFleetAtStart: a restarted gateway's planner routed its
// engines in their configured roles for its first interval (a decode
// engine configured as prefill got prefill legs, one warning each); the
// loop reads the fleet at once, so the engine is routed as it serves
// before the first decision. A step that cannot read the fleet shows no
// fleet, not the last one read; an undone switch is not counted moved
// (walkthrough, 2026-12-04).
func TestLoopReadsTheFleetAtStart(t *testing.T) {
	_, rl, a := scriptedFleet(t, fleet.RolePrefill)
	p, err := New(Config{Total: 2, Interval: 3600, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	src := &shapeSource{shape: func(float64) Shape { return SeedPhases()[0].Shape }, rng: rand.New(rand.NewPCG(1, 1))}
	l, err := NewLoop(LoopConfig{Planner: p, Source: src, Actuator: a, Name: "engine"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	waitUntil(t, "the engine routed as it serves", func() bool {
		eps := rl.last()
		return len(eps) == 1 && eps[0].Role == fleet.RoleDecode
	})
	if st := l.Status(); st.Decode != 1 || len(st.Instances) != 1 {
		t.Errorf("status before the first step: %+v", st)
	}
	cancel()
	<-done
	l.fail(errors.New("no engine"))
	l.mu.Lock()
	l.status.Switched = 1
	l.mu.Unlock()
	l.undone(1)
	if st := l.Status(); len(st.Instances) != 0 || st.Decode != 0 || st.Switched != 0 || st.Failed != 1 {
		t.Errorf("after a failed step and an undone switch: %+v", st)
	}
}

// TestKubeActuatorRelabelsPods: the pod's role label becomes "switching"
// with the target in an annotation, the engine switches, and the label
// then says its new role.
func TestKubeActuatorRelabelsPods(t *testing.T) {
	e := startEngine(t, fleet.RoleDecode)
	_, port, _ := strings.Cut(e.Addr(), ":")
	running := corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}
	client := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vllm-0", Namespace: "llm", Labels: map[string]string{"app": "vllm", "kvgate.io/role": "decode"}}, Status: running},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vllm-1", Namespace: "llm", Labels: map[string]string{"app": "vllm", "kvgate.io/role": "prefill"}}, Status: corev1.PodStatus{Phase: corev1.PodPending}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "llm", Labels: map[string]string{"app": "web"}}, Status: running},
	)
	var portN int
	for _, c := range port {
		portN = portN*10 + int(c-'0')
	}
	a, err := NewKubeActuator(client, KubeConfig{Namespace: "llm", Selector: "app=vllm", Port: portN, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := a.Instances(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inst) != 1 || inst[0].Name != "vllm-0" || inst[0].Role != fleet.RoleDecode || inst[0].Switching {
		t.Fatalf("instances: %+v", inst)
	}
	if err := a.Switch(context.Background(), "vllm-0", fleet.RolePrefill); err != nil {
		t.Fatal(err)
	}
	pod := func() *corev1.Pod {
		p, err := client.CoreV1().Pods("llm").Get(context.Background(), "vllm-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := pod(); p.Labels["kvgate.io/role"] != RoleSwitching || p.Annotations[AnnotationTargetRole] != "prefill" || p.Annotations[AnnotationPreviousRole] != "decode" {
		t.Fatalf("while switching: labels %v annotations %v", p.Labels, p.Annotations)
	}
	if err := a.Switch(context.Background(), "vllm-0", fleet.RolePrefill); err == nil {
		t.Error("a second switch was accepted")
	}
	waitUntil(t, "the pod to serve as prefill", func() bool { return !instance(t, a, "vllm-0").Switching })
	if p := pod(); p.Labels["kvgate.io/role"] != "prefill" || p.Annotations[AnnotationTargetRole] != "" {
		t.Fatalf("after: labels %v annotations %v", p.Labels, p.Annotations)
	}
	if in := instance(t, a, "vllm-0"); in.Role != fleet.RolePrefill {
		t.Fatalf("instance after: %+v", in)
	}
	if err := a.Switch(context.Background(), "missing", fleet.RoleDecode); err == nil {
		t.Error("switching a missing pod was accepted")
	}
	for _, bad := range []KubeConfig{{Namespace: "Bad_NS", Selector: "a=b", Port: 1}, {Namespace: "ns", Port: 1},
		{Namespace: "ns", Selector: "a=b"}, {Namespace: "ns", Selector: "a=b", Port: 1, Scheme: "ftp"}} {
		if _, err := NewKubeActuator(client, bad); err == nil {
			t.Errorf("config %+v accepted", bad)
		}
	}
}

// TestKubeActuatorRestoresLabelOnFailure: an engine that cannot be reached
// leaves its pod labelled as before.
func TestKubeActuatorRestoresLabelOnFailure(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	_, port, _ := strings.Cut(strings.TrimPrefix(dead.URL, "http://"), ":")
	dead.Close()
	portN := 0
	for _, c := range port {
		portN = portN*10 + int(c-'0')
	}
	client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "llm", Labels: map[string]string{"app": "vllm", "kvgate.io/role": "decode"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1"}})
	a, err := NewKubeActuator(client, KubeConfig{Namespace: "llm", Selector: "app=vllm", Port: portN, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Switch(context.Background(), "p", fleet.RolePrefill); err == nil {
		t.Fatal("switch of an unreachable engine succeeded")
	}
	p, _ := client.CoreV1().Pods("llm").Get(context.Background(), "p", metav1.GetOptions{})
	if p.Labels["kvgate.io/role"] != "decode" || len(p.Annotations) != 0 {
		t.Fatalf("not restored: labels %v annotations %v", p.Labels, p.Annotations)
	}
}

func TestDryRun(t *testing.T) {
	d := NewDryRun(nil, []Instance{{Name: "a", Role: fleet.RolePrefill}, {Name: "b", Role: fleet.RoleDecode}}, quiet())
	if err := d.Switch(context.Background(), "b", fleet.RolePrefill); err != nil {
		t.Fatal(err)
	}
	if in := instance(t, d, "b"); in.Role != fleet.RolePrefill {
		t.Fatalf("virtual fleet not updated: %+v", in)
	}
	if err := d.Switch(context.Background(), "zz", fleet.RolePrefill); err == nil {
		t.Error("unknown instance accepted")
	}
	// Over a real fleet it never switches.
	src := newFakeFleet(1, 1, 10)
	over := NewDryRun(src, nil, quiet())
	if err := over.Switch(context.Background(), "e01", fleet.RolePrefill); !errors.Is(err, errNotMoved) || src.switches != 0 {
		t.Fatalf("dry run switched the real fleet: %v %d", err, src.switches)
	}
	if d.Switches() != 2 || over.Switches() != 1 {
		t.Errorf("counts %d %d", d.Switches(), over.Switches())
	}
}

// stepChangeLoop is a loop over act for 24 instances whose load changes
// from the seed's first phase to its second at 300 s, on f's clock.
func stepChangeLoop(t *testing.T, f *fakeFleet, act Actuator, name string) *Loop {
	t.Helper()
	phases := SeedPhases()
	src := &shapeSource{shape: func(t float64) Shape {
		if t < 300 {
			return phases[0].Shape
		}
		return phases[1].Shape
	}, rng: rand.New(rand.NewPCG(1, 1))}
	p, err := New(Config{Total: 24, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLoop(LoopConfig{Planner: p, Source: src, Actuator: act, Name: name, Clock: func() float64 { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestDryRunLoopMovesNothing: a dry run over a real fleet decides switches
// but counts none moved (kvgate_planner_switched_instances_total climbed
// while nothing moved: walkthrough, 2026-12-04), and none failed; the
// status's lists are [] before the first step, not null.
func TestDryRunLoopMovesNothing(t *testing.T) {
	f := newFakeFleet(5, 19, 40)
	l := stepChangeLoop(t, f, NewDryRun(f, nil, quiet()), "dry-run")
	if b, _ := json.Marshal(l.Status()); !strings.Contains(string(b), `"instances":[]`) || !strings.Contains(string(b), `"switches":[]`) {
		t.Errorf("a fresh status: %s", b)
	}
	for f.now = 30; f.now <= 900; f.now += 30 {
		if _, err := l.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if st := l.Status(); st.Changes == 0 || st.Switched != 0 || st.Failed != 0 || f.switches != 0 {
		t.Fatalf("dry run: %d changes, %d switched, %d failed, the fleet switched %d; want changes, 0, 0, 0", st.Changes, st.Switched, st.Failed, f.switches)
	}
}

// TestLoopStatusHandlerAndMetrics runs a loop through a step change and
// checks what /admin/planner and /metrics would show.
func TestLoopStatusHandlerAndMetrics(t *testing.T) {
	f := newFakeFleet(5, 19, 40)
	l := stepChangeLoop(t, f, f, "fake")
	for f.now = 30; f.now <= 900; f.now += 30 {
		if _, err := l.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	st := l.Status()
	if st.Actuator != "fake" || st.Changes == 0 || st.Switched != f.switches || len(st.Switches) != st.Changes || st.Last == nil {
		t.Fatalf("status %+v (fleet switched %d)", st, f.switches)
	}
	if st.Prefill < 19 || st.Prefill+st.Decode+st.Switching != 24 {
		t.Errorf("split %dP%dD", st.Prefill, st.Decode)
	}
	rec := httptest.NewRecorder()
	l.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/planner", nil))
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || rec.Code != 200 {
		t.Fatalf("handler: %d %v %s", rec.Code, err, rec.Body)
	}
	for _, k := range []string{"prefill", "decode", "target_prefill", "switches", "last", "instances", "actions"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("/admin/planner lacks %q", k)
		}
	}
	rec = httptest.NewRecorder()
	l.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/admin/planner", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", rec.Code)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(l))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, lp := range m.GetLabel() {
				key += "," + lp.GetName() + "=" + lp.GetValue()
			}
			if c := m.GetCounter(); c != nil {
				got[key] = c.GetValue()
			} else {
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	for key, want := range map[string]float64{
		"kvgate_planner_changes_total":                           float64(st.Changes),
		"kvgate_planner_switched_instances_total":                float64(st.Switched),
		"kvgate_planner_instances,role=prefill,state=serving":    float64(st.Prefill),
		"kvgate_planner_target_instances,role=decode":            float64(st.TargetDecode),
		"kvgate_planner_decisions_total,action=switch":           float64(st.Actions[ActionSwitch]),
		"kvgate_planner_capacity_tokens_per_second,role=prefill": 20000,
	} {
		if got[key] != want {
			t.Errorf("%s = %v, want %v", key, got[key], want)
		}
	}
}

func TestRecorder(t *testing.T) {
	r, err := NewRecorder(100, 4)
	if err != nil {
		t.Fatal(err)
	}
	r.Arrived(Arrival{At: 1, PromptTokens: 100, CachedTokens: 40, OutputTokens: 10})
	r.Arrived(Arrival{At: 2, PromptTokens: 100, CachedTokens: 500, OutputTokens: 10, RejectedPrefill: true})
	r.Arrived(Arrival{At: 50, PromptTokens: 1000, OutputTokens: 1, RejectedDecode: true})
	r.Completed(Completion{At: 3, TTFT: 0.5, TPOT: 0.02})
	r.Completed(Completion{At: 4, TTFT: 3, TPOT: 0.1, TTFTMiss: true, TPOTMiss: true})
	o, _ := r.Observe(context.Background(), 10, 10, 0)
	if o.Requests != 2 || o.PromptTokens != 200 || o.CachedTokens != 140 || o.OutputTokens != 20 || o.RejectedPrefill != 1 ||
		o.Finished != 2 || o.TTFTMiss != 1 || o.TPOTMiss != 1 || o.MeanTTFT != 1.75 {
		t.Fatalf("observation %+v", o)
	}
	if s := o.Shape(); s.Rate != 0.2 || s.ISL != 100 || s.Hit != 0.7 {
		t.Errorf("shape %+v", s)
	}
	// Answers whose output was counted: the output they had, not the
	// max_tokens the requests planned, sizes the decode load.
	m, _ := NewRecorder(100, 16)
	for i := range 4 {
		m.Arrived(Arrival{At: float64(i), PromptTokens: 100, OutputTokens: 4096})
	}
	m.Completed(Completion{At: 5, TTFT: 0.1, TPOT: 0.01, OutputTokens: 300})
	m.Completed(Completion{At: 6, TTFT: 0.1, TPOT: 0.01, OutputTokens: 500})
	m.Completed(Completion{At: 7, TTFT: 0.1, TPOT: 0.01}) // not counted
	if o, _ := m.Observe(context.Background(), 10, 10, 0); o.OutputTokens != 1600 || o.Shape().OSL != 400 {
		t.Errorf("measured output: %d tokens, OSL %v; want 4 × 400", o.OutputTokens, o.Shape().OSL)
	}
	// A non-streamed answer counts its output, and nothing of latency:
	// no finished request, no TTFT in the mean.
	m.Completed(Completion{At: 8, OutputTokens: 100, Untimed: true})
	if o, _ := m.Observe(context.Background(), 10, 10, 0); o.OutputTokens != 1200 || o.Finished != 3 || math.Abs(o.MeanTTFT-0.1) > 1e-12 {
		t.Errorf("with an untimed answer of 100: %d tokens (want 4 × 300), %d finished (want 3), mean TTFT %v (want 0.1)", o.OutputTokens, o.Finished, o.MeanTTFT)
	}
	// Samples older than keep go; at most 4 are kept.
	r.Arrived(Arrival{At: 200, PromptTokens: 1})
	if o, _ := r.Observe(context.Background(), 201, 201, 0); o.Requests != 1 {
		t.Errorf("old samples kept: %+v", o)
	}
	for i := range 10 {
		r.Arrived(Arrival{At: 201 + float64(i), PromptTokens: 1})
	}
	if o, _ := r.Observe(context.Background(), 300, 100, 0); o.Requests != 4 {
		t.Errorf("cap not applied: %d", o.Requests)
	}
	if _, err := NewRecorder(0, 1); err == nil {
		t.Error("keep 0 accepted")
	}
}
