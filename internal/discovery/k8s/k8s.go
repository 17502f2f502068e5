// Package k8s discovers engines as Kubernetes pods: the pods of one
// namespace that match a label selector and are Running, Ready, not
// terminating and have an IP. An informer watches them; every change
// (debounced) recomputes the endpoint list. It is the only package that
// imports client-go.
package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvgate/kvgate/internal/discovery"
	"github.com/kvgate/kvgate/internal/fleet"
)

// Defaults of Config.
const (
	DefaultRoleLabel        = "kvgate.io/role"
	DefaultModelLabel       = "kvgate.io/model"
	DefaultEventsAnnotation = "kvgate.io/events-port"
	// DPSizeAnnotation is a pod's data-parallel ranks behind its one API
	// (fleet.Endpoint.DPSize); BootstrapPortAnnotation a prefill pod's
	// SGLang bootstrap port (fleet.Endpoint.BootstrapPort).
	DPSizeAnnotation        = "kvgate.io/dp-size"
	BootstrapPortAnnotation = "kvgate.io/bootstrap-port"
	// LoRAAnnotation lists the LoRA adapters a pod serves besides its
	// model, comma-separated (fleet.Endpoint.LoRA).
	LoRAAnnotation = "kvgate.io/lora"
	// ReplayAnnotation is a pod's KV-event replay port (vLLM's
	// replay_endpoint): replay=tcp://POD_IP:PORT beside its events, so a
	// gateway started in front of warm pods indexes what they hold (it
	// indexed nothing of it: a walkthrough, 2026-12-04).
	ReplayAnnotation = "kvgate.io/replay-port"
	DefaultDebounce  = 100 * time.Millisecond
)

// Config selects pods and says how to read an endpoint from one.
type Config struct {
	// Namespace and Selector (a label selector, e.g.
	// "app=vllm,tier!=canary") choose the pods; both required.
	Namespace string
	Selector  string
	// RoleLabel holds prefill, decode or both (missing: both). A pod with
	// another value is skipped and logged.
	RoleLabel string
	// ModelLabel names the served model, read from the pod's annotation of
	// that key first (label values cannot hold "/"), then its label; Model
	// applies to pods with neither. A pod without a model is skipped.
	ModelLabel string
	Model      string
	// The HTTP port: Port, or the container port named PortName. One is
	// required. Scheme is http (default) or https.
	Port     int
	PortName string
	Scheme   string
	// The optional KV-event port (events=tcp://POD_IP:PORT): the pod's
	// EventsAnnotation (a port number), else EventsPort, else the
	// container port named EventsPortName. None: no events.
	EventsAnnotation string
	EventsPort       int
	EventsPortName   string
	// NameFromPod names endpoints after their pods; by default they are
	// named IP:port, like every endpoint without a name (and like vLLM's
	// KV-event topic).
	NameFromPod bool
	// Debounce gathers a burst of pod changes (a rollout) into one update,
	// in [1ms, 1m]; 0: DefaultDebounce.
	Debounce time.Duration
	// Resync re-delivers every pod this often (0: never; the watch keeps
	// the list current).
	Resync time.Duration
	// Logger; nil: slog.Default().
	Logger *slog.Logger
}

// Client is the part of a Kubernetes clientset the source needs;
// kubernetes.Interface and client-go's fake clientset satisfy it.
type Client interface {
	CoreV1() corev1client.CoreV1Interface
}

// coreClient is a Client of the core API group alone, so a binary that
// discovers pods does not link every API group's client.
type coreClient struct{ c *corev1client.CoreV1Client }

func (c coreClient) CoreV1() corev1client.CoreV1Interface { return c.c }

// apiState follows the API server's answers to the informer's lists and
// watches: client-go retries a failed one with backoff, keeps the last
// list meanwhile and logs nothing at its default level, so a walkthrough
// stopped the API server for 13 s and kvgate said nothing. The first
// failure is logged, then at most one a watchLogEvery with the count,
// and the first success after them. The informer calls it from one
// goroutine at a time, but a watch and a list may overlap: a mutex.
type apiState struct {
	mu       sync.Mutex
	failures int       // since the last success
	logged   time.Time // the last failure logged
}

// watchLogEvery bounds how often apiState logs failures.
const watchLogEvery = 30 * time.Second

func (a *apiState) result(ctx context.Context, log *slog.Logger, err error) {
	if ctx.Err() != nil {
		return // stopping
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err == nil && a.failures > 0:
		log.Info("kubernetes: the API server answers again", "failures", a.failures)
		a.failures = 0
	case err != nil:
		a.failures++
		if now := time.Now(); now.Sub(a.logged) >= watchLogEvery {
			log.Warn("kubernetes: listing or watching pods failed; the last list is kept and client-go retries", "err", err, "failures", a.failures)
			a.logged = now
		}
	}
}

// NewClient connects to the cluster: in-cluster (the pod's service account)
// when kubeconfig is empty, else from that kubeconfig file.
func NewClient(kubeconfig string) (Client, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return coreClient{c}, nil
}

