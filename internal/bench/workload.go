// Package bench is kvgate's load generator: it sends OpenAI-style
// requests to any compatible server (kvgate, a vLLM engine, another
// router) on a schedule (open loop at a rate, closed loop at a
// concurrency, or a trace's timestamps), measures each streamed answer
// (TTFT, inter-token latency, TPOT, end-to-end) and reports percentiles,
// SLO attainment and goodput as a table, JSON, CSV and an HTML page with
// plots.
package bench

import (
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/internal/workload"
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
	// Count, when > 0, is the number of requests, whatever Duration
	// (a closed loop's --requests: its arrival times are not used).
	Count int
	// Constant spaces arrivals 1/Rate apart instead of Poisson's random
	// gaps; either way every arrival is within Duration.
	Constant bool
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
	switch {
	case c.Count < 0 || c.Count > maxItems:
		return nil, fmt.Errorf("bench: the number of requests must be in [1, %d]", maxItems)
	case !(c.Rate > 0) || c.Count == 0 && (!(c.Duration > 0) || c.Rate*c.Duration > maxItems):
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
	more := func(t float64) bool { return t < c.Duration }
	if c.Count > 0 {
		more = func(float64) bool { return len(items) < c.Count }
	}
	gap := func() float64 { return rng.ExpFloat64() / c.Rate }
	first := gap
	if c.Constant {
		// The first at 0, as a trace's constant arrivals and vLLM's
		// benchmark start: rate × duration requests (one fewer, from
		// 1/rate on, until 2026-12-04).
		gap, first = func() float64 { return 1 / c.Rate }, func() float64 { return 0 }
	}
	for t := first(); more(t); t += gap() {
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

// traceText renders a Mooncake trace's 512-token blocks as words. Every
// hash id becomes the same 512 words wherever it appears, so equal ids
// share prefixes on the server too. A trace hashes a prompt's last,
// partial block on its own, so the next turn of a conversation, whose
// block there is full and holds the partial one's tokens and more, has
// another id: rendered independently, the next turn would not resend the
// previous turn's last tokens, as a chat client does, and an engine would
// find the previous prompt cached only up to its last full 512-token
// block. So the first time an id appears right after a prefix that the
// latest prompt through that prefix ended in a partial block, its words
// start with that partial block's, and the previous prompt is a prefix of
// the next; but only while the prefix has not branched (no other id has
// followed it but the chain of such continuations): after a prefix that
// many conversations share (a system prompt) nothing tells whose turn
// continues whose, and inventing a shared prefix would be worse than
// missing one.
type traceText struct {
	// partial: the id of a prompt's last full block → the partial block
	// that followed it (the most recent such prompt).
	partial map[uint64]blockStart
	// startsWith: an id → the block whose first k words it starts with.
	startsWith map[uint64]blockStart
	// next: an id → the id that last followed it; branched: ids followed
	// by two ids that do not continue one another.
	next     map[uint64]uint64
	branched map[uint64]bool
	seen     map[uint64]bool
}

// blockStart is the first k words of block id, depth links deep.
type blockStart struct {
	id       uint64
	k, depth int
}

// maxStartDepth bounds how deep writeWords recurses through blocks that
// start with another's (a turn that stays within one block extends the
// previous turn's partial block: one link per such turn).
const maxStartDepth = 64

func newTraceText() *traceText {
	return &traceText{partial: map[uint64]blockStart{}, startsWith: map[uint64]blockStart{},
		next: map[uint64]uint64{}, branched: map[uint64]bool{}, seen: map[uint64]bool{}}
}

// writeWords writes words [lo, hi) of block id, each followed by a space:
// the first k of a block that starts with another's are that block's.
func (tt *traceText) writeWords(b *strings.Builder, id uint64, lo, hi int) {
	if s, ok := tt.startsWith[id]; ok && lo < s.k {
		tt.writeWords(b, s.id, lo, min(hi, s.k))
		lo = s.k
	}
	for j := lo; j < hi; j++ {
		b.WriteString(word('h', id*512+uint64(j)))
		b.WriteByte(' ')
	}
}

// place notes block id after block prev in a prompt that has tokens
// tokens from there on. At id's first appearance it continues the partial
// block of the last prompt that ended right after prev, if that prompt's
// partial block is what last followed prev, prev has not branched, and
// this prompt goes beyond it.
func (tt *traceText) place(prev, id uint64, tokens int) {
	if !tt.seen[id] {
		tt.seen[id] = true
		s, ok := tt.partial[prev]
		if ok && s.id != id && tokens > s.k && !tt.branched[prev] && tt.next[prev] == s.id {
			if s.depth = tt.startsWith[s.id].depth + 1; s.depth <= maxStartDepth {
				tt.startsWith[id] = s
				tt.next[prev] = id
				return
			}
		}
	}
	if n, ok := tt.next[prev]; !ok {
		tt.next[prev] = id
	} else if n != id {
		tt.branched[prev] = true
	}
}

// prompt renders one trace request of n tokens.
func (tt *traceText) prompt(b *strings.Builder, ids []uint64, n int, line int) {
	w := 0
	for i, h := range ids {
		if w >= n {
			break
		}
		if i == 0 {
			tt.seen[h] = true
		} else {
			tt.place(ids[i-1], h, n-w)
		}
		k := min(512, n-w)
		tt.writeWords(b, h, 0, k)
		w += k
	}
	for j := 0; w < n; j++ {
		b.WriteString(word('r', uint64(line)<<20|uint64(j)))
		b.WriteByte(' ')
		w++
	}
	if full := n / 512; n%512 != 0 && full >= 1 && full < len(ids) {
		tt.partial[ids[full-1]] = blockStart{id: ids[full], k: n % 512}
	}
}

// MooncakeTrace reads a Mooncake-format trace (JSON lines with timestamp
// in ms, input_length, output_length, hash_ids of 512-token blocks) and
// turns each request into a completion prompt (traceText: equal ids are
// equal words, and a turn that surely continues the previous one resends
// it whole); the part of input_length past the last hash id is words of
// the request's own. timeScale multiplies timestamps (0.5: twice the rate);
// maxOutput caps output lengths (0: none).
func MooncakeTrace(r io.Reader, timeScale float64, maxOutput int) ([]Item, error) {
	if !(timeScale > 0) || timeScale > 1e6 {
		return nil, fmt.Errorf("bench: trace time scale must be in (0, 1e6], got %v", timeScale)
	}
	var items []Item
	tt := newTraceText()
	ids := []uint64(nil)
	err := workload.ScanMooncake(r, func(rec workload.MooncakeRecord) error {
		if rec.InputLength > maxItemTokens || len(rec.HashIDs) > maxItemTokens/512+1 {
			return fmt.Errorf("bench: trace line %d: a prompt of at most %d tokens (%d hash ids) is replayed, got %d (%d)",
				rec.Line, maxItemTokens, maxItemTokens/512+1, rec.InputLength, len(rec.HashIDs))
		}
		if len(items) >= maxItems {
			return fmt.Errorf("bench: trace has more than %d requests", maxItems)
		}
		ids = ids[:0]
		for _, id := range rec.HashIDs {
			ids = append(ids, uint64(id))
		}
		var b strings.Builder
		tt.prompt(&b, ids, rec.InputLength, rec.Line)
		out := max(rec.OutputLength, 1)
		if maxOutput > 0 {
			out = min(out, maxOutput)
		}
		items = append(items, Item{At: rec.TimestampMs / 1000 * timeScale, Prompt: b.String(), MaxTokens: out, Session: -1})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	t0 := items[0].At
	for i := range items {
		items[i].At -= t0
	}
	return items, nil
}

// MarkRung makes items, a trace's requests, rung k of a rate ladder: for
// k > 0 each prompt's first word gets the rung's mark ("k3" before it, no
// word more), so that no prompt of one rung starts as one of another's and
// a server's cache warmed by an earlier rung does not serve a later one,
// while the prompts of one rung share the prefixes they shared. Rung 0
// (and a single run) is left as it is.
func MarkRung(items []Item, k int) {
	if k <= 0 {
		return
	}
	mark := "k" + strconv.Itoa(k)
	for i := range items {
		items[i].Prompt = mark + items[i].Prompt
	}
}

// Schedule gives items arrival times: "poisson" or "constant" at rate
// requests per second (the items' own times are replaced; a trace's
// requests sent at another rate than their timestamps'; Chat times its
// own).
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
