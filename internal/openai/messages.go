package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
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
// of it, its inline system messages kept in place (ParseMessagesAs).
func ParseMessages(body []byte) (*Request, error) {
	return ParseMessagesAs(body, InlinePreserve)
}

// ParseMessagesAs parses a /v1/messages body as the chat request vLLM
// makes of it: the system prompt (the top-level system, a string or its
// text blocks joined without a separator, the billing header's dropped)
// and the system messages inside messages placed as mode says
// (placeInline), as a system message; then the messages
// (convertMessage), each with its object as vLLM builds it (Message.Raw),
// so that an exact tokenizer renders it as the engine does: its text
// blocks as its content, its tool_use blocks as tool calls, a user's
// tool_result as a tool message before the rest of its message, an
// assistant's as the text "Tool result: …", its thinking blocks as its
// reasoning, an image as a part (which kvgate's tokenizers refuse, as
// they refuse a chat request's images). A user message left without
// content is dropped. The tools become the chat API's (messagesTools);
// output_config's effort and thinking set the template kwargs vLLM sets
// (messagesEffort); max_tokens (required) is MaxTokens; model, stream and
// kv_transfer_params are read as a chat request's, and ignore_eos (which
// vLLM's Messages API does not read; kvgate's emulator does, for kvgate
// bench). Raw is the body.
func ParseMessagesAs(body []byte, mode InlineSystem) (*Request, error) {
	return parseMessagesBody(body, true, func(string) InlineSystem { return mode })
}

// ParseMessagesFor is ParseMessagesAs, the placement the one mode gives
// for the request's model (its engines'), read in the same pass.
func ParseMessagesFor(body []byte, mode func(model string) InlineSystem) (*Request, error) {
	return parseMessagesBody(body, true, mode)
}

// ParseCountTokens parses a /v1/messages/count_tokens body: a Messages
// request without max_tokens, whose prompt is counted.
func ParseCountTokens(body []byte) (*Request, error) {
	return ParseCountTokensAs(body, InlinePreserve)
}

// ParseCountTokensAs is ParseCountTokens, the inline system messages
// placed as mode says.
func ParseCountTokensAs(body []byte, mode InlineSystem) (*Request, error) {
	return parseMessagesBody(body, false, func(string) InlineSystem { return mode })
}

// parseMessagesBody is ParseMessagesFor, max_tokens required if generates.
func parseMessagesBody(body []byte, generates bool, mode func(model string) InlineSystem) (*Request, error) {
	r, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	var system string
	var list []anthropicMessage
	var effort messagesEffort
	for _, m := range r.members {
		v := body[m.v0:m.v1]
		switch m.key {
		case "model", "stream", "kv_transfer_params", "chat_template_kwargs", "ignore_eos":
			err = r.setField(m.key, v)
		case "tools":
			r.Tools, err = messagesTools(v)
		case "max_tokens":
			r.MaxTokens, err = parseInt(m.key, v)
		case "system":
			system, err = messagesSystem(v)
		case "messages":
			list, err = readMessagesList(v)
		case "output_config", "thinking":
			err = effort.read(m.key, v)
		}
		if err != nil {
			return nil, err
		}
	}
	switch {
	case r.Model == "":
		// vLLM's Messages request requires it (a chat's may omit it).
		return nil, BadRequest("model is required").WithParam("model")
	case list == nil:
		return nil, BadRequest("messages is required").WithParam("messages")
	case r.MaxTokens == nil && generates:
		return nil, BadRequest("max_tokens is required").WithParam("max_tokens")
	}
	prompt, placed := placeInline(system, list, mode(r.Model))
	if prompt != "" {
		r.Messages = append(r.Messages, objectMessage("system", Content{String: prompt}, "", nil, true))
	}
	for _, m := range placed {
		if r.Messages, err = convertMessage(r.Messages, m); err != nil {
			return nil, err
		}
	}
	if len(r.Messages) == 0 {
		return nil, BadRequest("messages must not be empty").WithParam("messages")
	}
	r.ChatTemplateKwargs = effort.kwargs(r.ChatTemplateKwargs)
	return r, nil
}

// messagesBlock is one content block as kvgate reads it.
type messagesBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Thinking  *string         `json:"thinking"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"` // a tool_result's: a string or blocks
	// folded, when set, is a tool_result's content with inline system
	// text folded into it (placeInline), instead of Content.
	folded *messagesContentValue
}