// Source is the Kubernetes discovery source.
type Source struct {
	client   Client
	cfg      Config
	selector labels.Selector
	log      *slog.Logger
}

// New checks cfg.
func New(client Client, cfg Config) (*Source, error) {
	if client == nil {
		return nil, errors.New("kubernetes: no client")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("kubernetes: namespace is required")
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("kubernetes: namespace %q: %s", cfg.Namespace, errs[0])
	}
	if cfg.Selector == "" {
		return nil, errors.New("kubernetes: selector is required (every pod of the namespace is rarely meant)")
	}
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: selector %q: %w", cfg.Selector, err)
	}
	if cfg.RoleLabel == "" {
		cfg.RoleLabel = DefaultRoleLabel
	}
	if cfg.ModelLabel == "" {
		cfg.ModelLabel = DefaultModelLabel
	}
	if cfg.EventsAnnotation == "" {
		cfg.EventsAnnotation = DefaultEventsAnnotation
	}
	for _, k := range []struct{ field, key string }{{"role_label", cfg.RoleLabel}, {"model_label", cfg.ModelLabel}, {"events_annotation", cfg.EventsAnnotation}} {
		if errs := validation.IsQualifiedName(k.key); len(errs) > 0 {
			return nil, fmt.Errorf("kubernetes: %s %q: %s", k.field, k.key, errs[0])
		}
	}
	if (cfg.Port == 0) == (cfg.PortName == "") {
		return nil, errors.New("kubernetes: give one of port and port_name")
	}
	for _, p := range []struct {
		field string
		v     int
	}{{"port", cfg.Port}, {"events_port", cfg.EventsPort}} {
		if p.v < 0 || p.v > 65535 {
			return nil, fmt.Errorf("kubernetes: %s %d out of range [1, 65535]", p.field, p.v)
		}
	}
	if cfg.EventsPort != 0 && cfg.EventsPortName != "" {
		return nil, errors.New("kubernetes: give at most one of events_port and events_port_name")
	}
	switch cfg.Scheme {
	case "":
		cfg.Scheme = "http"
	case "http", "https":
	default:
		return nil, fmt.Errorf("kubernetes: scheme %q: http or https", cfg.Scheme)
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.Debounce < time.Millisecond || cfg.Debounce > time.Minute {
		return nil, fmt.Errorf("kubernetes: debounce %v out of range [1ms, 1m]", cfg.Debounce)
	}
	if cfg.Resync < 0 {
		return nil, fmt.Errorf("kubernetes: resync %v is negative", cfg.Resync)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("namespace", cfg.Namespace, "selector", cfg.Selector)
	return &Source{client: client, cfg: cfg, selector: sel, log: log}, nil
}

// Run watches the pods until ctx ends. A first list that fails (no access
// to the namespace, say) is an error.
func (s *Source) Run(ctx context.Context, update func([]fleet.Endpoint)) error {
	pods := s.client.CoreV1().Pods(s.cfg.Namespace)
	if _, err := pods.List(ctx, metav1.ListOptions{LabelSelector: s.cfg.Selector, Limit: 1}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kubernetes: list pods in %s: %w", s.cfg.Namespace, err)
	}
	var api apiState
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = s.cfg.Selector
			l, err := pods.List(ctx, o)
			api.result(ctx, s.log, err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = s.cfg.Selector
			w, err := pods.Watch(ctx, o)
			api.result(ctx, s.log, err)
			return w, err
		},
	}, s.client)
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, s.cfg.Resync, cache.Indexers{})
	// Keep what the endpoint needs; managed fields are most of a pod.
	if err := inf.SetTransform(func(o any) (any, error) {
		if p, ok := o.(*corev1.Pod); ok {
			p.ManagedFields = nil
		}
		return o, nil
	}); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	ictx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		inf.RunWithContext(ictx)
	}()
	defer func() {
		stop()
		<-done
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx ended first
	}

	n := discovery.NewNotifier("kubernetes", s.log, update)
	skipped := map[string]string{} // pod → why it was last skipped (logged once)
	publish := func() { n.Publish(s.endpoints(inf.GetStore().List(), skipped)) }
	publish()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			timer.Reset(s.cfg.Debounce)
		case <-timer.C:
			publish()
		}
	}
}

