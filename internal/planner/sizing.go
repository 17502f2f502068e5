// Package planner is kvgate's xPyD planner: it watches the shape of the load
// over a window (request rate, prompt and output lengths, prefix-hit rate,
// measured TTFT and TPOT against their SLOs), estimates what one prefill and
// one decode instance can carry, forecasts the next interval and sets how
// many instances of a fixed budget prefill and how many decode. It changes
// the split at minute granularity, one change at a time, with hysteresis, a
// cool-down and a check that the side giving up instances can absorb its
// load, and it prices the time a role switch takes (drain, then warm-up).
//
// Decisions are carried out by an Actuator: the fleet simulator, the engine
// emulator's POST /admin/role, Kubernetes (relabelling pods) or a dry run.
//
// The sizing arithmetic is the seed chapter's:
//
//	prefill load = rate × ISL × (1 − hit)   uncached prompt tokens per second
//	decode load  = rate × OSL               output tokens per second
//	P = ⌈prefill load / P capacity⌉,  D = ⌈decode load / D capacity⌉
package planner

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/yamlstrict"
	"gopkg.in/yaml.v3"
)

// Shape is the load's shape over an interval.
type Shape struct {
	// Rate is requests per second.
	Rate float64 `yaml:"rate" json:"rate"`
	// ISL and OSL are the mean prompt and output lengths in tokens.
	ISL float64 `yaml:"isl" json:"isl"`
	OSL float64 `yaml:"osl" json:"osl"`
	// Hit is the share of prompt tokens served from a prefix cache.
	Hit float64 `yaml:"hit" json:"hit"`
}

// PrefillLoad is the uncached prompt tokens per second the shape asks for.
// Each product is rounded on its own (the explicit conversions forbid a fused
// multiply-add), so the result is the seed's Python value bit for bit.
func (s Shape) PrefillLoad() float64 {
	return float64(float64(s.Rate*s.ISL) * (1 - s.Hit))
}

// DecodeLoad is the output tokens per second the shape asks for.
func (s Shape) DecodeLoad() float64 { return float64(s.Rate * s.OSL) }

// Capacity is what one instance of each role carries.
type Capacity struct {
	// Prefill is the uncached prompt tokens per second one prefill
	// instance computes.
	Prefill float64 `json:"prefill"`
	// Decode is the output tokens per second one decode instance produces
	// within the TPOT target.
	Decode float64 `json:"decode"`
}

// Need is the seed's sizing: the instances each role needs to carry a load
// of prefill (uncached tokens/s) and decode (output tokens/s) at 100 %
// utilisation. A load of 0 needs no instance. Counts saturate at
// math.MaxInt32.
func Need(prefill, decode float64, c Capacity) (p, d int) {
	return ceilCount(prefill / c.Prefill), ceilCount(decode / c.Decode)
}

func ceilCount(x float64) int {
	switch {
	case !(x > 0):
		return 0
	case x >= math.MaxInt32:
		return math.MaxInt32
	}
	return int(math.Ceil(x))
}

// Utilisation is the load of a P×D split: the prefill and decode load as
// fractions of what p and d instances carry (+Inf for load on no instance).
func Utilisation(prefill, decode float64, p, d int, c Capacity) (up, ud float64) {
	return util(prefill, p, c.Prefill), util(decode, d, c.Decode)
}

func util(load float64, n int, per float64) float64 {
	if load <= 0 {
		return 0
	}
	if n <= 0 {
		return math.Inf(1)
	}
	return load / float64(float64(n)*per)
}

// Phase is a named load shape (a period of the day).
type Phase struct {
	Name  string `yaml:"name" json:"name"`
	Shape `yaml:",inline"`
	// Minutes is how long the phase lasts in a simulated day (0: the
	// day's default).
	Minutes float64 `yaml:"minutes,omitempty" json:"minutes,omitempty"`
}

// SeedPhases are the seed chapter's three periods: daytime chat, evening
// long-document summaries, night-time coding agents.
func SeedPhases() []Phase {
	return []Phase{
		{Name: "chat", Shape: Shape{Rate: 100, ISL: 2000, OSL: 500, Hit: 0.6}},
		{Name: "long-documents", Shape: Shape{Rate: 30, ISL: 16000, OSL: 300, Hit: 0.2}},
		{Name: "agents", Shape: Shape{Rate: 25, ISL: 6000, OSL: 2000, Hit: 0.8}},
	}
}

// SeedCapacity is the seed's per-instance capacity: 20 000 prompt tokens/s
// of prefill, 3 000 output tokens/s of decode under the TPOT target.
func SeedCapacity() Capacity { return Capacity{Prefill: 20000, Decode: 3000} }

// SizingRanges are the ranges of the sizing inputs; kvgate plan's flags and the
// phases file are checked against them.
type SizingRanges struct {
	Total            flagrange.Range[int]
	Instances        flagrange.Range[int] // one side of --fixed
	PrefillCapacity  flagrange.Range[float64]
	DecodeCapacity   flagrange.Range[float64]
	Rate             flagrange.Range[float64]
	ISL, OSL         flagrange.Range[float64]
	Hit              flagrange.Range[float64]
	Minutes          flagrange.Range[float64]
	Phases           flagrange.Range[int]
	PhasesFileBytes  int
	PhaseNameMaxByte int
}

