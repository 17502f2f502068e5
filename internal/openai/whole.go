package openai

import (
	"encoding/json"
	"slices"
)

// WholeFromStream reports whether a gateway may ask the engine to stream
// r, a chat (chat) or completion request that does not stream, and
// answer the client whole from the stream (Assembler): it returns "" when
// it may, else the top-level key that keeps it from it ("stream" for a
// request that streams already).
//
// Only requests whose every key is one the Assembler answers exactly as
// the engine's own non-streamed answer qualify: the sampling and
// decoding parameters, which are the same either way; text, reasoning
// and a chat's logprobs (one object a token), which a stream carries
// whole. Keys whose non-streamed answer has more than the stream (echo,
// prompt_logprobs, best_of, vLLM's return_token_ids), whose streamed
// form differs between engines (a completion's logprobs: their
// text_offset, which llm-d-inference-sim counts from each event's text),
// which vLLM parses differently when streaming (tools: its streaming
// tool parsers), and any key not known here, keep the request as the
// client sent it.
func (r *Request) WholeFromStream(chat bool) string {
	if r.Stream {
		return "stream"
	}
	for _, m := range r.members {
		if !wholeKey(m.key, chat) && !neutral(m.key, r.Raw[m.v0:m.v1]) && !slices.Contains(routingKeys[:], m.key) {
			return m.key // (a routing key is stripped before the engine sees it)
		}
	}
	return ""
}

// neutral reports whether the member key: v asks for nothing beyond the
// default (vLLM reads null as absent): null, echo false, best_of 1, no
// tools.
func neutral(key string, v []byte) bool {
	switch string(v) {
	case "null":
		return true
	case "false":
		return key == "echo"
	case "1":
		return key == "best_of"
	case "[]":
		return key == "tools" || key == "functions"
	}
	return false
}

// wholeKey reports whether a request with the top-level key may be
// answered whole from a stream.
func wholeKey(key string, chat bool) bool {
	switch key {
	case "model", "stream", "n", "user", "metadata", "service_tier",
		"max_tokens", "min_tokens", "ignore_eos",
		"temperature", "top_p", "top_k", "min_p", "seed",
		"frequency_penalty", "presence_penalty", "repetition_penalty", "length_penalty",
		"stop", "stop_token_ids", "include_stop_str_in_output", "no_stop_trim",
		"skip_special_tokens", "spaces_between_special_tokens",
		"logit_bias", "allowed_token_ids", "bad_words",
		"return_tokens_as_token_ids",
		"response_format", "structured_outputs", "guided_json", "guided_regex",
		"guided_choice", "guided_grammar", "guided_decoding_backend",
		"guided_whitespace_pattern", "regex", "ebnf",
		"priority", "cache_salt", "request_id", "truncate_prompt_tokens",
		"add_special_tokens", "kv_transfer_params", "vllm_xargs", "lora_path":
		return true
	case "messages", "max_completion_tokens", "chat_template", "chat_template_kwargs",
		"add_generation_prompt", "continue_final_message", "documents",
		"mm_processor_kwargs", "reasoning_effort", "parallel_tool_calls",
		"logprobs", "top_logprobs":
		return chat
	case "prompt":
		return !chat
	}
	return false
}

// StreamInstead makes r's body ask for a stream (stream: true), every
// other byte kept: the gateway then answers the client whole
// (WholeFromStream, Assembler).
func (r *Request) StreamInstead() {
	body := r.Rewrite(Edit{Key: "stream", Value: json.RawMessage("true")})
	ms, err := objectMembers(body, "request body")
	if err != nil {
		return // cannot happen: an object with one valid member changed
	}
	r.Raw, r.members, r.Stream = body, ms, true
}

// WholeResponsesFromStream is WholeFromStream for a Responses API
// request: its streamed final event carries the whole response, so any
// request qualifies but one that streams already ("stream"), asks for
// stream_options, or runs in the background ("background": its
// unstreamed answer comes before the response is done).
func (r *Request) WholeResponsesFromStream() string {
	if r.Stream {
		return "stream"
	}
	for _, key := range []string{"stream_options", "background"} {
		if v := r.value(key); v != nil && !isNull(v) && string(v) != "false" {
			return key
		}
	}
	return ""
}
