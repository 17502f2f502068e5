package openai

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Claude Code sends system messages inside messages (a reminder after a
// tool result, a nudge now and then): a new one almost every turn. Where
// the engine puts them decides whether a conversation's next turn extends
// its last prompt. vLLM's Messages API has placed them three ways:
// hoisted into the leading system prompt (its first support, June 2026:
// a new one changes the prompt's head, so nothing after it is cached),
// then kept in place, and now as its --anthropic-inline-system says
// (auto, its default, probes the model's template once: "preserve" when
// the template renders a system message mid-conversation as a turn of its
// own, as Llama 3's does, "fold" when it refuses or moves it, as Qwen 3.5's
// and DeepSeek V3.2's and V4's do). The gateway must place them as its
// engines do for its keys to be theirs.

// InlineSystem is where a Messages request's system messages inside
// messages go.
type InlineSystem string

const (
	// InlinePreserve keeps them in place as system messages (the leading
	// ones join the system prompt; without any system prompt, as fold).
	InlinePreserve InlineSystem = "preserve"
	// InlineFold merges their text into a neighbouring user message (or
	// the last tool result), or a user message of their own.
	InlineFold InlineSystem = "fold"
	// InlineHoist joins every one into the system prompt, as vLLM did
	// first.
	InlineHoist InlineSystem = "hoist"
	// InlineAuto is preserve until the engine, or the model's template,
	// refuses a system message mid-conversation, then fold, as vLLM's
	// --anthropic-inline-system auto decides (the gateway's tokenizer
	// keeps the decision; a conversion here reads it as preserve).
	InlineAuto InlineSystem = "auto"
)

// ParseInlineSystem reads an InlineSystem ("" is auto).
func ParseInlineSystem(s string) (InlineSystem, error) {
	switch m := InlineSystem(s); m {
	case "":
		return InlineAuto, nil
	case InlineAuto, InlinePreserve, InlineFold, InlineHoist:
		return m, nil
	}
	return "", fmt.Errorf("inline system placement %q: want auto, preserve, fold or hoist", s)
}

// HasInlineSystem reports whether msgs, converted with the system
// messages inside messages kept in place, hold one (a system message
// after the first message).
func HasInlineSystem(msgs []Message) bool {
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Role == "system" {
			return true
		}
	}
	return false
}

// joinTexts joins the non-empty texts with blank lines, as vLLM joins
// system texts.
func joinTexts(texts ...string) string {
	var b strings.Builder
	for _, t := range texts {
		if t == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(t)
	}
	return b.String()
}

// systemText is a system message's text: a string (none when it is the
// billing header), or its text blocks but the billing header's.
func systemText(c messagesContentValue) string {
	if c.blocks == nil {
		if strings.HasPrefix(c.text, billingHeader) {
			return ""
		}
		return c.text
	}
	return blocksText(c.blocks)
}

// placeInline returns the system prompt and the messages, the system
// messages among msgs placed as mode says. top is the top-level system's
// text. Preserve and fold (vLLM's normalize_inline_system): the system
// messages that lead msgs join the prompt after top, blank lines
// between; one right after an assistant's tool_use waits until after the
// user message that answers it; then preserve keeps the rest in place
// (folding when there is no system prompt at all) and fold merges them
// (foldInline). Hoist: every system text joins top, without separators.
func placeInline(top string, msgs []anthropicMessage, mode InlineSystem) (string, []anthropicMessage) {
	if mode == InlineHoist {
		rest := make([]anthropicMessage, 0, len(msgs))
		var b strings.Builder
		b.WriteString(top)
		for _, m := range msgs {
			if m.role == "system" {
				b.WriteString(systemText(m.content))
			} else {
				rest = append(rest, m)
			}
		}
		return b.String(), rest
	}
	n := 0
	for n < len(msgs) && msgs[n].role == "system" {
		n++
	}
	var lead []string
	for _, m := range msgs[:n] {
		lead = append(lead, systemText(m.content))
	}
	leading := joinTexts(lead...)
	rest := afterToolResults(msgs[n:])
	prompt := joinTexts(top, leading)
	if (mode == InlinePreserve || mode == InlineAuto) && (top != "" || leading != "") {
		return prompt, rest
	}
	return prompt, foldInline(rest)
}

// afterToolResults moves each system message that follows an assistant's
// tool_use to after the user message that follows (which carries its
// results), or before the next assistant message, or to the end.
func afterToolResults(msgs []anthropicMessage) []anthropicMessage {
	out := make([]anthropicMessage, 0, len(msgs))
	var held []anthropicMessage
	awaiting := false
	for _, m := range msgs {
		if m.role == "system" {
			if awaiting {
				held = append(held, m)
			} else {
				out = append(out, m)
			}
			continue
		}
		if m.role == "assistant" {
			out, held = append(out, held...), held[:0]
		}
		out = append(out, m)
		if m.role == "user" {
			out, held = append(out, held...), held[:0]
		}
		awaiting = m.role == "assistant" && slices.ContainsFunc(m.content.blocks, func(b messagesBlock) bool { return b.Type == "tool_use" })
	}
	return append(out, held...)
}

