package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/openai"
)

// The stream tap stands between relay and the client for every streamed
// chat or completion. It asks the engine for the usage
// in every event (openai.Request.AskUsageEvents), which counts the
// tokens each event brought (an engine may send several an event: vLLM's
// --stream-interval, or its output collector when the API server lags),
// and passes the client only the usage it asked for. For a stream that
// may migrate (migrate.go) it also keeps the answer's text, and rewrites
// a continuation's events into the same answer.

// maxTapText bounds the answer text a tap keeps to continue from (a
// quarter of a million tokens of text, beyond any context window); a
// longer answer is not migrated.
const maxTapText = 1 << 20

// maxTapLine bounds an incomplete line a tap holds back; a longer one is
// written through and the stream is not migrated.
const maxTapLine = 1 << 20

// streamTap stands between relay and the client for a stream. It writes
// only whole lines, so that a continuation never follows half an event,
// and reads each event for the answer so far. After continueOn it
// rewrites the continuation's events (rewrite).
type streamTap struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	// status is the answer's status as the client has it (0: none yet).
	status int
	// tail is an incomplete line held back; out what a Write sends.
	tail, out []byte
	// open: the client's last line was not blank (an event is open).
	open bool
	// werr is the client's write error.
	werr error

	// The answer so far: wrote, whether any byte of its body came;
	// events, whether an event did; role, whether one named the role.
	wrote, events, role bool
	id                  string
	text                strings.Builder
	tokens              int
	finished            bool // a finish reason or an error event came
	done                bool // [DONE] came
	delivered           bool // the client has it
	// stuck says why the answer cannot be continued ("": it can).
	stuck string
	// failed is the engine's 5xx error event that came before any other
	// event (held back: Write fails with it).
	failed *engineErrorEvent
	// keep: the answer may migrate: its text is kept (maxTapText).
	keep bool
	// seqs is how many sequences the answer samples; counted, whether
	// the attempt in progress reported its tokens in its usage (vLLM's
	// is a sequence's: the choice's of its event).
	seqs    int
	counted bool

	// final and continuous: the client asked for the usage event at the
	// end (include_usage) and in every event (continuous_usage_stats).
	// The engines are asked for both (openai.Request.AskUsageEvents),
	// which count the tokens the client had; the client gets what it
	// asked for.
	final, continuous bool

	// A continuation's (after continueOn).
	cont       bool
	contStatus int
	scratch    http.Header
	skipBlank  bool
	// before is the tokens the client had when the continuation began;
	// prompt the original prompt's tokens as the gateway counted them.
	before, prompt int
}

// newStreamTap taps the answer to req, whose prompt the gateway counted
// prompt tokens and which samples seqs sequences (their events
// interleave), on its way to w, keeping its text if keep (it may
// migrate); it makes req ask the engines for the usage in every event
// (the client gets what it asked for).
func newStreamTap(w http.ResponseWriter, req *openai.Request, prompt, seqs int, keep bool) *streamTap {
	t := &streamTap{w: w, rc: http.NewResponseController(w), prompt: prompt, seqs: max(seqs, 1), keep: keep}
	t.final, t.continuous = req.UsageEvents()
	req.AskUsageEvents()
	return t
}

// again is a fresh tap for another attempt at the answer from its start
// (the client had none of this one), as the client asked it; nil for nil.
func (t *streamTap) again() *streamTap {
	if t == nil {
		return nil
	}
	return &streamTap{w: t.w, rc: t.rc, prompt: t.prompt, seqs: t.seqs, keep: t.keep, final: t.final, continuous: t.continuous}
}

// Header is the client's headers until a continuation: its engine's
// headers go nowhere (the client has the first engine's).
func (t *streamTap) Header() http.Header {
	if t.cont {
		if t.scratch == nil {
			t.scratch = http.Header{}
		}
		return t.scratch
	}
	return t.w.Header()
}

func (t *streamTap) WriteHeader(code int) {
	if t.cont {
		t.contStatus = code
		return
	}
	if t.status == 0 {
		t.status = code
		t.w.WriteHeader(code)
	}
}

