// Package perfmodel is the engine timing model shared by the fleet simulator
// (internal/sim) and the engine emulator (internal/engine): how long a prefill
// of n uncached tokens takes, how long one decode step takes for a batch, and
// how long a KV transfer between instances takes. One model, two users, so the
// simulator's predictions and the emulator's measured latencies agree.
package perfmodel

import (
	"errors"

	"github.com/kvgate/kvgate/internal/flagrange"
)

// Model holds the timing parameters of one engine instance. All times are in
// seconds.
type Model struct {
	// PrefillTokensPerSec is the prompt tokens one instance computes per
	// second (uncached tokens only; cached tokens cost nothing).
	PrefillTokensPerSec float64
	// DecodeStepBase is the fixed cost of one decode step (weights read once
	// per step, kernel launches).
	DecodeStepBase float64
	// DecodeStepPerSeq is the extra cost per sequence in the running batch.
	DecodeStepPerSeq float64
	// DecodeStepPerKContext is the extra cost per 1 000 tokens of context
	// summed over the batch (attention reads the KV cache).
	DecodeStepPerKContext float64
	// KVTransferTokensPerSec is the rate at which a decode instance receives
	// a prompt's KV cache from a prefill instance; 0 means free transfer.
	KVTransferTokensPerSec float64
}

// Default returns the baseline chapter's engine: 20 000 prompt tokens/s of
// prefill and a decode step of 10 ms + 0.05 ms per sequence + 0.01 ms per
// 1 000 context tokens, with KV moving at 400 000 tokens/s.
func Default() Model {
	return Model{
		PrefillTokensPerSec:    20000,
		DecodeStepBase:         0.010,
		DecodeStepPerSeq:       0.00005,
		DecodeStepPerKContext:  0.00001,
		KVTransferTokensPerSec: 400000,
	}
}

// MinStepTime is the shortest decode step a model may have (base + per
// sequence), in seconds: a step of no time would let a run do unbounded work
// in no simulated time.
const MinStepTime = 1e-6

// Limits are the ranges Validate enforces. Every time a model computes from
// parameters in these ranges and counts that fit an int is finite.
type Limits struct {
	PrefillTokensPerSec    flagrange.Range[float64]
	DecodeStepBase         flagrange.Range[float64]
	DecodeStepPerSeq       flagrange.Range[float64]
	DecodeStepPerKContext  flagrange.Range[float64]
	KVTransferTokensPerSec flagrange.Range[float64]
}

// ModelLimits returns the ranges of a Model's parameters; kvgate's
// --prefill-speed, --decode-step-* and --kv-transfer-speed flags use them.
func ModelLimits() Limits {
	return Limits{
		PrefillTokensPerSec:    flagrange.Range[float64]{Min: 1, Max: 1e9, Unit: "tokens/s"},
		DecodeStepBase:         flagrange.Range[float64]{Min: 0, Max: 60, Unit: "seconds"},
		DecodeStepPerSeq:       flagrange.Range[float64]{Min: 0, Max: 1, Unit: "seconds"},
		DecodeStepPerKContext:  flagrange.Range[float64]{Min: 0, Max: 1, Unit: "seconds"},
		KVTransferTokensPerSec: flagrange.Range[float64]{Min: 1, Max: 1e12, Unit: "tokens/s", Zero: "free"},
	}
}

// Validate reports parameters outside ModelLimits, named as kvgate's flags
// name them, and a decode step shorter than MinStepTime.
func (m Model) Validate() error {
	l := ModelLimits()
	errs := []error{
		l.PrefillTokensPerSec.Check("prefill-speed", m.PrefillTokensPerSec),
		l.DecodeStepBase.Check("decode-step-base", m.DecodeStepBase),
		l.DecodeStepPerSeq.Check("decode-step-per-seq", m.DecodeStepPerSeq),
		l.DecodeStepPerKContext.Check("decode-step-per-kctx", m.DecodeStepPerKContext),
		l.KVTransferTokensPerSec.Check("kv-transfer-speed", m.KVTransferTokensPerSec),
	}
	if !(m.DecodeStepBase+m.DecodeStepPerSeq >= MinStepTime) {
		errs = append(errs, errors.New("a decode step must take some time: decode-step-base + decode-step-per-seq >= 1e-06 seconds"))
	}
	return errors.Join(errs...)
}

// PrefillTime is the time to compute uncached prompt tokens.
func (m Model) PrefillTime(uncachedTokens int) float64 {
	if uncachedTokens <= 0 {
		return 0
	}
	return float64(uncachedTokens) / m.PrefillTokensPerSec
}

// DecodeStepTime is the time of one decode step producing one token for each
// of batch sequences whose contexts add up to contextTokens.
func (m Model) DecodeStepTime(batch int, contextTokens int) float64 {
	if batch <= 0 {
		return 0
	}
	return m.DecodeStepBase + m.DecodeStepPerSeq*float64(batch) + m.DecodeStepPerKContext*float64(contextTokens)/1000
}

// StepTime is the duration of one continuous-batching step that computes
// prefillTokens prompt tokens (chunks of prefills) and one token for each of
// decodes decoding sequences whose contexts add up to decodeContext: the
// engine emulator runs its steps for exactly this long, and the simulator
// predicts with it.
func (m Model) StepTime(prefillTokens, decodes, decodeContext int) float64 {
	return m.PrefillTime(prefillTokens) + m.DecodeStepTime(decodes, decodeContext)
}

// TransferTime is the time to move the KV cache of tokens prompt tokens
// between instances.
func (m Model) TransferTime(tokens int) float64 {
	if m.KVTransferTokensPerSec <= 0 || tokens <= 0 {
		return 0
	}
	return float64(tokens) / m.KVTransferTokensPerSec
}

// DecodeThroughput is the output tokens per second of a full batch of batch
// sequences with average context avgContext.
func (m Model) DecodeThroughput(batch int, avgContext int) float64 {
	st := m.DecodeStepTime(batch, batch*avgContext)
	if st <= 0 {
		return 0
	}
	return float64(batch) / st
}

// MaxBatchForTPOT is the largest batch whose step time stays within tpot
// seconds at the given average context; 0 if even one sequence misses it.
func (m Model) MaxBatchForTPOT(tpot float64, avgContext int) int {
	per := m.DecodeStepPerSeq + m.DecodeStepPerKContext*float64(avgContext)/1000
	room := tpot - m.DecodeStepBase
	if room < per {
		return 0
	}
	if per <= 0 {
		return 1 << 30
	}
	return int(room / per)
}
