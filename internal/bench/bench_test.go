package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/enginetest"
)

func startEngine(t *testing.T, scale float64) *engine.Engine { return enginetest.Start(t, scale) }

// histogram reads a Prometheus histogram's _sum and _count from /metrics.
func histogram(t *testing.T, url, name string) (sum, count float64) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch {
		case strings.HasPrefix(f[0], name+"_sum"):
			sum += v
		case strings.HasPrefix(f[0], name+"_count"):
			count += v
		}
	}
	return sum, count
}

// TestBenchAgreesWithEngineMetrics: against one emulator, the TTFT and
// TPOT bench measures agree with the engine's own histograms (issue 13).
func TestBenchAgreesWithEngineMetrics(t *testing.T) {
	// Real time (scale 1): HTTP and the race detector's overhead are small
	// against prefills of about 0.2 s.
	const scale = 1
	e := startEngine(t, scale)
	items, err := Chat(ChatConfig{Systems: 4, Sessions: 20, SystemTokens: 4000, TurnTokens: 400, OutputTokens: 16, Rate: 6, Duration: 4, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{URL: e.URL(), Model: "m", HTTP: http.DefaultClient, TimeScale: scale}
	recs, wall, err := Run(context.Background(), c, items, Mode{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize("x", recs, wall.Seconds()*scale, SLO{TTFT: 2})
	if s.Outcomes["ok"] != len(items) {
		t.Fatalf("outcomes %v", s.Outcomes)
	}
	ttftSum, ttftN := histogram(t, e.URL(), "vllm:time_to_first_token_seconds")
	tpotSum, tpotN := histogram(t, e.URL(), "vllm:time_per_output_token_seconds")
	var benchTPOT, gaps float64
	for _, r := range recs {
		benchTPOT += r.TPOT * float64(r.OutputTokens-1)
		gaps += float64(r.OutputTokens - 1)
	}
	engTTFT, engTPOT := ttftSum/ttftN, tpotSum/tpotN
	// The client sees the engine's times plus loopback HTTP: allow 20 % or
	// 15 ms, whichever is larger.
	near := func(a, b float64) bool { return a-b < max(0.2*b, 0.015) && b-a < max(0.2*b, 0.015) }
	if ttftN != float64(len(items)) || !near(s.TTFT.Mean, engTTFT) {
		t.Errorf("TTFT: bench mean %.4fs over %d, engine %.4fs over %.0f", s.TTFT.Mean, len(items), engTTFT, ttftN)
	}
	if !near(benchTPOT/gaps, engTPOT) {
		t.Errorf("TPOT: bench %.5fs, engine %.5fs", benchTPOT/gaps, engTPOT)
	}
	var html bytes.Buffer
	if err := WriteHTML(&html, "t", []RunResult{{Summary: s, Records: recs}}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(html.String(), "<svg"); n != 3 || !strings.Contains(html.String(), "<polyline") {
		t.Fatalf("report has %d plots", n)
	}
}

// TestMooncakeTraceConversation: a trace hashes a prompt's last, partial
// block on its own, so a conversation's next turn has another id there;
// rendered, each turn still resends the previous one whole (as a chat
// client does), while a prompt that only shares the full blocks (another
// conversation) does not take the partial block's words, nor does one
// after a prefix that two conversations followed; equal ids stay equal
// words.
func TestMooncakeTraceConversation(t *testing.T) {
	tr := `{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}
{"timestamp": 1, "input_length": 1300, "output_length": 5, "hash_ids": [1, 2, 4]}
{"timestamp": 2, "input_length": 1700, "output_length": 5, "hash_ids": [1, 2, 5, 6]}
{"timestamp": 3, "input_length": 2600, "output_length": 5, "hash_ids": [1, 2, 5, 7, 8, 9]}
{"timestamp": 4, "input_length": 1050, "output_length": 5, "hash_ids": [1, 2, 10]}
{"timestamp": 5, "input_length": 1700, "output_length": 5, "hash_ids": [1, 2, 5, 11]}
{"timestamp": 6, "input_length": 1000, "output_length": 5, "hash_ids": [1, 12]}
{"timestamp": 7, "input_length": 700, "output_length": 5, "hash_ids": [20, 21]}
{"timestamp": 8, "input_length": 600, "output_length": 5, "hash_ids": [20, 22]}
{"timestamp": 9, "input_length": 1200, "output_length": 5, "hash_ids": [20, 23, 24]}
`
	items, err := MooncakeTrace(strings.NewReader(tr), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	w := make([][]string, len(items))
	for i, it := range items {
		w[i] = strings.Fields(it.Prompt)
	}
	shared := func(a, b []string) int {
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		return n
	}
	for _, tc := range []struct{ a, b, want int }{
		{0, 1, 1100}, // turn 2 resends turn 1 whole (its 76-word partial block too)
		{1, 2, 1300}, // turn 3, a full block where turn 2 ended partial
		{2, 3, 1700}, // turn 4
		{3, 4, 1024}, // a shorter prompt after the same full blocks: another conversation
		{2, 5, 1536}, // block 5 is the same words wherever it appears
		{0, 6, 512},
		// Block 20 was followed by two conversations' partial blocks: whose
		// turn request 9 continues is unknown, so it takes neither's words.
		{7, 8, 512},
		{7, 9, 512},
		{8, 9, 512},
	} {
		if got := shared(w[tc.a], w[tc.b]); got != tc.want {
			t.Errorf("requests %d and %d share %d words, want %d", tc.a, tc.b, got, tc.want)
		}
	}
	for i, n := range []int{1100, 1300, 1700, 2600, 1050, 1700, 1000, 700, 600, 1200} {
		if len(w[i]) != n {
			t.Errorf("request %d: %d words, want %d", i, len(w[i]), n)
		}
	}
}

func TestMooncakeTraceText(t *testing.T) {
	tr := `{"timestamp": 1000, "input_length": 1030, "output_length": 5, "hash_ids": [7, 9, 11]}
{"timestamp": 3000, "input_length": 600, "output_length": 0, "hash_ids": [7, 12]}
`
	items, err := MooncakeTrace(strings.NewReader(tr), 0.5, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 2 || items[0].At != 0 || items[1].At != 1 || items[1].MaxTokens != 1 {
		t.Fatalf("%+v", items)
	}
	a, b := strings.Fields(items[0].Prompt), strings.Fields(items[1].Prompt)
	if len(a) != 1030 || len(b) != 600 {
		t.Fatalf("lengths %d %d", len(a), len(b))
	}
	same := 0
	for same < len(b) && a[same] == b[same] {
		same++
	}
	if same != 512 {
		t.Fatalf("shared prefix %d words, want exactly the 512 of hash id 7", same)
	}
	// Refused as the simulator refuses them (one reader, named errors).
	for _, bad := range []struct{ in, msg string }{
		{`{"timestamp": -1, "input_length": 5, "output_length": 1}`, "line 1: timestamp must be in [0, 1e+13] ms, got -1"},
		{`{"input_length": 0}`, "need timestamp, input_length and output_length"},
		{`nope`, "want a JSON object"},
		{`[1, 2]`, "want a JSON object"},
		{`{"timestamp": 1, "input_length": 5, "output_length": 9223372036854775807}`, "output_length must be"},
		{"{\"timestamp\": 5, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 4, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}", "line 2: timestamp 4 goes back in time"},
		{`{"timestamp": 1, "input_length": 2000000, "output_length": 1, "hash_ids": [` + strings.Repeat("1, ", 3906) + `1]}`, "at most 1048576 tokens"},
		{``, "no requests"},
	} {
		if _, err := MooncakeTrace(strings.NewReader(bad.in), 1, 0); err == nil || !strings.Contains(err.Error(), bad.msg) || strings.Contains(err.Error(), "Go value") {
			t.Errorf("%s: got %v, want %q", bad.in, err, bad.msg)
		}
	}
}

// FuzzMooncakeTrace: any input is either refused or rendered with one
// word per input token, each prompt's words the same as an earlier
// prompt's up to the blocks they share, and no panic.
func FuzzMooncakeTrace(f *testing.F) {
	f.Add(`{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}
{"timestamp": 1, "input_length": 1300, "output_length": 5, "hash_ids": [1, 2, 4]}`)
	f.Add(`{"timestamp": 7, "input_length": 700, "output_length": 5, "hash_ids": [20, 21]}
{"timestamp": 8, "input_length": 600, "output_length": 5, "hash_ids": [20, 22]}
{"timestamp": 9, "input_length": 1200, "output_length": 5, "hash_ids": [20, 23, 24]}`)
	f.Add(`{"timestamp": 0, "input_length": 3, "output_length": 0, "hash_ids": []}`)
	f.Fuzz(func(t *testing.T, in string) {
		if len(in) > 1<<14 {
			return
		}
		items, err := MooncakeTrace(strings.NewReader(in), 1, 0)
		if err != nil {
			return
		}
		var recs []struct {
			InputLength int      `json:"input_length"`
			HashIDs     []uint64 `json:"hash_ids"`
		}
		for _, l := range strings.Split(in, "\n") {
			if strings.TrimSpace(l) == "" {
				continue
			}
			var r struct {
				InputLength int      `json:"input_length"`
				HashIDs     []uint64 `json:"hash_ids"`
			}
			if json.Unmarshal([]byte(l), &r) != nil {
				t.Fatalf("accepted a line that does not parse: %q", l)
			}
			recs = append(recs, r)
		}
		if len(recs) != len(items) {
			t.Fatalf("%d records, %d items", len(recs), len(items))
		}
		words := make([][]string, len(items))
		for i, it := range items {
			words[i] = strings.Fields(it.Prompt)
			if len(words[i]) != recs[i].InputLength {
				t.Fatalf("item %d: %d words for %d tokens", i, len(words[i]), recs[i].InputLength)
			}
		}
		// Two prompts whose first k hash ids are equal and both hold those k
		// blocks whole have the same first 512·k words.
		for i := range items {
			for j := 0; j < i; j++ {
				k := 0
				for k < len(recs[i].HashIDs) && k < len(recs[j].HashIDs) && recs[i].HashIDs[k] == recs[j].HashIDs[k] {
					k++
				}
				k = min(k, recs[i].InputLength/512, recs[j].InputLength/512)
				for w := 0; w < 512*k; w++ {
					if words[i][w] != words[j][w] {
						t.Fatalf("items %d and %d share %d full blocks but differ at word %d", j, i, k, w)
					}
				}
			}
		}
	})
}
