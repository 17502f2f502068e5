package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ardanlabs/jinja"

	"github.com/kvgate/kvgate/internal/openai"
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
	t, err := jinja.Compile(useTojson(src))
	if err != nil {
		return nil, fmt.Errorf("tokens: chat template: %w", err)
	}
	vars := make(map[string]jinja.Value, len(specials))
	for k, v := range specials {
		vars[k] = jinja.NewString(v)
	}
	return &ChatTemplate{tmpl: t, vars: vars}, nil
}

// Render renders a conversation (RenderChat without tools or kwargs).
func (c *ChatTemplate) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	mode := ChatNoPrompt
	if addGenerationPrompt {
		mode = ChatGenerate
	}
	return c.RenderChat(msgs, ChatOptions{Mode: mode})
}

// RenderChat renders a conversation as vLLM has transformers render it:
// each message the object the client sent (ObjectMessage: its
// tool_calls, tool_call_id, name; else its role) with its content as a
// string (text parts joined, as vLLM does for text-only models), the
// request's tools as vLLM dumps them (toolsValue), its
// chat_template_kwargs as variables, and add_generation_prompt for
// ChatGenerate.
func (c *ChatTemplate) RenderChat(msgs []Message, opts ChatOptions) (string, error) {
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Text()))
		// The object's other members (tool_calls, tool_call_id, name),
		// decoded; its content, the bulk, is not decoded again.
		var reasoning, reasoningContent *jinja.Value
		eachOtherMember(m.object, func(key string, v []byte) {
			if val, err := jsonValue(v); err == nil {
				d.AsDict().Set(key, val)
				switch key {
				case "reasoning":
					reasoning = &val
				case "reasoning_content":
					reasoningContent = &val
				}
			}
		})
		if m.Role == "assistant" {
			setReasoning(d, reasoning, reasoningContent)
			parseToolArguments(d)
		}
		list[i] = d
	}
	vars := make(map[string]jinja.Value, len(c.vars)+4)
	for k, v := range c.vars {
		vars[k] = v
	}
	// Kwargs that are not an object and tools that are not a list of
	// functions are left out: the engine refuses such a request itself,
	// which the gateway still routes (on this rendering).
	if len(opts.Kwargs) > 0 {
		if kw, err := jsonValue(opts.Kwargs); err == nil && kw.IsDict() {
			for _, k := range kw.AsDict().OrderedKeys() {
				v, _ := kw.AsDict().Get(k)
				vars[k] = v
			}
		}
	}
	if len(opts.Tools) > 0 {
		if tools, err := toolsValue(opts.Tools); err == nil {
			vars["tools"] = tools
		}
	}
	vars["messages"] = jinja.NewList(list)
	vars["add_generation_prompt"] = jinja.NewBool(opts.Mode == ChatGenerate)
	vars[tojsonFilterVar] = pyTojsonFilter // after the kwargs: none replaces it
	out, err := c.tmpl.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errRender, err)
	}
	return out, nil
}

// pyTojsonFilter is the tojson filter the templates get (tojson.go).
var pyTojsonFilter = jinja.NewCallable("tojson", pyTojson)

// parseToolArguments makes each tool call's function arguments of the
// assistant message d an object, as vLLM does before the template runs
// (chat_utils._postprocess_messages: a JSON string parsed, none or ""
// an empty object); a string that is not JSON is left as it is. Templates
// write them with tojson: kept a string, the client's JSON was quoted
// where vLLM's was an object (Qwen 2.5, Llama 3.2), and every later turn
// of a tool conversation was keyed apart from the engine's blocks.
func parseToolArguments(d jinja.Value) {
	calls, ok := d.AsDict().Get("tool_calls")
	if !ok || !calls.IsList() {
		return
	}
	for _, c := range calls.AsList().Items {
		if !c.IsDict() {
			continue
		}
		fn, ok := c.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			continue
		}
		args, ok := fn.AsDict().Get("arguments")
		switch {
		case !ok || args.IsNone() || args.IsString() && args.AsString() == "":
			fn.AsDict().Set("arguments", jinja.NewDict())
		case args.IsString():
			if v, err := jsonValue([]byte(args.AsString())); err == nil {
				fn.AsDict().Set("arguments", v)
			}
		}
	}
}

