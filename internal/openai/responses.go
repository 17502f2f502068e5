package openai

import (
	"encoding/json"
	"fmt"
)

// The Responses API (POST /v1/responses) is, to an engine without a
// response store, a chat request in another envelope: vLLM renders its
// instructions and input through the model's chat template as it renders
// a chat request's messages. ParseResponses reads it so.

// maxResponsesItems bounds the input items read (a list longer than any
// conversation a context window holds).
const maxResponsesItems = 1 << 16

// ParseResponses parses a /v1/responses body as the chat request it
// amounts to: instructions as a system message, then the input (a string:
// one user message; a list: its messages, their text parts as text, and
// function calls and their outputs as the assistant's and the tool's
// text, which is how kvgate counts them: their exact rendering is the
// model's template's); max_output_tokens as MaxTokens; model, stream,
// previous_response_id, cache_salt and priority. Raw is the body.
func ParseResponses(body []byte) (*Request, error) {
	r, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	var input []Message
	for _, m := range r.members {
		v := body[m.v0:m.v1]
		switch m.key {
		case "model", "stream", "cache_salt", "priority":
			err = r.setField(m.key, v)
		case "max_output_tokens":
			r.MaxTokens, err = parseInt(m.key, v)
		case "previous_response_id":
			if !isNull(v) {
				r.PreviousResponseID, err = parseString(m.key, v)
			}
		case "store":
			if !isNull(v) {
				var b bool
				b, err = parseBool(m.key, v)
				r.Store = &b
			}
		case "instructions":
			if !isNull(v) {
				r.Instructions, err = parseString(m.key, v)
			}
		case "input":
			input, err = parseResponsesInput(v)
		}
		if err != nil {
			return nil, err
		}
	}
	if input == nil {
		return nil, BadRequest("input is required").WithParam("input")
	}
	if r.Instructions != "" {
		r.Messages = append(r.Messages, Message{Role: "system", Content: Content{String: r.Instructions}})
	}
	r.Messages = append(r.Messages, input...)
	if len(r.Messages) == 0 {
		return nil, BadRequest("input must not be empty").WithParam("input")
	}
	return r, nil
}

// responsesItem is one input item as kvgate reads it.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// parseResponsesInput reads input: a string, or a list of items.
func parseResponsesInput(v []byte) ([]Message, error) {
	switch {
	case isNull(v):
		return nil, nil
	case v[0] == '"':
		s, err := unquote(v)
		if err != nil {
			return nil, BadRequest("input: %v", err).WithParam("input")
		}
		return []Message{{Role: "user", Content: Content{String: s}}}, nil
	case v[0] != '[':
		return nil, BadRequest("input must be a string or a list of input items").WithParam("input")
	}
	msgs := []Message{}
	var err error
	eachElement(v, func(el []byte) {
		if err != nil {
			return
		}
		if len(msgs) >= maxResponsesItems {
			err = BadRequest("input has more than %d items", maxResponsesItems).WithParam("input")
			return
		}
		var m *Message
		if m, err = responsesMessage(el, len(msgs)); err == nil && m != nil {
			msgs = append(msgs, *m)
		}
	})
	return msgs, err
}

// responsesMessage is input item k as a chat message (nil: one that adds
// no text, a reasoning item's, say).
func responsesMessage(el []byte, k int) (*Message, error) {
	var it responsesItem
	if el[0] != '{' || json.Unmarshal(el, &it) != nil {
		return nil, BadRequest("input[%d] must be an input item object", k).WithParam("input")
	}
	switch {
	case it.Type == "message" || it.Type == "" && it.Role != "":
		if it.Role == "" {
			return nil, BadRequest("input[%d].role is required", k).WithParam("input")
		}
		c, err := parseContent(it.Content)
		if len(it.Content) == 0 || err != nil {
			return nil, BadRequest("input[%d].content must be a string or a list of content parts", k).WithParam("input")
		}
		for i := range c.Parts { // input_text, output_text: text
			if t := c.Parts[i].Type; t == "input_text" || t == "output_text" {
				c.Parts[i].Type = "text"
			}
		}
		return &Message{Role: it.Role, Content: c}, nil
	case it.Type == "function_call":
		return &Message{Role: "assistant", Content: Content{String: fmt.Sprintf("%s(%s)", it.Name, it.Arguments)}}, nil
	case it.Type == "function_call_output":
		out := string(it.Output)
		var s string
		if json.Unmarshal(it.Output, &s) == nil {
			out = s
		}
		return &Message{Role: "tool", Content: Content{String: out}}, nil
	case it.Type == "":
		return nil, BadRequest("input[%d] has neither a type nor a role", k).WithParam("input")
	}
	return nil, nil // reasoning and the rest: no text the prompt counts
}