// foldInline merges each system message's text into the conversation: a
// system message right after a user message is appended to it
// (appendToUser); one after an assistant's waits for the next message —
// prepended to it when it is the user's, a user message of its own before
// it when it is the assistant's, or at the end.
func foldInline(msgs []anthropicMessage) []anthropicMessage {
	out := make([]anthropicMessage, 0, len(msgs))
	var pending []string
	for _, m := range msgs {
		if m.role == "system" {
			text := systemText(m.content)
			switch {
			case text == "":
			case len(out) > 0 && out[len(out)-1].role == "user" && len(pending) == 0:
				out[len(out)-1] = appendToUser(out[len(out)-1], text)
			default:
				pending = append(pending, text)
			}
			continue
		}
		if len(pending) > 0 {
			text := joinTexts(pending...)
			pending = pending[:0]
			if m.role == "user" {
				m.content = addText(m.content, text, false)
			} else {
				out = append(out, anthropicMessage{role: "user", content: messagesContentValue{text: text}, param: m.param})
			}
		}
		out = append(out, m)
	}
	if len(pending) > 0 {
		out = append(out, anthropicMessage{role: "user", content: messagesContentValue{text: joinTexts(pending...)}, param: "messages"})
	}
	return out
}

// appendToUser appends text to a user message: to its last tool result
// when it holds nothing else (so no user turn follows its tool
// messages), else to its own text.
func appendToUser(m anthropicMessage, text string) anthropicMessage {
	blocks := m.content.blocks
	if len(blocks) > 0 && !slices.ContainsFunc(blocks, func(b messagesBlock) bool { return b.Type != "tool_result" }) {
		last := blocks[len(blocks)-1]
		c, _ := toolResultContent(last, m.param) // an unreadable one is refused when converted
		c = addText(c, text, true)
		last.folded = &c
		m.content.blocks = append(slices.Clone(blocks[:len(blocks)-1]), last)
		return m
	}
	m.content = addText(m.content, text, true)
	return m
}

// addText joins text onto one end of content: a string's, or the text
// block at that end (a new block when the block there is not text),
// blank lines between.
func addText(c messagesContentValue, text string, atEnd bool) messagesContentValue {
	if c.blocks == nil {
		if atEnd {
			return messagesContentValue{text: joinTexts(c.text, text)}
		}
		return messagesContentValue{text: joinTexts(text, c.text)}
	}
	blocks := slices.Clone(c.blocks)
	end := 0
	if atEnd {
		end = len(blocks) - 1
	}
	switch {
	case len(blocks) > 0 && blocks[end].Type == "text" && atEnd:
		blocks[end].Text = joinTexts(blocks[end].Text, text)
	case len(blocks) > 0 && blocks[end].Type == "text":
		blocks[end].Text = joinTexts(text, blocks[end].Text)
	case atEnd:
		blocks = append(blocks, messagesBlock{Type: "text", Text: text})
	default:
		blocks = slices.Insert(blocks, 0, messagesBlock{Type: "text", Text: text})
	}
	return messagesContentValue{blocks: blocks}
}

// messagesEffort is what of a Messages request sets the reasoning effort
// vLLM renders with: output_config's effort, and thinking's type
// ("disabled": none).
type messagesEffort struct {
	effort   string
	disabled bool
}

// read reads output_config or thinking (v).
func (e *messagesEffort) read(key string, v []byte) error {
	if isNull(v) {
		return nil
	}
	var m struct {
		Effort *string `json:"effort"`
		Type   *string `json:"type"`
	}
	if v[0] != '{' || json.Unmarshal(v, &m) != nil {
		return BadRequest("%s must be an object", key).WithParam(key)
	}
	switch {
	case key == "output_config" && m.Effort != nil:
		e.effort = *m.Effort
	case key == "thinking" && m.Type != nil:
		e.disabled = *m.Type == "disabled"
	}
	return nil
}

// kwargs is the request's chat_template_kwargs (sent) with what vLLM
// derives from the effort: reasoning_effort (thinking disabled: "none"),
// and enable_thinking (the effort is not none) unless sent.
func (e messagesEffort) kwargs(sent json.RawMessage) json.RawMessage {
	effort := e.effort
	if e.disabled {
		effort = "none"
	}
	if effort == "" {
		return sent
	}
	kw := membersOf(sent)
	out := []byte{'{'}
	for _, k := range kw.keys {
		if k == "reasoning_effort" {
			continue
		}
		out, _ = appendJSON(out, k)
		out = append(append(out, ':'), kw.vals[k]...)
		out = append(out, ',')
	}
	if _, ok := kw.vals["enable_thinking"]; !ok {
		out = append(out, `"enable_thinking":`...)
		out = append(out, fmt.Sprint(effort != "none")...)
		out = append(out, ',')
	}
	out = append(out, `"reasoning_effort":`...)
	out, _ = appendJSON(out, effort)
	return append(out, '}')
}
