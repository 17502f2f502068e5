package openai

import (
	"bytes"
	"encoding/json"
	"slices"
)

// A Responses request's input items become chat messages as vLLM makes
// them (its construct_chat_messages_with_tool_call, read in vLLM's
// public source; the item types pydantic gives each item, against
// openai-python's types, checked here with pydantic 2.13): an item that
// continues the assistant's turn is merged into the message before it
// when that is the assistant's and lacks what the item brings — a
// function call is added to its tool_calls, a reasoning item sets its
// reasoning, an assistant message its content — so a reasoning item, the
// function calls after it and a tool's output become one assistant
// message with reasoning and tool calls, then a tool message, which is
// what the model's template renders.

// convMessage is one converted message: its role, and its members in
// the order vLLM sets them.
type convMessage struct {
	role      string
	content   Content
	reasoning string
	calls     []messagesToolCall
	callID    json.RawMessage // a tool message's tool_call_id, as sent (null when absent)
	keys      []string        // members after role, in the order set
}

func (m *convMessage) set(key string) { m.keys = append(m.keys, key) }

// has reports whether member key is set (of at most four).
func (m *convMessage) has(key string) bool { return slices.Contains(m.keys, key) }

// message is m as a Message, its object (Raw) as vLLM builds it.
func (m *convMessage) message() Message {
	raw := []byte(`{"role":`)
	raw, _ = appendJSON(raw, m.role)
	for _, k := range m.keys {
		raw = append(raw, ',', '"')
		raw = append(raw, k...)
		raw = append(raw, '"', ':')
		switch k {
		case "content":
			raw, _ = appendJSON(raw, m.content)
		case "reasoning":
			raw, _ = appendJSON(raw, m.reasoning)
		case "tool_calls":
			raw, _ = appendJSON(raw, m.calls)
		case "tool_call_id":
			raw = append(raw, m.callID...)
		}
	}
	return Message{Role: m.role, Content: m.content, Raw: append(raw, '}')}
}

// responsesConversion converts input items one at a time.
type responsesConversion struct {
	out []convMessage
}

// messages is the conversion's result.
func (c *responsesConversion) messages() []Message {
	msgs := make([]Message, len(c.out))
	for i := range c.out {
		msgs[i] = c.out[i].message()
	}
	return msgs
}

// turn is the assistant message an item bringing member key (content,
// reasoning or tool_calls) goes into, key set: the last message when it
// is the assistant's and lacks key (tool_calls, which calls add to, it
// may have), else a new assistant message.
func (c *responsesConversion) turn(key string) *convMessage {
	n := len(c.out)
	if n == 0 || c.out[n-1].role != "assistant" || c.out[n-1].has(key) && key != "tool_calls" {
		c.out = append(c.out, convMessage{role: "assistant"})
		n++
	}
	p := &c.out[n-1]
	if !p.has(key) {
		p.set(key)
	}
	return p
}

// responsesItemHead is what every input item is read for first.
type responsesItemHead struct {
	Type   string `json:"type"`
	Role   string `json:"role"`
	Status string `json:"status"`
}

// add converts input item k (el). It reports whether the item, were it
// the last, leaves the final message open (vLLM's
// should_continue_final_message: a message or reasoning item in progress
// or incomplete).
func (c *responsesConversion) add(el []byte, k int) (bool, error) {
	var h responsesItemHead
	if el[0] != '{' || json.Unmarshal(el, &h) != nil {
		return false, itemError(k, "must be an input item object")
	}
	var err error
	switch {
	case h.Type == "message" || h.Type == "" && h.Role != "":
		err = c.addMessage(el, h.Role, k)
	case h.Type == "function_call":
		err = c.addCall(el, k)
	case h.Type == "reasoning":
		err = c.addReasoning(el, k)
	case h.Type == "function_call_output":
		err = c.addOutput(el, k)
	case h.Type == "":
		err = itemError(k, "has neither a type nor a role")
	}
	// Other items (item references, built-in tools' calls) add no
	// message: vLLM has none for them either.
	open := (h.Type == "message" || h.Type == "" && h.Role != "" || h.Type == "reasoning") &&
		(h.Status == "in_progress" || h.Status == "incomplete")
	return open, err
}

func itemError(k int, format string, args ...any) error {
	return BadRequest("input[%d] "+format, append([]any{k}, args...)...).WithParam("input")
}

