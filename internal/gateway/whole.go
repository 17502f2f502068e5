package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/kvgate/kvgate/internal/openai"
)

// Whole answers from streams (Config.NoStreamUpstream turns it off). A
// non-streamed answer tells the gateway nothing of when its first token
// came: its prefill's end is a guess, the predictor never learns from it,
// and the TPOT is unknown. So a chat, completion, Responses or Messages
// request the client did not stream is sent to its engine as a stream
// (when its answer can be built exactly from one:
// openai.Request.WholeFromStream, WholeResponsesFromStream; a message
// always can), and the gateway answers the client whole
// (openai.Assembler, ResponsesAssembler, MessagesAssembler), as Dynamo's frontend
// does with its workers' streams. The stream runs through the
// stream tap like a client's: its first token trains the predictor and
// ends the prefill, its tokens time the TPOT, an engine that fails in its
// prefill is retried, and with --migration-limit one that fails later is
// continued. An answer the engine did not stream (its error) goes to the
// client as it came.

// wholeAnswer stands between the stream tap and the client of a request
// answered whole from a stream: it reads the events into an Assembler
// and, once the answer is over (finish), sends it to the client.
type wholeAnswer struct {
	w   http.ResponseWriter
	asm assembler
	// status is the engine's (0: none yet); pass: the answer is not a
	// 200 stream and goes to the client as is.
	status int
	pass   bool
	// tail is an incomplete line; err the assembly's failure.
	tail []byte
	err  error
	// sent: the client has the answer's headers.
	sent bool
	// budget is the bytes every answer being assembled holds (of at most
	// wholeBudget); held this one's share.
	budget *atomic.Int64
	held   int64
	// fresh makes the assembler of an answer started again (restart);
	// base is the client's headers before any attempt's.
	fresh func() assembler
	base  http.Header
}

// wholeBudget bounds the event bytes held by all the answers being
// assembled at once (each also within openai.MaxAssembled): an answer
// that would pass it fails (502) rather than the gateway's memory.
const wholeBudget = 1 << 30

// assembler builds an unstreamed answer from a stream's events
// (openai.Assembler, openai.ResponsesAssembler, openai.MessagesAssembler).
type assembler interface {
	Event(data []byte) error
	Answer() (int, []byte, error)
}

func newWholeAnswer(w http.ResponseWriter, fresh func() assembler, budget *atomic.Int64) *wholeAnswer {
	return &wholeAnswer{w: w, asm: fresh(), budget: budget, fresh: fresh, base: w.Header().Clone()}
}

// restart readies the answer for another attempt from its start: what
// the broken one brought, its engine's headers included, is dropped.
func (a *wholeAnswer) restart() {
	a.release()
	a.asm, a.status, a.pass, a.tail, a.err = a.fresh(), 0, false, a.tail[:0], nil
	h := a.w.Header()
	clear(h)
	for k, v := range a.base {
		h[k] = v
	}
}

// errWholeBudget: the answers being assembled hold the whole budget.
var errWholeBudget = fmt.Errorf("the answers kvgate is assembling hold %d MiB already", wholeBudget>>20)

// hold takes n more bytes of the budget for this answer.
func (a *wholeAnswer) hold(n int) error {
	if a.budget.Add(int64(n)) > wholeBudget {
		a.budget.Add(-int64(n))
		return errWholeBudget
	}
	a.held += int64(n)
	return nil
}

// release gives the answer's bytes back to the budget (its answer sent
// or failed).
func (a *wholeAnswer) release() {
	a.budget.Add(-a.held)
	a.held = 0
}

// Header is the client's headers.
func (a *wholeAnswer) Header() http.Header { return a.w.Header() }

// WriteHeader takes the engine's status: a stream's waits for the whole
// answer; anything else goes to the client at once.
func (a *wholeAnswer) WriteHeader(code int) {
	if a.status != 0 {
		return
	}
	a.status = code
	if code != http.StatusOK || !eventStream(a.w.Header().Get("Content-Type")) {
		a.pass, a.sent = true, true
		a.w.WriteHeader(code)
	}
}

