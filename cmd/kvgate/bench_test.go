package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// parseBench parses bench flags as the command does.
func parseBench(t *testing.T, args ...string) *benchFlags {
	t.Helper()
	var f benchFlags
	fs, fl := newBenchFlagSet(&f, io.Discard)
	if err := parseFlags(fs, fl, args); err != nil {
		t.Fatal(err)
	}
	return &f
}

// TestBenchChatArrivalsWithinDuration: the chat workload is sent at the
// rate within --duration, as its help says; the arrivals were drawn a
// second time, unrelated to the count (a walkthrough's 4 s run at 5/s
// sent its last request at 6.5 s, another 18 requests within 2.05 s).
func TestBenchChatArrivalsWithinDuration(t *testing.T) {
	for _, arrivals := range []string{"poisson", "constant"} {
		for _, seed := range []string{"2", "3", "5"} {
			f := parseBench(t, "--rate", "5", "--duration", "4", "--seed", seed, "--arrivals", arrivals, "--sessions", "4", "--system-tokens", "4", "--turn-tokens", "4")
			items, err := benchItems(f, 5)
			if err != nil {
				t.Fatal(err)
			}
			last := items[len(items)-1].At
			if last >= 4 || arrivals == "constant" && len(items) != 19 {
				t.Errorf("%s, seed %s: %d requests, the last at %.2f s", arrivals, seed, len(items), last)
			}
		}
	}
}

// TestBenchNoRequest: a workload with no request is an error that says
// why, not a run of 0 % attainment (or "no request succeeded").
func TestBenchNoRequest(t *testing.T) {
	err := runBench(context.Background(), []string{"--url", "http://127.0.0.1:1", "--model", "m", "--rate", "0.5", "--duration", "0.01"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "has no request") {
		t.Errorf("got %v", err)
	}
}