// SizingLimits returns the ranges.
func SizingLimits() SizingRanges {
	return SizingRanges{
		Total:            flagrange.Range[int]{Min: 2, Max: 100000, Unit: "instances"},
		Instances:        flagrange.Range[int]{Min: 1, Max: 100000, Unit: "instances"},
		PrefillCapacity:  flagrange.Range[float64]{Min: 1, Max: 1e9, Unit: "tokens/s"},
		DecodeCapacity:   flagrange.Range[float64]{Min: 1, Max: 1e9, Unit: "tokens/s"},
		Rate:             flagrange.Range[float64]{Min: 0, Max: 1e6, Unit: "req/s"},
		ISL:              flagrange.Range[float64]{Min: 1, Max: 1 << 24, Unit: "tokens"},
		OSL:              flagrange.Range[float64]{Min: 1, Max: 1 << 20, Unit: "tokens"},
		Hit:              flagrange.Range[float64]{Min: 0, Max: 0.999},
		Minutes:          flagrange.Range[float64]{Min: 0.1, Max: 1440, Unit: "minutes", Zero: "the day's default"},
		Phases:           flagrange.Range[int]{Min: 1, Max: 64},
		PhasesFileBytes:  1 << 20,
		PhaseNameMaxByte: 64,
	}
}

// Validate checks a phase against SizingLimits.
func (ph Phase) Validate() error {
	l := SizingLimits()
	if ph.Name == "" || len(ph.Name) > l.PhaseNameMaxByte {
		return fmt.Errorf("phase name must be 1 to %d bytes, got %q", l.PhaseNameMaxByte, ph.Name)
	}
	if err := errors.Join(
		l.Rate.Check("rate", ph.Rate),
		l.ISL.Check("isl", ph.ISL),
		l.OSL.Check("osl", ph.OSL),
		l.Hit.Check("hit", ph.Hit),
		l.Minutes.Check("minutes", ph.Minutes),
	); err != nil {
		return fmt.Errorf("phase %s: %w", ph.Name, err)
	}
	return nil
}

// ParsePhases reads phases from YAML or JSON (JSON is YAML):
//
//	phases:
//	  - {name: chat, rate: 100, isl: 2000, osl: 500, hit: 0.6}
//
// Unknown fields, duplicate names and values out of range are errors.
func ParsePhases(r io.Reader) ([]Phase, error) {
	l := SizingLimits()
	data, err := io.ReadAll(io.LimitReader(r, int64(l.PhasesFileBytes)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > l.PhasesFileBytes {
		return nil, fmt.Errorf("phases file larger than %d bytes", l.PhasesFileBytes)
	}
	var doc struct {
		Phases []Phase `yaml:"phases"`
	}
	if err := yamlstrict.Decode(data, &doc); err != nil {
		return nil, fmt.Errorf("phases file: %w", err)
	}
	if doc.Phases == nil {
		return nil, errors.New("phases file is empty: no phases")
	}
	// rate, isl and osl have no default: a phase without one was sized
	// as 0 (0P0D, "fits"; a walkthrough, 2026-12-04).
	var keys struct {
		Phases []map[string]any `yaml:"phases"`
	}
	if err := yaml.Unmarshal(data, &keys); err == nil {
		for i, ph := range keys.Phases {
			for _, k := range []string{"rate", "isl", "osl"} {
				if _, ok := ph[k]; !ok {
					return nil, fmt.Errorf("phases[%d]: %s is required", i, k)
				}
			}
		}
	}
	if err := l.Phases.Check("number of phases", len(doc.Phases)); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, ph := range doc.Phases {
		if err := ph.Validate(); err != nil {
			return nil, fmt.Errorf("phases[%d]: %w", i, err)
		}
		if seen[ph.Name] {
			return nil, fmt.Errorf("phases[%d]: name %q used twice", i, ph.Name)
		}
		seen[ph.Name] = true
	}
	return doc.Phases, nil
}

// PhaseSizing is one row of the seed's table.
type PhaseSizing struct {
	Name string `json:"name"`
	// Prefill and Decode are the instances the phase needs.
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
	// Fits is whether they fit in the budget.
	Fits bool `json:"fits"`
	// FixedPrefillLoad and FixedDecodeLoad are the utilisation of the
	// fixed split's two sides (1 = full; above: overloaded).
	FixedPrefillLoad float64 `json:"fixed_prefill_load"`
	FixedDecodeLoad  float64 `json:"fixed_decode_load"`
}

// SizePhases computes the seed's table: what each phase needs out of total
// instances and how loaded a fixed fixedP×fixedD split is in it.
func SizePhases(phases []Phase, c Capacity, total, fixedP, fixedD int) []PhaseSizing {
	out := make([]PhaseSizing, len(phases))
	for i, ph := range phases {
		lp, ld := ph.PrefillLoad(), ph.DecodeLoad()
		p, d := Need(lp, ld, c)
		// A fleet keeps one instance of each role, as the planner does
		// (its minimums): a phase without traffic read "needs 0P0D".
		p, d = max(p, 1), max(d, 1)
		up, ud := Utilisation(lp, ld, fixedP, fixedD, c)
		out[i] = PhaseSizing{Name: ph.Name, Prefill: p, Decode: d, Fits: p <= total-d, FixedPrefillLoad: up, FixedDecodeLoad: ud}
	}
	return out
}