// eventStream reports whether the content type is text/event-stream.
func eventStream(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// Write reads the stream's next bytes (whole lines, from the tap).
func (a *wholeAnswer) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	if a.pass {
		return a.w.Write(p)
	}
	if a.err != nil {
		return 0, a.err
	}
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(a.tail)+len(p) > maxTapLine {
				a.err = errors.New("a line longer than the tap holds")
				return 0, a.err
			}
			a.tail = append(a.tail, p...)
			break
		}
		line := p[:i]
		if len(a.tail) > 0 {
			a.tail = append(a.tail, line...)
			line = a.tail
		}
		if err := a.line(line); err != nil {
			a.err = err
			return 0, err
		}
		a.tail, p = a.tail[:0], p[i+1:]
	}
	return n, nil
}

// line reads one line of the stream: its data lines are the events.
func (a *wholeAnswer) line(line []byte) error {
	data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
	if !ok {
		return nil // a blank line, a comment, an event name
	}
	if err := a.hold(len(data)); err != nil {
		return err
	}
	return a.asm.Event(data)
}

// FlushError flushes what passes to the client; an assembled answer has
// nothing to flush until its end.
func (a *wholeAnswer) FlushError() error {
	if a.pass {
		return http.NewResponseController(a.w).Flush()
	}
	return nil
}

// finish sends the client the assembled answer of a stream the engines
// ended, or returns why it cannot (a stream broken, errStreamBroken, the
// client has nothing; fail tells it). An answer passed on as is is sent.
func (a *wholeAnswer) finish() error {
	if a.pass {
		return nil
	}
	if a.err == nil && len(a.tail) > 0 {
		a.err = a.line(a.tail) // a last line without its line break
		a.tail = a.tail[:0]
	}
	if a.err != nil {
		return a.err
	}
	status, body, err := a.asm.Answer()
	if err != nil {
		return err
	}
	if status >= http.StatusInternalServerError {
		// The engine failed (an error event of its own, before or
		// after tokens): the client has nothing yet, so another engine
		// may answer it, as a 5xx before the first byte is retried.
		a.err = &engineErrorEvent{status: status, body: body}
		return a.err
	}
	h := a.w.Header()
	h.Del("Cache-Control")
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	a.sent = true
	a.w.WriteHeader(status)
	_, err = a.w.Write(body)
	return err
}

// engineErrorEvent: the engine's stream carried an error event of a 5xx
// (the answer assembled whole from it).
type engineErrorEvent struct {
	status int
	body   []byte
}

func (e *engineErrorEvent) Error() string {
	return fmt.Sprintf("the engine's stream carried an error (status %d): %.300s", e.status, e.body)
}

// writeTo answers w with the engine's error, its status and body.
func (e *engineErrorEvent) writeTo(w http.ResponseWriter) {
	w.Header().Del("Content-Length")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_, _ = w.Write(e.body)
}

// fail tells the client that the answer it did not get whole failed
// (502 with why; 504 when --upstream-timeout ran out; the engine's own
// error answer when its stream carried one), when it has nothing of it
// yet; false when it has.
func (a *wholeAnswer) fail(err error) bool {
	if a.sent {
		return false
	}
	a.sent = true
	var ee *engineErrorEvent
	if errors.As(err, &ee) { // nowhere else to send it: the engine's own error
		ee.writeTo(a.w)
		return true
	}
	a.w.Header().Del("Content-Length")
	status := http.StatusBadGateway
	if errors.Is(err, context.DeadlineExceeded) {
		status = http.StatusGatewayTimeout
	}
	openai.WriteError(a.w, openai.Errorf(status, "kvgate: the engine's answer failed before its end: %v", err))
	return true
}

// streamUpstream returns what makes the assembler of rt's answer when
// rt, which the client did not stream, goes to its engine as a stream
// answered whole, and makes it one; nil when it goes as sent.
func (g *Gateway) streamUpstream(rt *routed) func() assembler {
	if rt.req.Stream || rt.api == apiGenerate {
		return nil
	}
	why := "--no-stream-upstream"
	if !g.cfg.NoStreamUpstream {
		switch rt.api {
		case apiResponses:
			why = rt.req.WholeResponsesFromStream()
		case apiMessages:
			why = "" // a message's stream carries all of it
		default:
			why = rt.req.WholeFromStream(rt.chat())
		}
	}
	if why != "" {
		g.met.whole.WithLabelValues("as_sent").Inc()
		return nil
	}
	rt.req.StreamInstead()
	g.met.whole.WithLabelValues("streamed").Inc()
	switch rt.api {
	case apiResponses:
		return func() assembler { return &openai.ResponsesAssembler{} }
	case apiMessages:
		return func() assembler { return &openai.MessagesAssembler{} }
	}
	chat := rt.chat()
	return func() assembler { return openai.NewAssembler(chat) }
}
