package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Request is a completion or chat completion request as kvgate reads it:
// the fields kvgate acts on, typed, and the body as received (Raw), so a
// proxy forwards everything else untouched and edits only a few top-level
// fields (Rewrite, PrefillBody, DecodeBody, StripRoutingParams).
//
// Top-level keys are matched exactly (case-sensitively, as vLLM does) and a
// key given twice is an error, so kvgate and the engine behind it never
// read different values from one body. Nested objects (messages,
// stream_options) are decoded by encoding/json.
type Request struct {
	Model    string
	Prompt   Prompt    // completions; Kind is PromptNone when absent or null
	Messages []Message // chat; nil when absent or null
	// Optional integers: nil when absent or null. Values are as sent:
	// range checks belong to the consumer, which knows its limits.
	MaxTokens           *int64
	MaxCompletionTokens *int64
	MinTokens           *int64
	N                   *int64
	IgnoreEOS           bool
	Stream              bool
	StreamOptions       *StreamOptions
	// KVTransferParams is the raw kv_transfer_params object; nil when
	// absent or null. See ParseKVTransferParams.
	KVTransferParams    json.RawMessage
	CacheSalt           string
	AddGenerationPrompt *bool
	// ContinueFinalMessage is vLLM's continue_final_message: the chat
	// template leaves the final message open and the model continues it
	// (add_generation_prompt must then be false).
	ContinueFinalMessage bool
	// Priority is vLLM's request priority (lower is served earlier; an
	// engine without priority scheduling refuses any but 0); nil when
	// absent or null.
	Priority *int64
	// PreviousResponseID and Store are a Responses API request's
	// previous_response_id ("" when absent) and store (nil when absent);
	// ParseResponses.
	PreviousResponseID string
	Store              *bool
	// Instructions is a Responses API request's instructions, which
	// ParseResponses also makes Messages' first, a system message.
	Instructions string
	// Tools and ChatTemplateKwargs are a chat request's tools (nil when
	// absent, null or empty) and chat_template_kwargs (nil when absent
	// or null), as sent: the chat template renders both into the prompt
	// (tools, typically into its system part), so a tokenizer that
	// renders it as the engine does needs them.
	Tools              json.RawMessage
	ChatTemplateKwargs json.RawMessage

	// Raw is the body as received.
	Raw     []byte
	members []member
}

// StreamOptions is the stream_options object.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
	// ContinuousUsageStats is vLLM's and SGLang's continuous_usage_stats:
	// with IncludeUsage, every event carries the usage so far.
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

// AskUsageEvents makes r's body ask for the usage in every streamed
// event: stream_options with include_usage and continuous_usage_stats
// true, its other members kept. A gateway that continues a broken
// stream (migration) counts the tokens the client had from it: an
// engine may send several tokens an event (vLLM's --stream-interval, or
// its output collector when the server lags).
func (r *Request) AskUsageEvents() {
	opts := map[string]json.RawMessage{}
	if v := r.value("stream_options"); v != nil && !isNull(v) {
		_ = json.Unmarshal(v, &opts) // an object: ParseRequest checked it
	}
	opts["include_usage"] = json.RawMessage("true")
	opts["continuous_usage_stats"] = json.RawMessage("true")
	v, _ := json.Marshal(opts)
	body := r.Rewrite(Edit{Key: "stream_options", Value: v})
	ms, err := objectMembers(body, "request body")
	if err != nil {
		return // cannot happen: an object with one valid member changed
	}
	r.Raw, r.members = body, ms
	r.StreamOptions = &StreamOptions{IncludeUsage: true, ContinuousUsageStats: true}
}

// UsageEvents reports whether the request asks for its final usage event
// (include_usage) and for the usage in every event (vLLM's rule:
// continuous_usage_stats counts only with include_usage).
func (r *Request) UsageEvents() (final, continuous bool) {
	if o := r.StreamOptions; o != nil && o.IncludeUsage {
		return true, o.ContinuousUsageStats
	}
	return false, false
}