// messagesSystem reads the top-level system: a string, or its text
// blocks but the billing header, joined without a separator.
func messagesSystem(v []byte) (string, error) {
	if isNull(v) {
		return "", nil
	}
	c, err := messagesContent(v, "system")
	if err != nil {
		return "", err
	}
	if c.blocks == nil {
		return c.text, nil
	}
	return blocksText(c.blocks), nil
}

// blocksText is the text of text blocks but the billing header's,
// joined without a separator, as vLLM reads a system's.
func blocksText(blocks []messagesBlock) string {
	var b strings.Builder
	for _, bl := range blocks {
		if bl.Type == "text" && !strings.HasPrefix(bl.Text, billingHeader) {
			b.WriteString(bl.Text)
		}
	}
	return b.String()
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

// anthropicMessage is one message of a Messages request, read: its chat
// role and its content; param names it in errors.
type anthropicMessage struct {
	role    string
	content messagesContentValue
	param   string
}

// readMessagesList reads the messages.
func readMessagesList(v []byte) ([]anthropicMessage, error) {
	if isNull(v) {
		return nil, nil
	}
	if v[0] != '[' {
		return nil, BadRequest("messages must be a list of messages").WithParam("messages")
	}
	out := []anthropicMessage{}
	var err error
	eachElement(v, func(el []byte) {
		if err != nil {
			return
		}
		if len(out) >= maxMessagesBlocks {
			err = BadRequest("messages has more than %d messages", maxMessagesBlocks).WithParam("messages")
			return
		}
		var m anthropicMessage
		m, err = readMessage(el, len(out))
		out = append(out, m)
	})
	return out, err
}

// messagesRoles maps a message's role to its chat role: Claude Code's
// ctx and msg are the user's, as vLLM reads them.
var messagesRoles = map[string]string{"user": "user", "assistant": "assistant", "system": "system", "ctx": "user", "msg": "user"}

// readMessage reads message k (el).
func readMessage(el []byte, k int) (anthropicMessage, error) {
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	param := fmt.Sprintf("messages[%d]", k)
	if el[0] != '{' || json.Unmarshal(el, &m) != nil {
		return anthropicMessage{}, BadRequest("%s must be a message object", param).WithParam("messages")
	}
	role, ok := messagesRoles[m.Role]
	if !ok {
		return anthropicMessage{}, BadRequest("%s.role must be user or assistant, got %q", param, m.Role).WithParam("messages")
	}
	c, err := messagesContent(m.Content, param+".content")
	if err != nil {
		return anthropicMessage{}, err.(*Error).WithParam("messages")
	}
	return anthropicMessage{role: role, content: c, param: param}, nil
}

// convertMessage appends message m to out as the chat messages vLLM
// converts it to, each with its object (Message.Raw) as vLLM builds it:
// role, then reasoning (its thinking blocks), tool_calls (its tool_use
// blocks, arguments written as Python's json.dumps writes the input) and
// content (a string as sent; of blocks, one text a string, more parts a
// list, none no content); a user's tool_result a tool message of its own
// before it; a system message (kept in place) its text, or nothing when
// it has none.
func convertMessage(out []Message, m anthropicMessage) ([]Message, error) {
	c, param := m.content, m.param
	switch {
	case m.role == "system":
		if text := systemText(c); text != "" {
			out = append(out, objectMessage("system", Content{String: text}, "", nil, true))
		}
		return out, nil
	case c.blocks == nil:
		return append(out, objectMessage(m.role, Content{String: c.text}, "", nil, true)), nil
	}
	var content Content
	var reasoning strings.Builder
	var calls []messagesToolCall
	for j, b := range c.blocks {
		switch b.Type {
		case "text":
			if b.Text != "" {
				content.Parts = append(content.Parts, ContentPart{Type: "text", Text: b.Text})
			}
		case "image":
			// Refused here, in the client's terms (it was refused once
			// converted, as messages[k+1]'s "image_url" part).
			return nil, imageRefused(fmt.Sprintf("%s.content[%d]", param, j))
		case "thinking":
			if b.Thinking != nil {
				reasoning.WriteString(*b.Thinking)
			}
		case "tool_use":
			call, err := toolCallOf(b, param)
			if err != nil {
				return nil, err
			}
			calls = append(calls, call)
		case "tool_result":
			text, image, err := toolResultText(b, param)
			if err != nil {
				return nil, err
			}
			if image >= 0 {
				// vLLM sends a result's images as a user message of
				// image parts after it; refused as any image is (text
				// only), where they were dropped unsaid.
				return nil, imageRefused(fmt.Sprintf("%s.content[%d].content[%d]", param, j, image))
			}
			if m.role == "user" {
				out = append(out, toolMessage(b.ToolUseID, text))
			} else {
				content.Parts = append(content.Parts, ContentPart{Type: "text", Text: "Tool result: " + text})
			}
		}
	}
	if len(content.Parts) == 1 && content.Parts[0].Type == "text" {
		content = Content{String: content.Parts[0].Text}
	}
	hasContent := content.Parts != nil || content.String != ""
	if m.role == "user" && !hasContent {
		return out, nil // only tool results, or nothing
	}
	return append(out, objectMessage(m.role, content, reasoning.String(), calls, hasContent)), nil
}

// messagesToolCall is a tool_use block as the chat API's tool call.
type messagesToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// toolCallOf is a tool_use block's call: its input (none: {}) written as
// Python's json.dumps writes it.
func toolCallOf(b messagesBlock, param string) (messagesToolCall, error) {
	c := messagesToolCall{ID: b.ID, Type: "function"}
	c.Function.Name = b.Name
	in := b.Input
	if len(in) == 0 || isNull(in) {
		in = json.RawMessage("{}")
	}
	args, err := PythonJSON(in)
	if err != nil {
		return c, BadRequest("%s: a tool_use input: %v", param, err).WithParam("messages")
	}
	c.Function.Arguments = args
	return c, nil
}

// toolMessage is a user's tool_result as a tool message.
func toolMessage(id, text string) Message {
	raw, _ := json.Marshal(struct {
		Role       string `json:"role"`
		ToolCallID string `json:"tool_call_id"`
		Content    string `json:"content"`
	}{"tool", id, text})
	return Message{Role: "tool", Content: Content{String: text}, Raw: raw}
}

// objectMessage is a converted message with its object: role, reasoning
// (if any), tool_calls (if any), content (if hasContent: a string, or
// parts).
func objectMessage(role string, content Content, reasoning string, calls []messagesToolCall, hasContent bool) Message {
	raw := []byte(`{"role":`)
	raw, _ = appendJSON(raw, role)
	if reasoning != "" {
		raw = append(raw, `,"reasoning":`...)
		raw, _ = appendJSON(raw, reasoning)
	}
	if calls != nil {
		raw = append(raw, `,"tool_calls":`...)
		raw, _ = appendJSON(raw, calls)
	}
	if hasContent {
		raw = append(raw, `,"content":`...)
		raw, _ = appendJSON(raw, content)
	}
	return Message{Role: role, Content: content, Raw: append(raw, '}')}
}

// appendJSON appends v's JSON to b.
func appendJSON(b []byte, v any) ([]byte, error) {
	j, err := json.Marshal(v)
	return append(b, j...), err
}

// toolResultText is a tool_result's content as text (folded into, when
// inline system text was): a string, or its text blocks joined by
// newlines; and the index of its first image block (-1: none).
func toolResultText(b messagesBlock, param string) (text string, image int, err error) {
	c, err := toolResultContent(b, param)
	if err != nil || c.blocks == nil {
		return c.text, -1, err
	}
	var texts []string
	image = -1
	for i, bl := range c.blocks {
		switch {
		case bl.Type == "text":
			texts = append(texts, bl.Text)
		case bl.Type == "image" && image < 0:
			image = i
		}
	}
	return strings.Join(texts, "\n"), image, nil
}

// imageRefused is the refusal of the image block at param: kvgate's
// tokenizers count text only (docs/serve.md, "The Messages API").
func imageRefused(param string) *Error {
	return BadRequest("%s: image blocks are not supported: kvgate's tokenizers count text only", param).WithParam("messages")
}

// toolResultContent is a tool_result's content: folded, or read from
// Content (none: the empty string).
func toolResultContent(b messagesBlock, param string) (messagesContentValue, error) {
	switch {
	case b.folded != nil:
		return *b.folded, nil
	case len(b.Content) == 0 || isNull(b.Content):
		return messagesContentValue{}, nil
	}
	c, err := messagesContent(b.Content, param+".content")
	if err != nil {
		return c, err.(*Error).WithParam("messages")
	}
	return c, nil
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

// messagesErrorTypes pairs statuses with the Messages API's error types
// (Anthropic's: 529 is its overloaded status, first so that the type
// reads back as it).
var messagesErrorTypes = [...]struct {
	status int
	typ    string
}{
	{http.StatusBadRequest, "invalid_request_error"},
	{http.StatusUnauthorized, "authentication_error"},
	{http.StatusForbidden, "permission_error"},
	{http.StatusNotFound, "not_found_error"},
	{http.StatusRequestEntityTooLarge, "request_too_large"},
	{http.StatusTooManyRequests, "rate_limit_error"},
	{529, "overloaded_error"},
	{http.StatusServiceUnavailable, "overloaded_error"},
	{http.StatusGatewayTimeout, "timeout_error"},
	{http.StatusInternalServerError, "api_error"},
}

// MessagesErrorType is the Messages API's error type for status (the
// Anthropic SDKs read the status; people and logs read the type): other
// 5xx are api_error, other 4xx invalid_request_error.
func MessagesErrorType(status int) string {
	for _, e := range messagesErrorTypes {
		if e.status == status {
			return e.typ
		}
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// MessagesErrorStatus is the status of a Messages API error type (500
// for a type it does not name, vLLM's OpenAI-style ones among them).
func MessagesErrorStatus(typ string) int {
	for _, e := range messagesErrorTypes {
		if e.typ == typ {
			return e.status
		}
	}
	return http.StatusInternalServerError
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

// messagesForm reports whether w, or a writer it wraps (Unwrap, as
// http.ResponseController reads them), is a MessagesErrors writer.
func messagesForm(w http.ResponseWriter) bool {
	for range 16 { // writers wrap a few deep; a cycle must not hang
		if _, ok := w.(messagesErrors); ok {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	return false
}

// messagesTools is a Messages request's tools as the chat API's, as vLLM
// converts them: each a function of the tool's name, description
// (null when absent), input_schema as its parameters (with "type":
// "object" when it names no type), strict and defer_loading (nil: no
// tools).
func messagesTools(v []byte) (json.RawMessage, error) {
	if isNull(v) {
		return nil, nil
	}
	bad := BadRequest("tools must be a list of tools with a name and an input_schema").WithParam("tools")
	if v[0] != '[' {
		return nil, bad
	}
	out := []byte{'['}
	var err error
	i := 0
	eachElement(v, func(el []byte) {
		if err != nil {
			return
		}
		// The body is valid JSON (parseObject): the members are read as
		// written, not decoded again.
		t := membersOf(el)
		name, desc, schema := t.vals["name"], t.vals["description"], t.vals["input_schema"]
		strict, deferLoading := t.vals["strict"], t.vals["defer_loading"]
		switch {
		case el[0] != '{' || !jsonIs(name, '"') || !jsonIs(desc, '"') || !jsonIs(strict, 't', 'f') || !jsonIs(deferLoading, 't', 'f'):
			err = bad
			return
		case len(schema) == 0 || schema[0] != '{':
			err = BadRequest("tools[%d].input_schema must be an object", i).WithParam("tools")
			return
		}
		ms, e := objectMembers(schema, "input_schema")
		switch {
		case e != nil:
			err = BadRequest("tools[%d].input_schema must be an object", i).WithParam("tools")
			return
		case len(ms) == 0:
			schema = []byte(`{"type":"object"}`)
		case find(ms, "type") == nil: // vLLM adds it, last
			body := bytes.TrimRight(schema[:len(bytes.TrimRight(schema, " \t\r\n"))-1], " \t\r\n")
			schema = append(slices.Clone(body), `,"type":"object"}`...)
		}
		if i > 0 {
			out = append(out, ',')
		}
		i++
		out = append(out, `{"type":"function","function":{"name":`...)
		out = appendRawOr(out, name, `""`)
		out = append(out, `,"description":`...)
		out = appendRawOr(out, desc, "null")
		out = append(out, `,"parameters":`...)
		out = append(out, schema...)
		out = append(out, `,"strict":`...)
		out = appendRawOr(out, strict, "null")
		out = append(out, `,"defer_loading":`...)
		out = appendRawOr(out, deferLoading, "null")
		out = append(out, "}}"...)
	})
	if err != nil || i == 0 {
		return nil, err
	}
	return append(out, ']'), nil
}

// jsonIs reports whether the JSON value v is absent, null, or starts with
// one of first (a string '"', a boolean 't' or 'f').
func jsonIs(v []byte, first ...byte) bool {
	return len(v) == 0 || isNull(v) || slices.Contains(first, v[0])
}

// appendRawOr appends the JSON value v as written, or none when it is
// absent or null (a null name: as empty as an absent one).
func appendRawOr(out, v []byte, none string) []byte {
	if len(v) == 0 || isNull(v) {
		return append(out, none...)
	}
	return append(out, v...)
}
