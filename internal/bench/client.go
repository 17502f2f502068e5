package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	// Status is the HTTP status (0: no answer).
	Status int `json:"status"`
	// Outcome: ok, rejected (429), client_error (other 4xx),
	// server_error (5xx), transport (no answer, broken stream).
	Outcome      string  `json:"outcome"`
	Error        string  `json:"error,omitempty"`
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
	// what it received).
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
}

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

func (c *Client) body(it *Item) ([]byte, string) {
	req := map[string]any{"model": c.Model, "max_tokens": it.MaxTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "ignore_eos": true}
	if it.Chat {
		msgs := []map[string]string{}
		if it.System != "" {
			msgs = append(msgs, map[string]string{"role": "system", "content": it.System})
		}
		for _, h := range it.History {
			msgs = append(msgs, map[string]string{"role": "user", "content": h},
				map[string]string{"role": "assistant", "content": historyAnswer})
		}
		req["messages"] = append(msgs, map[string]string{"role": "user", "content": it.Prompt})
		b, _ := json.Marshal(req)
		return b, "/v1/chat/completions"
	}
	req["prompt"] = it.Prompt
	b, _ := json.Marshal(req)
	return b, "/v1/completions"
}

// Do sends one request (streamed, with usage) and measures it.
func (c *Client) Do(ctx context.Context, it *Item, idx int, start time.Time) Record {
	body, path := c.body(it)
	rec := Record{Index: idx, Session: it.Session, PredictedTTFT: -1, Held: -1, PredictedCached: -1}
	sent := time.Now()
	rec.Sent = sent.Sub(start).Seconds() * c.scale()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.base(idx), "/")+path, bytes.NewReader(body))
	if err != nil {
		rec.Outcome, rec.Error = "transport", err.Error()
		return rec
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		rec.Outcome, rec.Error = "transport", err.Error()
		return rec
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	rec.Endpoint = resp.Header.Get("X-Kvgate-Prefill-Endpoint")
	rec.PredictedTTFT = c.millisHeader(resp.Header.Get("X-Kvgate-Predicted-Ttft-Ms"))
	rec.Held = c.millisHeader(resp.Header.Get("X-Kvgate-Held-Ms"))
	rec.PredictedCached = countHeader(resp.Header.Get("X-Kvgate-Cached-Tokens"))
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		rec.Error = strings.TrimSpace(string(msg))
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			rec.Outcome = "rejected"
		case resp.StatusCode >= 500:
			rec.Outcome = "server_error"
		default:
			rec.Outcome = "client_error"
		}
		return rec
	}
	if err := c.readStream(resp.Body, sent, &rec); err != nil {
		rec.Outcome, rec.Error = "transport", err.Error()
		return rec
	}
	if n, err := strconv.Atoi(resp.Header.Get("X-Kvgate-Prefill-Cached-Tokens")); err == nil && n >= 0 {
		rec.CachedTokens = min(n, max(rec.PromptTokens, 0))
	}
	rec.Outcome = "ok"
	return rec
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

// readStream reads SSE events: the first event with text is the first
// token; every later one with text is a token arrival.
func (c *Client) readStream(r io.Reader, sent time.Time, rec *Record) error {
	sc := bufio.NewScanner(io.LimitReader(r, maxAnswerBytes))
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	var first, last time.Time
	tokens, gaps := 0, 0
	var sumGap, maxGap float64
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
		if ch.Usage != nil {
			rec.PromptTokens, rec.OutputTokens = ch.Usage.PromptTokens, ch.Usage.CompletionTokens
			if d := ch.Usage.PromptTokensDetails; d != nil {
				rec.CachedTokens = d.CachedTokens
			}
		}
		text := false
		for _, c := range ch.Choices {
			if c.Text != "" || c.Delta.Content != "" {
				text = true
			}
		}
		if !text {
			continue
		}
		now := time.Now()
		if first.IsZero() {
			first = now
		} else {
			g := now.Sub(last).Seconds()
			sumGap += g
			maxGap = max(maxGap, g)
			gaps++
		}
		last = now
		tokens++
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !done {
		return errors.New("stream ended without [DONE]")
	}
	end := time.Now()
	s := c.scale()
	rec.E2E = end.Sub(sent).Seconds() * s
	if first.IsZero() {
		return errors.New("no token in the answer")
	}
	rec.TTFT = first.Sub(sent).Seconds() * s
	if rec.OutputTokens == 0 {
		rec.OutputTokens = tokens
	}
	if gaps > 0 {
		rec.MeanITL, rec.MaxITL = sumGap/float64(gaps)*s, maxGap*s
	}
	if rec.OutputTokens > 1 {
		rec.TPOT = last.Sub(first).Seconds() * s / float64(rec.OutputTokens-1)
	}
	return nil
}
