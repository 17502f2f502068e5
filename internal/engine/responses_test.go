package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// respObject is what the tests read of a response object.
type respObject struct {
	ID                string
	Object            string
	Status            string
	IncompleteDetails *struct{ Reason string } `json:"incomplete_details"`
	Output            []struct {
		Type, Role string
		Content    []struct{ Type, Text string }
	}
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
}

func (o respObject) text() string {
	if len(o.Output) != 1 || len(o.Output[0].Content) != 1 {
		return ""
	}
	return o.Output[0].Content[0].Text
}

func postResponse(t *testing.T, e *Engine, body map[string]any) (int, respObject, string) {
	t.Helper()
	resp, raw := postJSON(t, e.URL()+"/v1/responses", body)
	var o respObject
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(raw, &o); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
	}
	return resp.StatusCode, o, string(raw)
}

// tokenCount is the engine's count of a chat conversation's prompt.
func tokenCount(t *testing.T, e *Engine, msgs []map[string]string) int {
	t.Helper()
	_, raw := postJSON(t, e.URL()+"/tokenize", map[string]any{"model": e.cfg.Model, "messages": msgs})
	var tok struct{ Count int }
	if err := json.Unmarshal(raw, &tok); err != nil || tok.Count == 0 {
		t.Fatalf("tokenize: %s", raw)
	}
	return tok.Count
}

// TestResponses: the Responses API as vLLM serves it: the instructions
// and input as a chat request's messages, the answer a response object
// (incomplete at max_output_tokens); with the store on, a request that
// continues one is its conversation plus the new input (its prefix
// cached), and GET returns it; with it off, previous_response_id is a
// 404.
func TestResponses(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.ResponsesStore = true })
	model := e.cfg.Model
	status, o, raw := postResponse(t, e, map[string]any{"model": model, "instructions": "be brief", "input": "tell me a story", "max_output_tokens": 6})
	want := tokenCount(t, e, []map[string]string{{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}})
	if status != 200 || !strings.HasPrefix(o.ID, "resp_") || o.Object != "response" || o.Status != "incomplete" || o.IncompleteDetails == nil ||
		o.IncompleteDetails.Reason != "max_output_tokens" || o.Usage.OutputTokens != 6 || o.Usage.InputTokens != want ||
		len(strings.Fields(o.text())) != 6 || o.Output[0].Role != "assistant" || o.Output[0].Content[0].Type != "output_text" {
		t.Fatalf("want a response object of 6 tokens after %d input tokens: %d %s", want, status, raw)
	}
	status, o2, raw := postResponse(t, e, map[string]any{"model": model, "instructions": "be brief", "input": []map[string]any{
		{"role": "user", "content": []map[string]string{{"type": "input_text", "text": "and then?"}}}}, "previous_response_id": o.ID, "max_output_tokens": 3})
	want = tokenCount(t, e, []map[string]string{{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"},
		{"role": "assistant", "content": o.text()}, {"role": "user", "content": "and then?"}})
	if status != 200 || o2.Usage.InputTokens != want || o2.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Fatalf("want the conversation continued (%d input tokens, its prefix cached): %d %s", want, status, raw)
	}
	if code, body := getBody(t, e.URL()+"/v1/responses/"+o2.ID); code != 200 || !strings.Contains(string(body), o2.ID) || !strings.Contains(string(body), o2.text()) {
		t.Fatalf("GET: %d %s", code, body)
	}
	if code, _ := getBody(t, e.URL()+"/v1/responses/resp_nope"); code != 404 {
		t.Fatalf("GET of an unknown id: %d", code)
	}
	// Cancel, as vLLM answers it for a response that is not background.
	for _, c := range []struct {
		id   string
		code int
		says string
	}{{o2.ID, 400, "Cannot cancel a synchronous response."}, {"resp_nope", 404, "not found"}} {
		resp, err := http.Post(e.URL()+"/v1/responses/"+c.id+"/cancel", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.Contains(string(body), c.says) {
			t.Errorf("cancel %s: %d %s", c.id, resp.StatusCode, body)
		}
	}
	off := startEngine(t)
	if status, _, raw := postResponse(t, off, map[string]any{"model": model, "input": "x", "previous_response_id": o.ID}); status != 404 {
		t.Fatalf("another engine (no store) continuing %s: %d %s", o.ID, status, raw)
	}
	if status, _, raw := postResponse(t, e, map[string]any{"model": model, "input": 5}); status != 400 {
		t.Fatalf("input 5: %d %s", status, raw)
	}
}

