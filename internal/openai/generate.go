package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// GenerateDefaultMaxNewTokens is SGLang's max_new_tokens when a /generate
// request gives none.
const GenerateDefaultMaxNewTokens = 128

// ParseGenerate parses a body of SGLang's native POST /generate: one JSON
// object with "text" (a string or a list of strings) or "input_ids" (token
// ids, or a list of lists of them) — exactly one of the two —,
// "sampling_params" (an object; its max_new_tokens and n are read into
// MaxTokens and N), "stream", and "lora_path" (the adapter's name, a
// string, read into Model; SGLang's /generate names no model). Other
// fields are the engine's and are forwarded untouched. Every error is a
// 400 *Error naming the field.
func ParseGenerate(body []byte) (*Request, error) {
	r, err := ParseRequest(body)
	if err != nil {
		return nil, err
	}
	// The OpenAI fields ParseRequest knows mean nothing to /generate:
	// only SGLang's are read.
	*r = Request{Raw: r.Raw, members: r.members, Stream: r.Stream}
	text, ids := find(r.members, "text"), find(r.members, "input_ids")
	if text != nil && isNull(body[text.v0:text.v1]) {
		text = nil
	}
	if ids != nil && isNull(body[ids.v0:ids.v1]) {
		ids = nil
	}
	switch {
	case text == nil && ids == nil && find(r.members, "input_embeds") != nil:
		return nil, BadRequest("input_embeds is not supported: kvgate routes by the prompt's tokens; send text or input_ids").WithParam("input_embeds")
	case text == nil && ids == nil:
		return nil, BadRequest("text or input_ids is required").WithParam("text")
	case text != nil && ids != nil:
		return nil, BadRequest("give text or input_ids, not both").WithParam("input_ids")
	case text != nil:
		v := body[text.v0:text.v1]
		if v[0] == '[' && len(bytes.TrimSpace(v[1:len(v)-1])) == 0 {
			return nil, BadRequest("text must not be empty").WithParam("text")
		}
		if v[0] != '"' && v[0] != '[' || v[0] == '[' && !listOfStrings(v) {
			return nil, BadRequest("text must be a string or a list of strings").WithParam("text")
		}
		if r.Prompt, err = parsePrompt(v); err != nil {
			return nil, BadRequest("text must be a string or a list of strings").WithParam("text")
		}
	default:
		v := body[ids.v0:ids.v1]
		if v[0] != '[' || listOfStrings(v) {
			return nil, BadRequest("input_ids must be a list of token ids or a list of lists of them").WithParam("input_ids")
		}
		if r.Prompt, err = parsePrompt(v); err != nil {
			// parsePrompt's message lists a prompt's shapes, strings among
			// them: input_ids takes token ids alone.
			if e, ok := err.(*Error); ok && strings.Contains(e.Message, promptShapes) {
				return nil, BadRequest("input_ids must be a list of token ids or a list of lists of them").WithParam("input_ids")
			}
			return nil, renamed(err, "prompt", "input_ids")
		}
	}
	if err := r.Prompt.Check(); err != nil {
		param := "text"
		if ids != nil {
			param = "input_ids"
		}
		return nil, renamed(err, "prompt", param)
	}
	if err := r.samplingParams(body); err != nil {
		return nil, err
	}
	if m := find(r.members, "lora_path"); m != nil && !isNull(body[m.v0:m.v1]) {
		if r.Model, err = loraPath(body[m.v0:m.v1]); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// samplingParams reads max_new_tokens and n of sampling_params: an
// object, or, for a batch, a list of them, one a prompt, as SGLang takes
// them (the largest of each is planned; an element without
// max_new_tokens has SGLang's default).
func (r *Request) samplingParams(body []byte) error {
	m := find(r.members, "sampling_params")
	if m == nil || isNull(body[m.v0:m.v1]) {
		return nil
	}
	v := body[m.v0:m.v1]
	switch v[0] {
	case '{':
		return r.samplingObject(v, "sampling_params")
	case '[':
		var list []json.RawMessage
		if json.Unmarshal(v, &list) != nil || len(list) == 0 {
			return BadRequest("sampling_params must be an object or a list of them").WithParam("sampling_params")
		}
		var most, n *int64
		for i, el := range list {
			var one Request
			if err := one.samplingObject(el, fmt.Sprintf("sampling_params[%d]", i)); err != nil {
				return err
			}
			if one.MaxTokens == nil {
				d := int64(GenerateDefaultMaxNewTokens)
				one.MaxTokens = &d
			}
			if most == nil || *one.MaxTokens > *most {
				most = one.MaxTokens
			}
			if one.N != nil && (n == nil || *one.N > *n) {
				n = one.N
			}
		}
		r.MaxTokens, r.N = most, n
		return nil
	}
	return BadRequest("sampling_params must be an object or a list of them").WithParam("sampling_params")
}

// samplingObject reads max_new_tokens and n of one sampling_params
// object, named name in errors.
func (r *Request) samplingObject(v []byte, name string) error {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || v[0] != '{' {
		return BadRequest("%s must be an object", name).WithParam(name)
	}
	ms, err := objectMembers(v, name)
	if err != nil {
		return err.(*Error).WithParam(name)
	}
	for _, f := range []struct {
		key string
		dst **int64
	}{{"max_new_tokens", &r.MaxTokens}, {"n", &r.N}} {
		if p := find(ms, f.key); p != nil {
			if *f.dst, err = parseInt(name+"."+f.key, v[p.v0:p.v1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// loraPath reads lora_path: an adapter's name, or a batch's list of them
// naming one adapter (a batch goes to one engine).
func loraPath(v []byte) (string, error) {
	refuse := BadRequest("lora_path must be an adapter's name, or a list naming one adapter (kvgate sends a batch to one engine)").WithParam("lora_path")
	if len(v) > 0 && v[0] == '[' {
		var names []string
		if json.Unmarshal(v, &names) != nil || len(names) == 0 {
			return "", refuse
		}
		for _, n := range names[1:] {
			if n != names[0] {
				return "", refuse
			}
		}
		if names[0] == "" {
			return "", refuse
		}
		return names[0], nil
	}
	name, err := parseString("lora_path", v)
	if err != nil || name == "" {
		return "", refuse
	}
	return name, nil
}

// listOfStrings reports whether the JSON list v starts with a string.
func listOfStrings(v []byte) bool {
	i := skipSpace(v, 1)
	return i < len(v) && v[i] == '"'
}

// renamed is err (a 400 about from) told about to instead.
func renamed(err error, from, to string) error {
	e, ok := err.(*Error)
	if !ok {
		return err
	}
	out := *e
	out.Message = strings.ReplaceAll(e.Message, from, to)
	if out.Param == from {
		out.Param = to
	}
	return &out
}
