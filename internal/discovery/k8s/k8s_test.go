package k8s

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvgate/kvgate/internal/discovery/discoverytest"
	"github.com/kvgate/kvgate/internal/fleet"
)

type podOpt func(*corev1.Pod)

func newPod(ns, name, ip string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "vllm"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: 8000}, {Name: "kv-events", ContainerPort: 5557},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
		}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func label(k, v string) podOpt { return func(p *corev1.Pod) { p.Labels[k] = v } }
func annotation(k, v string) podOpt {
	return func(p *corev1.Pod) { metav1.SetMetaDataAnnotation(&p.ObjectMeta, k, v) }
}
func notReady(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestEndpointFromPod(t *testing.T) {
	base := Config{Namespace: "ns", Selector: "app=vllm", Port: 8000, Logger: quiet()}
	now := metav1.Now()
	tests := []struct {
		name    string
		cfg     func(*Config)
		pod     *corev1.Pod
		want    fleet.Endpoint
		serving bool
		err     string
	}{
		{name: "defaults", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m1")), serving: true,
			want: fleet.Endpoint{Name: "10.0.0.1:8000", URL: "http://10.0.0.1:8000", Model: "m1"}},
		{name: "role, model annotation wins, pod name, named ports, https",
			cfg: func(c *Config) {
				c.Port, c.PortName, c.EventsPortName, c.NameFromPod, c.Scheme = 0, "http", "kv-events", true, "https"
			},
			pod: newPod("ns", "p", "10.0.0.2", label(DefaultRoleLabel, "prefill"), label(DefaultModelLabel, "short"),
				annotation(DefaultModelLabel, "meta-llama/Llama-3.1-8B-Instruct")), serving: true,
			want: fleet.Endpoint{Name: "p", URL: "https://10.0.0.2:8000", Model: "meta-llama/Llama-3.1-8B-Instruct",
				Role: fleet.RolePrefill, Events: "tcp://10.0.0.2:5557"}},
		{name: "fixed model, events annotation over events port, IPv6",
			cfg: func(c *Config) { c.Model, c.EventsPort = "fixed", 6000 },
			pod: newPod("ns", "p", "fd00::7", label(DefaultRoleLabel, "decode"), annotation(DefaultEventsAnnotation, "5600")), serving: true,
			want: fleet.Endpoint{Name: "[fd00::7]:8000", URL: "http://[fd00::7]:8000", Model: "fixed", Role: fleet.RoleDecode, Events: "tcp://[fd00::7]:5600"}},
		{name: "custom keys", cfg: func(c *Config) { c.RoleLabel, c.ModelLabel = "example.com/r", "example.com/m" },
			pod: newPod("ns", "p", "10.0.0.3", label("example.com/r", "both"), label("example.com/m", "x")), serving: true,
			want: fleet.Endpoint{Name: "10.0.0.3:8000", URL: "http://10.0.0.3:8000", Model: "x"}},
		{name: "not ready", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), notReady)},
		{name: "no ready condition", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), func(p *corev1.Pod) { p.Status.Conditions = nil })},
		{name: "pending", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending })},
		{name: "no IP", pod: newPod("ns", "p", "", label(DefaultModelLabel, "m"))},
		{name: "terminating", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), func(p *corev1.Pod) { p.DeletionTimestamp = &now })},
		{name: "bad role", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), label(DefaultRoleLabel, "leader")), serving: true, err: `unknown role "leader"`},
		{name: "no model", pod: newPod("ns", "p", "10.0.0.1"), serving: true, err: "no model"},
		{name: "no named port", cfg: func(c *Config) { c.Port, c.PortName = 0, "grpc" }, pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m")), serving: true, err: `no container port named "grpc"`},
		{name: "bad events annotation", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), annotation(DefaultEventsAnnotation, "99999")), serving: true, err: "not a port number"},
		{name: "data-parallel ranks, SGLang bootstrap port",
			pod: newPod("ns", "p", "10.0.0.4", label(DefaultModelLabel, "m"), label(DefaultRoleLabel, "prefill"),
				annotation(DPSizeAnnotation, "4"), annotation(BootstrapPortAnnotation, "8998")), serving: true,
			want: fleet.Endpoint{Name: "10.0.0.4:8000", URL: "http://10.0.0.4:8000", Model: "m", Role: fleet.RolePrefill, DPSize: 4, BootstrapPort: 8998}},
		{name: "bad dp-size annotation", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), annotation(DPSizeAnnotation, "four")), serving: true, err: "not an integer"},
		{name: "dp-size out of range", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), annotation(DPSizeAnnotation, "5000")), serving: true, err: "dp_size (annotation kvgate.io/dp-size) must be in"},
		{name: "bootstrap port on a decode pod", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), label(DefaultRoleLabel, "decode"), annotation(BootstrapPortAnnotation, "8998")), serving: true, err: "role=prefill"},
		{name: "LoRA adapters", pod: newPod("ns", "p", "10.0.0.5", label(DefaultModelLabel, "m"), annotation(LoRAAnnotation, "sql, chat")), serving: true,
			want: fleet.Endpoint{Name: "10.0.0.5:8000", URL: "http://10.0.0.5:8000", Model: "m", LoRA: []string{"sql", "chat"}}},
		{name: "an empty adapter name", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), annotation(LoRAAnnotation, "sql,,chat")), serving: true, err: "an adapter's name must be"},
		{name: "no named events port", cfg: func(c *Config) { c.EventsPortName = "zmq" }, pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m")), serving: true, err: `"zmq" (events)`},
		// A replay port, so that a gateway started in front of warm pods
		// indexes what they hold (walkthrough, 2026-12-04).
		{name: "replay port", pod: newPod("ns", "p", "10.0.0.6", label(DefaultModelLabel, "m"), annotation(DefaultEventsAnnotation, "5557"), annotation(ReplayAnnotation, "5558")), serving: true,
			want: fleet.Endpoint{Name: "10.0.0.6:8000", URL: "http://10.0.0.6:8000", Model: "m", Events: "tcp://10.0.0.6:5557", Replay: "tcp://10.0.0.6:5558"}},
		{name: "bad replay port", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), annotation(DefaultEventsAnnotation, "5557"), annotation(ReplayAnnotation, "x")), serving: true, err: "kvgate.io/replay-port=\"x\" is not a port number"},
		{name: "replay without events", pod: newPod("ns", "p", "10.0.0.1", label(DefaultModelLabel, "m"), annotation(ReplayAnnotation, "5558")), serving: true, err: "a replay port without a KV-event port"},
	}
	for _, tt := range tests {
		cfg := base
		if tt.cfg != nil {
			tt.cfg(&cfg)
		}
		s, err := New(fake.NewClientset(), cfg)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got, serving, err := s.endpoint(tt.pod)
		if serving != tt.serving {
			t.Errorf("%s: serving %v", tt.name, serving)
		}
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil || (serving && !got.Equal(tt.want)) {
			t.Errorf("%s:\n got %+v %v\nwant %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	ok := Config{Namespace: "ns", Selector: "app=vllm", Port: 8000}
	for _, tt := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.Namespace = "" }, "namespace is required"},
		{func(c *Config) { c.Namespace = "Bad_NS" }, "namespace"},
		{func(c *Config) { c.Selector = "" }, "selector is required"},
		{func(c *Config) { c.Selector = "app in (" }, "selector"},
		{func(c *Config) { c.Port = 0 }, "one of port and port_name"},
		{func(c *Config) { c.PortName = "http" }, "one of port and port_name"},
		{func(c *Config) { c.Port = 70000 }, "port 70000 out of range"},
		{func(c *Config) { c.EventsPort, c.EventsPortName = 5557, "kv" }, "at most one of events_port"},
		{func(c *Config) { c.Scheme = "ftp" }, "scheme"},
		{func(c *Config) { c.RoleLabel = "bad label!" }, "role_label"},
		{func(c *Config) { c.Debounce = time.Hour }, "debounce"},
		{func(c *Config) { c.Resync = -time.Second }, "resync"},
	} {
		cfg := ok
		tt.mut(&cfg)
		if _, err := New(fake.NewClientset(), cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: error %v, want %q", cfg, err, tt.want)
		}
	}
	if _, err := New(nil, ok); err == nil {
		t.Error("nil client accepted")
	}
}

