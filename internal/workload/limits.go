package workload

import (
	"fmt"

	"github.com/kvgate/kvgate/internal/flagrange"
)

// Caps on what one workload may hold, so that neither a generator, the trace
// reader nor the simulator replaying the result can run out of memory or
// loop for ever on a request no engine would take. Generators check their
// expected size against them before generating; ReadMooncake and
// Trace.Validate check the actual size.
const (
	// MaxRequests is the most requests in one workload (about 60 bytes
	// each in the trace, and a few arrays of that length in a simulation).
	MaxRequests = 10_000_000
	// MaxKeys bounds the block keys one workload is expected to hold (8
	// bytes each; the arrays a generated conversation leaves behind as it
	// grows add up to at most four times its final length).
	MaxKeys = 1 << 25
	// MaxGeneratedTokens bounds the random prompt tokens a generator draws
	// and hashes (time, not memory: only the last partial block of each
	// conversation is kept).
	MaxGeneratedTokens = 1 << 32
	// MaxPromptTokens is the longest prompt of one request.
	MaxPromptTokens = 1 << 24
	// MaxOutputTokens is the longest output of one request.
	MaxOutputTokens = 1 << 20
	// MaxTimestampMs is the latest Mooncake timestamp (about 317 years in
	// milliseconds).
	MaxTimestampMs = 1e13
)

// Limits are the ranges of the generators' parameters and of the trace
// reader's time scale; kvgate sim's flags of the same names use them.
type Limits struct {
	Rate         flagrange.Range[float64] // requests per second
	Duration     flagrange.Range[float64] // seconds of arrivals
	TimeScale    flagrange.Range[float64] // trace arrival-time multiplier
	BlockSize    flagrange.Range[int]
	Systems      flagrange.Range[int]
	Sessions     flagrange.Range[int]
	SystemTokens flagrange.Range[int]
	TurnTokens   flagrange.Range[int]
	OutputTokens flagrange.Range[int] // chat output tokens and the shapes' mean OSL
	ISL          flagrange.Range[int]
	Hit          flagrange.Range[float64]
	Prefixes     flagrange.Range[int]
	// The long-prompt workload's first-prompt distribution (median and
	// lognormal sigma), its context window and mean turns per
	// conversation.
	PromptMedian  flagrange.Range[int]
	PromptSigma   flagrange.Range[float64]
	ContextTokens flagrange.Range[int]
	Turns         flagrange.Range[float64]
}

// ParamLimits returns the parameter ranges.
func ParamLimits() Limits {
	return Limits{
		Rate:         flagrange.Range[float64]{Min: 0.001, Max: 1e6, Unit: "req/s"},
		Duration:     flagrange.Range[float64]{Min: 0.001, Max: 86400, Unit: "seconds"},
		TimeScale:    flagrange.Range[float64]{Min: 1e-6, Max: 1e6},
		BlockSize:    flagrange.Range[int]{Min: 1, Max: 4096, Unit: "tokens"},
		Systems:      flagrange.Range[int]{Min: 1, Max: 1 << 20},
		Sessions:     flagrange.Range[int]{Min: 1, Max: 1 << 20},
		SystemTokens: flagrange.Range[int]{Min: 0, Max: 1 << 22, Unit: "tokens"},
		TurnTokens:   flagrange.Range[int]{Min: 1, Max: 1 << 22, Unit: "tokens"},
		// The shapes draw up to 1.5× their mean: half the cap keeps them in.
		OutputTokens:  flagrange.Range[int]{Min: 0, Max: MaxOutputTokens / 2, Unit: "tokens"},
		ISL:           flagrange.Range[int]{Min: 1, Max: 1 << 22, Unit: "tokens"},
		Hit:           flagrange.Range[float64]{Min: 0, Max: 0.999},
		Prefixes:      flagrange.Range[int]{Min: 1, Max: 1 << 16},
		PromptMedian:  flagrange.Range[int]{Min: 1, Max: MaxPromptTokens, Unit: "tokens"},
		PromptSigma:   flagrange.Range[float64]{Min: 0, Max: 4},
		ContextTokens: flagrange.Range[int]{Min: 1, Max: MaxPromptTokens, Unit: "tokens"},
		Turns:         flagrange.Range[float64]{Min: 1, Max: 10000},
	}
}

// expectedRequests is the mean number of requests of a Poisson stream of
// rate for duration seconds.
func expectedRequests(rate, duration float64) float64 { return rate * duration }

// checkBudget reports a workload whose expected size exceeds the caps.
func checkBudget(name string, requests, keys, tokens float64) error {
	switch {
	case !(requests <= MaxRequests):
		return fmt.Errorf("%s workload: rate × duration = %.4g expected requests, more than the %d a workload may hold", name, requests, MaxRequests)
	case !(keys <= MaxKeys):
		return fmt.Errorf("%s workload: about %.4g prompt blocks to hold, more than %d: lower the rate, duration or prompt sizes, or raise the block size", name, keys, MaxKeys)
	case !(tokens <= MaxGeneratedTokens):
		return fmt.Errorf("%s workload: about %.4g prompt tokens to generate, more than %d", name, tokens, int64(MaxGeneratedTokens))
	}
	return nil
}
