package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// The Anthropic Messages API (POST /v1/messages), which vLLM and SGLang
// serve beside the OpenAI APIs (Claude-Code-style clients speak it), is
// to the engine a chat request in another envelope: vLLM converts it to
// one and renders its messages through the model's chat template.
// ParseMessages reads it as vLLM converts it, so that the gateway's
// tokens and block keys are the engine's.

// maxMessagesBlocks bounds the messages and content blocks read (more
// than any context window holds).
const maxMessagesBlocks = 1 << 16

// billingHeader starts a system text block that vLLM drops: Claude Code
// puts a per-request hash there, which would defeat prefix caching.
const billingHeader = "x-anthropic-billing-header"

// ParseMessages parses a /v1/messages body as the chat request vLLM makes
// of it: the system text (the top-level system, a string or text blocks,
// then any system message's, joined without a separator) as a system
// message, then the messages: a string content as it is, text blocks as
// text parts, an image as a part of its type (which kvgate's tokenizer
// refuses, as it refuses a chat request's images), a tool_use block as
// the text name(input) (kvgate's rendering of a tool call; the exact one
// is the template's), a user's tool_result as a tool message before the
// rest of its message, an assistant's as the text "Tool result: …", and
// thinking blocks not at all (templates drop past reasoning). A user
// message left without content is dropped. max_tokens (required) is
// MaxTokens; model, stream and kv_transfer_params are read as a chat
// request's. Raw is the body.
func ParseMessages(body []byte) (*Request, error) {
	return parseMessagesBody(body, true)
}

// ParseCountTokens parses a /v1/messages/count_tokens body: a Messages
// request without max_tokens, whose prompt is counted.
func ParseCountTokens(body []byte) (*Request, error) {
	return parseMessagesBody(body, false)
}

// parseMessagesBody is ParseMessages, max_tokens required if generates.
func parseMessagesBody(body []byte, generates bool) (*Request, error) {
	r, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	var system []string
	var msgs []Message
	for _, m := range r.members {
		v := body[m.v0:m.v1]
		switch m.key {
		case "model", "stream", "kv_transfer_params":
			err = r.setField(m.key, v)
		case "max_tokens":
			r.MaxTokens, err = parseInt(m.key, v)
		case "system":
			system, err = messagesSystem(v)
		case "messages":
			msgs, err = parseMessagesList(v, &system)
		}
		if err != nil {
			return nil, err
		}
	}
	switch {
	case msgs == nil:
		return nil, BadRequest("messages is required").WithParam("messages")
	case r.MaxTokens == nil && generates:
		return nil, BadRequest("max_tokens is required").WithParam("max_tokens")
	}
	if s := strings.Join(system, ""); s != "" {
		r.Messages = append(r.Messages, Message{Role: "system", Content: Content{String: s}})
	}
	r.Messages = append(r.Messages, msgs...)
	if len(r.Messages) == 0 {
		return nil, BadRequest("messages must not be empty").WithParam("messages")
	}
	return r, nil
}