// TestResponsesStream: the stream's events in vLLM's order, their
// sequence numbers from 0, the deltas making the text, and
// response.completed last (no [DONE]); created and in_progress come
// before the first token.
func TestResponsesStream(t *testing.T) {
	e := startEngine(t)
	b, _ := json.Marshal(map[string]any{"model": e.cfg.Model, "input": "stream it", "max_output_tokens": 5, "stream": true})
	resp, err := http.Post(e.URL()+"/v1/responses", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var types []string
	var deltas string
	var final respObject
	for _, nd := range readNamedEvents(t, resp.Body) {
		name, data := nd[0], nd[1]
		var ev struct {
			Type     string
			Seq      int `json:"sequence_number"`
			Delta    string
			Response json.RawMessage
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Type != name || ev.Seq != len(types) {
			t.Fatalf("event %d %s: %s (%v)", len(types), name, data, err)
		}
		types = append(types, name)
		deltas += ev.Delta
		if name == "response.completed" {
			json.Unmarshal(ev.Response, &final)
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		strings.Repeat("response.output_text.delta ", 5) + "response.output_text.done response.content_part.done response.output_item.done response.completed"
	if strings.Join(types, " ") != want || deltas != final.text() || final.Usage.OutputTokens != 5 {
		t.Fatalf("events %v\ndeltas %q, final %+v", types, deltas, final)
	}
	// The same request unstreamed has the same text (until 2026-12-04
	// every delta after the first began with two spaces).
	if _, whole, raw := postResponse(t, e, map[string]any{"model": e.cfg.Model, "input": "stream it", "max_output_tokens": 5}); whole.text() != deltas {
		t.Fatalf("unstreamed %q, streamed %q: %s", whole.text(), deltas, raw)
	}
}

// TestResponsesEchoTheRequest: a response repeats its request's
// metadata, sampling and tool settings as vLLM's and OpenAI's do, or
// their defaults (a walkthrough found metadata always {} and the rest
// absent).
func TestResponsesEchoTheRequest(t *testing.T) {
	e := startEngine(t)
	read := func(raw string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		return m
	}
	tools := []map[string]any{{"type": "function", "name": "f", "parameters": map[string]any{"type": "object"}}}
	status, _, raw := postResponse(t, e, map[string]any{"model": e.cfg.Model, "input": "hi", "max_output_tokens": 3,
		"metadata": map[string]string{"k": "v"}, "temperature": 0.2, "tools": tools, "tool_choice": "required", "user": "u1"})
	if status != 200 {
		t.Fatalf("%d %s", status, raw)
	}
	m := read(raw)
	if md, _ := m["metadata"].(map[string]any); md["k"] != "v" || m["temperature"] != 0.2 || m["tool_choice"] != "required" || m["user"] != "u1" {
		t.Errorf("not echoed: %s", raw)
	}
	if ts, _ := m["tools"].([]any); len(ts) != 1 {
		t.Errorf("tools not echoed: %s", raw)
	}
	status, _, raw = postResponse(t, e, map[string]any{"model": e.cfg.Model, "input": "hi", "max_output_tokens": 3, "metadata": nil})
	if status != 200 {
		t.Fatalf("%d %s", status, raw)
	}
	m = read(raw)
	if md, ok := m["metadata"].(map[string]any); !ok || len(md) != 0 || m["temperature"] != 1.0 || m["tool_choice"] != "auto" || m["parallel_tool_calls"] != true ||
		m["truncation"] != "disabled" || m["background"] != false {
		t.Errorf("defaults: %s", raw)
	}
	if ts, ok := m["tools"].([]any); !ok || len(ts) != 0 {
		t.Errorf("tools default: %s", raw)
	}
}

// TestResponseIDsAreRandom: a response's id is random, as vLLM's
// (resp_ and a UUID), not the request's X-Request-Id: stored responses
// are read, continued and cancelled by id alone (a walkthrough read
// another client's by the next sequential id, and two requests with one
// header shared an id).
func TestResponseIDsAreRandom(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.ResponsesStore = true })
	ids := map[string]bool{}
	for range 2 {
		_, raw := postJSON(t, e.URL()+"/v1/responses", map[string]any{"model": e.cfg.Model, "input": "hi", "max_output_tokens": 2}, "X-Request-Id", "dup")
		var o respObject
		if err := json.Unmarshal(raw, &o); err != nil || !strings.HasPrefix(o.ID, "resp_") || strings.Contains(o.ID, "dup") || len(o.ID) < 5+32 {
			t.Fatalf("id %q (%v): %s", o.ID, err, raw)
		}
		ids[o.ID] = true
	}
	if len(ids) != 2 {
		t.Errorf("two responses, ids %v", ids)
	}
}

// TestResponsesMetadataBounded: metadata that is not an object of strings,
// or beyond OpenAI's bounds, is a 400 (it was echoed, and kept, whatever
// its size).
func TestResponsesMetadataBounded(t *testing.T) {
	e := startEngine(t)
	big := map[string]string{}
	for i := range 17 {
		big[fmt.Sprint("k", i)] = "v"
	}
	for _, c := range []struct {
		name string
		md   any
		code int
	}{
		{"ok", map[string]string{"owner": "me"}, 200},
		{"a string", "notanobject", 400},
		{"nested", map[string]any{"a": map[string]any{"b": 1}}, 400},
		{"17 pairs", big, 400},
		{"a long value", map[string]string{"k": strings.Repeat("v", 513)}, 400},
	} {
		status, _, raw := postResponse(t, e, map[string]any{"model": e.cfg.Model, "input": "hi", "max_output_tokens": 2, "metadata": c.md})
		if status != c.code || (c.code == 400 && !strings.Contains(raw, `"param":"metadata"`)) {
			t.Errorf("%s: %d %s, want %d", c.name, status, raw, c.code)
		}
	}
}
