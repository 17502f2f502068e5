package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kvgate/kvgate/internal/discovery/k8s"
	"github.com/kvgate/kvgate/internal/fleet"
)

// Annotations the Kubernetes actuator keeps on a pod while it switches.
const (
	// AnnotationTargetRole holds the role a switching pod goes to.
	AnnotationTargetRole = "kvgate.io/target-role"
	// AnnotationPreviousRole holds the role it leaves.
	AnnotationPreviousRole = "kvgate.io/previous-role"
	// RoleSwitching is the role label's value while a pod switches: no
	// role kvgate's discovery accepts, so gateways stop routing to it.
	RoleSwitching = "switching"
)

// KubeConfig selects the engine pods and how to reach their role API.
type KubeConfig struct {
	Namespace string
	Selector  string
	// RoleLabel is the label kvgate's Kubernetes discovery reads the role
	// from (default kvgate.io/role).
	RoleLabel string
	// Port is the engines' HTTP port (their POST /admin/role).
	Port int
	// Scheme is http (default) or https.
	Scheme string
	// Grace is how long after relabelling a pod (its gateways drop it) the
	// actuator waits before asking it to switch; in [0, 10m].
	Grace  time.Duration
	Client *http.Client
	Logger *slog.Logger
}

// KubeActuator moves engine pods between roles by relabelling them: the
// pod's role label becomes "switching" (gateways using kvgate's Kubernetes
// discovery drop it) with the target in an annotation, the engine is asked
// to switch (POST /admin/role: drain, warm up), and once it serves in its
// new role the label says so and discovery brings it back.
type KubeActuator struct {
	client   k8s.Client
	cfg      KubeConfig
	selector labels.Selector
	rc       roleClient
	log      *slog.Logger
}

// NewKubeActuator checks cfg.
func NewKubeActuator(client k8s.Client, cfg KubeConfig) (*KubeActuator, error) {
	if client == nil {
		return nil, errors.New("kubernetes actuator: no client")
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("kubernetes actuator: namespace %q: %s", cfg.Namespace, errs[0])
	}
	if cfg.Selector == "" {
		return nil, errors.New("kubernetes actuator: selector is required")
	}
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("kubernetes actuator: selector %q: %w", cfg.Selector, err)
	}
	if cfg.RoleLabel == "" {
		cfg.RoleLabel = k8s.DefaultRoleLabel
	}
	if errs := validation.IsQualifiedName(cfg.RoleLabel); len(errs) > 0 {
		return nil, fmt.Errorf("kubernetes actuator: role label %q: %s", cfg.RoleLabel, errs[0])
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("kubernetes actuator: port must be in [1, 65535], got %d", cfg.Port)
	}
	switch cfg.Scheme {
	case "":
		cfg.Scheme = "http"
	case "http", "https":
	default:
		return nil, fmt.Errorf("kubernetes actuator: scheme %q: http or https", cfg.Scheme)
	}
	if cfg.Grace < 0 || cfg.Grace > 10*time.Minute {
		return nil, fmt.Errorf("kubernetes actuator: grace must be in [0, 10m], got %v", cfg.Grace)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &KubeActuator{client: client, cfg: cfg, selector: sel, rc: roleClient{cfg.Client}, log: cfg.Logger}, nil
}

func (a *KubeActuator) url(p *corev1.Pod) string {
	return a.cfg.Scheme + "://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(a.cfg.Port))
}

// patch merges labels and annotations into the pod (a nil value deletes
// the key).
func (a *KubeActuator) patch(ctx context.Context, pod string, lbl, ann map[string]*string) error {
	doc := map[string]any{"metadata": map[string]any{"labels": lbl, "annotations": ann}}
	body, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	_, err = a.client.CoreV1().Pods(a.cfg.Namespace).Patch(ctx, pod, types.MergePatchType, body, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("kubernetes actuator: patch pod %s: %w", pod, err)
	}
	return nil
}

func ptr(s string) *string { return &s }

