package gateway

import (
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
)

// messagesBody is a Messages API request: system, one user turn.
func messagesBody(system, user string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": testModel, "system": system, "max_tokens": maxTokens, "stream": stream,
		"messages": []map[string]any{{"role": "user", "content": []map[string]string{{"type": "text", "text": user}}}}})
	return string(b)
}

// anthropicError reads a Messages API error body ("" when it is not one).
func anthropicError(body string) string {
	var e openai.MessagesErrorBody
	if json.Unmarshal([]byte(body), &e) != nil || e.Type != "error" || e.Error.Message == "" {
		return ""
	}
	return e.Error.Type
}

// TestMessages: the Messages API through the gateway to an emulated
// engine, whose tokenizer the gateway uses (source=engine). Its prompt is
// keyed as the engine renders it: after a message,
// the same conversation sent as a chat request is claimed cached by the
// gateway exactly as far as the engine finds it; a streamed message's
// first token trains the predictor; count_tokens is forwarded; the
// gateway's own errors are in the Messages API's form.
func TestMessages(t *testing.T) {
	e, g, url, admin := exactGateway(t)
	system := prefix("messages")
	r := post(t, url+"/v1/messages", messagesBody(system, "hello", 4, false), nil)
	var m struct {
		Type, Role string
		Content    []struct{ Type, Text string }
		StopReason string `json:"stop_reason"`
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(r.body), &m); err != nil || r.status != 200 || m.Type != "message" || m.Role != "assistant" ||
		len(m.Content) != 1 || len(strings.Fields(m.Content[0].Text)) != 4 || m.StopReason != "max_tokens" || m.Usage.OutputTokens != 4 {
		t.Fatalf("message: %d %s", r.status, r.body)
	}
	waitIndexed(t, g, e)
	chat, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 1,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": "hello"}}})
	c := post(t, url+"/v1/chat/completions", string(chat), nil)
	claimed, _ := strconv.Atoi(c.header.Get(hdrCached))
	found, ok := usageCached([]byte(c.body))
	if c.status != 200 || !ok || claimed != found || found < m.Usage.InputTokens-16 {
		t.Fatalf("the same conversation as chat: claimed %d cached, the engine found %d of the message's %d: %d %s", claimed, found, m.Usage.InputTokens, c.status, c.body)
	}

	s := post(t, url+"/v1/messages", messagesBody(system, "stream it", 5, true), nil)
	if s.status != 200 || !strings.HasSuffix(strings.TrimSpace(s.body), `data: {"type":"message_stop"}`) || strings.Count(s.body, "event: content_block_delta") != 5 {
		t.Fatalf("stream: %d %s", s.status, s.body)
	}
	samples := 0
	for _, st := range adminEndpoints(t, admin) {
		samples += st.Predictor.Samples
	}
	if samples != 3 { // the unstreamed message and chat request (streamed upstream, whole.go) and the stream
		t.Errorf("predictor samples %d, want 3", samples)
	}

	count := post(t, url+"/v1/messages/count_tokens", `{"model":"`+testModel+`","system":`+strconv.Quote(system)+`,"messages":[{"role":"user","content":"hello"}]}`, nil)
	var counted struct {
		InputTokens int `json:"input_tokens"`
	}
	if count.status != 200 || json.Unmarshal([]byte(count.body), &counted) != nil || counted.InputTokens != m.Usage.InputTokens {
		t.Fatalf("count_tokens: %d %s, want %d", count.status, count.body, m.Usage.InputTokens)
	}
	for _, bad := range []struct {
		path, body string
		status     int
		typ        string
	}{
		{"/v1/messages", `{"model":"` + testModel + `","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{"/v1/messages", `{"model":"` + testModel + `","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{"/v1/messages", `{"model":"nope","max_tokens":3,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
		{"/v1/messages", `{"model":"` + testModel + `","max_tokens":3,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, 400, "invalid_request_error"},
		// An image a tool returned, refused as any image (it was dropped,
		// and the request served).
		{"/v1/messages", `{"model":"` + testModel + `","max_tokens":3,"messages":[{"role":"user","content":"read it"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Read","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}]}]}`, 400, "invalid_request_error"},
		{"/v1/messages/count_tokens", `{"model":"nope","messages":[]}`, 404, "not_found_error"},
	} {
		r := post(t, url+bad.path, bad.body, nil)
		if r.status != bad.status || anthropicError(r.body) != bad.typ {
			t.Errorf("%s %s: %d %s, want %d %s", bad.path, bad.body, r.status, r.body, bad.status, bad.typ)
		}
	}
}

// TestMessagesRejectedEarly: a message that cannot meet its SLO is
// refused before any compute, in the Messages API's form, with the
// header that stops the Anthropic SDKs retrying it.
func TestMessagesRejectedEarly(t *testing.T) {
	c := &capture{}
	up := c.server(t)
	// cache-only: kvgate's hold would serve a request that misses its SLO
	// even alone on this idle, quiet fleet (docs/policies.md).
	cfg := Config{Endpoints: []fleet.Endpoint{{Name: "up", URL: up.URL, Model: testModel, PrefillSpeed: 1000}}, Classes: []Class{{Name: "standard", TTFT: 0.5}},
		Policy: "cache-only"}
	_, url, _ := startGateway(t, cfg, Options{})
	r := post(t, url+"/v1/messages", messagesBody(strings.Repeat("word ", 4000), "x", 2, true), nil)
	if r.status != 429 || anthropicError(r.body) != "rate_limit_error" || r.header.Get("X-Should-Retry") != "false" || r.header.Get("Retry-After") == "" ||
		!strings.Contains(r.body, "rejected before any compute") {
		t.Fatalf("want an early 429 in the Messages API's form: %d %v %s", r.status, r.header, r.body)
	}
	if len(c.bodies) != 0 {
		t.Fatalf("the engine was sent %d requests", len(c.bodies))
	}
}

// TestMessagesOnDisaggregatedFleet: vLLM's P/D flow runs completions; a
// message to a disaggregated model is a 400 saying what to use.
func TestMessagesOnDisaggregatedFleet(t *testing.T) {
	p, d := startEngine(t, fleet.RolePrefill, nil), startEngine(t, fleet.RoleDecode, nil)
	cfg := Config{Endpoints: []fleet.Endpoint{endpointOf(p, fleet.RolePrefill), endpointOf(d, fleet.RoleDecode)}, NoHealthChecks: true}
	g, url, admin := startGateway(t, cfg, Options{})
	r := post(t, url+"/v1/messages", messagesBody("s", "x", 2, false), nil)
	if r.status != 400 || anthropicError(r.body) != "invalid_request_error" || !strings.Contains(r.body, "/v1/messages runs on aggregated endpoints") {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// The client's error, refused before it was routed: nothing counted
	// but its outcome (it was upstream_error, its tokens in the hit rate).
	m := get(t, admin+"/metrics")
	if got := outcomes(t, g); !maps.Equal(got, map[string]int{"bad_request": 1}) || !strings.Contains(m, "kvgate_prompt_tokens_total 0") {
		t.Errorf("counted %v:\n%s", got, grepLines(m, "kvgate_prompt_tokens_total"))
	}
}

// TestMessagesFirstToken: an engine may send a message_start before its
// prefill; the gateway takes the first content_block_delta as the first
// token (its TTFT), the message_delta's output tokens as the answer's
// (two a delta here), and the answer as complete at message_stop.
func TestMessagesFirstToken(t *testing.T) {
	checkFirstTokenEvent(t, "/v1/messages", messagesBody("s", "x", 100, true),
		[][2]string{{"message_start", `,"message":{"id":"m1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":3,"output_tokens":0}}`},
			{"content_block_start", `,"index":0,"content_block":{"type":"text","text":""}`}},
		"content_block_delta", func(i int) string {
			return fmt.Sprintf(`,"index":0,"delta":{"type":"text_delta","text":"w%d x%d"}`, i, i)
		},
		[][2]string{{"content_block_stop", `,"index":0`},
			{"message_delta", `,"delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":3,"output_tokens":20}`}, {"message_stop", ``}})
}

// TestMessagesRetryInPrefill: an engine that sends message_start and
// dies in its prefill has sent the client nothing: the gateway held the
// event, and retries the request elsewhere, whose whole stream the
// client reads.
func TestMessagesRetryInPrefill(t *testing.T) {
	checkRetryInPrefill(t, "/v1/messages", messagesBody("s", "x", 3, true),
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_dead\"}}\n\n",
		"msg_dead", "event: message_start", "event: message_stop")
}

func TestHasTokenEvent(t *testing.T) {
	for _, c := range []struct {
		k    namedEvents
		b    string
		want bool
	}{
		{responsesEvents, "event: response.created\ndata: {\"instructions\":\"use x.delta\\n\"}\n\n", false},
		{responsesEvents, "event: response.created\ndata: {}\n\nevent: response.output_text.delta\ndata: {}\n\n", true},
		{responsesEvents, "event: response.reasoning_text.delta\r\n", true},
		{responsesEvents, "event:response.function_call_arguments.delta", true},
		{responsesEvents, "event: response.output_text.del", false},
		{responsesEvents, "data: event: x.delta\n", false},
		{responsesEvents, "event: content_block_delta\n", false},
		{messagesEvents, "event: message_start\ndata: {\"message\":{\"content\":\"event: content_block_delta\"}}\n\n", false},
		{messagesEvents, "event: message_start\ndata: {}\n\nevent: content_block_start\ndata: {}\n\nevent: content_block_delta\n", true},
		{messagesEvents, "event:content_block_delta\r\n", true},
		{messagesEvents, "event: content_block_delt", false},
		{messagesEvents, "event: response.output_text.delta\n", false},
		{0, "event: content_block_delta\n", false},
		{messagesEvents, "", false},
	} {
		if got := c.k.hasTokenEvent([]byte(c.b)); got != c.want {
			t.Errorf("%d %q: %v, want %v", c.k, c.b, got, c.want)
		}
	}
}
