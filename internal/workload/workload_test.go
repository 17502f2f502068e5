package workload

import (
	"math"
	"os"
	"strings"
	"testing"
)

func TestChatMatchesSeedShape(t *testing.T) {
	tr, err := Chat(SeedChat(40))
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := len(tr.Requests); n < 4600 || n > 5000 {
		t.Errorf("40 req/s for 120 s gave %d requests", n)
	}
	// Every conversation starts with one of 20 system prompts of 32 blocks
	// and grows by 300 tokens per turn.
	firsts := map[uint64]bool{}
	last := map[int]int{}
	for _, r := range tr.Requests {
		firsts[r.Keys[0]] = true
		if p, ok := last[r.Session]; ok && r.PromptTokens != p+300 {
			t.Fatalf("session %d grew from %d to %d", r.Session, p, r.PromptTokens)
		}
		last[r.Session] = r.PromptTokens
		if len(r.Keys) != r.PromptTokens/64 {
			t.Fatalf("%d tokens but %d keys", r.PromptTokens, len(r.Keys))
		}
	}
	if len(firsts) > 20 || len(firsts) < 15 {
		t.Errorf("%d distinct first blocks, want at most 20 system prompts", len(firsts))
	}
}

func TestShapes(t *testing.T) {
	for _, tc := range []struct {
		name string
		gen  func(ShapeConfig) (*Trace, error)
		cfg  ShapeConfig
	}{{"docs", Docs, LongDocs()}, {"agents", AgentSteps, Agents()}} {
		tr, err := tc.gen(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Validate(); err != nil {
			t.Fatal(err)
		}
		var isl, osl float64
		for _, r := range tr.Requests {
			isl += float64(r.PromptTokens)
			osl += float64(r.OutputTokens)
		}
		n := float64(len(tr.Requests))
		if rate := n / tr.Duration; math.Abs(rate-tc.cfg.Rate)/tc.cfg.Rate > 0.1 {
			t.Errorf("%s: rate %.1f, want %.1f", tc.name, rate, tc.cfg.Rate)
		}
		if m := isl / n; math.Abs(m-float64(tc.cfg.ISL))/float64(tc.cfg.ISL) > 0.15 {
			t.Errorf("%s: mean ISL %.0f, want about %d", tc.name, m, tc.cfg.ISL)
		}
		if m := osl / n; math.Abs(m-float64(tc.cfg.OSL))/float64(tc.cfg.OSL) > 0.1 {
			t.Errorf("%s: mean OSL %.0f, want about %d", tc.name, m, tc.cfg.OSL)
		}
	}
	if _, err := Docs(ShapeConfig{}); err == nil {
		t.Error("empty config must fail")
	}
}

func TestReadMooncake(t *testing.T) {
	in := `{"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]}
{"timestamp": 3000, "input_length": 600, "output_length": 1, "hash_ids": [7, 10]}
`
	tr, err := ReadMooncake(strings.NewReader(in), 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 2 || tr.Requests[1].Arrival != 1 {
		t.Fatalf("want 2 requests, the second at 1 s: %+v", tr.Requests)
	}
	if len(tr.Requests[0].Keys) != 2 || len(tr.Requests[1].Keys) != 1 {
		t.Error("only full 512-token blocks get keys")
	}
	if tr.Requests[0].Keys[0] != tr.Requests[1].Keys[0] {
		t.Error("equal hash ids must give equal keys")
	}
	bad := []struct{ name, in, msg string }{
		{"json", `{"timestamp": 1, "input_length": `, "line 1"},
		{"missing", `{"timestamp": 1, "output_length": 3}`, "input_length"},
		{"negative", `{"timestamp": 1, "input_length": -3, "output_length": 3}`, "input_length > 0"},
		{"backwards", "{\"timestamp\": 5, \"input_length\": 3, \"output_length\": 3}\n{\"timestamp\": 1, \"input_length\": 3, \"output_length\": 3}", "line 2"},
		{"empty", "", "no requests"},
	}
	for _, b := range bad {
		if _, err := ReadMooncake(strings.NewReader(b.in), 1); err == nil || !strings.Contains(err.Error(), b.msg) {
			t.Errorf("%s: got %v, want an error mentioning %q", b.name, err, b.msg)
		}
	}
	if _, err := ReadMooncake(strings.NewReader(in), 0); err == nil {
		t.Error("time scale 0 must fail")
	}
}

func TestRealMooncakeTrace(t *testing.T) {
	f, err := os.Open("../../../shared/traces/mooncake_conversation_trace.jsonl")
	if err != nil {
		t.Skip("shared trace not present:", err)
	}
	defer f.Close()
	tr, err := ReadMooncake(f, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 12031 {
		t.Errorf("got %d requests, want 12031", len(tr.Requests))
	}
	if err := tr.Validate(); err != nil {
		t.Fatal(err)
	}
}

func FuzzReadMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}`))
	f.Add([]byte("{\"timestamp\": 1}\n{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := ReadMooncake(strings.NewReader(string(b)), 1)
		if err == nil {
			if verr := tr.Validate(); verr != nil {
				t.Fatalf("accepted a trace that does not validate: %v", verr)
			}
		}
	})
}
