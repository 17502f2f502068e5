package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Record is what one request did. Durations are in seconds, already
// multiplied by the run's time scale (so an emulator running N times
// faster than real time reports modelled seconds).
type Record struct {
	Index   int     `json:"index"`
	Session int     `json:"session"`
	Sent    float64 `json:"sent"` // seconds from the run's start (scaled)
	// Late is how long after it was due the request was sent (seconds,
	// scaled): in an open loop the in-flight bound's wait, or a generator
	// behind its schedule; 0 in a closed loop. TTFT and E2E count from
	// when it was due (Sent − Late), so that a server slow enough to fill
	// the bound is not measured by the requests it kept waiting.
	Late float64 `json:"late"`
	// Status is the HTTP status (0: no answer).
	Status int `json:"status"`
	// Outcome: ok, rejected (429), client_error (other 4xx),
	// server_error (5xx), transport (no answer, broken stream), timeout
	// (cut by Client.Timeout), interrupted (in flight when the run was
	// stopped).
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
	// Unstreamed: the answer came whole (Client.Whole): TTFT is its
	// arrival and it has no TPOT nor inter-token latency (TPOT, MeanITL
	// and MaxITL are 0, and no summary counts them).
	Unstreamed   bool    `json:"unstreamed,omitempty"`
	TTFT         float64 `json:"ttft"`
	E2E          float64 `json:"e2e"`
	TPOT         float64 `json:"tpot"`
	MeanITL      float64 `json:"mean_itl"`
	MaxITL       float64 `json:"max_itl"`
	PromptTokens int     `json:"prompt_tokens"`
	// CachedTokens is the prompt tokens the engine that computed the
	// prompt reported cached: the answer's usage, or behind kvgate's
	// gateway in front of a P/D fleet its x-kvgate-prefill-cached-tokens
	// (the prefill engine's own count; the decode engine's usage counts
	// what it received); -1 when the answer cannot say (vLLM's Messages
	// API reports none).
	CachedTokens int `json:"cached_tokens"`
	OutputTokens int `json:"output_tokens"`
	// Endpoint is kvgate's x-kvgate-prefill-endpoint, when present.
	Endpoint string `json:"endpoint,omitempty"`
	// PredictedTTFT is kvgate's x-kvgate-predicted-ttft-ms in seconds: the
	// TTFT the gateway predicted when it sent the request (-1: no such
	// header, or not a finite number of milliseconds in [0, 1e9]).
	PredictedTTFT float64 `json:"predicted_ttft"`
	// Held is kvgate's x-kvgate-held-ms in seconds: how long the gateway
	// kept the request before sending it (its hold, parsing, deciding); -1
	// without the header. Held + PredictedTTFT is the TTFT kvgate
	// predicted for the client.
	Held float64 `json:"held"`
	// PredictedCached is kvgate's x-kvgate-cached-tokens: the prompt
	// tokens the gateway believed the chosen engine held when it routed
	// the request (-1 without the header, or not an integer in [0, 2^31)).
	// Beside CachedTokens, the engine's own count, it shows where the
	// gateway's view of the caches was wrong.
	PredictedCached int `json:"predicted_cached"`
	// gaps counts the answer's gaps between chunks by bucket (itl.go),
	// for the run's inter-token latency percentiles.
	gaps []gapCount
}

// Client sends requests to one server.
type Client struct {
	URL string // base URL, e.g. http://127.0.0.1:8000
	// More are other base URLs of the same service (gateway replicas):
	// request i goes to the (i mod (1+len(More)))th of URL and More, as a
	// load balancer in front of replicas would spread them.
	More      []string
	Model     string
	HTTP      *http.Client
	TimeScale float64 // wall seconds × TimeScale = reported seconds (default 1)
	Header    http.Header
	// Responses sends chat items through the Responses API
	// (/v1/responses: the system prompt as instructions, the turns as
	// input items) instead of /v1/chat/completions; Messages through
	// Anthropic's Messages API (/v1/messages: the system prompt as its
	// system, the turns as its messages).
	Responses, Messages bool
	// Whole sends chat and completion requests unstreamed: the answer's
	// arrival is its first token (TTFT = E2E), and there is no TPOT.
	Whole bool
	// Timeout bounds each request, in wall time, from its sending to its
	// answer's end (0: none): one that takes longer (a stream that stopped
	// sending and never ended) is cut and its outcome is "timeout".
	Timeout time.Duration
}