// addMessage converts a message item: the assistant's becomes (or fills
// in) an assistant message with its first part's text, as vLLM takes
// it; another role's is kept, its input_text and output_text parts as
// text parts.
func (c *responsesConversion) addMessage(el []byte, role string, k int) error {
	var m struct {
		Content json.RawMessage `json:"content"`
	}
	_ = json.Unmarshal(el, &m) // el is an object; content is read raw
	if role == "" {
		return itemError(k, ".role is required")
	}
	content, err := parseContent(m.Content)
	if len(m.Content) == 0 || isNull(m.Content) || err != nil {
		return itemError(k, ".content must be a string or a list of content parts")
	}
	for i := range content.Parts {
		if t := content.Parts[i].Type; t == "input_text" || t == "output_text" {
			content.Parts[i].Type = "text"
		}
	}
	if role != "assistant" {
		msg := convMessage{role: role, content: content}
		msg.set("content")
		c.out = append(c.out, msg)
		return nil
	}
	if content.Parts != nil {
		if len(content.Parts) == 0 { // vLLM keeps such an item as sent
			msg := convMessage{role: role, content: content}
			msg.set("content")
			c.out = append(c.out, msg)
			return nil
		}
		content = Content{String: content.Parts[0].Text}
	}
	c.turn("content").content = content
	return nil
}

// addCall converts a function call: a tool call (a namespaced tool's
// name flattened as vLLM flattens it, namespace__name) of the assistant
// message before it, or of a new one.
func (c *responsesConversion) addCall(el []byte, k int) error {
	var f struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		Arguments string `json:"arguments"`
		CallID    string `json:"call_id"`
	}
	if err := json.Unmarshal(el, &f); err != nil {
		return itemError(k, "must be a function call with a name, arguments and a call_id as strings")
	}
	call := messagesToolCall{ID: f.CallID, Type: "function"}
	call.Function.Name = f.Name
	if f.Namespace != "" {
		call.Function.Name = f.Namespace + "__" + f.Name
	}
	call.Function.Arguments = f.Arguments
	p := c.turn("tool_calls")
	p.calls = append(p.calls, call)
	return nil
}

// addReasoning converts a reasoning item: its first content part's text,
// else its first summary's ("" when it has neither), as the reasoning of
// the assistant message before it when that has none, else of a new one.
func (c *responsesConversion) addReasoning(el []byte, k int) error {
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Summary []struct {
			Text string `json:"text"`
		} `json:"summary"`
	}
	if err := json.Unmarshal(el, &r); err != nil {
		return itemError(k, "must be a reasoning item whose content and summary are lists of texts")
	}
	var text string
	switch {
	case len(r.Content) > 0:
		text = r.Content[0].Text
	case len(r.Summary) > 0:
		text = r.Summary[0].Text
	}
	c.turn("reasoning").reasoning = text
	return nil
}

// addOutput converts a function call's output: a tool message (a string
// output its content; a list of parts, its parts).
func (c *responsesConversion) addOutput(el []byte, k int) error {
	var o struct {
		CallID json.RawMessage `json:"call_id"`
		Output json.RawMessage `json:"output"`
	}
	_ = json.Unmarshal(el, &o) // el is an object; both are read raw
	content, err := parseContent(o.Output)
	if err != nil {
		return itemError(k, ".output must be a string or a list of content parts")
	}
	for i := range content.Parts {
		if content.Parts[i].Type == "input_text" {
			content.Parts[i].Type = "text"
		}
	}
	id := o.CallID
	if len(id) == 0 {
		id = json.RawMessage("null")
	} else if id[0] != '"' && !isNull(id) {
		return itemError(k, ".call_id must be a string")
	}
	msg := convMessage{role: "tool", content: content, callID: id}
	msg.set("content")
	msg.set("tool_call_id")
	c.out = append(c.out, msg)
	return nil
}

// The function tools' members as openai-python's types (2026-08) dump
// them after the three FunctionDefinition declares (name, description,
// parameters), which vLLM's conversion to a chat tool puts first: a
// function tool's, and a namespace's function's (another class, another
// order).
var (
	functionToolExtras   = []string{"strict", "allowed_callers", "defer_loading", "output_schema"}
	namespacedToolExtras = []string{"allowed_callers", "defer_loading", "output_schema", "strict"}
)