// setReasoning gives an assistant message's reasoning to the template
// under both its names, as vLLM does (chat_utils: "reasoning" and, for
// templates that read it, as Qwen's do, "reasoning_content"): the
// message's reasoning, else its reasoning_content (vLLM's chat API reads
// the older name as the newer); null or absent counts as none.
func setReasoning(d jinja.Value, reasoning, reasoningContent *jinja.Value) {
	r := reasoning
	if r == nil || r.IsNone() {
		r = reasoningContent
	}
	if r == nil || r.IsNone() {
		return
	}
	d.AsDict().Set("reasoning", *r)
	d.AsDict().Set("reasoning_content", *r)
}

// errRender is a chat template's refusal of a conversation (it raised, or
// failed on its values).
var errRender = errors.New("tokens: render chat template")

// eachOtherMember calls f with each top-level member of the JSON object
// obj but its role and content, in order, without decoding their values
// (openai.Members).
func eachOtherMember(obj []byte, f func(key string, v []byte)) {
	openai.Members(obj, func(key string, v []byte) {
		if key != "role" && key != "content" {
			f(key, v)
		}
	})
}

// toolsValue is a request's tools as vLLM gives them to the template
// (its pydantic models dumped): each tool's type (default "function")
// and function first, the function's name, description and parameters
// (null when absent) first, then any other members in the order sent.
func toolsValue(raw json.RawMessage) (jinja.Value, error) {
	v, err := jsonValue(raw)
	if err != nil || !v.IsList() {
		return jinja.Value{}, fmt.Errorf("tokens: tools: not a JSON list")
	}
	items := v.AsList().Items
	out := make([]jinja.Value, len(items))
	for i, t := range items {
		if !t.IsDict() {
			return jinja.Value{}, fmt.Errorf("tokens: tools[%d]: not an object", i)
		}
		fn, _ := t.AsDict().Get("function")
		if !fn.IsDict() {
			return jinja.Value{}, fmt.Errorf("tokens: tools[%d].function: not an object", i)
		}
		f := ordered(fn, []string{"name", "description", "parameters"}, nil)
		out[i] = ordered(t, []string{"type", "function"}, map[string]jinja.Value{"type": jinja.NewString("function"), "function": f})
	}
	return jinja.NewList(out), nil
}

// ordered is the dict d with the keys first, in their order (null when
// d lacks one and over has none), then its other keys; over's values
// replace d's.
func ordered(d jinja.Value, first []string, over map[string]jinja.Value) jinja.Value {
	out := jinja.NewDict()
	for _, k := range first {
		v, ok := d.AsDict().Get(k)
		if o, has := over[k]; has && (k != "type" || !ok) {
			v, ok = o, true
		}
		if !ok {
			v = jinja.None()
		}
		out.AsDict().Set(k, v)
	}
	for _, k := range d.AsDict().OrderedKeys() {
		if _, done := out.AsDict().Get(k); !done {
			v, _ := d.AsDict().Get(k)
			out.AsDict().Set(k, v)
		}
	}
	return out
}

// jsonValue decodes JSON into template values, objects keeping their
// members' order (as Python's dicts do; jinja.FromGoValue sorts them),
// integers kept integers.
func jsonValue(raw []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return decodeValue(dec, 0)
}

// maxJSONDepth bounds the nesting jsonValue follows.
const maxJSONDepth = 256

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Value{}, errors.New("tokens: JSON nested too deep")
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, v)
			}
			_, err = dec.Token()
			return jinja.NewList(items), err
		}
		d := jinja.NewDict()
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return jinja.Value{}, err
			}
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return jinja.Value{}, err
			}
			d.AsDict().Set(k.(string), v)
		}
		_, err = dec.Token()
		return d, err
	case nil:
		return jinja.None(), nil
	}
	return jinja.FromGoValue(tok), nil
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
