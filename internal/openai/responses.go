package openai

// The Responses API (POST /v1/responses) is, to an engine without a
// response store, a chat request in another envelope: vLLM renders its
// instructions and input through the model's chat template as it renders
// a chat request's messages. ParseResponses reads it so.

// maxResponsesItems bounds the input items read (a list longer than any
// conversation a context window holds).
const maxResponsesItems = 1 << 16

// ParseResponses parses a /v1/responses body as the chat request vLLM
// makes of it: instructions as a system message, then the input (a
// string: one user message; a list of items: the messages vLLM converts
// them to, each with its object, Message.Raw, so that an exact tokenizer
// renders it as the engine does: responsesConversion), the function
// tools as the chat API's (responsesTools) and the template kwargs its
// reasoning effort sets (responsesKwargs); a last message item or
// reasoning in progress or incomplete is continued
// (ContinueFinalMessage), as vLLM continues it. max_output_tokens is
// MaxTokens; model, stream, previous_response_id, store, cache_salt and
// priority are read. A chat_template_kwargs member is not read: vLLM
// sets it itself. Raw is the body.
func ParseResponses(body []byte) (*Request, error) {
	r, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	var input []Message
	var continueFinal bool
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
			input, continueFinal, err = parseResponsesInput(v)
		case "tools":
			r.Tools, err = responsesTools(v)
		case "reasoning":
			r.ChatTemplateKwargs, err = responsesKwargs(v)
		}
		if err != nil {
			return nil, err
		}
	}
	if input == nil {
		return nil, BadRequest("input is required").WithParam("input")
	}
	if r.Instructions != "" {
		r.Messages = append(r.Messages, objectMessage("system", Content{String: r.Instructions}, "", nil, true))
	}
	r.Messages = append(r.Messages, input...)
	if len(r.Messages) == 0 {
		return nil, BadRequest("input must not be empty").WithParam("input")
	}
	if continueFinal {
		r.ContinueFinalMessage = true
		no := false
		r.AddGenerationPrompt = &no
	}
	return r, nil
}

// parseResponsesInput reads input: a string, or a list of items, which
// it converts as vLLM does (responsesConversion). continueFinal reports
// a last item that leaves the final message open.
func parseResponsesInput(v []byte) (msgs []Message, continueFinal bool, err error) {
	switch {
	case isNull(v):
		return nil, false, nil
	case v[0] == '"':
		s, err := unquote(v)
		if err != nil {
			return nil, false, BadRequest("input: %v", err).WithParam("input")
		}
		return []Message{objectMessage("user", Content{String: s}, "", nil, true)}, false, nil
	case v[0] != '[':
		return nil, false, BadRequest("input must be a string or a list of input items").WithParam("input")
	}
	var c responsesConversion
	k := 0
	eachElement(v, func(el []byte) {
		if err != nil {
			return
		}
		if k >= maxResponsesItems {
			err = BadRequest("input has more than %d items", maxResponsesItems).WithParam("input")
			return
		}
		continueFinal, err = c.add(el, k)
		k++
	})
	if err != nil {
		return nil, false, err
	}
	return c.messages(), continueFinal, nil
}