// messagesBlock is one content block as kvgate reads it.
type messagesBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`
	Content json.RawMessage `json:"content"` // a tool_result's: a string or blocks
}

// messagesSystem reads the top-level system: a string, or text blocks
// (the billing header's dropped).
func messagesSystem(v []byte) ([]string, error) {
	if isNull(v) {
		return nil, nil
	}
	c, err := messagesContent(v, "system")
	if err != nil {
		return nil, err
	}
	return systemTexts(c), nil
}

// systemTexts is the system text of content c: a string, or its text
// blocks but the billing header.
func systemTexts(c messagesContentValue) []string {
	if c.blocks == nil {
		return []string{c.text}
	}
	var out []string
	for _, b := range c.blocks {
		if b.Type == "text" && b.Text != "" && !strings.HasPrefix(b.Text, billingHeader) {
			out = append(out, b.Text)
		}
	}
	return out
}

// messagesContentValue is a content: a string (blocks nil) or blocks.
type messagesContentValue struct {
	text   string
	blocks []messagesBlock
}

// messagesContent reads a content: a string or a list of blocks, each
// with a type.
func messagesContent(v []byte, param string) (messagesContentValue, error) {
	switch {
	case len(v) > 0 && v[0] == '"':
		s, err := unquote(v)
		if err != nil {
			return messagesContentValue{}, BadRequest("%s: %v", param, err).WithParam(param)
		}
		return messagesContentValue{text: s}, nil
	case len(v) == 0 || v[0] != '[':
		return messagesContentValue{}, BadRequest("%s must be a string or a list of content blocks", param).WithParam(param)
	}
	blocks := []messagesBlock{}
	var err error
	eachElement(v, func(el []byte) {
		if err != nil {
			return
		}
		var b messagesBlock
		switch {
		case len(blocks) >= maxMessagesBlocks:
			err = BadRequest("%s has more than %d content blocks", param, maxMessagesBlocks)
		case el[0] != '{' || json.Unmarshal(el, &b) != nil:
			err = BadRequest("%s[%d] must be a content block object", param, len(blocks))
		case b.Type == "":
			err = BadRequest("%s[%d].type is required", param, len(blocks))
		}
		blocks = append(blocks, b)
	})
	if err != nil {
		return messagesContentValue{}, err.(*Error).WithParam(param)
	}
	return messagesContentValue{blocks: blocks}, nil
}

// parseMessagesList reads the messages: a system message's text is added
// to system; the others are converted (messagesMessage).
func parseMessagesList(v []byte, system *[]string) ([]Message, error) {
	if isNull(v) {
		return nil, nil
	}
	if v[0] != '[' {
		return nil, BadRequest("messages must be a list of messages").WithParam("messages")
	}
	out := []Message{}
	var err error
	k := 0
	eachElement(v, func(el []byte) {
		if err != nil {
			return
		}
		if k >= maxMessagesBlocks {
			err = BadRequest("messages has more than %d messages", maxMessagesBlocks).WithParam("messages")
			return
		}
		out, err = messagesMessage(out, system, el, k)
		k++
	})
	return out, err
}

// messagesRoles maps a message's role to its chat role: Claude Code's
// ctx and msg are the user's, as vLLM reads them.
var messagesRoles = map[string]string{"user": "user", "assistant": "assistant", "system": "system", "ctx": "user", "msg": "user"}

// messagesMessage appends message k (el) to out as chat messages.
func messagesMessage(out []Message, system *[]string, el []byte, k int) ([]Message, error) {
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	param := fmt.Sprintf("messages[%d]", k)
	if el[0] != '{' || json.Unmarshal(el, &m) != nil {
		return nil, BadRequest("%s must be a message object", param).WithParam("messages")
	}
	role, ok := messagesRoles[m.Role]
	if !ok {
		return nil, BadRequest("%s.role must be user or assistant, got %q", param, m.Role).WithParam("messages")
	}
	c, err := messagesContent(m.Content, param+".content")
	if err != nil {
		return nil, err.(*Error).WithParam("messages")
	}
	switch {
	case role == "system":
		*system = append(*system, systemTexts(c)...)
		return out, nil
	case c.blocks == nil:
		return append(out, Message{Role: role, Content: Content{String: c.text}}), nil
	}
	msg := Message{Role: role}
	for _, b := range c.blocks {
		switch b.Type {
		case "text":
			if b.Text != "" {
				msg.Content.Parts = append(msg.Content.Parts, ContentPart{Type: "text", Text: b.Text})
			}
		case "image":
			msg.Content.Parts = append(msg.Content.Parts, ContentPart{Type: "image"})
		case "tool_use":
			in := string(b.Input)
			if in == "" || in == "null" {
				in = "{}"
			}
			msg.Content.Parts = append(msg.Content.Parts, ContentPart{Type: "text", Text: fmt.Sprintf("%s(%s)", b.Name, in)})
		case "tool_result":
			text, err := toolResultText(b.Content, param)
			if err != nil {
				return nil, err
			}
			if role == "user" {
				out = append(out, Message{Role: "tool", Content: Content{String: text}})
			} else {
				msg.Content.Parts = append(msg.Content.Parts, ContentPart{Type: "text", Text: "Tool result: " + text})
			}
		}
	}
	if len(msg.Content.Parts) == 1 && msg.Content.Parts[0].Type == "text" {
		msg.Content = Content{String: msg.Content.Parts[0].Text}
	}
	if role == "user" && msg.Content.Parts == nil && msg.Content.String == "" {
		return out, nil // only tool results, or nothing
	}
	return append(out, msg), nil
}

// toolResultText is a tool_result's content as text: a string, or its
// text blocks joined by newlines.
func toolResultText(v json.RawMessage, param string) (string, error) {
	if len(v) == 0 || isNull(v) {
		return "", nil
	}
	c, err := messagesContent(v, param+".content")
	if err != nil {
		return "", err.(*Error).WithParam("messages")
	}
	if c.blocks == nil {
		return c.text, nil
	}
	var texts []string
	for _, b := range c.blocks {
		if b.Type == "text" {
			texts = append(texts, b.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// MessagesErrorBody is an error as the Messages API sends it:
//
//	{"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}
type MessagesErrorBody struct {
	Type  string            `json:"type"`
	Error MessagesErrorInfo `json:"error"`
}

// MessagesErrorInfo is the inside of MessagesErrorBody.
type MessagesErrorInfo struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// MessagesErrorType is the Messages API's error type for status (the
// Anthropic SDKs read the status; people and logs read the type).
func MessagesErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable || status == 529:
		return "overloaded_error"
	case status == http.StatusGatewayTimeout:
		return "timeout_error"
	case status >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}

// messagesErrors is a client's writer whose errors WriteError writes in
// the Messages API's form.
type messagesErrors struct{ http.ResponseWriter }

// Unwrap is the client's writer (http.ResponseController finds its
// Flush there).
func (w messagesErrors) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// MessagesErrors is w, to which WriteError writes in the Messages API's
// form (MessagesErrorBody): a handler of /v1/messages passes it on
// instead of w.
func MessagesErrors(w http.ResponseWriter) http.ResponseWriter { return messagesErrors{w} }