// errTimeout is the cause of a request's context when Client.Timeout cut
// it.
var errTimeout = errors.New("bench: request timeout")

// maxAnswerBytes bounds what is read of one answer.
const maxAnswerBytes = 64 << 20

func (c *Client) scale() float64 {
	if c.TimeScale > 0 {
		return c.TimeScale
	}
	return 1
}

// base is the URL request idx goes to.
func (c *Client) base(idx int) string {
	n := 1 + len(c.More)
	if i := idx % n; i > 0 {
		return c.More[i-1]
	}
	return c.URL
}

// historyAnswer stands for the assistant's answer to an earlier turn of a
// generated chat (the workload does not keep the answers it got).
const historyAnswer = "ok"

// turns is a chat item's turns as messages: each earlier turn the
// user's, answered by the assistant (historyAnswer), then the new one;
// typ, when set, is each message's type (the Responses API's items).
func turns(it *Item, typ string) []map[string]string {
	msg := func(role, text string) map[string]string {
		m := map[string]string{"role": role, "content": text}
		if typ != "" {
			m["type"] = typ
		}
		return m
	}
	var msgs []map[string]string
	for _, h := range it.History {
		msgs = append(msgs, msg("user", h), msg("assistant", historyAnswer))
	}
	return append(msgs, msg("user", it.Prompt))
}

func (c *Client) body(it *Item) ([]byte, string) {
	switch {
	case it.Chat && c.Responses:
		return c.responsesBody(it)
	case it.Chat && c.Messages:
		return c.messagesBody(it)
	}
	req := map[string]any{"model": c.Model, "max_tokens": it.MaxTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "ignore_eos": true}
	if c.Whole {
		req["stream"] = false
		delete(req, "stream_options")
	}
	if it.Chat {
		msgs := turns(it, "")
		if it.System != "" {
			msgs = append([]map[string]string{{"role": "system", "content": it.System}}, msgs...)
		}
		req["messages"] = msgs
		b, _ := json.Marshal(req)
		return b, "/v1/chat/completions"
	}
	req["prompt"] = it.Prompt
	b, _ := json.Marshal(req)
	return b, "/v1/completions"
}

// responsesBody is a chat item as a streamed Responses API request.
func (c *Client) responsesBody(it *Item) ([]byte, string) {
	req := map[string]any{"model": c.Model, "max_output_tokens": it.MaxTokens, "stream": true, "input": turns(it, "message"), "ignore_eos": true}
	if it.System != "" {
		req["instructions"] = it.System
	}
	b, _ := json.Marshal(req)
	return b, "/v1/responses"
}

// messagesBody is a chat item as a Messages API request (ignore_eos,
// which vLLM's Messages API does not read, makes kvgate's emulator run
// to max_tokens there too).
func (c *Client) messagesBody(it *Item) ([]byte, string) {
	req := map[string]any{"model": c.Model, "max_tokens": it.MaxTokens, "stream": !c.Whole, "messages": turns(it, ""), "ignore_eos": true}
	if it.System != "" {
		req["system"] = it.System
	}
	b, _ := json.Marshal(req)
	return b, "/v1/messages"
}

// Do sends one request (streamed, with usage, unless Whole) and measures
// it from its sending.
func (c *Client) Do(ctx context.Context, it *Item, idx int, start time.Time) Record {
	return c.do(ctx, it, idx, start, time.Time{})
}

