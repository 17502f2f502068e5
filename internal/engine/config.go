// Package engine is an emulated vLLM-compatible inference engine: real HTTP
// (OpenAI API, SSE streaming, /tokenize, /metrics), real continuous batching
// with chunked prefill, a prefix cache with vLLM's block-pool semantics,
// preemption, KV events over ZeroMQ and the NixlConnector prefill/decode
// protocol — with no model: step durations come from internal/perfmodel, the
// timing model shared with the fleet simulator, and output text is
// deterministic filler.
//
// Embed it with New, Start and Handler; many engines can run in one process.
package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvgate/kvgate/internal/engine/kvpub"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/perfmodel"
)

// Role is what an engine serves in a disaggregated fleet.
type Role string

// Roles.
const (
	RoleBoth    Role = "both"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// ParseRole parses both, prefill or decode.
func ParseRole(s string) (Role, error) {
	switch Role(s) {
	case RoleBoth, RolePrefill, RoleDecode:
		return Role(s), nil
	}
	return "", fmt.Errorf("role must be both, prefill or decode, got %q", s)
}

// Config configures one engine. Durations (RoleSwitchWarmup, KVHoldTimeout)
// are modelled time and are divided by TimeScale like every other modelled
// duration.
type Config struct {
	// Model is the served model name.
	Model string
	// Host and Port are where Start listens; Port 0 picks a free port.
	Host string
	Port int
	// Role is the initial role.
	Role Role
	// Perf is the timing model.
	Perf perfmodel.Model
	// MaxNumBatchedTokens is the token budget of one step (chunked prefill).
	MaxNumBatchedTokens int
	// MaxNumSeqs bounds the running batch.
	MaxNumSeqs int
	// NumGPUBlocks is the KV capacity in blocks of BlockSize tokens.
	NumGPUBlocks int
	// BlockSize is the tokens per KV block.
	BlockSize int
	// MaxModelLen bounds prompt + output tokens of one request.
	MaxModelLen int
	// StreamInterval sends streamed tokens in chunks of this many tokens
	// (vLLM's --stream-interval); 1 sends every token at once.
	StreamInterval int
	// TimeScale > 1 runs faster than real time: every modelled duration is
	// divided by it. Reported latencies (metrics) are in modelled seconds.
	TimeScale float64

	// KVEventsEndpoint, when set, binds a ZMQ PUB socket for KV events.
	KVEventsEndpoint string
	// KVEventsReplayEndpoint, when set, binds a ZMQ ROUTER for replays.
	KVEventsReplayEndpoint string
	// KVEventsTopic overrides the default topic kv@<host:port>@<model>.
	KVEventsTopic string
	// KVEventsFormat is array (vLLM <= 0.23) or map (newer vLLM).
	KVEventsFormat kvpub.Format
	// KVEventsBufferSteps bounds the replay buffer.
	KVEventsBufferSteps int

	// RoleSwitchWarmup is the delay after draining before the new role
	// serves (modelled time).
	RoleSwitchWarmup time.Duration
	// KVHoldTimeout is how long a prefill engine keeps the blocks of a
	// request answered for remote decode if no decode engine releases them
	// (modelled time; vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
	KVHoldTimeout time.Duration
	// EngineID names the engine in kv_transfer_params; default derived from
	// the address.
	EngineID string

	// HTTP is the HTTP server's protection (timeouts, connection limit,
	// body caps); zero fields take httpserve's defaults, and a zero
	// MaxBodyBytes is derived from MaxModelLen.
	HTTP httpserve.Config

	// Logger receives logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig is an engine with the seed's timing model and vLLM's
// defaults.
func DefaultConfig() Config {
	return Config{
		Model:               "kvgate-emulated",
		Host:                "127.0.0.1",
		Port:                8000,
		Role:                RoleBoth,
		Perf:                perfmodel.Default(),
		MaxNumBatchedTokens: 8192,
		MaxNumSeqs:          256,
		NumGPUBlocks:        8192,
		BlockSize:           16,
		MaxModelLen:         32768,
		TimeScale:           1,
		StreamInterval:      1,
		KVEventsFormat:      kvpub.FormatArray,
		KVEventsBufferSteps: kvpub.DefaultBufferSteps,
		RoleSwitchWarmup:    10 * time.Second,
		KVHoldTimeout:       480 * time.Second,
	}
}

// Validate reports unusable settings.
func (c Config) Validate() error {
	var errs []error
	if c.Model == "" {
		errs = append(errs, errors.New("model name is required"))
	}
	if _, err := ParseRole(string(c.Role)); err != nil {
		errs = append(errs, err)
	}
	if err := c.Perf.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("timing model: %w", err))
	}
	if c.MaxNumBatchedTokens <= 0 {
		errs = append(errs, errors.New("max-num-batched-tokens must be > 0"))
	}
	if c.MaxNumSeqs <= 0 {
		errs = append(errs, errors.New("max-num-seqs must be > 0"))
	}
	if c.NumGPUBlocks <= 0 {
		errs = append(errs, errors.New("num-gpu-blocks must be > 0"))
	}
	if c.BlockSize <= 0 {
		errs = append(errs, errors.New("block-size must be > 0"))
	}
	if c.MaxModelLen <= 0 {
		errs = append(errs, errors.New("max-model-len must be > 0"))
	}
	if c.StreamInterval < 0 {
		errs = append(errs, errors.New("stream-interval must be >= 1"))
	}
	if !(c.TimeScale > 0) {
		errs = append(errs, errors.New("time-scale must be > 0"))
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d out of range", c.Port))
	}
	if c.KVEventsReplayEndpoint != "" && c.KVEventsEndpoint == "" {
		errs = append(errs, errors.New("kv-events-replay-endpoint needs kv-events-endpoint"))
	}
	if c.RoleSwitchWarmup < 0 || c.KVHoldTimeout < 0 {
		errs = append(errs, errors.New("role-switch-warmup and kv-hold-timeout must be >= 0"))
	}
	return errors.Join(errs...)
}

// real converts modelled seconds to wall-clock time.
func (c Config) real(modelled float64) time.Duration {
	return time.Duration(modelled / c.TimeScale * float64(time.Second))
}

// modelled converts wall-clock time to modelled seconds.
func (c Config) modelled(d time.Duration) float64 {
	return d.Seconds() * c.TimeScale
}
