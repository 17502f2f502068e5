package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// completionsDefaultMaxTokens is what vLLM's /v1/completions generates
// when max_tokens is absent (the OpenAI API's default).
const completionsDefaultMaxTokens = 16

// Continuation is the body that asks an engine to go on with the answer
// to r (a completion or chat request, one sequence) whose first tokens
// produced text: a stream that broke after the client had them. The
// engine is given the text as the answer's start and generates the rest:
//   - chat: the messages with an assistant message holding text, and
//     continue_final_message true and add_generation_prompt false (vLLM's
//     way to continue a message); a request that already continued its
//     final message gets text appended to it;
//   - completions: the prompt with text appended (a text prompt only: a
//     prompt of token ids cannot take text);
//
// and max_tokens (max_completion_tokens) and min_tokens less the tokens
// already generated; a completion without max_tokens had vLLM's 16.
// echo and prompt_logprobs, which the client had with the first part,
// are removed. The rest of the body is kept as received.
//
// The engine tokenizes text afresh, which may split it into tokens other
// than the ones generated: the continuation is exact in text, not in ids.
func (r *Request) Continuation(chat bool, text string, tokens int) ([]byte, error) {
	if r.N != nil && *r.N != 1 {
		return nil, errors.New("more than one sequence (n)")
	}
	if tokens < 0 {
		return nil, errors.New("negative token count")
	}
	edits := []Edit{{Key: "echo"}, {Key: "prompt_logprobs"}}
	limits, err := r.remainingLimits(chat, tokens)
	if err != nil {
		return nil, err
	}
	edits = append(edits, limits...)
	var e []Edit
	if chat {
		e, err = r.continueChat(text)
	} else {
		e, err = r.continuePrompt(text)
	}
	if err != nil {
		return nil, err
	}
	return r.Rewrite(append(edits, e...)...), nil
}

// remainingLimits are the edits of the output bounds once tokens are
// generated.
func (r *Request) remainingLimits(chat bool, tokens int) ([]Edit, error) {
	var edits []Edit
	rest := func(key string, v int64) error {
		if v < 1 { // the gateway refuses these; no overflow below
			return fmt.Errorf("%s %d", key, v)
		}
		left := v - int64(tokens)
		if left < 1 {
			return fmt.Errorf("%s %d leaves nothing to generate after %d tokens", key, v, tokens)
		}
		edits = append(edits, Edit{Key: key, Value: json.RawMessage(strconv.FormatInt(left, 10))})
		return nil
	}
	switch {
	case r.MaxTokens != nil:
		if err := rest("max_tokens", *r.MaxTokens); err != nil {
			return nil, err
		}
	case !chat:
		if err := rest("max_tokens", completionsDefaultMaxTokens); err != nil {
			return nil, err
		}
	}
	if chat && r.MaxCompletionTokens != nil {
		if err := rest("max_completion_tokens", *r.MaxCompletionTokens); err != nil {
			return nil, err
		}
	}
	if r.MinTokens != nil && *r.MinTokens >= 0 { // a negative one is the engine's to refuse, as sent
		left := max(*r.MinTokens-int64(tokens), 0)
		edits = append(edits, Edit{Key: "min_tokens", Value: json.RawMessage(strconv.FormatInt(left, 10))})
	}
	return edits, nil
}

// continueChat: the messages with text as the assistant's answer so far.
// It reads the body as received (Raw), which a proxy keeps after letting
// the parsed messages go.
func (r *Request) continueChat(text string) ([]Edit, error) {
	var msgs []json.RawMessage
	if err := json.Unmarshal(r.value("messages"), &msgs); err != nil || len(msgs) == 0 {
		return nil, errors.New("no messages")
	}
	if r.ContinueFinalMessage {
		var last map[string]json.RawMessage
		var content string
		if err := json.Unmarshal(msgs[len(msgs)-1], &last); err != nil {
			return nil, errors.New("final message unreadable")
		}
		if err := json.Unmarshal(last["content"], &content); err != nil {
			return nil, errors.New("the final message to continue has no string content")
		}
		last["content"], _ = json.Marshal(content + text)
		b, err := json.Marshal(last)
		if err != nil {
			return nil, err
		}
		msgs[len(msgs)-1] = b
	} else {
		b, _ := json.Marshal(struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}{"assistant", text})
		msgs = append(msgs, b)
	}
	all, err := json.Marshal(msgs)
	if err != nil {
		return nil, err
	}
	return []Edit{
		{Key: "messages", Value: all},
		{Key: "continue_final_message", Value: json.RawMessage("true")},
		{Key: "add_generation_prompt", Value: json.RawMessage("false")},
	}, nil
}

// continuePrompt: the prompt with text appended.
func (r *Request) continuePrompt(text string) ([]Edit, error) {
	prompt, ok := r.TextPrompt()
	if !ok {
		return nil, errors.New("not one text prompt (a prompt of token ids cannot take text)")
	}
	p, _ := json.Marshal(prompt + text)
	return []Edit{{Key: "prompt", Value: p}}, nil
}

// TextPrompt is a completion's prompt when it is one text (a string, or
// a list of one string), read from the body as received.
func (r *Request) TextPrompt() (string, bool) {
	v := r.value("prompt")
	var one string
	if json.Unmarshal(v, &one) == nil && len(v) > 0 && v[0] == '"' {
		return one, true
	}
	var list []string
	if json.Unmarshal(v, &list) == nil && len(list) == 1 {
		return list[0], true
	}
	return "", false
}

// NoSpecialTokens reports whether the request asks for its prompt without
// the tokenizer's special tokens (add_special_tokens: false; vLLM's
// completions add them by default).
func (r *Request) NoSpecialTokens() bool {
	return string(r.value("add_special_tokens")) == "false"
}

// Field is the raw JSON value of the body's top-level key (nil: absent
// or null).
func (r *Request) Field(key string) []byte {
	if v := r.value(key); v != nil && !isNull(v) {
		return v
	}
	return nil
}

// value is the raw value of the body's top-level key (nil: absent).
func (r *Request) value(key string) []byte {
	if m := find(r.members, key); m != nil {
		return r.Raw[m.v0:m.v1]
	}
	return nil
}
