// Package enginetest starts kvgate's engine emulator on loopback for the
// tests of other packages.
package enginetest

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
)

// Model is the model the emulators Start runs serve.
const Model = "m"

// Start runs an emulator serving Model at scale times real time on a
// free loopback port, its logs discarded, closed when t ends; mutate
// edits its config before it starts.
func Start(t testing.TB, scale float64, mutate ...func(*engine.Config)) *engine.Engine {
	t.Helper()
	cfg := engine.DefaultConfig()
	cfg.Model, cfg.Port, cfg.TimeScale = Model, 0, scale
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, m := range mutate {
		m(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}