// PromptKind is the shape of a completion prompt.
type PromptKind uint8

// Prompt shapes.
const (
	PromptNone       PromptKind = iota // absent or null
	PromptText                         // "text": Texts has one element
	PromptTexts                        // ["text", ...]
	PromptTokens                       // [id, ...]: Tokens has one element
	PromptTokenLists                   // [[id, ...], ...]
)

// Prompt is a completion prompt: a string, a list of strings, a list of
// token ids or a list of lists of token ids.
type Prompt struct {
	Kind   PromptKind
	Texts  []string
	Tokens [][]uint32
}

// Len is the number of prompts (a batch has more than one).
func (p Prompt) Len() int {
	switch p.Kind {
	case PromptText, PromptTexts:
		return len(p.Texts)
	case PromptTokens, PromptTokenLists:
		return len(p.Tokens)
	}
	return 0
}

// Message is one chat message: its role and content, and for the chat
// API the message object as sent (Raw: its tool_calls, tool_call_id,
// name and reasoning, which a chat template may render too; nil for a
// message another API's request was converted to).
type Message struct {
	Role    string          `json:"role"`
	Content Content         `json:"content"`
	Raw     json.RawMessage `json:"-"`
}

// Content is a message's content: a string, null, or a list of parts.
type Content struct {
	String string
	Parts  []ContentPart // non-nil for the list form
}

// ContentPart is one part of a list content; parts other than text keep
// only their type here.
type ContentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// UnmarshalJSON accepts a string, null or a list of content parts.
func (c *Content) UnmarshalJSON(b []byte) error {
	var err error
	*c, err = parseContent(b)
	return err
}

// parseContent reads a message content from valid JSON.
func parseContent(b []byte) (Content, error) {
	switch {
	case isNull(b):
		return Content{}, nil
	case len(b) > 0 && b[0] == '"':
		s, err := unquote(b)
		return Content{String: s}, err
	case len(b) > 0 && b[0] == '[':
		parts := []ContentPart{}
		if err := json.Unmarshal(b, &parts); err != nil {
			return Content{}, errors.New("content parts must be objects with a type and, for text, a text")
		}
		return Content{Parts: parts}, nil
	}
	return Content{}, errors.New("content must be a string or a list of content parts")
}

// MarshalJSON writes the string or the parts.
func (c Content) MarshalJSON() ([]byte, error) {
	if c.Parts != nil {
		return json.Marshal(c.Parts)
	}
	return json.Marshal(c.String)
}

