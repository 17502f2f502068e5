package gateway

import (
	"fmt"
	"reflect"
	"strings"
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
// default class's targets), early rejection and the hold's parameters
// (but max_requests and touch_priority) take effect at once; every other
// field that changed needs a restart, is reported (restartFields) and
// keeps its running value. A config that does not validate changes
// nothing.
func (g *Gateway) Reload(next Config) (needRestart []string, err error) {
	next.Defaults()
	if err := next.Validate(); err != nil {
		return nil, fmt.Errorf("reload refused, the running config is kept: %w", err)
	}
	if err := g.SetEndpoints(next.Endpoints); err != nil {
		return nil, fmt.Errorf("reload refused, the running config is kept: %w", err)
	}
	g.classes.Store(newClassSet(&next))
	g.sched.Store(next.scheduler(g.sched.Load().Policy))
	return restartFields(&g.cfg, &next), nil
}

// reloadable reports whether Reload applies the top-level field of that
// YAML name.
func reloadable(name string) bool {
	switch name {
	case "endpoints", "early_reject", "slo_ttft", "slo_tpot", "classes", "default_class", "class_header", "hold":
		return true
	}
	return false
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
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" {
			name = t.Field(i).Name
		}
		if !reloadable(name) && !reflect.DeepEqual(cv.Field(i).Interface(), nv.Field(i).Interface()) {
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
