package gateway

import "bytes"

// The Anthropic Messages API (POST /v1/messages), which vLLM and SGLang
// serve (Claude-Code-style clients speak it), is routed as the chat
// request the engine makes of it (openai.ParseMessages): its system and
// messages are the prompt's, tokenized, keyed and scored as a chat
// request's, and the request goes to the engine's /v1/messages as sent.
// Its stream is one of named events (namedEvents); the gateway's own
// errors on it are in its form (openai.MessagesErrors).
// count_tokens is forwarded to an endpoint of the model.

// namedEvents is the kind of a stream of named events, whose "event:"
// lines say which bring tokens and which ends it (0: an OpenAI stream of
// data lines, ended by [DONE]).
type namedEvents uint8

const (
	responsesEvents namedEvents = iota + 1 // the Responses API's
	messagesEvents                         // the Messages API's
)

// namedEventsOf is the kind of rt's stream.
func namedEventsOf(rt *routed) namedEvents {
	switch rt.api {
	case apiResponses:
		return responsesEvents
	case apiMessages:
		return messagesEvents
	}
	return 0
}

// token reports whether the event named name brings tokens: a
// Responses stream's response.….delta (text, reasoning or a call's
// arguments), a Messages stream's content_block_delta.
func (k namedEvents) token(name []byte) bool {
	switch k {
	case responsesEvents:
		return bytes.HasSuffix(name, []byte(".delta"))
	case messagesEvents:
		return string(name) == "content_block_delta"
	}
	return false
}

// last reports whether the event named name ends the stream: a
// Responses stream's response.completed, .incomplete, .failed or error;
// a Messages stream's message_stop or error.
func (k namedEvents) last(name []byte) bool {
	switch k {
	case responsesEvents:
		switch string(name) {
		case "response.completed", "response.incomplete", "response.failed", "error":
			return true
		}
	case messagesEvents:
		return string(name) == "message_stop" || string(name) == "error"
	}
	return false
}

// hasTokenEvent reports whether b has a line naming a token's event.
func (k namedEvents) hasTokenEvent(b []byte) bool {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if name, ok := bytes.CutPrefix(line, []byte("event:")); ok && k.token(bytes.TrimSpace(name)) {
			return true
		}
	}
	return false
}