// endpoints turns the pods in the store into a sorted endpoint list,
// logging each pod skipped for a configuration reason once per reason.
func (s *Source) endpoints(objs []any, skipped map[string]string) []fleet.Endpoint {
	eps := make([]fleet.Endpoint, 0, len(objs))
	seen := make(map[string]bool, len(objs))
	podOf := make(map[string]string, len(objs)) // endpoint name → its pod
	for _, o := range objs {
		pod, ok := o.(*corev1.Pod)
		if !ok || !s.selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		seen[pod.Name] = true
		ep, serving, err := s.endpoint(pod)
		switch {
		case err != nil:
			if skipped[pod.Name] != err.Error() {
				skipped[pod.Name] = err.Error()
				s.log.Warn("kubernetes: pod skipped", "pod", pod.Name, "err", err)
			}
			continue
		case !serving:
			delete(skipped, pod.Name)
			continue
		}
		if skipped[pod.Name] != "" && !strings.Contains(skipped[pod.Name], " left out: ") {
			delete(skipped, pod.Name) // its labels are fine now
		}
		eps = append(eps, ep)
		podOf[ep.Name] = pod.Name
	}
	for name := range skipped {
		if !seen[name] {
			delete(skipped, name)
		}
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].Name < eps[j].Name })
	// The list must be valid as a whole (a pod whose model is another's
	// adapter, two pods on one name, more ranks than a fleet holds): a
	// pod that would break it is skipped as a bad label is, and logged
	// once while it lasts (until 2026-12-04 the gateway refused every
	// list after it).
	kept, refused := fleet.ValidateEach(eps)
	for _, r := range refused {
		// Logged under its pod as the pod's other skips are.
		if pod := podOf[r.Endpoint.Name]; skipped[pod] != r.Error() {
			skipped[pod] = r.Error()
			s.log.Warn("kubernetes: pod skipped", "pod", pod, "err", r.Error())
		}
	}
	return kept
}

// endpoint reads one pod. serving is false for a pod that cannot take
// traffic now (not running, not ready, terminating, no IP); err explains a
// serving pod whose labels or ports do not make an endpoint.
func (s *Source) endpoint(pod *corev1.Pod) (ep fleet.Endpoint, serving bool, err error) {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" || !podReady(pod) {
		return ep, false, nil
	}
	role, err := fleet.ParseRole(pod.Labels[s.cfg.RoleLabel])
	if err != nil {
		return ep, true, fmt.Errorf("label %s: %w", s.cfg.RoleLabel, err)
	}
	model := pod.Annotations[s.cfg.ModelLabel]
	if model == "" {
		model = pod.Labels[s.cfg.ModelLabel]
	}
	if model == "" {
		model = s.cfg.Model
	}
	if model == "" {
		return ep, true, fmt.Errorf("no model: no annotation or label %s and no fixed model", s.cfg.ModelLabel)
	}
	port := s.cfg.Port
	if port == 0 {
		if port = containerPort(pod, s.cfg.PortName); port == 0 {
			return ep, true, fmt.Errorf("no container port named %q", s.cfg.PortName)
		}
	}
	ip := pod.Status.PodIP
	ep = fleet.Endpoint{
		URL:   s.cfg.Scheme + "://" + net.JoinHostPort(ip, strconv.Itoa(port)),
		Model: model,
		Role:  role,
	}
	if s.cfg.NameFromPod {
		ep.Name = pod.Name
	}
	events, err := s.eventsPort(pod)
	if err != nil {
		return ep, true, err
	}
	if events != 0 {
		ep.Events = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(events))
	}
	if v, ok := pod.Annotations[ReplayAnnotation]; ok {
		p, err := strconv.Atoi(v)
		switch {
		case err != nil || p < 1 || p > 65535:
			return ep, true, fmt.Errorf("annotation %s=%q is not a port number", ReplayAnnotation, v)
		case events == 0:
			return ep, true, fmt.Errorf("annotation %s: a replay port without a KV-event port (%s)", ReplayAnnotation, s.cfg.EventsAnnotation)
		}
		ep.Replay = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(p))
	}
	for _, a := range []struct {
		key string
		dst *int
	}{{DPSizeAnnotation, &ep.DPSize}, {BootstrapPortAnnotation, &ep.BootstrapPort}} {
		if v, ok := pod.Annotations[a.key]; ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return ep, true, fmt.Errorf("annotation %s=%q is not an integer", a.key, v)
			}
			*a.dst = n
		}
	}
	if v := pod.Annotations[LoRAAnnotation]; v != "" {
		for _, name := range strings.Split(v, ",") {
			ep.LoRA = append(ep.LoRA, strings.TrimSpace(name))
		}
	}
	if err := ep.Normalize(); err != nil {
		// The endpoint's fields are the pod's annotations: name them.
		return ep, true, errors.New(annotated.Replace(err.Error()))
	}
	return ep, true, nil
}

// annotated names, in an endpoint's errors, the annotations its fields
// came from.
var annotated = strings.NewReplacer("dp_size", "dp_size (annotation "+DPSizeAnnotation+")",
	"bootstrap_port", "bootstrap_port (annotation "+BootstrapPortAnnotation+")")

func (s *Source) eventsPort(pod *corev1.Pod) (int, error) {
	if v, ok := pod.Annotations[s.cfg.EventsAnnotation]; ok {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			return 0, fmt.Errorf("annotation %s=%q is not a port number", s.cfg.EventsAnnotation, v)
		}
		return p, nil
	}
	if s.cfg.EventsPort != 0 {
		return s.cfg.EventsPort, nil
	}
	if s.cfg.EventsPortName != "" {
		if p := containerPort(pod, s.cfg.EventsPortName); p != 0 {
			return p, nil
		}
		return 0, fmt.Errorf("no container port named %q (events)", s.cfg.EventsPortName)
	}
	return 0, nil
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// containerPort finds a named port among the pod's containers.
func containerPort(pod *corev1.Pod, name string) int {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return int(p.ContainerPort)
			}
		}
	}
	return 0
}