// do is Do for an item due at due (zero: now): its latencies count from
// when it was due if it is sent later, as its user would have waited.
func (c *Client) do(ctx context.Context, it *Item, idx int, start, due time.Time) Record {
	rec := Record{Index: idx, Session: it.Session, PredictedTTFT: -1, Held: -1, PredictedCached: -1}
	sent := time.Now()
	from := sent
	if !due.IsZero() && due.Before(sent) {
		from = due
		rec.Late = sent.Sub(due).Seconds() * c.scale()
	}
	rec.Sent = sent.Sub(start).Seconds() * c.scale()
	run := ctx
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, c.Timeout, errTimeout)
		defer cancel()
	}
	if err := c.exchange(ctx, it, idx, from, &rec); err != nil {
		rec.Outcome, rec.Error = "transport", err.Error()
		switch {
		case run.Err() != nil:
			// The run was stopped (Ctrl-C) while it was in flight: no
			// failure of the server's (it was counted transport).
			rec.Outcome, rec.Error = "interrupted", "the run was stopped while the request was in flight"
		case errors.Is(context.Cause(ctx), errTimeout):
			rec.Outcome = "timeout"
			// In the server's time, as the timeout was given (to the
			// millisecond: the wall-time conversion leaves nanoseconds).
			rec.Error = fmt.Sprintf("timed out: no whole answer within %g s", math.Round(c.Timeout.Seconds()*c.scale()*1e3)/1e3)
		case errors.As(err, new(serverError)):
			rec.Outcome = "server_error"
		}
		return rec
	}
	if rec.Outcome == "" {
		rec.Outcome = "ok"
	}
	return rec
}

// exchange sends the request and reads its answer into rec, its latencies
// counted from from. An answer other than 200 sets rec's outcome; an error
// is a failure to send or to read the answer.
func (c *Client) exchange(ctx context.Context, it *Item, idx int, from time.Time, rec *Record) error {
	body, path := c.body(it)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.base(idx), "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	rec.Endpoint = resp.Header.Get("X-Kvgate-Prefill-Endpoint")
	rec.PredictedTTFT = c.millisHeader(resp.Header.Get("X-Kvgate-Predicted-Ttft-Ms"))
	rec.Held = c.millisHeader(resp.Header.Get("X-Kvgate-Held-Ms"))
	rec.PredictedCached = countHeader(resp.Header.Get("X-Kvgate-Cached-Tokens"))
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		// How long its client waited for the refusal (a 429 may come
		// after a wait at the router, or in an engine's queue): E2E, no
		// TTFT. It was 0 until 2026-12-05.
		rec.E2E = time.Since(from).Seconds() * c.scale()
		rec.Error = strings.TrimSpace(string(msg))
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			rec.Outcome = "rejected"
		case resp.StatusCode >= 500:
			rec.Outcome = "server_error"
		default:
			rec.Outcome = "client_error"
		}
		return nil
	}
	if err := c.reader(path, resp.Header.Get("Content-Type"))(resp.Body, from, rec); err != nil {
		return err
	}
	if n, err := strconv.Atoi(resp.Header.Get("X-Kvgate-Prefill-Cached-Tokens")); err == nil && n >= 0 {
		rec.CachedTokens = min(n, max(rec.PromptTokens, 0))
	}
	return nil
}

// reader is how an answer of content type ct from path is read.
func (c *Client) reader(path, ct string) func(io.Reader, time.Time, *Record) error {
	switch {
	case !c.Whole && strings.HasPrefix(ct, "application/json"):
		return wholeToStream
	case path == "/v1/responses":
		return c.readResponsesStream
	case path == "/v1/messages" && c.Whole:
		return c.readWholeMessage
	case path == "/v1/messages":
		return c.readMessagesStream
	case c.Whole:
		return c.readWhole
	}
	return c.readStream
}

// serverError is an answer that began (200) and then said the server
// failed: an error event in the stream, or an error body.
type serverError string

func (e serverError) Error() string { return string(e) }

