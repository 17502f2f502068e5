// Package bench is kvgate's load generator: it sends OpenAI-style
// requests to any compatible server (kvgate, a vLLM engine, another
// router) on a schedule (open loop at a rate, closed loop at a
// concurrency, or a trace's timestamps), measures each streamed answer
// (TTFT, inter-token latency, TPOT, end-to-end) and reports percentiles,
// SLO attainment and goodput as a table, JSON, CSV and an HTML page with
// plots.
package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Item is one request to send.
type Item struct {
	// At is when to send it, seconds from the start (open loop and
	// traces; closed loops ignore it).
	At float64
	// Prompt is the completion prompt; with Chat, the conversation's
	// messages are System, then each of History as a user message
	// answered by the assistant, then Prompt as the user's new turn.
	Prompt    string
	System    string
	History   []string
	Chat      bool
	MaxTokens int
	// Session groups the turns of one conversation (for reports).
	Session int
}

// word is the text of token id: one word per token for tokenizers that
// split on words (the emulator's, and close to a BPE's for such words).
func word(prefix byte, id uint64) string {
	return string(prefix) + strconv.FormatUint(id, 36)
}

// ChatConfig is the multi-turn chat workload of the baseline chapter, as
// text: Systems shared system prompts of SystemTokens words, Sessions
// conversations each growing by TurnTokens words a turn, Poisson arrivals
// at Rate for Duration seconds, OutputTokens per answer.
type ChatConfig struct {
	Systems, Sessions, SystemTokens, TurnTokens, OutputTokens int
	Rate, Duration                                            float64
	Seed                                                      uint64
	// AsChat sends /v1/chat/completions (system + user message);
	// otherwise the whole conversation is one completion prompt.
	AsChat bool
}

// Limits of generated workloads.
const (
	maxItems      = 1_000_000
	maxItemTokens = 1 << 20
)

// Chat generates the chat workload.
func Chat(c ChatConfig) ([]Item, error) {
	if c.Systems <= 0 || c.Sessions <= 0 || c.SystemTokens < 0 || c.TurnTokens <= 0 || c.OutputTokens <= 0 {
		return nil, fmt.Errorf("bench: chat needs systems, sessions, turn and output tokens > 0")
	}
	if !(c.Rate > 0) || !(c.Duration > 0) || c.Rate*c.Duration > maxItems {
		return nil, fmt.Errorf("bench: rate × duration must be in (0, %d] requests", maxItems)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xbe7c4))
	systems := make([]string, c.Systems)
	for i := range systems {
		var b strings.Builder
		for j := 0; j < c.SystemTokens; j++ {
			b.WriteString(word('s', rng.Uint64()%1e9))
			b.WriteByte(' ')
		}
		systems[i] = b.String()
	}
	type conv struct {
		system int
		text   strings.Builder
		turns  []string // with AsChat: each turn's words
		words  int
	}
	convs := make([]conv, c.Sessions)
	for i := range convs {
		convs[i].system = rng.IntN(c.Systems)
	}
	var items []Item
	for t := rng.ExpFloat64() / c.Rate; t < c.Duration; t += rng.ExpFloat64() / c.Rate {
		s := rng.IntN(c.Sessions)
		cv := &convs[s]
		if cv.words+c.TurnTokens > maxItemTokens {
			cv.text.Reset()
			cv.turns, cv.words = nil, 0
		}
		var turn strings.Builder
		for j := 0; j < c.TurnTokens; j++ {
			turn.WriteString(word('u', rng.Uint64()%1e9))
			turn.WriteByte(' ')
		}
		cv.words += c.TurnTokens
		it := Item{At: t, MaxTokens: c.OutputTokens, Session: s, Chat: c.AsChat}
		if c.AsChat {
			// A turn as a chat client sends it: the earlier turns, each
			// answered, then the new one (the gateway tells a
			// conversation's first turn by its having no answer yet).
			it.System, it.History, it.Prompt = systems[cv.system], cv.turns[:len(cv.turns):len(cv.turns)], turn.String()
			cv.turns = append(cv.turns, it.Prompt)
		} else {
			cv.text.WriteString(turn.String())
			it.Prompt = systems[cv.system] + cv.text.String()
		}
		items = append(items, it)
	}
	return items, nil
}

// MooncakeTrace reads a Mooncake-format trace (JSON lines with timestamp
// in ms, input_length, output_length, hash_ids of 512-token blocks) and
// turns each request into a completion prompt: every hash id becomes the
// same 512 words wherever it appears, so equal ids share prefixes on the
// server too; the part of input_length past the last full block is words
// of the request's own. timeScale multiplies timestamps (0.5: twice the
// rate); maxOutput caps output lengths (0: none).
func MooncakeTrace(r io.Reader, timeScale float64, maxOutput int) ([]Item, error) {
	if !(timeScale > 0) || timeScale > 1e6 {
		return nil, fmt.Errorf("bench: trace time scale must be in (0, 1e6], got %v", timeScale)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var items []Item
	line := 0
	for sc.Scan() {
		line++
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var rec struct {
			Timestamp    float64  `json:"timestamp"`
			InputLength  int      `json:"input_length"`
			OutputLength int      `json:"output_length"`
			HashIDs      []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("bench: trace line %d: %w", line, err)
		}
		if rec.InputLength < 1 || rec.InputLength > maxItemTokens || rec.OutputLength < 0 || rec.OutputLength > maxItemTokens ||
			math.IsNaN(rec.Timestamp) || rec.Timestamp < 0 || rec.Timestamp > 1e12 || len(rec.HashIDs) > maxItemTokens/512+1 {
			return nil, fmt.Errorf("bench: trace line %d: lengths, timestamp or hash ids out of range", line)
		}
		if len(items) >= maxItems {
			return nil, fmt.Errorf("bench: trace has more than %d requests", maxItems)
		}
		var b strings.Builder
		n := 0
		for _, h := range rec.HashIDs {
			for j := 0; j < 512 && n < rec.InputLength; j++ {
				b.WriteString(word('h', h*512+uint64(j)))
				b.WriteByte(' ')
				n++
			}
		}
		for j := 0; n < rec.InputLength; j++ {
			b.WriteString(word('r', uint64(line)<<20|uint64(j)))
			b.WriteByte(' ')
			n++
		}
		out := max(rec.OutputLength, 1)
		if maxOutput > 0 {
			out = min(out, maxOutput)
		}
		items = append(items, Item{At: rec.Timestamp / 1000 * timeScale, Prompt: b.String(), MaxTokens: out, Session: -1})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: trace: %w", err)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("bench: trace has no requests")
	}
	t0 := items[0].At
	for i := range items {
		items[i].At -= t0
	}
	return items, nil
}

// Schedule gives items arrival times: "poisson" or "constant" at rate
// requests per second (the items' own times are replaced).
func Schedule(items []Item, kind string, rate float64, seed uint64) error {
	if !(rate > 0) || rate > 1e6 {
		return fmt.Errorf("bench: rate must be in (0, 1e6], got %v", rate)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5c4ed))
	t := 0.0
	for i := range items {
		switch kind {
		case "poisson":
			t += rng.ExpFloat64() / rate
		case "constant":
			t = float64(i) / rate
		default:
			return fmt.Errorf("bench: arrivals %q: poisson or constant", kind)
		}
		items[i].At = t
	}
	return nil
}