// pods lists the running pods of the selector that have an IP, by name.
func (a *KubeActuator) pods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := a.client.CoreV1().Pods(a.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: a.selector.String()})
	if err != nil {
		return nil, fmt.Errorf("kubernetes actuator: list pods: %w", err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Instances implements Actuator. A switching pod whose engine serves in its
// target role is relabelled with it.
func (a *KubeActuator) Instances(ctx context.Context) ([]Instance, error) {
	pods, err := a.pods(ctx)
	if err != nil {
		return nil, err
	}
	var out []Instance
	for i := range pods {
		p := &pods[i]
		label := p.Labels[a.cfg.RoleLabel]
		target, switching := p.Annotations[AnnotationTargetRole]
		if !switching {
			role, err := fleet.ParseRole(label)
			if err != nil {
				a.log.Warn("kubernetes actuator: pod with an unknown role; ignored", "pod", p.Name, "role", label)
				continue
			}
			in := Instance{Name: p.Name, Role: role}
			if st, err := a.rc.status(ctx, p.Name, a.url(p)); err == nil {
				in.Load = float64(st.InFlight)
			}
			out = append(out, in)
			continue
		}
		to, err := fleet.ParseRole(target)
		if err != nil {
			return nil, fmt.Errorf("kubernetes actuator: pod %s: annotation %s: %w", p.Name, AnnotationTargetRole, err)
		}
		prev, _ := fleet.ParseRole(p.Annotations[AnnotationPreviousRole])
		in := Instance{Name: p.Name, Role: prev, Switching: true, Target: to}
		st, err := a.rc.status(ctx, p.Name, a.url(p))
		if err != nil {
			return nil, err
		}
		if st.State == "serving" && st.Role == to.String() {
			if err := a.patch(ctx, p.Name, map[string]*string{a.cfg.RoleLabel: ptr(to.String())},
				map[string]*string{AnnotationTargetRole: nil, AnnotationPreviousRole: nil}); err != nil {
				return nil, err
			}
			a.log.Info("planner: pod serves in its new role", "pod", p.Name, "role", to)
			in = Instance{Name: p.Name, Role: to, Load: float64(st.InFlight)}
		}
		out = append(out, in)
	}
	return out, nil
}

// Switch implements Actuator.
func (a *KubeActuator) Switch(ctx context.Context, name string, to fleet.Role) error {
	if to != fleet.RolePrefill && to != fleet.RoleDecode {
		return fmt.Errorf("pod %s: the planner switches to prefill or decode, not %s", name, to)
	}
	p, err := a.client.CoreV1().Pods(a.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kubernetes actuator: pod %s: %w", name, err)
	}
	if _, busy := p.Annotations[AnnotationTargetRole]; busy {
		return fmt.Errorf("pod %s is already switching", name)
	}
	from := p.Labels[a.cfg.RoleLabel]
	if from == to.String() {
		return fmt.Errorf("pod %s is already %s", name, to)
	}
	if p.Status.PodIP == "" {
		return fmt.Errorf("pod %s has no IP", name)
	}
	if err := a.patch(ctx, name, map[string]*string{a.cfg.RoleLabel: ptr(RoleSwitching)},
		map[string]*string{AnnotationTargetRole: ptr(to.String()), AnnotationPreviousRole: ptr(from)}); err != nil {
		return err
	}
	err = sleepCtx(ctx, a.cfg.Grace)
	if err == nil {
		err = a.rc.set(ctx, name, a.url(p), to)
	}
	if err != nil {
		// Put the pod back as it was; a context that ended needs a fresh
		// one to do it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if perr := a.patch(rctx, name, map[string]*string{a.cfg.RoleLabel: ptr(from)},
			map[string]*string{AnnotationTargetRole: nil, AnnotationPreviousRole: nil}); perr != nil {
			err = fmt.Errorf("%w (and restoring its label: %v)", err, perr)
		}
		return err
	}
	a.log.Info("planner: pod switching", "pod", name, "from", from, "to", to)
	return nil
}
