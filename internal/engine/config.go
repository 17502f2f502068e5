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
	"math"
	"slices"
	"time"

	"github.com/kvgate/kvgate/internal/engine/kvpub"
	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/perfmodel"
)

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
	Role fleet.Role
	// Perf is the timing model.
	Perf perfmodel.Model
	// MaxNumBatchedTokens is the token budget of one step (chunked prefill).
	MaxNumBatchedTokens int
	// MaxNumSeqs bounds the running batch.
	MaxNumSeqs int
	// PriorityScheduling orders the waiting queue by each request's
	// priority, lower first, then by arrival (vLLM's --scheduling-policy
	// priority); without it the queue is first come, first served and a
	// request with a priority other than 0 is refused, as vLLM does.
	PriorityScheduling bool
	// NumGPUBlocks is the KV capacity in blocks of BlockSize tokens.
	NumGPUBlocks int
	// BlockSize is the tokens per KV block.
	BlockSize int
	// MaxModelLen bounds prompt + output tokens of one request.
	MaxModelLen int
	// ResponsesStore keeps Responses API answers in memory (the newest
	// maxStoredResponses), as vLLM does with
	// VLLM_ENABLE_RESPONSES_API_STORE=1: a later request names one as
	// its previous_response_id, GET /v1/responses/{id} returns it.
	// Without it store is ignored, as vLLM ignores it by default.
	ResponsesStore bool
	// APIKey, when set, is required on every /v1 request as
	// "Authorization: Bearer KEY" (else 401 {"error": "Unauthorized"}), as
	// vLLM's --api-key (or VLLM_API_KEY) requires it; /health, /metrics,
	// /tokenize and the rest stay open, as vLLM's do.
	APIKey string
	// InlineSystem is where a Messages request's system messages inside
	// messages go (vLLM's --anthropic-inline-system: preserve or fold;
	// hoist, as vLLM placed them first); "" is preserve.
	InlineSystem openai.InlineSystem
	// BOS starts a text prompt (a completion's, /generate's, /tokenize's
	// prompt form) with a BOS token (id 1) unless the request says
	// add_special_tokens: false, as a Llama-family tokenizer does in
	// vLLM and SGLang; a chat's template writes its own.
	BOS bool
	// StreamInterval sends streamed tokens in chunks of this many tokens
	// (vLLM's --stream-interval); 1 sends every token at once.
	StreamInterval int
	// TimeScale > 1 runs faster than real time: every modelled duration is
	// divided by it. Reported latencies (metrics) are in modelled seconds.
	TimeScale float64

	// LoRAModules names the LoRA adapters served besides Model (vLLM's
	// --lora-modules NAME=PATH …; the emulator has no weights, so only the
	// names matter). A request naming one is served as the base model,
	// its blocks hashed with the adapter's name and published with it
	// (lora_name, and lora_id: its place in the list from 1), as vLLM
	// does; it shares no prefix with the base model or another adapter.
	LoRAModules []string
	// MaxLoRAs bounds the adapters in one batch (vLLM's --max-loras,
	// default 1): a waiting request for another adapter is passed over
	// while that many run, and the requests behind it go first.
	MaxLoRAs int

	// KVEventsEndpoint, when set, binds a ZMQ PUB socket for KV events.
	KVEventsEndpoint string
	// KVEventsReplayEndpoint, when set, binds a ZMQ ROUTER for replays.
	KVEventsReplayEndpoint string
	// PromptTokensDetails: usage reports prompt_tokens_details (the
	// cached prompt tokens), as vLLM with --enable-prompt-tokens-details;
	// a chat's only when some were cached, as vLLM's. DefaultConfig sets
	// it; kvgate engine's flag is off by default, as vLLM's.
	PromptTokensDetails bool
	// KVEventsTopic overrides the default topic kv@<host:port>@<model>
	// (llm-d's); with KVEventsTopicSet even when empty (vLLM's default
	// topic, "").
	KVEventsTopic    string
	KVEventsTopicSet bool
	// KVEventsFormat is array (vLLM <= 0.23) or map (newer vLLM).
	KVEventsFormat kvpub.Format
	// KVEventsStyle is vLLM's (default) or llm-d-inference-sim's: batches
	// numbered from 1 and parent 0 for a chain start in the array form.
	KVEventsStyle kvpub.Style
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

// DefaultConfig is an engine with the baseline chapter's timing model and vLLM's
// defaults.
func DefaultConfig() Config {
	return Config{
		PromptTokensDetails: true, // kvgate engine's flag defaults to vLLM's off
		Model:               "kvgate-emulated",
		Host:                "127.0.0.1",
		Port:                8000,
		Role:                fleet.RoleBoth,
		Perf:                perfmodel.Default(),
		MaxNumBatchedTokens: 8192,
		MaxNumSeqs:          256,
		NumGPUBlocks:        8192,
		BlockSize:           16,
		MaxModelLen:         32768,
		MaxLoRAs:            1,
		TimeScale:           1,
		StreamInterval:      1,
		KVEventsFormat:      kvpub.FormatArray,
		KVEventsBufferSteps: kvpub.DefaultBufferSteps,
		RoleSwitchWarmup:    10 * time.Second,
		KVHoldTimeout:       480 * time.Second,
	}
}