// errorEvent reads an OpenAI or vLLM error event or body ({"error":
// {"message"}}, or vLLM's older {"object":"error","message"}): its
// message, or "" when data is not one.
func errorEvent(data []byte) string {
	var ev struct {
		Object  string          `json:"object"`
		Message string          `json:"message"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return ""
	}
	if ev.Object == "error" {
		return cmp.Or(ev.Message, "error")
	}
	if len(ev.Error) == 0 || string(ev.Error) == "null" {
		return ""
	}
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(ev.Error, &e) == nil && e.Message != "" {
		return e.Message
	}
	return string(ev.Error)
}

// wholeToStream reads a whole JSON answer to a streamed request: an
// error body is the server's failure; any other is not the stream asked
// for.
func wholeToStream(r io.Reader, _ time.Time, _ *Record) error {
	body, _ := io.ReadAll(io.LimitReader(r, 4096))
	if msg := errorEvent(body); msg != "" {
		return serverError("error answer: " + msg)
	}
	return errors.New(`the server answered the streamed request with one JSON body (it ignored "stream": true)`)
}

// millisHeader parses one of kvgate's millisecond headers into seconds of
// the server's time (× TimeScale, as every latency bench reports); -1 when
// it is absent or not a number in [0, 1e9] ms.
func (c *Client) millisHeader(h string) float64 {
	ms, err := strconv.ParseFloat(strings.TrimSpace(h), 64)
	if err != nil || !(ms >= 0 && ms <= 1e9) {
		return -1
	}
	return ms / 1000 * c.scale()
}

// countHeader parses a token count header: -1 when absent or not an
// integer in [0, 2^31).
func countHeader(h string) int {
	n, err := strconv.ParseInt(strings.TrimSpace(h), 10, 64)
	if err != nil || n < 0 || n >= 1<<31 {
		return -1
	}
	return int(n)
}

// chunk is the part of a streamed chunk bench reads.
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
			// A reasoning model's reasoning, which vLLM's reasoning
			// parsers stream apart from the content (reasoning_content;
			// reasoning in newer vLLM): generated tokens, timed as the
			// content's, as vLLM's benchmark times them.
			ReasoningContent looseText `json:"reasoning_content"`
			Reasoning        looseText `json:"reasoning"`
			// A tool call's name and arguments, streamed in pieces:
			// generated tokens too.
			ToolCalls []json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// output reports whether the chunk carries generated output: text,
// content, reasoning or a tool call.
func (ch *chunk) output() bool {
	for _, c := range ch.Choices {
		if c.Text != "" || c.Delta.Content != "" || c.Delta.ReasoningContent != "" || c.Delta.Reasoning != "" || len(c.Delta.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// looseText is a field read as text when it is a JSON string and as none
// otherwise, so that a server whose field of that name is something else
// (an object, an array) does not fail the stream.
type looseText string

func (t *looseText) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*t = looseText(s)
	}
	return nil
}

// takeUsage records the chunk's usage (not nil) in rec.
func (ch *chunk) takeUsage(rec *Record) {
	rec.PromptTokens, rec.OutputTokens, rec.CachedTokens = ch.Usage.PromptTokens, ch.Usage.CompletionTokens, -1
	if d := ch.Usage.PromptTokensDetails; d != nil {
		rec.CachedTokens = d.CachedTokens
	}
}

// arrivals times a stream's token events: the first is the first token,
// every later one a token arrival. Gaps are in reported seconds (× scale).
type arrivals struct {
	scale          float64
	first, last    time.Time
	tokens, gaps   int
	sumGap, maxGap float64
	tally          gapTally
}

func (c *Client) newArrivals() *arrivals { return &arrivals{scale: c.scale(), tally: gapTally{}} }

func (a *arrivals) token() {
	now := time.Now()
	if a.first.IsZero() {
		a.first = now
	} else {
		g := now.Sub(a.last).Seconds() * a.scale
		a.sumGap += g
		a.maxGap = max(a.maxGap, g)
		a.gaps++
		a.tally.add(g)
	}
	a.last = now
	a.tokens++
}

// record finishes rec with the stream's latencies (its output tokens the
// usage's, else its token events).
func (a *arrivals) record(sent time.Time, rec *Record) error {
	end := time.Now()
	s := a.scale
	rec.E2E = end.Sub(sent).Seconds() * s
	if a.first.IsZero() {
		return errors.New("no token in the answer")
	}
	rec.TTFT = a.first.Sub(sent).Seconds() * s
	if rec.OutputTokens == 0 {
		rec.OutputTokens = a.tokens
	}
	if a.gaps > 0 {
		rec.MeanITL, rec.MaxITL = a.sumGap/float64(a.gaps), a.maxGap
		rec.gaps = a.tally.counts()
	}
	if rec.OutputTokens > 1 {
		rec.TPOT = a.last.Sub(a.first).Seconds() * s / float64(rec.OutputTokens-1)
	}
	return nil
}

// sseScanner reads an answer's lines, at most maxAnswerBytes of it and
// 8 MiB a line.
func sseScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(io.LimitReader(r, maxAnswerBytes))
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	return sc
}

// responsesEvent is the part of a Responses API stream event bench reads.
type responsesEvent struct {
	Type     string `json:"type"`
	Delta    string `json:"delta"`
	Response struct {
		Usage *struct {
			InputTokens        int `json:"input_tokens"`
			OutputTokens       int `json:"output_tokens"`
			InputTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	} `json:"response"`
}

// readResponsesStream reads a Responses API stream: each text delta is a
// token arrival, response.completed (or incomplete) its end and usage.
func (c *Client) readResponsesStream(r io.Reader, sent time.Time, rec *Record) error {
	return c.readEvents(r, sent, rec, "response.completed", func(data []byte, a *arrivals) (bool, error) {
		var ev responsesEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			return false, fmt.Errorf("bad SSE event: %v", err)
		}
		switch {
		case strings.HasSuffix(ev.Type, ".delta") && ev.Delta != "":
			a.token()
		case ev.Type == "response.completed" || ev.Type == "response.incomplete":
			if u := ev.Response.Usage; u != nil {
				rec.PromptTokens, rec.OutputTokens, rec.CachedTokens = u.InputTokens, u.OutputTokens, -1
				if d := u.InputTokensDetails; d != nil {
					rec.CachedTokens = d.CachedTokens
				}
			}
			return true, nil
		case ev.Type == "response.failed" || ev.Type == "error":
			return false, serverError(fmt.Sprintf("the stream failed: %s", data))
		}
		return false, nil
	})
}

// readEvents reads a stream of named events: event takes each data
// line's JSON (and the arrivals, to time tokens) and says whether it
// ended the stream, whose last event is named last.
func (c *Client) readEvents(r io.Reader, sent time.Time, rec *Record, last string, event func(data []byte, a *arrivals) (bool, error)) error {
	sc := sseScanner(r)
	a := c.newArrivals()
	done := false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		end, err := event(bytes.TrimSpace(data), a)
		if err != nil {
			return err
		}
		done = done || end
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !done {
		return fmt.Errorf("stream ended without %s", last)
	}
	return a.record(sent, rec)
}

// readWhole reads an unstreamed answer: it comes whole, so its arrival
// is its first token for the client.
func (c *Client) readWhole(r io.Reader, sent time.Time, rec *Record) error {
	b, err := io.ReadAll(io.LimitReader(r, maxAnswerBytes))
	if err != nil {
		return err
	}
	var ch chunk
	if err := json.Unmarshal(b, &ch); err != nil {
		return fmt.Errorf("bad answer: %v", err)
	}
	if msg := errorEvent(b); msg != "" {
		return serverError("error answer: " + msg)
	}
	if len(ch.Choices) == 0 || ch.Usage == nil {
		return errors.New("an answer without a choice or a usage")
	}
	ch.takeUsage(rec)
	rec.E2E = time.Since(sent).Seconds() * c.scale()
	rec.TTFT, rec.Unstreamed = rec.E2E, true
	return nil
}

// readStream reads SSE events: the first event with generated output
// (text, or a reasoning model's reasoning: chunk.output) is the first
// token; every later one is a token arrival.
func (c *Client) readStream(r io.Reader, sent time.Time, rec *Record) error {
	sc := sseScanner(r)
	a := c.newArrivals()
	done := false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			done = true
			break
		}
		var ch chunk
		if err := json.Unmarshal(data, &ch); err != nil {
			return fmt.Errorf("bad SSE event: %v", err)
		}
		if msg := errorEvent(data); msg != "" {
			return serverError("error event: " + msg)
		}
		if ch.Usage != nil {
			ch.takeUsage(rec)
		}
		if ch.output() {
			a.token()
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !done {
		return errors.New("stream ended without [DONE]")
	}
	return a.record(sent, rec)
}

// messagesUsage is a Messages API usage. vLLM counts the whole prompt as
// input and reports no cache hits; SGLang and Anthropic's API count as
// input what was not read from the cache, which cache_read_input_tokens
// (and cache_creation_input_tokens) count apart.
type messagesUsage struct {
	InputTokens   *int `json:"input_tokens"`
	OutputTokens  int  `json:"output_tokens"`
	CacheRead     *int `json:"cache_read_input_tokens"`
	CacheCreation *int `json:"cache_creation_input_tokens"`
}

// take records the usage in rec: its output tokens, and, when it reports
// its input (Anthropic's API reports it in message_start, vLLM's in
// message_delta too), its prompt the three counts' sum and its cache hits
// the reads, when reported (else -1: unknown).
func (u *messagesUsage) take(rec *Record) {
	rec.OutputTokens = u.OutputTokens
	if u.InputTokens == nil {
		return
	}
	rec.PromptTokens, rec.CachedTokens = *u.InputTokens, -1
	if u.CacheRead != nil {
		rec.CachedTokens = max(*u.CacheRead, 0)
		rec.PromptTokens += rec.CachedTokens
		if u.CacheCreation != nil {
			rec.PromptTokens += max(*u.CacheCreation, 0)
		}
	}
}

// readMessagesStream reads a Messages API stream: each content_block_delta
// with text or thinking (an extended-thinking model's reasoning, generated
// tokens too) is a token arrival, message_delta its usage, message_stop its
// end; an error event fails it.
func (c *Client) readMessagesStream(r io.Reader, sent time.Time, rec *Record) error {
	rec.CachedTokens = -1 // unknown until a usage says (take)
	return c.readEvents(r, sent, rec, "message_stop", func(data []byte, a *arrivals) (bool, error) {
		var ev struct {
			Type  string `json:"type"`
			Delta struct {
				Text        string `json:"text"`
				Thinking    string `json:"thinking"`
				PartialJSON string `json:"partial_json"` // a tool call's input, in pieces
			} `json:"delta"`
			Message struct {
				Usage *messagesUsage `json:"usage"`
			} `json:"message"`
			Usage *messagesUsage `json:"usage"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return false, fmt.Errorf("bad SSE event: %v", err)
		}
		switch ev.Type {
		case "content_block_delta":
			if ev.Delta.Text != "" || ev.Delta.Thinking != "" || ev.Delta.PartialJSON != "" {
				a.token()
			}
		case "message_start":
			if ev.Message.Usage != nil {
				ev.Message.Usage.take(rec)
			}
		case "message_delta":
			if ev.Usage != nil {
				ev.Usage.take(rec)
			}
		case "message_stop":
			return true, nil
		case "error":
			return false, serverError(fmt.Sprintf("the stream failed: %s", data))
		}
		return false, nil
	})
}

// readWholeMessage reads an unstreamed message: its arrival is its first
// token for the client.
func (c *Client) readWholeMessage(r io.Reader, sent time.Time, rec *Record) error {
	rec.CachedTokens = -1 // unknown until its usage says (take)
	b, err := io.ReadAll(io.LimitReader(r, maxAnswerBytes))
	if err != nil {
		return err
	}
	var m struct {
		Type  string         `json:"type"`
		Usage *messagesUsage `json:"usage"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Type != "message" || m.Usage == nil {
		return fmt.Errorf("bad answer: not a message with its usage (%v)", err)
	}
	m.Usage.take(rec)
	rec.E2E = time.Since(sent).Seconds() * c.scale()
	rec.TTFT, rec.Unstreamed = rec.E2E, true
	return nil
}
