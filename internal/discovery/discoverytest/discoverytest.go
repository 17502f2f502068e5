// Package discoverytest runs discovery sources in tests: updates on a
// channel, a bounded wait for each, and a log sink to wait on.
package discoverytest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
)

// HangGuard bounds every wait; it only turns a hang into a failure and is
// never a speed claim.
const HangGuard = 20 * time.Second

// Source is discovery.Source (restated to keep this package free of
// import cycles with the packages it tests).
type Source interface {
	Run(ctx context.Context, update func([]fleet.Endpoint)) error
}

// Run runs src until the test ends (then checks that Run returns nil
// promptly); its updates arrive on the channel.
func Run(t testing.TB, src Source) <-chan []fleet.Endpoint {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	updates := make(chan []fleet.Endpoint, 100)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(eps []fleet.Endpoint) { updates <- eps }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(HangGuard):
			t.Error("Run did not return after cancel")
		}
	})
	return updates
}

// Next waits for the next update.
func Next(t testing.TB, updates <-chan []fleet.Endpoint) []fleet.Endpoint {
	t.Helper()
	select {
	case eps := <-updates:
		return eps
	case <-time.After(HangGuard):
		t.Fatal("no update")
		return nil
	}
}

// NoUpdate fails if an update is waiting.
func NoUpdate(t testing.TB, updates <-chan []fleet.Endpoint) {
	t.Helper()
	select {
	case eps := <-updates:
		t.Fatalf("unexpected update %v", eps)
	default:
	}
}

// LogSink collects a logger's lines; safe for concurrent use.
type LogSink struct {
	mu    sync.Mutex
	lines []string
}

// Logger returns a text logger writing here.
func (s *LogSink) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(s, nil)) }

// Write implements io.Writer.
func (s *LogSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.lines = append(s.lines, string(p))
	s.mu.Unlock()
	return len(p), nil
}

// String returns everything logged.
func (s *LogSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "")
}

// Count returns how many lines contain sub.
func (s *LogSink) Count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.lines {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// Wait waits until n lines contain sub.
func (s *LogSink) Wait(t testing.TB, sub string, n int) {
	t.Helper()
	deadline := time.Now().Add(HangGuard)
	for s.Count(sub) < n {
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q (%d wanted); have:\n%s", sub, n, s.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}
