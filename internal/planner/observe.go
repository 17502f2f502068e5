package planner

import (
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/workload"
)

// Observation is what the planner sees of the traffic over its window: the
// requests that arrived (all of them, rejected ones included: they are
// demand), their sizes and the cached part of their prompts as routed,
// rejections by the side that caused them, and the measured latencies of
// the requests that finished.
type Observation struct {
	// Now is the clock at the end of the window; Window its length in
	// seconds.
	Now    float64 `json:"now"`
	Window float64 `json:"window"`
	// Requests arrived, with their prompt, cached-prompt and output
	// tokens: as the answers finished in the window had them, when any
	// was counted, else as planned (max_tokens).
	Requests     int   `json:"requests"`
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Rejected requests: for the prefill side (predicted TTFT over its
	// SLO) and for the decode side (no KV room, predicted TPOT over SLO).
	RejectedPrefill int `json:"rejected_prefill"`
	RejectedDecode  int `json:"rejected_decode"`
	// Finished requests, how many missed each SLO, and the mean measured
	// TTFT and TPOT (seconds).
	Finished int     `json:"finished"`
	TTFTMiss int     `json:"ttft_miss"`
	TPOTMiss int     `json:"tpot_miss"`
	MeanTTFT float64 `json:"mean_ttft"`
	MeanTPOT float64 `json:"mean_tpot"`
	// Recent, when set, holds the latest requests (a warm-up, then the
	// window) with arrivals from 0: the what-if simulation replays them.
	Recent *workload.Trace `json:"-"`
}

// Shape is the observed load shape.
func (o *Observation) Shape() Shape {
	var s Shape
	if o.Window > 0 {
		s.Rate = float64(o.Requests) / o.Window
	}
	if o.Requests > 0 {
		s.ISL = float64(o.PromptTokens) / float64(o.Requests)
		s.OSL = float64(o.OutputTokens) / float64(o.Requests)
	}
	if o.PromptTokens > 0 {
		s.Hit = float64(o.CachedTokens) / float64(o.PromptTokens)
	}
	return s
}

// missShare is the measured share of requests missing their SLO: the
// window's rejections and the SLO misses of its finished requests.
func (o *Observation) missShare() float64 {
	miss := float64(o.RejectedPrefill + o.RejectedDecode)
	if o.Requests == 0 {
		return 0
	}
	if o.Finished > 0 {
		served := float64(o.Requests - o.RejectedPrefill - o.RejectedDecode)
		miss += served * float64(max(o.TTFTMiss, o.TPOTMiss)) / float64(o.Finished)
	}
	return miss / float64(o.Requests)
}

// Loads are the observed prefill load (uncached prompt tokens per second)
// and decode load (output tokens per second).
func (o *Observation) Loads() (prefill, decode float64) {
	if o.Window <= 0 {
		return 0, 0
	}
	return float64(o.PromptTokens-o.CachedTokens) / o.Window, float64(o.OutputTokens) / o.Window
}

// Instance is one instance as an actuator reports it.
type Instance struct {
	Name string     `json:"name"`
	Role fleet.Role `json:"role"`
	// Switching is set while a role change is in progress (draining or
	// warming up); Target is the role it goes to.
	Switching bool       `json:"switching,omitempty"`
	Target    fleet.Role `json:"target,omitempty"`
	// Load orders instances of one role by the work they hold (the
	// planner moves the least loaded: they drain first); any unit.
	Load float64 `json:"load"`
}

// counts returns the serving prefill and decode instances and how many
// are switching.
func counts(inst []Instance) (p, d, switching int) {
	for _, in := range inst {
		switch {
		case in.Switching:
			switching++
		case in.Role == fleet.RolePrefill:
			p++
		case in.Role == fleet.RoleDecode:
			d++
		}
	}
	return p, d, switching
}
