package tokens

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ardanlabs/jinja"
)

// ChatTemplate is a model's own Jinja chat template (tokenizer_config.json's
// chat_template), rendered the way transformers' apply_chat_template does:
// with trim_blocks and lstrip_blocks, the conversation as "messages",
// "add_generation_prompt", and the tokenizer's special tokens (bos_token,
// eos_token, ...) as variables. Safe for concurrent use.
type ChatTemplate struct {
	tmpl *jinja.Template
	vars map[string]jinja.Value // special tokens
}

// NewChatTemplate compiles a Jinja chat template. specials are the
// template's special-token variables (e.g. "bos_token": "<|begin_of_text|>").
func NewChatTemplate(src string, specials map[string]string) (*ChatTemplate, error) {
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("tokens: chat template: %w", err)
	}
	vars := make(map[string]jinja.Value, len(specials))
	for k, v := range specials {
		vars[k] = jinja.NewString(v)
	}
	return &ChatTemplate{tmpl: t, vars: vars}, nil
}

// Render renders a conversation. Message contents are passed as strings
// (text parts joined, as vLLM does for text-only models).
func (c *ChatTemplate) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Text()))
		list[i] = d
	}
	vars := make(map[string]jinja.Value, len(c.vars)+2)
	for k, v := range c.vars {
		vars[k] = v
	}
	vars["messages"] = jinja.NewList(list)
	vars["add_generation_prompt"] = jinja.NewBool(addGenerationPrompt)
	out, err := c.tmpl.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("tokens: render chat template: %w", err)
	}
	return out, nil
}

// specialTokenKeys are tokenizer_config.json's special-token entries that
// transformers passes to chat templates.
var specialTokenKeys = []string{"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}

// loadChatTemplate reads tokenizer_config.json (may be empty) and an
// optional chat_template.jinja text, which takes precedence.
func (s *LocalSource) loadChatTemplate(config []byte, jinjaSrc string) error {
	specials := map[string]string{}
	var tmpl string
	if len(config) > 0 {
		var cfg map[string]json.RawMessage
		if err := json.Unmarshal(config, &cfg); err != nil {
			return fmt.Errorf("tokens: parse tokenizer_config.json: %w", err)
		}
		for _, k := range specialTokenKeys {
			if v, ok := specialToken(cfg[k]); ok {
				specials[k] = v
			}
		}
		if raw := cfg["chat_template"]; len(raw) > 0 && string(raw) != "null" {
			t, err := configTemplate(raw)
			if err != nil {
				return err
			}
			tmpl = t
		}
	}
	if jinjaSrc != "" {
		tmpl = jinjaSrc
	}
	if tmpl == "" {
		return nil
	}
	ct, err := NewChatTemplate(tmpl, specials)
	if err != nil {
		return err
	}
	s.chat = ct
	return nil
}

// specialToken reads a special-token entry: a string or {"content": ...}.
func specialToken(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s, true
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Content != "" {
		return o.Content, true
	}
	return "", false
}

// configTemplate reads chat_template: a string, or a list of named
// templates of which "default" is the one for plain chats.
func configTemplate(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", errors.New("tokens: tokenizer_config.json chat_template is neither a string nor a list of named templates")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", errors.New(`tokens: tokenizer_config.json chat_template has no template named "default"`)
}