// Limits are the ranges of a Config's numbers that Validate enforces; the
// kvgate engine flags of the same names show and check the same ranges.
// They keep an engine within bounded memory (the block pool is allocated
// up front: NumGPUBlocks × 24 bytes) and every modelled duration, divided by
// TimeScale, within what a time.Duration holds.
type Limits struct {
	Port                flagrange.Range[int]
	MaxNumBatchedTokens flagrange.Range[int]
	MaxNumSeqs          flagrange.Range[int]
	MaxLoRAs            flagrange.Range[int]
	NumGPUBlocks        flagrange.Range[int]
	BlockSize           flagrange.Range[int]
	MaxModelLen         flagrange.Range[int]
	StreamInterval      flagrange.Range[int]
	KVEventsBufferSteps flagrange.Range[int]
	TimeScale           flagrange.Range[float64]
	RoleSwitchWarmup    flagrange.Range[time.Duration]
	KVHoldTimeout       flagrange.Range[time.Duration]
}

// ConfigLimits returns the ranges Validate enforces.
func ConfigLimits() Limits {
	return Limits{
		Port:                flagrange.Range[int]{Min: 0, Max: 65535},
		MaxNumBatchedTokens: flagrange.Range[int]{Min: 1, Max: 1 << 24, Unit: "tokens"},
		MaxNumSeqs:          flagrange.Range[int]{Min: 1, Max: 1 << 16, Unit: "sequences"},
		MaxLoRAs:            flagrange.Range[int]{Min: 1, Max: maxLoRAModules, Unit: "adapters"},
		NumGPUBlocks:        flagrange.Range[int]{Min: 1, Max: 1 << 22, Unit: "blocks"},
		BlockSize:           flagrange.Range[int]{Min: 1, Max: 4096, Unit: "tokens"},
		MaxModelLen:         flagrange.Range[int]{Min: 1, Max: 1 << 24, Unit: "tokens"},
		StreamInterval:      flagrange.Range[int]{Min: 1, Max: 1 << 20, Unit: "tokens", Zero: "1"},
		KVEventsBufferSteps: flagrange.Range[int]{Min: 1, Max: 1 << 20, Unit: "steps", Zero: "default 10000"},
		TimeScale:           flagrange.Range[float64]{Min: 1e-3, Max: 1e6},
		RoleSwitchWarmup:    flagrange.Range[time.Duration]{Min: 0, Max: time.Hour},
		KVHoldTimeout:       flagrange.Range[time.Duration]{Min: 0, Max: 24 * time.Hour},
	}
}

// Validate reports unusable settings, numbers outside ConfigLimits and
// perfmodel.ModelLimits included, named as the kvgate engine flags name them.
func (c Config) Validate() error {
	var errs []error
	if c.Model == "" {
		errs = append(errs, errors.New("model name is required"))
	}
	if err := checkRole(c.Role); err != nil {
		errs = append(errs, err)
	}
	if err := c.Perf.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("timing model: %w", err))
	}
	l := ConfigLimits()
	errs = append(errs,
		l.Port.Check("port", c.Port),
		l.MaxNumBatchedTokens.Check("max-num-batched-tokens", c.MaxNumBatchedTokens),
		l.MaxNumSeqs.Check("max-num-seqs", c.MaxNumSeqs),
		l.MaxLoRAs.Check("max-loras", c.MaxLoRAs),
		l.NumGPUBlocks.Check("num-gpu-blocks", c.NumGPUBlocks),
		l.BlockSize.Check("block-size", c.BlockSize),
		l.MaxModelLen.Check("max-model-len", c.MaxModelLen),
		l.StreamInterval.Check("stream-interval", c.StreamInterval),
		l.KVEventsBufferSteps.Check("kv-events-buffer-steps", c.KVEventsBufferSteps),
		l.TimeScale.Check("time-scale", c.TimeScale),
		l.RoleSwitchWarmup.Check("role-switch-warmup", c.RoleSwitchWarmup),
		l.KVHoldTimeout.Check("kv-hold-timeout", c.KVHoldTimeout),
	)
	errs = append(errs, c.checkLoRA())
	if c.KVEventsReplayEndpoint != "" && c.KVEventsEndpoint == "" {
		errs = append(errs, errors.New("kv-events-replay-endpoint needs kv-events-endpoint"))
	}
	return errors.Join(errs...)
}

// maxLoRAModules bounds the adapters an engine serves.
const maxLoRAModules = 1024

// checkLoRA checks LoRAModules: at most maxLoRAModules names, each
// non-empty, once, and not the base model's.
func (c Config) checkLoRA() error {
	if len(c.LoRAModules) > maxLoRAModules {
		return fmt.Errorf("lora-modules: %d adapters, at most %d", len(c.LoRAModules), maxLoRAModules)
	}
	for i, name := range c.LoRAModules {
		switch {
		case name == "":
			return fmt.Errorf("lora-modules: adapter %d has no name", i+1)
		case name == c.Model:
			return fmt.Errorf("lora-modules: adapter %q has the base model's name", name)
		case slices.Contains(c.LoRAModules[:i], name):
			return fmt.Errorf("lora-modules: adapter %q is listed twice", name)
		}
	}
	return nil
}

// real converts modelled seconds to wall-clock time. Validate keeps the
// result within a time.Duration for every modelled time a valid config
// produces; anything beyond saturates rather than wrapping negative, and a
// negative or NaN time is 0.
func (c Config) real(modelled float64) time.Duration {
	ns := modelled / c.TimeScale * float64(time.Second)
	switch {
	case !(ns > 0):
		return 0
	case ns >= math.MaxInt64:
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// modelled converts wall-clock time to modelled seconds.
func (c Config) modelled(d time.Duration) float64 {
	return d.Seconds() * c.TimeScale
}
