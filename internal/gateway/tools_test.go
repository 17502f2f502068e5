package gateway

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
)

// TestToolsKeyedAsRendered: a chat request's tools and its assistant
// messages' tool calls are part of the prompt a model's template renders
// (the emulator puts the tools into the system message, as Qwen's
// templates do), so a gateway that tokenizes with the engine's own
// template (source=engine) sends them along: turn after turn of an agent's
// conversation, the gateway claims cached exactly what the engine finds.
func TestToolsKeyedAsRendered(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, nil)
	cfg := Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}, Policy: "kvgate", BlockSize: 16,
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + e.URL()}}
	g, url, _ := startGateway(t, cfg, Options{})
	waitSubscribed(t, g)
	tools := json.RawMessage(`[{"type":"function","function":{"name":"read_file","description":"Read a file of the repository.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}},` +
		`{"type":"function","function":{"name":"run","description":"Run a shell command.","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}}]`)
	msgs := []any{map[string]any{"role": "system", "content": prefix("agent")}, map[string]any{"role": "user", "content": "fix the failing test"}}
	for turn := range 4 {
		waitFor(t, func() bool {
			st := g.sub.Stats()
			next := e.KVEventsSeq()
			return len(st) == 1 && (next == 0 || st[0].LastSeq != nil && *st[0].LastSeq+1 >= next)
		})
		body, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 1, "messages": msgs, "tools": tools, "chat_template_kwargs": map[string]bool{"enable_thinking": false}})
		r := post(t, url+"/v1/chat/completions", string(body), nil)
		claimed, _ := strconv.Atoi(r.header.Get(hdrCached))
		found, ok := openai.ResponseCachedTokens([]byte(r.body))
		if r.status != 200 || !ok || claimed != found || (turn > 0 && found == 0) {
			t.Fatalf("turn %d: claimed %d cached, the engine found %d: %d %s", turn, claimed, found, r.status, r.body)
		}
		call := map[string]any{"id": "call_" + strconv.Itoa(turn), "type": "function", "function": map[string]string{"name": "read_file", "arguments": `{"path": "a.go"}`}}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{call}},
			map[string]any{"role": "tool", "tool_call_id": call["id"], "content": prefix("file" + strconv.Itoa(turn))})
	}
	// The tools are in the prompt: the engine counts more tokens with them.
	with, _ := json.Marshal(map[string]any{"model": testModel, "messages": msgs, "tools": tools})
	without, _ := json.Marshal(map[string]any{"model": testModel, "messages": msgs})
	var a, b struct{ Count int }
	if json.Unmarshal([]byte(post(t, e.URL()+"/tokenize", string(with), nil).body), &a) != nil ||
		json.Unmarshal([]byte(post(t, e.URL()+"/tokenize", string(without), nil).body), &b) != nil || a.Count <= b.Count+50 {
		t.Fatalf("the engine counts %d tokens with the tools, %d without", a.Count, b.Count)
	}
}
