package planner

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a Loop's state to Prometheus at scrape time; register
// it on the registry /metrics serves (NewCollector).
type Collector struct{ l *Loop }

// NewCollector returns the collector of l.
func NewCollector(l *Loop) *Collector { return &Collector{l: l} }

var (
	descInstances = prometheus.NewDesc("kvgate_planner_instances", "Instances by role and state (serving, switching) as the planner last saw them.", []string{"role", "state"}, nil)
	descTarget    = prometheus.NewDesc("kvgate_planner_target_instances", "The split the planner wants, by role.", []string{"role"}, nil)
	descUtil      = prometheus.NewDesc("kvgate_planner_utilization", "Forecast utilisation of the current split, by role (1 = full).", []string{"role"}, nil)
	descLoad      = prometheus.NewDesc("kvgate_planner_load_tokens_per_second", "Forecast load by role: uncached prompt tokens/s (prefill), output tokens/s (decode).", []string{"role"}, nil)
	descCapacity  = prometheus.NewDesc("kvgate_planner_capacity_tokens_per_second", "Estimated capacity of one instance, by role.", []string{"role"}, nil)
	descChanges   = prometheus.NewDesc("kvgate_planner_changes_total", "Split changes the planner started.", nil, nil)
	descSwitched  = prometheus.NewDesc("kvgate_planner_switched_instances_total", "Instances the planner moved between roles.", nil, nil)
	descFailed    = prometheus.NewDesc("kvgate_planner_failed_switches_total", "Switches the actuator refused, or found undone (an engine back in its old role).", nil, nil)
	descStepErrs  = prometheus.NewDesc("kvgate_planner_step_errors_total", "Planning steps that made no decision: the fleet or the window could not be read.", nil, nil)
	descDecisions = prometheus.NewDesc("kvgate_planner_decisions_total", "Planning steps by action (switch, hold, wait).", []string{"action"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInstances, descTarget, descUtil, descLoad, descCapacity, descChanges, descSwitched, descFailed, descStepErrs, descDecisions} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.l.Status()
	gauge := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	counter := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, lv...)
	}
	switching := map[string]int{}
	for _, in := range s.Instances {
		if in.Switching {
			switching[in.Role.String()]++
		}
	}
	gauge(descInstances, float64(s.Prefill), "prefill", "serving")
	gauge(descInstances, float64(s.Decode), "decode", "serving")
	gauge(descInstances, float64(switching["prefill"]), "prefill", "switching")
	gauge(descInstances, float64(switching["decode"]), "decode", "switching")
	gauge(descTarget, float64(s.TargetPrefill), "prefill")
	gauge(descTarget, float64(s.TargetDecode), "decode")
	if d := s.Last; d != nil {
		// A role with no instance has no utilisation (the decision's
		// is a large number standing for its load on nothing).
		if d.Prefill > 0 {
			gauge(descUtil, finite(d.PrefillUtil), "prefill")
		}
		if d.Decode > 0 {
			gauge(descUtil, finite(d.DecodeUtil), "decode")
		}
		gauge(descLoad, d.PrefillLoad, "prefill")
		gauge(descLoad, d.DecodeLoad, "decode")
		gauge(descCapacity, d.Capacity.Prefill, "prefill")
		gauge(descCapacity, d.Capacity.Decode, "decode")
	}
	counter(descChanges, float64(s.Changes))
	counter(descSwitched, float64(s.Switched))
	counter(descFailed, float64(s.Failed))
	counter(descStepErrs, float64(s.StepErrors))
	for _, a := range []string{ActionSwitch, ActionHold, ActionWait} {
		counter(descDecisions, float64(s.Actions[a]), a)
	}
}

// finite maps +Inf (load on no instance) to a large number Prometheus
// graphs can show.
func finite(v float64) float64 {
	if v > 1e9 {
		return 1e9
	}
	return v
}
