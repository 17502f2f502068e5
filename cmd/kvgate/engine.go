package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/kvpub"
	"github.com/kvgate/kvgate/internal/httpserve"
)

// runEngine runs one emulated vLLM engine until ctx ends.
func runEngine(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := engine.DefaultConfig()
	fs := flag.NewFlagSet("engine", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Model, "model", cfg.Model, "served model name")
	fs.StringVar(&cfg.Host, "host", cfg.Host, "HTTP listen host")
	fs.IntVar(&cfg.Port, "port", cfg.Port, "HTTP listen port (0 = any free port)")
	role := fs.String("role", string(cfg.Role), "role: both, prefill or decode")
	fs.Float64Var(&cfg.Perf.PrefillTokensPerSec, "prefill-speed", cfg.Perf.PrefillTokensPerSec, "prefill throughput, uncached prompt tokens per second")
	fs.Float64Var(&cfg.Perf.DecodeStepBase, "decode-step-base", cfg.Perf.DecodeStepBase, "fixed cost of one decode step, seconds")
	fs.Float64Var(&cfg.Perf.DecodeStepPerSeq, "decode-step-per-seq", cfg.Perf.DecodeStepPerSeq, "decode step cost per running sequence, seconds")
	fs.Float64Var(&cfg.Perf.DecodeStepPerKContext, "decode-step-per-kctx", cfg.Perf.DecodeStepPerKContext, "decode step cost per 1000 context tokens in the batch, seconds")
	fs.Float64Var(&cfg.Perf.KVTransferTokensPerSec, "kv-transfer-speed", cfg.Perf.KVTransferTokensPerSec, "KV transfer rate from a prefill engine, tokens per second (0 = free)")
	fs.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", cfg.MaxNumBatchedTokens, "token budget of one step (chunked prefill)")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "maximum running sequences")
	fs.IntVar(&cfg.NumGPUBlocks, "num-gpu-blocks", cfg.NumGPUBlocks, "KV cache capacity in blocks")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "maximum prompt + output tokens of a request")
	fs.IntVar(&cfg.StreamInterval, "stream-interval", cfg.StreamInterval, "stream output in chunks of this many tokens (vLLM's --stream-interval)")
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "run this many times faster than real time (modelled durations are divided by it)")
	fs.StringVar(&cfg.KVEventsEndpoint, "kv-events-endpoint", "", "bind a ZMQ PUB socket for KV events here, e.g. tcp://*:5557")
	fs.StringVar(&cfg.KVEventsReplayEndpoint, "kv-events-replay-endpoint", "", "bind a ZMQ ROUTER replay socket here, e.g. tcp://*:5558")
	fs.StringVar(&cfg.KVEventsTopic, "kv-events-topic", "", "KV events topic (default kv@<host:port>@<model>)")
	format := fs.String("kv-events-format", cfg.KVEventsFormat.String(), "KV event encoding: array (vLLM <= 0.23) or map (newer vLLM)")
	fs.IntVar(&cfg.KVEventsBufferSteps, "kv-events-buffer-steps", cfg.KVEventsBufferSteps, "event batches kept for replay")
	fs.DurationVar(&cfg.RoleSwitchWarmup, "role-switch-warmup", cfg.RoleSwitchWarmup, "warm-up after draining on a role switch (modelled time)")
	fs.DurationVar(&cfg.KVHoldTimeout, "kv-hold-timeout", cfg.KVHoldTimeout, "how long a prefill engine keeps KV for a remote decode (modelled time)")
	fs.StringVar(&cfg.EngineID, "engine-id", "", "engine id in kv_transfer_params (default from the address)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	httpserve.AddFlags(fs, &cfg.HTTP) // --max-body-bytes 0: derived from --max-model-len
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	var err error
	if cfg.Role, err = engine.ParseRole(*role); err != nil {
		return err
	}
	if cfg.KVEventsFormat, err = kvpub.ParseFormat(*format); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("log level: %w", err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

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
