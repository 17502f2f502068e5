package tokens

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Message is one chat message (OpenAI shape). Content may be a string or a
// list of parts; only text parts are rendered.
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// text, when set (TextMessage), is the content as plain text: no
	// JSON is built or parsed for it until the message is marshalled.
	text *string
	// object, when set (ObjectMessage), is the message object as the
	// client sent it, whose other members (tool_calls, tool_call_id,
	// name) a model's own template renders too.
	object json.RawMessage
}

// MarshalJSON writes the message in OpenAI's shape: as the client sent
// it, when it was (ObjectMessage).
func (m Message) MarshalJSON() ([]byte, error) {
	if m.object != nil {
		return m.object, nil
	}
	if m.text != nil {
		return json.Marshal(struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}{m.Role, *m.text})
	}
	type plain struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	c := m.Content
	if len(c) == 0 {
		c = json.RawMessage("null")
	}
	return json.Marshal(plain{m.Role, c})
}

// Text returns the message's text: the string content, or its text parts
// joined with newlines.
func (m Message) Text() string {
	if m.text != nil {
		return *m.text
	}
	c := m.Content
	if len(c) == 0 || string(c) == "null" {
		return ""
	}
	var s string
	if err := json.Unmarshal(c, &s); err == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(c, &parts); err == nil {
		var b strings.Builder
		for i, p := range parts {
			if p.Type != "" && p.Type != "text" {
				continue
			}
			if i > 0 && b.Len() > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return string(c)
}

// TextMessage builds a Message with string content.
func TextMessage(role, text string) Message {
	return Message{Role: role, text: &text}
}

// ObjectMessage builds a Message with string content text (its text
// parts) from object, the message as the client sent it (valid JSON),
// which an engine's or the model's own template is given whole.
func ObjectMessage(role, text string, object json.RawMessage) Message {
	return Message{Role: role, text: &text, object: object}
}

// Template renders a conversation to prompt text as a sequence of segments:
// Prefix (once), one segment per message, then the generation prompt. The
// prompt is their concatenation; segments are what the tokenizer caches, so
// every message is tokenized once per conversation however long it grows.
// Templates put special tokens at message boundaries, so tokenizing
// segments separately gives the same ids as tokenizing the whole prompt.
type Template struct {
	Name string
	// Prefix opens the prompt (e.g. a BOS token), may be empty.
	Prefix string
	// Message is a format with %[1]s = role and %[2]s = text.
	Message string
	// Generation opens the assistant's turn.
	Generation string
}

// Built-in templates.
var builtinTemplates = map[string]Template{
	"chatml": {Name: "chatml", Message: "<|im_start|>%[1]s\n%[2]s<|im_end|>\n", Generation: "<|im_start|>assistant\n"},
	"llama3": {Name: "llama3", Prefix: "<|begin_of_text|>", Message: "<|start_header_id|>%[1]s<|end_header_id|>\n\n%[2]s<|eot_id|>",
		Generation: "<|start_header_id|>assistant<|end_header_id|>\n\n"},
	"plain": {Name: "plain", Message: "%[1]s: %[2]s\n\n", Generation: "assistant: "},
}

// DefaultTemplate is used when a model names none.
const DefaultTemplate = "chatml"

// LookupTemplate returns a built-in template by name ("" = default).
func LookupTemplate(name string) (Template, error) {
	if name == "" {
		name = DefaultTemplate
	}
	t, ok := builtinTemplates[strings.ToLower(name)]
	if !ok {
		names := make([]string, 0, len(builtinTemplates))
		for n := range builtinTemplates {
			names = append(names, n)
		}
		sort.Strings(names)
		return Template{}, fmt.Errorf("tokens: unknown chat template %q (have %s)", name, strings.Join(names, ", "))
	}
	return t, nil
}

// ChatOptions is what, besides its messages, a conversation's prompt is
// rendered from: how it ends, and the request's tools and
// chat_template_kwargs as it sent them (nil: none), which a model's own
// template renders too (tools, typically into its system part). The
// built-in templates (Template) render neither.
type ChatOptions struct {
	Mode   ChatMode
	Tools  json.RawMessage
	Kwargs json.RawMessage
	// Alternative, when set, gives another rendering of the same request
	// to try when the engine or the model's own template refuses this
	// one (a Messages request's system messages folded instead of kept in
	// place, as vLLM folds them for a template that refuses them); nil
	// from it: none.
	Alternative func() []Message
}

// ChatMode is how a conversation's prompt ends: vLLM's chat request flags
// add_generation_prompt and continue_final_message.
type ChatMode uint8

const (
	// ChatGenerate opens the assistant's turn (add_generation_prompt,
	// the chat API's default).
	ChatGenerate ChatMode = iota
	// ChatNoPrompt ends with the last message (add_generation_prompt
	// false).
	ChatNoPrompt
	// ChatContinue leaves the final message open for the model to go on
	// with (continue_final_message): the prompt ends with its text.
	ChatContinue
)

// Segments renders msgs to segments (see Template), the assistant's turn
// opened.
func (t Template) Segments(msgs []Message) []string { return t.SegmentsAs(msgs, ChatGenerate) }

// SegmentsAs renders msgs to segments, ending as mode says.
func (t Template) SegmentsAs(msgs []Message, mode ChatMode) []string {
	segs := make([]string, 0, len(msgs)+2)
	if t.Prefix != "" {
		segs = append(segs, t.Prefix)
	}
	for _, m := range msgs {
		segs = append(segs, fmt.Sprintf(t.Message, m.Role, m.Text()))
	}
	switch {
	case mode == ChatContinue && len(msgs) > 0:
		i := len(segs) - 1
		segs[i] = ContinueCut(segs[i], msgs[len(msgs)-1].Text())
	case mode == ChatGenerate && t.Generation != "":
		segs = append(segs, t.Generation)
	}
	return segs
}

// ContinueCut is rendered cut after the last occurrence of the final
// message's text, as transformers' apply_chat_template does for
// continue_final_message (and so vLLM): the template's end of that
// message goes. An empty text occurs at the end, so nothing is cut (as
// there); a text the template changed is tried without its surrounding
// space, then nothing is cut.
func ContinueCut(rendered, final string) string {
	for _, f := range []string{final, strings.TrimSpace(final)} {
		if i := strings.LastIndex(rendered, f); i >= 0 {
			return rendered[:i+len(f)]
		}
	}
	return rendered
}

// Render returns the whole prompt text.
func (t Template) Render(msgs []Message) string {
	return strings.Join(t.Segments(msgs), "")
}
