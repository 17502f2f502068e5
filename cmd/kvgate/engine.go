package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/kvpub"
	"github.com/kvgate/kvgate/internal/engineauth"
	"github.com/kvgate/kvgate/internal/flagrange"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/httpserve"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/perfmodel"
)

// engineFlags are the kvgate engine flags that are not Config fields.
type engineFlags struct {
	role, format, style, logLevel, scheduling, inlineSystem string
}

// newEngineFlagSet registers the engine flags on cfg (defaults from its
// current values); every numeric flag has the range engine.Config.Validate
// enforces.
func newEngineFlagSet(cfg *engine.Config, ef *engineFlags, stderr io.Writer) (*flag.FlagSet, *flagrange.Flags) {
	fs := flag.NewFlagSet("engine", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fl := flagrange.New(fs)
	lim, pm := engine.ConfigLimits(), perfmodel.ModelLimits()
	fs.StringVar(&cfg.Model, "model", cfg.Model, "served model name")
	fs.Func("lora-modules", "LoRA adapters served besides the model, NAME or NAME=PATH (vLLM's form; the path is ignored), comma-separated or repeated: requests naming one are served with its own prefix cache, and its KV events carry lora_name and lora_id", func(v string) error {
		for _, item := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(strings.TrimSpace(item), "=")
			if name == "" {
				return fmt.Errorf("%q: an adapter needs a name (NAME or NAME=PATH)", item)
			}
			cfg.LoRAModules = append(cfg.LoRAModules, name)
		}
		return nil
	})
	fs.StringVar(&cfg.Host, "host", cfg.Host, "HTTP listen host")
	flagrange.Var(fl, &cfg.Port, "port", lim.Port, "HTTP listen port (0 = any free port)")
	fs.StringVar(&ef.role, "role", cfg.Role.String(), "role: both, prefill or decode")
	flagrange.Var(fl, &cfg.Perf.PrefillTokensPerSec, "prefill-speed", pm.PrefillTokensPerSec, "prefill throughput, uncached prompt tokens per second")
	flagrange.Var(fl, &cfg.Perf.DecodeStepBase, "decode-step-base", pm.DecodeStepBase, "fixed cost of one decode step, seconds")
	flagrange.Var(fl, &cfg.Perf.DecodeStepPerSeq, "decode-step-per-seq", pm.DecodeStepPerSeq, "decode step cost per running sequence, seconds")
	flagrange.Var(fl, &cfg.Perf.DecodeStepPerKContext, "decode-step-per-kctx", pm.DecodeStepPerKContext, "decode step cost per 1000 context tokens in the batch, seconds")
	flagrange.Var(fl, &cfg.Perf.KVTransferTokensPerSec, "kv-transfer-speed", pm.KVTransferTokensPerSec, "KV transfer rate from a prefill engine, tokens per second")
	flagrange.Var(fl, &cfg.MaxNumBatchedTokens, "max-num-batched-tokens", lim.MaxNumBatchedTokens, "token budget of one step (chunked prefill)")
	flagrange.Var(fl, &cfg.MaxNumSeqs, "max-num-seqs", lim.MaxNumSeqs, "maximum running sequences")
	flagrange.Var(fl, &cfg.MaxLoRAs, "max-loras", lim.MaxLoRAs, "LoRA adapters in one batch (vLLM's --max-loras): a waiting request for another adapter is passed over while this many run")
	fs.StringVar(&ef.scheduling, "scheduling-policy", "fcfs", "waiting queue order: fcfs (first come, first served; a request with a priority other than 0 is refused) or priority (by each request's priority, lower first, then arrival), as vLLM's flag")
	flagrange.Var(fl, &cfg.NumGPUBlocks, "num-gpu-blocks", lim.NumGPUBlocks, "KV cache capacity in blocks")
	flagrange.Var(fl, &cfg.BlockSize, "block-size", lim.BlockSize, "tokens per KV block")
	flagrange.Var(fl, &cfg.MaxModelLen, "max-model-len", lim.MaxModelLen, "maximum prompt + output tokens of a request")
	fs.BoolVar(&cfg.BOS, "bos", cfg.BOS, "start a text prompt (completions, /generate, /tokenize's prompt form) with a BOS token unless the request says add_special_tokens: false, as a Llama-family tokenizer does in vLLM and SGLang (a chat's template writes its own)")
	fs.StringVar(&ef.inlineSystem, "anthropic-inline-system", "preserve", "where the Messages API puts system messages inside messages, as vLLM's flag of that name: preserve (in place) or fold (into the user turn beside them; auto is preserve here, whose template renders them); hoist (into the system prompt) is vLLM's first way, before it kept them in place")
	fs.StringVar(&cfg.APIKey, "api-key", "", "require \"Authorization: Bearer KEY\" on /v1 requests, as vLLM's --api-key (default: VLLM_API_KEY); /health, /metrics and /tokenize stay open")
	fs.BoolVar(&cfg.ResponsesStore, "responses-store", false, "keep Responses API answers in memory (the newest 4096), as vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1: previous_response_id and GET /v1/responses/{id} find them")
	flagrange.Var(fl, &cfg.StreamInterval, "stream-interval", lim.StreamInterval, "stream output in chunks of this many tokens (vLLM's --stream-interval)")
	flagrange.Var(fl, &cfg.TimeScale, "time-scale", lim.TimeScale, "run this many times faster than real time (modelled durations are divided by it)")
	fs.StringVar(&cfg.KVEventsEndpoint, "kv-events-endpoint", "", "bind a ZMQ PUB socket for KV events here, e.g. tcp://*:5557")
	fs.StringVar(&cfg.KVEventsReplayEndpoint, "kv-events-replay-endpoint", "", "bind a ZMQ ROUTER replay socket here, e.g. tcp://*:5558")
	fs.BoolVar(&cfg.PromptTokensDetails, "enable-prompt-tokens-details", false, "report cached prompt tokens in usage.prompt_tokens_details, as vLLM's flag of that name (off by default there too; a chat's only when some were cached)")
	fs.StringVar(&cfg.KVEventsTopic, "kv-events-topic", "", "KV events topic (default kv@<host:port>@<model>, llm-d's; given empty, '', vLLM's default empty topic)")
	fs.StringVar(&ef.format, "kv-events-format", cfg.KVEventsFormat.String(), "KV event encoding: array (vLLM <= 0.23) or map (newer vLLM)")
	fs.StringVar(&ef.style, "kv-events-style", cfg.KVEventsStyle.String(), "KV event numbering: vllm (batches from 0, nil parent at a chain start) or llmd-sim (as llm-d-inference-sim: batches from 1, parent 0 in the array form)")
	flagrange.Var(fl, &cfg.KVEventsBufferSteps, "kv-events-buffer-steps", lim.KVEventsBufferSteps, "event batches kept for replay")
	flagrange.Var(fl, &cfg.RoleSwitchWarmup, "role-switch-warmup", lim.RoleSwitchWarmup, "warm-up after draining on a role switch (modelled time)")
	flagrange.Var(fl, &cfg.KVHoldTimeout, "kv-hold-timeout", lim.KVHoldTimeout, "how long a prefill engine keeps KV for a remote decode (modelled time)")
	fs.StringVar(&cfg.EngineID, "engine-id", "", "engine id in kv_transfer_params (default from the address)")
	fs.StringVar(&ef.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	body := httpserve.ConfigLimits().BodyBytes
	body.Zero = "from --max-model-len"
	httpserve.AddFlagsBody(fl, &cfg.HTTP, body)
	return fs, fl
}

// runEngine runs one emulated vLLM engine until ctx ends.
func runEngine(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := engine.DefaultConfig()
	var ef engineFlags
	fs, fl := newEngineFlagSet(&cfg, &ef, stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvgate engine [flags]\n\nRuns one emulated vLLM engine: its OpenAI-compatible HTTP API, /metrics and\nKV events over ZMQ, timed by the simulator's model (no GPU; docs/engine.md).\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, fl, args); err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) { cfg.KVEventsTopicSet = cfg.KVEventsTopicSet || f.Name == "kv-events-topic" })
	if cfg.APIKey == "" {
		cfg.APIKey = os.Getenv("VLLM_API_KEY") // read after the flags: -h does not show it
	}
	if cfg.APIKey != "" {
		if err := engineauth.Check(cfg.APIKey); err != nil {
			return &usageError{err: fmt.Errorf("--api-key (or VLLM_API_KEY): %w", err)}
		}
	}
	var err error
	if cfg.Role, err = fleet.ParseRole(ef.role); err != nil || ef.role == "" { // "" is not a role here
		return fmt.Errorf("role must be both, prefill or decode, got %q", ef.role)
	}
	switch ef.scheduling {
	case "fcfs":
		cfg.PriorityScheduling = false
	case "priority":
		cfg.PriorityScheduling = true
	default:
		return fmt.Errorf("scheduling-policy must be fcfs or priority, got %q", ef.scheduling)
	}
	if cfg.InlineSystem, err = openai.ParseInlineSystem(ef.inlineSystem); err != nil {
		return fmt.Errorf("anthropic-inline-system: %w", err)
	}
	if cfg.KVEventsFormat, err = kvpub.ParseFormat(ef.format); err != nil {
		return err
	}
	if cfg.KVEventsStyle, err = kvpub.ParseStyle(ef.style); err != nil {
		return err
	}
	if cfg.Logger, err = textLogger(stderr, ef.logLevel); err != nil {
		return fmt.Errorf("log level: %w", err)
	}

	e, err := engine.New(cfg)
	if err != nil {
		return err
	}
	if err := e.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "kvgate engine: model %s, role %s, serving on %s", cfg.Model, e.Role(), e.URL())
	if ep := e.KVEventsEndpoint(); ep != "" {
		fmt.Fprintf(stdout, ", KV events on %s topic %q", ep, e.KVEventsTopic())
	}
	fmt.Fprintln(stdout)
	<-ctx.Done()
	shutdown := make(chan error, 1)
	go func() { shutdown <- e.Close() }()
	select {
	case err := <-shutdown:
		return err
	case <-time.After(5 * time.Second):
		return fmt.Errorf("engine did not stop within 5s")
	}
}
