package engine

import (
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/internal/openai"
)

// The Anthropic Messages API (POST /v1/messages and its count_tokens), as
// vLLM serves it: the request converted to a chat request
// (openai.ParseMessages), the answer a message object, or streamed as the
// Messages API's events; errors in its form (openai.MessagesErrors).

// inlineSystem is where this engine puts a Messages request's system
// messages inside messages (Config.InlineSystem).
func (e *Engine) inlineSystem() openai.InlineSystem {
	if e.cfg.InlineSystem == "" {
		return openai.InlinePreserve
	}
	return e.cfg.InlineSystem
}

func (e *Engine) handleMessages(w http.ResponseWriter, r *http.Request) {
	e.serveGeneration(openai.MessagesErrors(w), r, apiMessages)
}

// handleCountTokens serves POST /v1/messages/count_tokens: the prompt's
// tokens, {"input_tokens": n, "context_management": …}, as vLLM
// counts and writes them.
func (e *Engine) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	w = openai.MessagesErrors(w)
	toks, err := e.counted(w, r, func(b []byte) (*openai.Request, error) { return openai.ParseCountTokensAs(b, e.inlineSystem()) })
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	openai.WriteJSON(w, http.StatusOK, map[string]any{"input_tokens": len(toks), "context_management": map[string]int{"original_input_tokens": len(toks)}})
}

// messageAnswer is a message as the Messages API writes it.
type messageAnswer struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Content      []messageBlock `json:"content"`
	Model        string         `json:"model"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        messageUsage   `json:"usage"`
}

type messageBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// messageUsage counts the whole prompt as input, as vLLM does (the
// Anthropic API counts cache reads apart; vLLM reports none).
type messageUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// stopReason is the Messages API's name of a finish reason (vLLM's map).
func stopReason(finish string) *string {
	r := "end_turn"
	if finish == finishLength {
		r = "max_tokens"
	}
	return &r
}

// message is the answer with out's first n tokens (done: with its stop
// reason; else, the message_start event's, without content).
func (s *responder) message(out requestOutput, n int) messageAnswer {
	m := messageAnswer{ID: s.id, Type: "message", Role: "assistant", Content: []messageBlock{}, Model: s.model,
		Usage: messageUsage{InputTokens: s.rq.promptLen, OutputTokens: n}}
	if out.done {
		m.StopReason = stopReason(out.finishReason)
		if n > 0 {
			m.Content = []messageBlock{{Type: "text", Text: s.text(n)}}
		}
	}
	return m
}

// streamMessages streams rq's answer as the Messages API's events, as
// vLLM converts its chat stream: message_start and the text block's
// start with the first token, a text delta an event (the tokens since
// the last at a stream interval above 1), then the block's stop,
// message_delta (stop reason and usage) and message_stop, which ends
// the stream (no [DONE]).
func (e *Engine) streamMessages(w http.ResponseWriter, r *http.Request, rq *request, resp *responder) {
	sent := 0
	e.sseStream(w, r, rq, nil, func(b []byte, out requestOutput) []byte {
		if sent == 0 && out.generated > 0 {
			b = namedEvent(b, "message_start", map[string]any{"message": resp.message(requestOutput{}, 0)})
			b = namedEvent(b, "content_block_start", map[string]any{"index": 0, "content_block": messageBlock{Type: "text"}})
		}
		eachDelta(&sent, out.generated, e.cfg.StreamInterval, func(from, to int) {
			var d strings.Builder
			outputText(&d, rq, from, to)
			b = namedEvent(b, "content_block_delta", map[string]any{"index": 0, "delta": map[string]string{"type": "text_delta", "text": d.String()}})
		})
		if out.done {
			if out.generated > 0 {
				b = namedEvent(b, "content_block_stop", map[string]any{"index": 0})
			} else {
				b = namedEvent(b, "message_start", map[string]any{"message": resp.message(requestOutput{}, 0)})
			}
			b = namedEvent(b, "message_delta", map[string]any{
				"delta": map[string]any{"stop_reason": stopReason(out.finishReason), "stop_sequence": nil},
				"usage": messageUsage{InputTokens: rq.promptLen, OutputTokens: out.generated}})
			b = namedEvent(b, "message_stop", map[string]any{})
		}
		return b
	})
}
