package planner

import (
	"github.com/kvgate/kvgate/internal/perfmodel"
)

// CapacityEstimator says what one instance of each role carries for a load
// of a given shape.
type CapacityEstimator interface {
	Estimate(s Shape) Capacity
}

// StaticCapacity is a configured capacity, the same for every shape (the
// seed's 20 000 and 3 000 tokens/s).
type StaticCapacity Capacity

// Estimate implements CapacityEstimator.
func (c StaticCapacity) Estimate(Shape) Capacity { return Capacity(c) }

// ModelCapacity derives the capacity from an engine's timing model, as a
// profile would measure it: a prefill instance computes
// Model.PrefillTokensPerSec uncached tokens per second; a decode instance
// runs the largest batch whose step fits the TPOT target at the shape's
// mean context (prompt plus half the output) and whose sequences fit its KV
// capacity, and produces batch / step tokens per second.
type ModelCapacity struct {
	Model perfmodel.Model
	// TPOT is the target time per output token (seconds).
	TPOT float64
	// KVTokens is a decode instance's KV capacity (0: unbounded).
	KVTokens int
}

// Estimate implements CapacityEstimator.
func (m ModelCapacity) Estimate(s Shape) Capacity {
	c := Capacity{Prefill: m.Model.PrefillTokensPerSec}
	ctx := int(s.ISL + s.OSL/2)
	b := m.Model.MaxBatchForTPOT(m.TPOT, ctx)
	if seq := int(s.ISL + s.OSL); m.KVTokens > 0 && seq > 0 {
		b = min(b, m.KVTokens/seq)
	}
	if b <= 0 {
		// Not even one sequence meets the target: one at a time is what
		// the instance can do.
		b = 1
	}
	if st := m.Model.DecodeStepTime(b, b*ctx); st > 0 {
		c.Decode = float64(b) / st
	}
	return c
}

// learned corrects a capacity estimate from what the fleet measures: when
// one side misses its SLO while the estimate says it has headroom, its
// capacity is lower than estimated; when it keeps its SLO while the
// estimate says it is overloaded, higher. Each window moves the correction
// by a bounded factor.
type learned struct {
	prefill, decode float64 // multipliers, in [minLearn, maxLearn]
}

const (
	minLearn  = 0.5
	maxLearn  = 2
	learnStep = 0.1
	// missHigh and missLow are the miss rates of a side (its rejections
	// and SLO misses over the window's requests) that count as missing and
	// as keeping its SLO.
	missHigh = 0.05
	missLow  = 0.005
)

func newLearned() learned { return learned{prefill: 1, decode: 1} }

func (l *learned) apply(c Capacity) Capacity {
	return Capacity{Prefill: c.Prefill * l.prefill, Decode: c.Decode * l.decode}
}

// update adjusts the multipliers from one window: up and ud are the
// estimated utilisations (with the current multipliers) of the split that
// served the window, rp and rd the utilisations each side is sized for.
func (l *learned) update(o *Observation, up, ud, rp, rd float64) {
	if o.Requests == 0 {
		return
	}
	n := float64(o.Requests)
	mp := float64(o.RejectedPrefill+o.TTFTMiss) / n
	md := float64(o.RejectedDecode+o.TPOTMiss) / n
	l.prefill = adjust(l.prefill, mp, up, rp)
	l.decode = adjust(l.decode, md, ud, rd)
}

func adjust(k, miss, u, rho float64) float64 {
	switch {
	case miss > missHigh && u < rho:
		k *= 1 - learnStep
	case miss < missLow && u > 1:
		k *= 1 + learnStep
	}
	return min(max(k, minLearn), maxLearn)
}
