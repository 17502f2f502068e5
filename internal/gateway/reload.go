package gateway

import (
	"fmt"
	"reflect"
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

// Reload applies a new configuration: endpoints, SLO classes, the default
// class and early rejection take effect at once; fields that need a
// restart (listen and admin addresses, policy, block size, tokenizers,
// central KV events) are reported and left as they run. A config that does
// not validate changes nothing.
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
	cur := g.cfg
	for _, f := range []struct {
		name string
		a, b any
	}{
		{"listen", cur.Listen, next.Listen}, {"admin", cur.Admin, next.Admin}, {"policy", cur.Policy, next.Policy}, {"predictor", cur.Predictor, next.Predictor},
		{"block_size", cur.BlockSize, next.BlockSize}, {"tokenizers", cur.Tokenizers, next.Tokenizers},
		{"bind_events", cur.BindEvents, next.BindEvents}, {"bind_events_ranks", cur.BindEventsRanks, next.BindEventsRanks}, {"http", cur.HTTP, next.HTTP},
		{"max_inflight", cur.MaxInflight, next.MaxInflight}, {"prefill_speed", cur.PrefillSpeed, next.PrefillSpeed},
		{"engine_step_tokens", cur.engineStepTokens(), next.engineStepTokens()},
		{"hold.max_requests", cur.Hold.MaxRequests, next.Hold.MaxRequests},
		{"hold.touch_priority", cur.Hold.TouchPriority, next.Hold.TouchPriority}, {"sync", cur.Sync, next.Sync},
	} {
		if !reflect.DeepEqual(f.a, f.b) {
			needRestart = append(needRestart, f.name)
		}
	}
	return needRestart, nil
}