// Text flattens the content: the string, or the text parts joined with
// newlines. A part of another type is an error (text only).
func (c Content) Text() (string, error) {
	if c.Parts == nil {
		return c.String, nil
	}
	var b strings.Builder
	for i, p := range c.Parts {
		if p.Type != "text" && p.Type != "" {
			return "", fmt.Errorf("content part type %q is not supported: kvgate counts a prompt's tokens, and so routes it, from its text only (images, audio and video are not routed; docs/serve.md)", p.Type)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// DecodeObject decodes body, which must be one JSON object and nothing
// else, into v (a pointer to a struct) with encoding/json. Errors are 400s.
// For small bodies of admin APIs; requests use ParseRequest.
func DecodeObject(body []byte, v any) error {
	i := skipSpace(body, 0)
	if i == len(body) {
		return BadRequest("request body is empty; expected a JSON object")
	}
	if body[i] != '{' {
		return BadRequest("request body must be a JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		var e *Error
		if errors.As(err, &e) { // from a field's UnmarshalJSON
			return e
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return BadRequest("%s must be %s, not %s", te.Field, jsonKind(te.Type), article(te.Value)).WithParam(te.Field)
		}
		return BadRequest("invalid JSON body: %v", err)
	}
	return nil
}

// jsonKind names the JSON value a Go type is decoded from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	if t.Kind() >= reflect.Int && t.Kind() <= reflect.Float64 {
		return "a number"
	}
	return "another type"
}

// article is a JSON value kind as encoding/json names it ("number",
// "array", …) with its article.
func article(kind string) string {
	switch {
	case kind == "array":
		return "a list"
	case kind == "object":
		return "an object"
	case kind == "bool":
		return "a boolean"
	case strings.HasPrefix(kind, "number "): // a number that does not fit: its value
		return strings.TrimPrefix(kind, "number ")
	case kind == "":
		return "this value"
	}
	return "a " + kind
}

// ParseRequest parses a completion or chat request body: one JSON object,
// nothing after it. Every error is a 400 *Error naming the field.
func ParseRequest(body []byte) (*Request, error) {
	r, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	ms := r.members
	for i := range ms {
		if err := r.setField(ms[i].key, body[ms[i].v0:ms[i].v1]); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// parseObject is the Request of a body that is one JSON object, its
// members indexed and nothing else read.
func parseObject(body []byte) (*Request, error) {
	if len(body) == 0 || skipSpace(body, 0) == len(body) {
		return nil, BadRequest("request body is empty; expected a JSON object")
	}
	if !valid(body) {
		return nil, BadRequest("invalid JSON body: %v", jsonError(body))
	}
	ms, err := objectMembers(body, "request body")
	if err != nil {
		return nil, err
	}
	return &Request{Raw: body, members: ms}, nil
}

// jsonError says what is wrong with invalid JSON (position included).
func jsonError(body []byte) error {
	var v any
	err := json.Unmarshal(body, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("%v (at byte %d)", se, se.Offset)
	}
	if err == nil {
		return errors.New("not a single JSON value")
	}
	return err
}

func (r *Request) setField(key string, v []byte) error {
	var err error
	switch key {
	case "model":
		r.Model, err = parseString(key, v)
	case "prompt":
		r.Prompt, err = parsePrompt(v)
	case "messages":
		r.Messages, err = parseMessages(v)
	case "max_tokens":
		r.MaxTokens, err = parseInt(key, v)
	case "max_completion_tokens":
		r.MaxCompletionTokens, err = parseInt(key, v)
	case "min_tokens":
		r.MinTokens, err = parseInt(key, v)
	case "n":
		r.N, err = parseInt(key, v)
	case "ignore_eos":
		r.IgnoreEOS, err = parseBool(key, v)
	case "stream":
		r.Stream, err = parseBool(key, v)
	case "stream_options":
		if !isNull(v) {
			r.StreamOptions = &StreamOptions{}
			if v[0] != '{' || json.Unmarshal(v, r.StreamOptions) != nil {
				err = BadRequest("stream_options must be an object like {\"include_usage\": true}").WithParam(key)
			}
		}
	case "kv_transfer_params":
		if !isNull(v) {
			r.KVTransferParams = json.RawMessage(v)
		}
	case "tools":
		switch {
		case v[0] == '[' && len(trimSpace(v[1:])) > 1:
			r.Tools = json.RawMessage(v)
		case v[0] != '[' && !isNull(v):
			err = BadRequest("tools must be a list of tools").WithParam(key)
		}
	case "chat_template_kwargs":
		switch {
		case v[0] == '{':
			r.ChatTemplateKwargs = json.RawMessage(v)
		case !isNull(v):
			err = BadRequest("chat_template_kwargs must be an object").WithParam(key)
		}
	case "cache_salt":
		r.CacheSalt, err = parseString(key, v)
	case "priority":
		r.Priority, err = parseInt(key, v)
	case "add_generation_prompt":
		r.AddGenerationPrompt, err = parseOptBool(key, v)
	case "continue_final_message":
		var b *bool
		if b, err = parseOptBool(key, v); b != nil {
			r.ContinueFinalMessage = *b
		}
	}
	if err == nil && r.ContinueFinalMessage && r.AddGenerationPrompt != nil && *r.AddGenerationPrompt {
		err = BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.").WithParam(key)
	}
	return err
}

const promptShapes = "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids"

func parsePrompt(v []byte) (Prompt, error) {
	bad := func() (Prompt, error) { return Prompt{}, BadRequest(promptShapes).WithParam("prompt") }
	switch {
	case isNull(v):
		return Prompt{}, nil
	case v[0] == '"':
		s, err := unquote(v)
		if err != nil {
			return bad()
		}
		return Prompt{Kind: PromptText, Texts: []string{s}}, nil
	case v[0] != '[':
		return bad()
	}
	i := skipSpace(v, 1)
	switch {
	case v[i] == ']' || v[i] == '-' || v[i] >= '0' && v[i] <= '9':
		ids, err := tokenIDs(v, "prompt", "prompt")
		if err != nil {
			return Prompt{}, err
		}
		return Prompt{Kind: PromptTokens, Tokens: [][]uint32{ids}}, nil
	case v[i] == '"':
		var ss []string
		if json.Unmarshal(v, &ss) != nil {
			return bad()
		}
		return Prompt{Kind: PromptTexts, Texts: ss}, nil
	case v[i] == '[':
		var lists [][]uint32
		for j := i; j < len(v) && v[j] == '['; {
			k := skipValue(v, j)
			ids, err := tokenIDs(v[j:k], fmt.Sprintf("prompt[%d]", len(lists)), "prompt")
			if err != nil {
				return Prompt{}, err
			}
			lists = append(lists, ids)
			j = skipSpace(v, k)
			if j < len(v) && v[j] == ',' {
				j = skipSpace(v, j+1)
				if v[j] != '[' {
					return bad()
				}
				continue
			}
			if v[j] != ']' {
				return bad()
			}
		}
		return Prompt{Kind: PromptTokenLists, Tokens: lists}, nil
	}
	return bad()
}

// parseMessages reads the messages list from valid JSON: role and
// content of each message, keys matched exactly as at the top level.
func parseMessages(v []byte) ([]Message, error) {
	if isNull(v) {
		return nil, nil
	}
	if v[0] != '[' {
		return nil, BadRequest("messages must be a list of messages").WithParam("messages")
	}
	msgs := []Message{}
	i := skipSpace(v, 1)
	for i < len(v) && v[i] != ']' {
		j := skipValue(v, i)
		k := len(msgs)
		m, err := parseMessage(v[i:j], k)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
		if i = skipSpace(v, j); i < len(v) && v[i] == ',' {
			i = skipSpace(v, i+1)
		}
	}
	return msgs, nil
}

func parseMessage(b []byte, k int) (Message, error) {
	if b[0] != '{' {
		return Message{}, BadRequest("messages[%d] must be an object", k).WithParam("messages")
	}
	ms, err := objectMembers(b, fmt.Sprintf("messages[%d]", k))
	if err != nil {
		return Message{}, err.(*Error).WithParam("messages")
	}
	m := Message{Raw: b}
	if r := find(ms, "role"); r != nil {
		if m.Role, err = parseString("", b[r.v0:r.v1]); err != nil {
			return Message{}, BadRequest("messages[%d].role must be a string", k).WithParam("messages")
		}
	}
	if c := find(ms, "content"); c != nil {
		if m.Content, err = parseContent(b[c.v0:c.v1]); err != nil {
			return Message{}, BadRequest("messages[%d].content: %v", k, err).WithParam("messages")
		}
	}
	return m, nil
}

// ParseCompletion parses a /v1/completions body: ParseRequest, and the
// prompt must be present and not empty.
func ParseCompletion(body []byte) (*Request, error) {
	r, err := ParseRequest(body)
	if err != nil {
		return nil, err
	}
	if err := r.Prompt.Check(); err != nil {
		return nil, err
	}
	return r, nil
}

// Check requires a prompt that is present and not empty: no empty string,
// no empty list, no empty list of token ids inside a list.
func (p Prompt) Check() error {
	empty := BadRequest("prompt must not be empty").WithParam("prompt")
	switch p.Kind {
	case PromptNone:
		return BadRequest("prompt is required").WithParam("prompt")
	case PromptText, PromptTexts:
		if len(p.Texts) == 0 {
			return empty
		}
		for i, s := range p.Texts {
			if s == "" {
				return empty.withIndex(p.Kind == PromptTexts, i)
			}
		}
	case PromptTokens, PromptTokenLists:
		if len(p.Tokens) == 0 {
			return empty
		}
		for i, ids := range p.Tokens {
			if len(ids) == 0 {
				return empty.withIndex(p.Kind == PromptTokenLists, i)
			}
		}
	}
	return nil
}

func (e *Error) withIndex(list bool, i int) *Error {
	if list {
		e.Message = fmt.Sprintf("prompt[%d] must not be empty", i)
	}
	return e
}

// ParseChat parses a /v1/chat/completions body: ParseRequest, and messages
// must be a non-empty list of messages with a role.
func ParseChat(body []byte) (*Request, error) {
	r, err := ParseRequest(body)
	if err != nil {
		return nil, err
	}
	if err := CheckMessages(r.Messages); err != nil {
		return nil, err
	}
	return r, nil
}

// CheckMessages requires a non-empty list of messages, each with a role.
func CheckMessages(msgs []Message) error {
	if msgs == nil {
		return BadRequest("messages is required").WithParam("messages")
	}
	if len(msgs) == 0 {
		return BadRequest("messages must be a non-empty list").WithParam("messages")
	}
	for i, m := range msgs {
		if m.Role == "" {
			return BadRequest("messages[%d].role is required", i).WithParam("messages")
		}
	}
	return nil
}

// OpensConversation reports whether a chat request starts a conversation:
// no message is the assistant's yet, so the client's next turn, if any,
// will extend this prompt.
func OpensConversation(msgs []Message) bool {
	if len(msgs) == 0 {
		return false
	}
	for _, m := range msgs {
		if m.Role == "assistant" {
			return false
		}
	}
	return true
}

// OutputLimit is the request's bound on output tokens: for chat
// max_completion_tokens when given, else max_tokens; nil when neither is.
func (r *Request) OutputLimit(chat bool) *int64 {
	if chat && r.MaxCompletionTokens != nil {
		return r.MaxCompletionTokens
	}
	return r.MaxTokens
}

// Has reports whether the body has the top-level key (null included).
func (r *Request) Has(key string) bool { return find(r.members, key) != nil }

// Edit changes one top-level member of a body: Value nil deletes Key;
// otherwise Key is set to Value (raw JSON), in place when present and
// appended otherwise.
type Edit struct {
	Key   string
	Value json.RawMessage
}

// Rewrite returns a copy of Raw with edits applied; every other byte is
// kept as received. Values must be valid JSON (not checked). The Request
// itself is unchanged.
func (r *Request) Rewrite(edits ...Edit) []byte {
	out := make([]byte, 0, len(r.Raw)+64)
	pending := make([]bool, len(edits))
	for i := range edits {
		pending[i] = true
	}
	wrote := false
	emit := func(key string, val []byte) {
		if wrote {
			out = append(out, ',')
		}
		wrote = true
		k, _ := json.Marshal(key)
		out = append(append(append(out, k...), ':'), val...)
	}
	out = append(out, '{')
	for _, m := range r.members {
		val := r.Raw[m.v0:m.v1]
		keyTok := r.Raw[m.k0:skipString(r.Raw, m.k0)]
		keep := true
		for i, e := range edits {
			if e.Key != m.key {
				continue
			}
			pending[i] = false
			if keep = e.Value != nil; keep {
				val = e.Value
			}
		}
		if !keep {
			continue
		}
		if wrote {
			out = append(out, ',')
		}
		wrote = true
		out = append(append(append(out, keyTok...), ':'), val...)
	}
	for i, e := range edits {
		if !pending[i] {
			continue
		}
		// The last edit of a key wins.
		last := e
		for j := i + 1; j < len(edits); j++ {
			if edits[j].Key == e.Key {
				last, pending[j] = edits[j], false
			}
		}
		if last.Value != nil {
			emit(last.Key, last.Value)
		}
	}
	return append(out, '}')
}
