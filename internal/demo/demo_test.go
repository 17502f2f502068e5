package demo

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/bench"
	"github.com/kvgate/kvgate/internal/fleet"
)

// TestStartReplicasRetriesTakenPort: a synced replica whose sync port
// was taken between its choice and its bind (another process's) has the
// replicas started again on other ports; three taken choices in a row
// are an error, every replica stopped.
func TestStartReplicasRetriesTakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenAddr := "tcp://" + taken.Addr().String()
	cfg := Config{TimeScale: 1, SLO: bench.SLO{TTFT: 2}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	spec := RunSpec{Policy: "round-robin", Prefill: 1, Replicas: 3}
	eps := []fleet.Endpoint{{Name: "e", URL: "http://127.0.0.1:9", Model: model, Role: fleet.RoleBoth}}
	for _, c := range []struct {
		takenTries int
		ok         bool
	}{{1, true}, {3, false}} {
		picks := 0
		pick := func() (string, error) {
			picks++
			if picks <= 3*c.takenTries && picks%3 == 1 { // the first replica's, c.takenTries times
				return takenAddr, nil
			}
			return freeLoopback()
		}
		urls, _, stop, err := startReplicas(context.Background(), cfg, spec, eps, pick)
		stop()
		if c.ok && (err != nil || len(urls) != 3 || picks != 6) {
			t.Fatalf("taken once: %v, %d replicas, %d ports picked (want 6)", err, len(urls), picks)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), "address already in use")) {
			t.Fatalf("taken three times: %v", err)
		}
	}
}