// FlushError: Write flushes what it writes (http.ResponseController).
func (t *streamTap) FlushError() error { return t.werr }

// Write takes the next bytes of the answer: whole lines go to the client
// (rewritten for a continuation), an incomplete one waits.
func (t *streamTap) Write(p []byte) (int, error) {
	n := len(p)
	if t.werr != nil {
		return 0, t.werr
	}
	if t.cont && t.contStatus != http.StatusOK {
		return len(p), nil // a continuation refused: nothing of it reaches the client
	}
	if !t.cont {
		if t.status == 0 {
			t.WriteHeader(http.StatusOK)
		}
		t.wrote = t.wrote || n > 0
		if t.status != http.StatusOK {
			return len(p), t.send(p) // not a stream: as is
		}
	}
	out := t.out[:0]
	defer func() { t.out = out[:0] }()
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			t.tail = append(t.tail, p...)
			if len(t.tail) > maxTapLine {
				t.halt("a line longer than the tap holds")
				out = append(out, t.tail...)
				t.tail, t.open = t.tail[:0], true
			}
			break
		}
		line := p[:i+1]
		if len(t.tail) > 0 {
			t.tail = append(t.tail, line...)
			line = t.tail
		}
		out = t.line(out, line)
		t.tail = t.tail[:0]
		p = p[i+1:]
		if t.failed != nil { // nothing of this answer goes to the client
			t.werr = t.failed
			return 0, t.failed
		}
	}
	if len(out) > 0 {
		if err := t.send(out); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// send writes p to the client and flushes it.
func (t *streamTap) send(p []byte) error {
	if err := writeFlush(t.w, t.rc, p); err != nil {
		t.werr = err
		return err
	}
	t.delivered = t.done
	return nil
}

// doneSent reports whether the client has the stream's [DONE] (relay:
// the answer is complete whatever fails after).
func (t *streamTap) doneSent() bool { return t.delivered }

// line reads one whole line (its '\n' included) and appends what the
// client is to get of it to out.
func (t *streamTap) line(out, line []byte) []byte {
	body := bytes.TrimRight(line, "\r\n")
	if len(body) == 0 {
		if t.skipBlank {
			t.skipBlank = false
			return out
		}
		t.open = false
		return append(out, line...)
	}
	data, ok := bytes.CutPrefix(body, []byte("data:"))
	if !ok {
		t.open = true
		return append(out, line...) // a comment, an event name: as is
	}
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		t.done, t.open = true, true
		return append(out, line...)
	}
	c, err := openai.ParseStreamChunk(data)
	if err != nil {
		t.halt("an event that is not a JSON object")
		t.open = true
		return append(out, line...)
	}
	if c.Error != nil && !t.events && !t.cont {
		// The engine failed before its answer's first event: with a
		// 5xx the event is held, and the attempt fails before the client
		// has a byte of it (Write), so that another engine may answer.
		if status, body := openai.ErrorAnswer(data); status >= http.StatusInternalServerError {
			t.failed = &engineErrorEvent{status: status, body: bytes.Clone(body)}
			return out
		}
	}
	t.read(&c)
	// What the client did not ask for: the usage event at the end, the
	// usage in every event.
	usageOnly := c.Usage != nil && c.Choices == 0 && c.Error == nil
	if usageOnly && !t.final {
		t.skipBlank = true
		return out
	}
	keepUsage := usageOnly || t.continuous
	if !t.cont {
		t.role = t.role || c.Role
		t.open = true
		if c.Usage != nil && !keepUsage {
			return append(c.AppendWithoutUsage(append(out, "data: "...), data), '\n')
		}
		return append(out, line...)
	}
	if t.role && c.Role && len(c.Text) == 0 && !c.Finished && c.Error == nil {
		t.skipBlank = true // the continuation's role event: the client had one
		return out
	}
	t.role = t.role || c.Role
	if t.open {
		out = append(out, '\n') // end the event the broken stream left open
	}
	t.open = true
	return append(append(append(out, "data: "...), t.rewrite(data, keepUsage)...), '\n')
}

