package engine

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
)

// messageObject is what the tests read of a message.
type messageObject struct {
	ID, Type, Role, Model string
	Content               []struct{ Type, Text string }
	StopReason            *string `json:"stop_reason"`
	Usage                 struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
}

func (m messageObject) text() string {
	var b strings.Builder
	for _, c := range m.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// TestMessages: the Messages API as vLLM serves it: the system and
// messages as a chat request's (the same prompt tokens), the answer a
// message (max_tokens its stop reason at the limit), count_tokens the
// prompt's count, errors in the API's form.
func TestMessages(t *testing.T) {
	e := startEngine(t)
	body := map[string]any{"model": e.cfg.Model, "system": "be brief", "max_tokens": 6,
		"messages": []map[string]any{{"role": "user", "content": []map[string]string{{"type": "text", "text": "tell me a story"}}}}}
	resp, raw := postJSON(t, e.URL()+"/v1/messages", body)
	var m messageObject
	_ = json.Unmarshal(raw, &m)
	want := tokenCount(t, e, []map[string]string{{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}})
	if resp.StatusCode != 200 || m.Type != "message" || m.Role != "assistant" || m.Model != e.cfg.Model || m.StopReason == nil || *m.StopReason != "max_tokens" ||
		m.Usage.InputTokens != want || m.Usage.OutputTokens != 6 || len(m.Content) != 1 || m.Content[0].Type != "text" || len(strings.Fields(m.text())) != 6 {
		t.Fatalf("want a message of 6 tokens after %d input tokens: %d %s", want, resp.StatusCode, raw)
	}
	delete(body, "max_tokens")
	resp, raw = postJSON(t, e.URL()+"/v1/messages/count_tokens", body)
	var count struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.Unmarshal(raw, &count); err != nil || resp.StatusCode != 200 || count.InputTokens != want {
		t.Fatalf("count_tokens: %d %s, want %d", resp.StatusCode, raw, want)
	}
	// Without max_tokens a message is a 400 in the Messages API's form.
	resp, raw = postJSON(t, e.URL()+"/v1/messages", body)
	var errBody struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal(raw, &errBody); err != nil || resp.StatusCode != 400 || errBody.Type != "error" || errBody.Error.Type != "invalid_request_error" ||
		!strings.Contains(errBody.Error.Message, "max_tokens") {
		t.Fatalf("no max_tokens: %d %s", resp.StatusCode, raw)
	}
	body["max_tokens"], body["model"] = 3, "other"
	if resp, raw = postJSON(t, e.URL()+"/v1/messages", body); resp.StatusCode != 404 || !strings.Contains(string(raw), `"not_found_error"`) {
		t.Fatalf("another model: %d %s", resp.StatusCode, raw)
	}
	// A natural end is end_turn.
	body["model"] = e.cfg.Model
	body["max_tokens"] = 1000
	_, raw = postJSON(t, e.URL()+"/v1/messages", body)
	if err := json.Unmarshal(raw, &m); err != nil || m.StopReason == nil || *m.StopReason != "end_turn" {
		t.Fatalf("natural end: %s", raw)
	}
	// A max_tokens beyond the room the prompt leaves is the chat's 400
	// (vLLM's Messages API is its chat); it was served, a cap cut to fit.
	body["max_tokens"] = e.cfg.MaxModelLen
	if resp, raw = postJSON(t, e.URL()+"/v1/messages", body); resp.StatusCode != 400 || !strings.Contains(string(raw), "maximum context length") ||
		!strings.Contains(string(raw), `"invalid_request_error"`) {
		t.Fatalf("max_tokens of the whole context: %d %s", resp.StatusCode, raw)
	}
	pd := startEngine(t, func(c *Config) { c.Role = fleet.RolePrefill })
	if resp, raw = postJSON(t, pd.URL()+"/v1/messages", body); resp.StatusCode != 400 || !strings.Contains(string(raw), "aggregated only") {
		t.Fatalf("a prefill engine: %d %s", resp.StatusCode, raw)
	}
}

// messagesEvents reads a Messages API stream: its event names, the text
// of its deltas and its message_delta's usage.
func messagesEvents(t *testing.T, resp *http.Response) (names []string, text string, stop string, usage messageObject) {
	t.Helper()
	for _, nd := range readNamedEvents(t, resp.Body) {
		name, data := nd[0], nd[1]
		var ev struct {
			Type  string
			Delta struct {
				Text       string
				StopReason string `json:"stop_reason"`
			}
			Message *messageObject
			Usage   json.RawMessage
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Type != name {
			t.Fatalf("event %d %s: %s (%v)", len(names), name, data, err)
		}
		names = append(names, name)
		text += ev.Delta.Text
		if ev.Delta.StopReason != "" {
			stop = ev.Delta.StopReason
		}
		if len(ev.Usage) > 0 {
			_ = json.Unmarshal(ev.Usage, &usage.Usage)
		}
		if ev.Message != nil && (ev.Message.Type != "message" || ev.Message.Role != "assistant" || len(ev.Message.Content) != 0) {
			t.Fatalf("message_start: %s", data)
		}
	}
	return names, text, stop, usage
}

// TestMessagesStream: the stream's events in vLLM's order (message_start
// with the first token), the deltas making the unstreamed answer's text,
// message_delta's stop reason and usage, message_stop last (no [DONE]);
// at a stream interval the tokens of a step come as one delta.
func TestMessagesStream(t *testing.T) {
	for _, interval := range []int{1, 1000} {
		e := startEngine(t, func(c *Config) { c.StreamInterval = interval })
		body := map[string]any{"model": e.cfg.Model, "max_tokens": 5, "messages": []map[string]any{{"role": "user", "content": "stream it"}}}
		b, _ := json.Marshal(map[string]any{"model": e.cfg.Model, "max_tokens": 5, "stream": true, "messages": body["messages"]})
		resp, err := http.Post(e.URL()+"/v1/messages", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		names, text, stop, usage := messagesEvents(t, resp)
		resp.Body.Close()
		deltas := strings.Count(strings.Join(names, " "), "content_block_delta")
		got := strings.ReplaceAll(strings.Join(names, " "), "content_block_delta ", "")
		if got != "message_start content_block_start content_block_stop message_delta message_stop" || deltas < 1 || (interval == 1 && deltas != 5) ||
			stop != "max_tokens" || usage.Usage.OutputTokens != 5 || usage.Usage.InputTokens == 0 {
			t.Fatalf("interval %d: events %v, stop %q, usage %+v", interval, names, stop, usage.Usage)
		}
		_, raw := postJSON(t, e.URL()+"/v1/messages", body)
		var whole messageObject
		if err := json.Unmarshal(raw, &whole); err != nil || whole.text() != text || whole.Usage.InputTokens != usage.Usage.InputTokens {
			t.Fatalf("unstreamed %s, streamed %q", raw, text)
		}
	}
}