// TestFollowsPods drives a fake API server through the life of a fleet:
// pods appear, become ready, change role, get deleted.
func TestFollowsPods(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(
		newPod("llm", "a", "10.0.0.1", label(DefaultModelLabel, "m"), label(DefaultRoleLabel, "prefill")),
		newPod("llm", "other-app", "10.0.0.9", label("app", "web"), label(DefaultModelLabel, "m")),
		newPod("elsewhere", "x", "10.0.1.1", label(DefaultModelLabel, "m")),
	)
	logs, want := followPods(t, client)
	pods := client.CoreV1().Pods("llm")
	want("start", "a/prefill")

	// A pod that is not ready yet is not an endpoint; the next change
	// shows it was never added.
	if _, err := pods.Create(ctx, newPod("llm", "b", "10.0.0.2", label(DefaultModelLabel, "m"), notReady), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, newPod("llm", "c", "10.0.0.3", label(DefaultModelLabel, "m"), label(DefaultRoleLabel, "decode")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("c appears", "a/prefill c/decode")

	// b becomes ready.
	b, err := pods.Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Status.Conditions[0].Status = corev1.ConditionTrue
	if _, err := pods.UpdateStatus(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("b ready", "a/prefill b/both c/decode")

	// a changes role.
	a, err := pods.Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Labels[DefaultRoleLabel] = "decode"
	if _, err := pods.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a decode", "a/decode b/both c/decode")

	// A bad role label takes b out, logged once.
	b, _ = pods.Get(ctx, "b", metav1.GetOptions{})
	b.Labels[DefaultRoleLabel] = "boss"
	if _, err := pods.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("b bad role", "a/decode c/decode")
	if n := logs.Count(`unknown role \"boss\"`); n != 1 {
		t.Fatalf("bad role logged %d times:\n%s", n, logs.String())
	}

	// c leaves the selector; a is deleted.
	c, _ := pods.Get(ctx, "c", metav1.GetOptions{})
	c.Labels["app"] = "retired"
	if _, err := pods.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("c unselected", "a/decode")
	if err := pods.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a deleted", "")
}

func TestRunListError(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf(`pods is forbidden: User "system:serviceaccount:llm:default" cannot list resource "pods"`)
	})
	src, err := New(client, Config{Namespace: "llm", Selector: "app=vllm", Port: 8000, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	err = src.Run(context.Background(), func([]fleet.Endpoint) { t.Error("update without a list") })
	if err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("error %v", err)
	}
}

// TestPodThatBreaksTheFleetIsSkipped: a pod that makes the list invalid
// as a whole (its model is another pod's LoRA adapter) is skipped and
// logged once, and later pods still come and go (before, every list
// after it was refused by the gateway: deleted pods stayed routed, new
// ones never came).
func TestPodThatBreaksTheFleetIsSkipped(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(newPod("llm", "a", "10.0.0.1", label(DefaultModelLabel, "m"), annotation(LoRAAnnotation, "x")))
	logs, want := followPods(t, client)
	want("start", "a/both")
	pods := client.CoreV1().Pods("llm")
	if _, err := pods.Create(ctx, newPod("llm", "b", "10.0.0.2", label(DefaultModelLabel, "x")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(ctx, newPod("llm", "c", "10.0.0.3", label(DefaultModelLabel, "m")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("b clashes, c joins", "a/both c/both")
	if err := pods.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a deleted: b is valid now", "b/both c/both")
	if n := logs.Count(`pod skipped`); n != 1 || logs.Count(`adapter`) != 1 {
		t.Fatalf("the clash logged %d times:\n%s", n, logs.String())
	}
}

// TestAPIOutageIsLogged: the informer's lists and watches that fail are
// logged (client-go retries them silently), at most once per
// watchLogEvery, and the first answer after them too.
func TestAPIOutageIsLogged(t *testing.T) {
	var logs discoverytest.LogSink
	var a apiState
	ctx := context.Background()
	refused := errors.New("connection refused")
	a.result(ctx, logs.Logger(), nil)
	for range 3 {
		a.result(ctx, logs.Logger(), refused)
	}
	a.result(ctx, logs.Logger(), nil)
	if logs.Count("failed; the last list is kept") != 1 || logs.Count("answers again") != 1 || logs.Count("failures=3") != 1 {
		t.Errorf("logs:\n%s", logs.String())
	}
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	a.result(stopped, logs.Logger(), refused) // stopping: not an outage
	if a.failures != 0 {
		t.Errorf("a failure while stopping was counted")
	}
}

// followPods runs a source over client's pods in namespace llm, selector
// app=vllm, named after the pods, and returns its log and want, which
// waits for the next update and compares it as name/role words.
func followPods(t *testing.T, client *fake.Clientset) (*discoverytest.LogSink, func(step, w string)) {
	t.Helper()
	logs := new(discoverytest.LogSink)
	src, err := New(client, Config{Namespace: "llm", Selector: "app=vllm", Port: 8000, NameFromPod: true,
		Debounce: 5 * time.Millisecond, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	updates := discoverytest.Run(t, src)
	return logs, func(step, w string) {
		t.Helper()
		var got []string
		for _, e := range discoverytest.Next(t, updates) {
			got = append(got, e.Name+"/"+e.Role.String())
		}
		if g := strings.Join(got, " "); g != w {
			t.Fatalf("%s: got %q, want %q", step, g, w)
		}
	}
}