// read takes an event's news: its text, whether the answer finished, and
// the tokens the client has: the usage's count when the engine reports
// it (an event may bring several tokens: vLLM's --stream-interval, or
// its output collector when the server lags), else one an event of text.
func (t *streamTap) read(c *openai.StreamChunk) {
	t.finished = t.finished || c.Finished || c.Error != nil
	if c.Other {
		t.halt("more than text (reasoning, tool calls or a second choice)")
	}
	n, counted := openai.UsageCompletion(c.Usage)
	switch {
	case counted:
		// A sequence's count (each event's choice's): the longest.
		t.tokens, t.counted = max(t.tokens, t.before+n), true
	case len(c.Text) > 0 && !t.counted:
		t.tokens++
	}
	if len(c.Text) > 0 && t.keep {
		if t.text.Len()+len(c.Text) > maxTapText {
			t.halt("an answer longer than the tap keeps")
		} else {
			t.text.Write(c.Text)
		}
	}
	t.events = true
	if t.id == "" {
		t.id = c.IDString()
	}
}

// tokensSent is how many tokens a sequence of the attempt in progress
// had (relay's TPOT): the first engine's, or a continuation's; counted
// by events, each sequence's share of them.
func (t *streamTap) tokensSent() int {
	if t.counted {
		return t.tokens - t.before
	}
	return (t.tokens - t.before) / t.seqs
}

// halt marks the answer as one that cannot be continued.
func (t *streamTap) halt(why string) {
	if t.stuck == "" {
		t.stuck = why
	}
}

// rewrite is a continuation's event as the client's answer: the first
// engine's id, and in its usage (kept if keepUsage) the whole answer's
// tokens: the completion both engines made, and the client's prompt,
// which is the continuation's prompt less the tokens the client had (the
// engine's own count; the gateway's when the engine reports none).
func (t *streamTap) rewrite(data []byte, keepUsage bool) []byte {
	var ev map[string]json.RawMessage
	if json.Unmarshal(data, &ev) != nil {
		return data
	}
	if t.id != "" {
		ev["id"], _ = json.Marshal(t.id)
	}
	if !keepUsage {
		delete(ev, "usage")
	}
	if u := ev["usage"]; len(u) > 0 && string(u) != "null" {
		var usage map[string]json.RawMessage
		var n struct {
			Prompt     *int `json:"prompt_tokens"`
			Completion int  `json:"completion_tokens"`
		}
		if json.Unmarshal(u, &usage) == nil && json.Unmarshal(u, &n) == nil {
			prompt := t.prompt
			if n.Prompt != nil && *n.Prompt >= t.before {
				prompt = *n.Prompt - t.before
			}
			completion := n.Completion + t.before
			usage["prompt_tokens"], _ = json.Marshal(prompt)
			usage["completion_tokens"], _ = json.Marshal(completion)
			usage["total_tokens"], _ = json.Marshal(prompt + completion)
			ev["usage"], _ = json.Marshal(usage)
		}
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return data
	}
	return b
}

// broken reports whether the answer so far can and must be continued:
// the client has a 200 stream that its engine neither finished nor
// ended (events, or a body that ended empty: the relay sends the
// headers with the first body bytes, so an engine that breaks before
// them is retried, not migrated), and is there to read more.
func (t *streamTap) broken() bool {
	return t.status == http.StatusOK && (t.events || !t.wrote) && t.werr == nil && !t.done && !t.finished
}

// continueOn readies the tap for a continuation's answer.
func (t *streamTap) continueOn() {
	t.cont, t.contStatus, t.scratch, t.skipBlank, t.counted = true, 0, nil, false, false
	t.tail = t.tail[:0] // half a line of the broken stream: never sent
	t.before = t.tokens
}

// eof takes a held last line as whole: the answer's body ended cleanly
// without a line break after it (a stream's [DONE] so written still
// ends it). A body that broke keeps its half line from the client.
func (t *streamTap) eof() {
	if len(t.tail) == 0 || t.werr != nil || (t.cont && t.contStatus != http.StatusOK) {
		return
	}
	line := t.tail
	t.tail = nil // line is the tail's: line must not append to itself
	if out := t.line(t.out[:0], line); len(out) > 0 {
		_ = t.send(out)
	}
	t.tail = line[:0]
}
