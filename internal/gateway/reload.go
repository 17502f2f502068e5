package gateway

import (
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
	"gopkg.in/yaml.v3"
)

// classSet is the reloadable part of the SLO configuration.
type classSet struct {
	classes []Class
	def     string
	header  string
}

func newClassSet(c *Config) *classSet {
	return &classSet{classes: append([]Class(nil), c.Classes...), def: c.DefaultClass, header: c.ClassHeader}
}

// Reload applies a new configuration: endpoints, the SLO classes (and the
// default class's targets), early rejection, displacement and the hold's parameters
// (but max_requests and touch_priority) take effect at once; every other
// field that changed needs a restart, is reported (restartFields) and
// keeps its running value. A config that does not validate changes
// nothing.
func (g *Gateway) Reload(next Config) (needRestart []string, err error) {
	next.Defaults()
	if err := next.Validate(); err != nil {
		return nil, err
	}
	if err := g.SetEndpoints(next.Endpoints); err != nil {
		return nil, err
	}
	g.classes.Store(newClassSet(&next))
	exported := next
	exported.Policy = g.cfg.Policy // the running one: a new policy needs a restart
	g.met.exportClasses(&exported)
	g.sched.Store(next.scheduler(g.sched.Load().Policy))
	restart := restartFields(&g.cfg, &next)
	g.running.Store(applied(g.running.Load(), &next))
	g.met.reloads.WithLabelValues("applied").Inc()
	g.met.lastReload.SetToCurrentTime()
	return restart, nil
}

// ReloadRefused counts a reload refused: its file did not load, or Reload
// refused it (Reload counts the ones it applies).
func (g *Gateway) ReloadRefused() { g.met.reloads.WithLabelValues("refused").Inc() }

// serveConfig answers GET /admin/config: the configuration running now,
// as YAML with the file's keys (a reload applies some fields and keeps
// the rest until a restart: this is what runs), and the reloads.
func (g *Gateway) serveConfig(w http.ResponseWriter, _ *http.Request) {
	run := *g.running.Load()
	// The endpoints are the fleet listed now: configured, discovered and
	// as the planner switched them, in or out of health.
	g.mu.RLock()
	run.Endpoints = make([]fleet.Endpoint, 0, len(g.members))
	for _, m := range g.members {
		run.Endpoints = append(run.Endpoints, m.ep)
	}
	g.mu.RUnlock()
	sort.Slice(run.Endpoints, func(i, j int) bool { return run.Endpoints[i].Name < run.Endpoints[j].Name })
	run.Health = run.Health.WithDefaults()
	run.Hold = run.Hold.withDefaults()
	if run.Sync.Bind != "" && run.Sync.Heartbeat == 0 {
		run.Sync.Heartbeat = time.Second // replicasync's default
	}
	// The file's way: slo_ttft and slo_tpot when the classes are theirs
	// (the default class Defaults made), classes alone otherwise. Both
	// were shown, which a start refuses (a dump saved and loaded again
	// failed; walkthrough, 2026-12-04).
	if derived := []Class{{Name: "standard", Priority: 1, TTFT: run.SLOTTFT, TPOT: run.SLOTPOT}}; reflect.DeepEqual(run.Classes, derived) && run.DefaultClass == "standard" {
		run.Classes, run.DefaultClass = nil, ""
	} else {
		run.SLOTTFT, run.SLOTPOT = 0, 0
	}
	if run.EngineAPIKey != "" {
		run.EngineAPIKey = "<set>" // a secret: that it is set, not what
	}
	out, err := yaml.Marshal(&run)
	if err != nil {
		openai.WriteError(w, openai.Errorf(http.StatusInternalServerError, "config: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	fmt.Fprintf(w, "# the configuration running (kvgate serve), as of %s: the file's fields a reload applies\n"+
		"# (docs/serve.md, \"Configuration\") as last reloaded, the others as at the start, defaults\n"+
		"# filled in; endpoints: the fleet listed now.\n",
		g.now().UTC().Format(time.RFC3339))
	_, _ = w.Write(out)
}

// reloadable reports whether Reload applies the top-level field of that
// YAML name.
func reloadable(name string) bool {
	switch name {
	case "endpoints", "early_reject", "displace", "slo_ttft", "slo_tpot", "classes", "default_class", "class_header", "hold":
		return true
	}
	return false
}

// applied is what runs after a reload of next over run (GET
// /admin/config): run with next's reloadable fields, by the same rule as
// restartFields (reloadable, the hold's max_requests and touch_priority
// kept).
func applied(run, next *Config) *Config {
	out := *run
	ov, nv := reflect.ValueOf(&out).Elem(), reflect.ValueOf(next).Elem()
	for i := range ov.NumField() {
		if reloadable(yamlName(ov.Type().Field(i))) {
			ov.Field(i).Set(nv.Field(i))
		}
	}
	out.Hold.MaxRequests, out.Hold.TouchPriority = run.Hold.MaxRequests, run.Hold.TouchPriority
	return &out
}

// yamlName is a Config field's key in the file.
func yamlName(f reflect.StructField) string {
	if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); name != "" {
		return name
	}
	return f.Name
}

// restartFields names the fields of next that differ from cur and that a
// reload does not apply: every top-level field but the reloadable ones
// (compared whole, by reflection, so that a field added to Config is never
// ignored in silence), and the hold's max_requests and touch_priority.
func restartFields(cur, next *Config) []string {
	var out []string
	cv, nv := reflect.ValueOf(cur).Elem(), reflect.ValueOf(next).Elem()
	t := cv.Type()
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); !reloadable(name) && !reflect.DeepEqual(cv.Field(i).Interface(), nv.Field(i).Interface()) {
			out = append(out, name)
		}
	}
	if cur.Hold.MaxRequests != next.Hold.MaxRequests {
		out = append(out, "hold.max_requests")
	}
	if cur.Hold.TouchPriority != next.Hold.TouchPriority {
		out = append(out, "hold.touch_priority")
	}
	return out
}