// responsesTools converts a Responses request's tools to the chat API's
// as vLLM does for the chat template (construct_tool_dicts): each
// function tool, and each function of a namespace tool (named
// namespace__name), as {"type": "function", "function": {...}} with the
// function's name, description and parameters first, then the members
// openai-python's model dumps (null when not sent), then any others sent,
// in their order. Other tools (built-in ones, custom tools) are not given
// to the template. nil when none is left.
func responsesTools(v []byte) (json.RawMessage, error) {
	if isNull(v) {
		return nil, nil
	}
	if v[0] != '[' {
		return nil, BadRequest("tools must be a list of tools").WithParam("tools")
	}
	var out bytes.Buffer
	n := 0
	var err error
	k := 0
	eachElement(v, func(el []byte) {
		if err != nil {
			return
		}
		if k >= maxResponsesItems {
			err = BadRequest("tools has more than %d tools", maxResponsesItems).WithParam("tools")
			return
		}
		if el[0] != '{' {
			err = BadRequest("tools[%d] must be a tool object", k).WithParam("tools")
			return
		}
		k++
		tool := membersOf(el)
		switch string(tool.vals["type"]) {
		case `"function"`:
			n++
			writeChatTool(&out, n, tool, "", functionToolExtras)
		case `"namespace"`:
			ns, _ := unquote(tool.vals["name"])
			eachElement(tool.vals["tools"], func(sub []byte) {
				if f := membersOf(sub); string(f.vals["type"]) == `"function"` {
					n++
					writeChatTool(&out, n, f, ns, namespacedToolExtras)
				}
			})
		}
	})
	if err != nil || n == 0 {
		return nil, err
	}
	out.WriteByte(']')
	return out.Bytes(), nil
}

// keyedMembers is a JSON object's members: raw values by key, and the
// keys in order.
type keyedMembers struct {
	vals map[string][]byte
	keys []string
}

// membersOf reads obj's members; a repeated key keeps its last value, as
// Python's json does, at its first place.
func membersOf(obj []byte) keyedMembers {
	m := keyedMembers{vals: map[string][]byte{}}
	Members(obj, func(key string, v []byte) {
		if _, seen := m.vals[key]; !seen {
			m.keys = append(m.keys, key)
		}
		m.vals[key] = v
	})
	return m
}

// writeChatTool writes function tool f as a chat tool (the n-th: the
// list's opening or a comma before it), named ns__name when ns is set.
func writeChatTool(out *bytes.Buffer, n int, f keyedMembers, ns string, extras []string) {
	if n == 1 {
		out.WriteByte('[')
	} else {
		out.WriteByte(',')
	}
	out.WriteString(`{"type":"function","function":{`)
	first := true
	member := func(key string, v []byte) {
		if !first {
			out.WriteByte(',')
		}
		first = false
		k, _ := json.Marshal(key)
		out.Write(k)
		out.WriteByte(':')
		if v == nil || json.Compact(out, v) != nil {
			out.WriteString("null")
		}
	}
	name := f.vals["name"]
	if ns != "" {
		s, _ := unquote(name)
		name, _ = json.Marshal(ns + "__" + s)
	}
	member("name", name)
	member("description", f.vals["description"])
	member("parameters", f.vals["parameters"])
	done := map[string]bool{"type": true, "name": true, "description": true, "parameters": true}
	for _, k := range extras {
		member(k, f.vals[k])
		done[k] = true
	}
	for _, k := range f.keys {
		if !done[k] {
			member(k, f.vals[k])
		}
	}
	out.WriteString(`}}`)
}

// responsesKwargs is the chat_template_kwargs vLLM derives from a
// Responses request's reasoning (ResponsesRequest.build_chat_params):
// nil without an effort.
func responsesKwargs(v []byte) (json.RawMessage, error) {
	if isNull(v) {
		return nil, nil
	}
	var r struct {
		Effort  *string `json:"effort"`
		Enabled *bool   `json:"enabled"`
	}
	if v[0] != '{' || json.Unmarshal(v, &r) != nil {
		return nil, BadRequest("reasoning must be an object").WithParam("reasoning")
	}
	effort := ""
	switch {
	case r.Enabled != nil && !*r.Enabled:
		effort = "none"
	case r.Effort != nil && *r.Effort == "minimal":
		effort = "low"
	case r.Effort != nil && (*r.Effort == "none" || *r.Effort == "low" || *r.Effort == "medium" || *r.Effort == "high"):
		effort = *r.Effort
	case r.Enabled != nil && *r.Enabled:
		effort = "medium"
	}
	switch effort {
	case "none":
		return json.RawMessage(`{"enable_thinking":false,"force_nonempty_content":true,"reasoning_effort":"none"}`), nil
	case "low":
		return json.RawMessage(`{"enable_thinking":true,"low_effort":true,"reasoning_effort":"low"}`), nil
	case "medium", "high":
		return json.RawMessage(`{"enable_thinking":true,"reasoning_effort":"` + effort + `"}`), nil
	}
	return nil, nil
}
