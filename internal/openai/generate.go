package openai

import "strings"

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
	case text == nil && ids == nil:
		return nil, BadRequest("text or input_ids is required").WithParam("text")
	case text != nil && ids != nil:
		return nil, BadRequest("give text or input_ids, not both").WithParam("input_ids")
	case text != nil:
		v := body[text.v0:text.v1]
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
		if r.Model, err = parseString("lora_path", body[m.v0:m.v1]); err != nil || r.Model == "" {
			return nil, BadRequest("lora_path must be an adapter's name (one for the whole request)").WithParam("lora_path")
		}
	}
	return r, nil
}

// samplingParams reads max_new_tokens and n of sampling_params.
func (r *Request) samplingParams(body []byte) error {
	m := find(r.members, "sampling_params")
	if m == nil || isNull(body[m.v0:m.v1]) {
		return nil
	}
	v := body[m.v0:m.v1]
	if v[0] != '{' {
		return BadRequest("sampling_params must be an object").WithParam("sampling_params")
	}
	ms, err := objectMembers(v, "sampling_params")
	if err != nil {
		return err.(*Error).WithParam("sampling_params")
	}
	for _, f := range []struct {
		key string
		dst **int64
	}{{"max_new_tokens", &r.MaxTokens}, {"n", &r.N}} {
		if p := find(ms, f.key); p != nil {
			if *f.dst, err = parseInt("sampling_params."+f.key, v[p.v0:p.v1]); err != nil {
				return err
			}
		}
	}
	return nil
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
