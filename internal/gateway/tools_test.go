package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
)

// exactGateway starts an engine and a gateway in front of it that
// tokenizes with the engine's own template (source=engine), the kvgate
// policy, 16-token blocks, subscribed to its KV events.
func exactGateway(t *testing.T) (e *engine.Engine, g *Gateway, url, admin string) {
	t.Helper()
	e = startEngine(t, fleet.RoleBoth, nil)
	cfg := Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}, Policy: "kvgate", BlockSize: 16,
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + e.URL()}}
	g, url, admin = startGateway(t, cfg, Options{})
	waitSubscribed(t, g)
	return e, g, url, admin
}

// TestToolsKeyedAsRendered: a chat request's tools and its assistant
// messages' tool calls are part of the prompt a model's template renders
// (the emulator puts the tools into the system message, as Qwen's
// templates do), so a gateway that tokenizes with the engine's own
// template (source=engine) sends them along: turn after turn of an agent's
// conversation, the gateway claims cached exactly what the engine finds.
// (TestMessagesToolsKeyedAsRendered: the same through the Messages API.)
func TestToolsKeyedAsRendered(t *testing.T) {
	e, g, url, _ := exactGateway(t)
	tools := json.RawMessage(`[{"type":"function","function":{"name":"read_file","description":"Read a file of the repository.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}},` +
		`{"type":"function","function":{"name":"run","description":"Run a shell command.","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}}]`)
	msgs := []any{map[string]any{"role": "system", "content": prefix("agent")}, map[string]any{"role": "user", "content": "fix the failing test"}}
	for turn := range 4 {
		waitIndexed(t, g, e)
		body, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 1, "messages": msgs, "tools": tools, "chat_template_kwargs": map[string]bool{"enable_thinking": false}})
		r := post(t, url+"/v1/chat/completions", string(body), nil)
		claimed, _ := strconv.Atoi(r.header.Get(hdrCached))
		found, ok := usageCached([]byte(r.body))
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

// TestMessagesToolsKeyedAsRendered: an agent speaking the Messages API
// (Claude Code's shape: a system prompt, tools, then turns of tool_use and
// tool_result blocks) is keyed as the engine renders the chat request it
// converts the message to: turn after turn, the gateway claims cached
// exactly what the engine finds (its /v1/messages reports no cache hits,
// so each turn is sent twice, then as the chat request it converts to,
// whose cached tokens the engine reports: the second message's claim
// must be what the chat request finds).
func TestMessagesToolsKeyedAsRendered(t *testing.T) {
	e, g, url, _ := exactGateway(t)
	tools := []map[string]any{{"name": "read_file", "description": "Read a file.", "input_schema": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]string{"type": "string"}}}},
		{"name": "run", "input_schema": map[string]any{"properties": map[string]any{"cmd": map[string]string{"type": "string"}}}}}
	system := []map[string]string{{"type": "text", "text": "x-anthropic-billing-header: cch=1234;"}, {"type": "text", "text": prefix("claude")}}
	msgs := []any{map[string]any{"role": "user", "content": "fix the failing test"}}
	for turn := range 3 {
		waitIndexed(t, g, e)
		body, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 1, "system": system, "tools": tools, "messages": msgs})
		r := post(t, url+"/v1/messages", string(body), nil)
		if first, _ := strconv.Atoi(r.header.Get(hdrCached)); r.status != 200 || (turn > 0 && first == 0) {
			t.Fatalf("turn %d: %d %s (claimed %d)", turn, r.status, r.body, first)
		}
		waitIndexed(t, g, e)
		// Sent again, all of it is cached: an exact gateway claims what
		// the engine then finds.
		r = post(t, url+"/v1/messages", string(body), nil)
		claimed, _ := strconv.Atoi(r.header.Get(hdrCached))
		// The engine's own count of that prompt cached: the same
		// request again, as the chat request vLLM converts it to.
		waitIndexed(t, g, e)
		c := post(t, url+"/v1/chat/completions", asChat(t, body, openai.InlinePreserve), nil)
		again, _ := strconv.Atoi(c.header.Get(hdrCached))
		found, ok := usageCached([]byte(c.body))
		var m struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
			}
		}
		_ = json.Unmarshal([]byte(r.body), &m)
		var u struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		_ = json.Unmarshal([]byte(c.body), &u)
		if c.status != 200 || !ok || again != found || claimed != found || u.Usage.PromptTokens != m.Usage.InputTokens || found < m.Usage.InputTokens-16 {
			t.Fatalf("turn %d: the message's %d prompt tokens, claimed %d cached; as chat %d, claimed %d, the engine found %d: %s",
				turn, m.Usage.InputTokens, claimed, u.Usage.PromptTokens, again, found, c.body)
		}
		id := "toolu_" + strconv.Itoa(turn)
		msgs = append(msgs, map[string]any{"role": "assistant", "content": []map[string]any{{"type": "text", "text": "Let me look."},
			{"type": "tool_use", "id": id, "name": "read_file", "input": map[string]any{"path": "a.go", "line": 1.0}}}},
			map[string]any{"role": "user", "content": []map[string]any{{"type": "tool_result", "tool_use_id": id, "content": prefix("file" + strconv.Itoa(turn))}}})
	}
}

// TestResponsesToolsKeyedAsRendered: a Codex-shaped agent speaking the
// Responses API (instructions, a developer message, function and
// namespace tools, then turns of reasoning, a function call and its
// output) is keyed as the engine renders the chat request vLLM converts
// it to (openai.ParseResponses: the calls as the assistant's tool calls,
// the tools as chat tools): turn after turn the gateway claims cached
// exactly what the engine finds. With the tools left out of the
// rendering the two part at the system prompt's end.
func TestResponsesToolsKeyedAsRendered(t *testing.T) {
	e, g, url, _ := exactGateway(t)
	tools := json.RawMessage(`[{"type":"function","name":"shell","description":"Runs a shell command.","strict":false,` +
		`"parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]}},` +
		`{"type":"web_search"},{"type":"namespace","name":"mcp","description":"Files.","tools":[{"type":"function","name":"read","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}]}]`)
	input := []any{
		map[string]any{"type": "message", "role": "developer", "content": []map[string]string{{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}}},
		map[string]any{"type": "message", "role": "user", "content": []map[string]string{{"type": "input_text", "text": "fix the failing test"}}},
	}
	usage := func(body string) (in, cached int) {
		var u struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
				Details     struct {
					Cached int `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			}
		}
		if err := json.Unmarshal([]byte(body), &u); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return u.Usage.InputTokens, u.Usage.Details.Cached
	}
	for turn := range 4 {
		waitIndexed(t, g, e)
		body, _ := json.Marshal(map[string]any{"model": testModel, "max_output_tokens": 1, "instructions": prefix("codex"),
			"input": input, "tools": tools, "reasoning": map[string]string{"effort": "medium"}, "store": false})
		r := post(t, url+"/v1/responses", string(body), nil)
		claimed, _ := strconv.Atoi(r.header.Get(hdrCached))
		in, found := usage(r.body)
		if r.status != 200 || claimed != found || (turn > 0 && found < in/2) {
			t.Fatalf("turn %d: %d prompt tokens, claimed %d cached, the engine found %d: %d %s", turn, in, claimed, found, r.status, r.body)
		}
		id := "call_" + strconv.Itoa(turn)
		input = append(input,
			map[string]any{"type": "reasoning", "id": "rs_" + strconv.Itoa(turn), "summary": []map[string]string{{"type": "summary_text", "text": "Run it."}}},
			map[string]any{"type": "function_call", "call_id": id, "name": "read", "namespace": "mcp", "arguments": `{"path":"x.go"}`},
			map[string]any{"type": "function_call_output", "call_id": id, "output": prefix("out" + strconv.Itoa(turn))})
	}
	// The tools and calls are in the engine's prompt: it counts more
	// tokens with them than for the same texts without.
	with, _ := json.Marshal(map[string]any{"model": testModel, "max_output_tokens": 1, "input": input, "tools": tools, "store": false})
	var plain []any
	for _, it := range input {
		if typ := it.(map[string]any)["type"]; typ != "reasoning" && typ != "function_call" {
			plain = append(plain, it)
		}
	}
	without, _ := json.Marshal(map[string]any{"model": testModel, "max_output_tokens": 1, "input": plain, "store": false})
	a, _ := usage(post(t, e.URL()+"/v1/responses", string(with), nil).body)
	b, _ := usage(post(t, e.URL()+"/v1/responses", string(without), nil).body)
	if a <= b+100 {
		t.Fatalf("the engine counts %d tokens with the tools and calls, %d without", a, b)
	}
}

// asChat is a Messages body as the chat request vLLM converts it to (its
// inline system messages placed as mode says), one output token.
func asChat(t *testing.T, body []byte, mode openai.InlineSystem) string {
	t.Helper()
	parsed, err := openai.ParseMessagesAs(body, mode)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []json.RawMessage
	for _, m := range parsed.Messages {
		msgs = append(msgs, m.Raw)
	}
	chat, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 1, "messages": msgs, "tools": parsed.Tools})
	return string(chat)
}

// inlineSystemClaims runs three turns of a Claude-Code-shaped
// conversation (a new system reminder inside messages every turn)
// through a gateway whose tokenizer places inline system messages as
// gwMode says, to an engine that places them as engineMode says, and
// returns per turn what the gateway claimed cached on the turn's first
// send (first) and on its second (claimed), and what the engine found for
// the second (the same conversation as the chat request the engine
// converts it to: its Messages API reports no cache hits).
func inlineSystemClaims(t *testing.T, engineMode, gwMode openai.InlineSystem) (first, claimed, found []int) {
	e := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.InlineSystem = engineMode })
	cfg := Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}, Policy: "kvgate", BlockSize: 16,
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + e.URL() + ",inline_system=" + string(gwMode)}}
	g, url, _ := startGateway(t, cfg, Options{})
	waitSubscribed(t, g)
	msgs := []any{map[string]any{"role": "user", "content": prefix("task")}}
	for turn := range 3 {
		body, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 1, "system": prefix("claude"), "messages": msgs})
		for send := range 2 {
			waitIndexed(t, g, e)
			r := post(t, url+"/v1/messages", string(body), nil)
			if r.status != 200 {
				t.Fatalf("turn %d: %d %s", turn, r.status, r.body)
			}
			n, _ := strconv.Atoi(r.header.Get(hdrCached))
			if send == 0 {
				first = append(first, n)
			} else {
				claimed = append(claimed, n)
			}
		}
		waitIndexed(t, g, e)
		c := post(t, e.URL()+"/v1/chat/completions", asChat(t, body, engineMode), nil)
		n, ok := usageCached([]byte(c.body))
		if c.status != 200 || !ok {
			t.Fatalf("turn %d: as chat %d %s", turn, c.status, c.body)
		}
		found = append(found, n)
		msgs = append(msgs, map[string]any{"role": "assistant", "content": prefix("answer" + strconv.Itoa(turn))},
			map[string]any{"role": "system", "content": "<system-reminder>" + strconv.Itoa(1000-turn) + " tokens left</system-reminder>"},
			map[string]any{"role": "user", "content": "go on " + strconv.Itoa(turn)})
	}
	return first, claimed, found
}

// TestMessagesInlineSystemKeyed: with its tokenizer told where the
// engines put inline system messages (inline_system=), the gateway claims
// cached what the engine finds, turn after turn, for each of vLLM's
// placements; told otherwise (preserve, against an engine that folds),
// its claims part from the engine's cache.
func TestMessagesInlineSystemKeyed(t *testing.T) {
	for _, mode := range []openai.InlineSystem{openai.InlinePreserve, openai.InlineFold, openai.InlineHoist} {
		first, claimed, found := inlineSystemClaims(t, mode, mode)
		t.Logf("%s: a turn's first send claimed %v cached; its second %v, the engine found %v", mode, first, claimed, found)
		for turn := range found {
			if claimed[turn] != found[turn] || turn > 0 && mode != openai.InlineHoist && found[turn] < found[turn-1] {
				t.Errorf("%s: turn %d claimed %d cached, the engine found %d (all: %v, %v)", mode, turn, claimed[turn], found[turn], claimed, found)
			}
		}
	}
	_, claimed, found := inlineSystemClaims(t, openai.InlineFold, openai.InlinePreserve)
	t.Logf("preserve against fold: claimed %v, found %v", claimed, found)
	if claimed[2] == found[2] {
		t.Errorf("a gateway preserving against an engine folding claimed what the engine found: %v, %v", claimed, found)
	}
}

// TestMessagesInlineSystemAuto: with the placement left to auto, a model
// whose engine refuses a system message in place (as Qwen 3.5's template
// does) has its Messages requests tokenized with them folded from the
// first refusal on, as vLLM's auto probe decides: the request is served,
// the engine asked about the in-place conversation once, and the
// gateway's claims are what the (folding) engine finds.
func TestMessagesInlineSystemAuto(t *testing.T) {
	e := startEngine(t, fleet.RoleBoth, func(c *engine.Config) { c.InlineSystem = openai.InlineFold })
	var refused atomic.Int64
	tok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct{ Messages []struct{ Role string } }
		_ = json.Unmarshal(body, &req)
		for i, m := range req.Messages {
			if i > 0 && m.Role == "system" {
				refused.Add(1)
				http.Error(w, `{"error":"System message must be at the beginning."}`, http.StatusBadRequest)
				return
			}
		}
		resp, err := http.Post(e.URL()+"/tokenize", "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(tok.Close)
	cfg := Config{Endpoints: []fleet.Endpoint{endpointOf(e, fleet.RoleBoth)}, Policy: "kvgate", BlockSize: 16,
		Tokenizers: []string{"model=" + testModel + ",source=engine,url=" + tok.URL}}
	g, url, _ := startGateway(t, cfg, Options{})
	waitSubscribed(t, g)
	msgs := []any{map[string]any{"role": "user", "content": prefix("task")}, map[string]any{"role": "assistant", "content": prefix("answer")},
		map[string]any{"role": "system", "content": "<system-reminder>999 tokens left</system-reminder>"}, map[string]any{"role": "user", "content": "go on"}}
	body, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 1, "system": prefix("claude"), "messages": msgs})
	var claimed int
	for range 2 {
		waitIndexed(t, g, e)
		r := post(t, url+"/v1/messages", string(body), nil)
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		claimed, _ = strconv.Atoi(r.header.Get(hdrCached))
	}
	if mode := g.toks.For(testModel).InlineSystem(); mode != openai.InlineFold || refused.Load() != 1 {
		t.Fatalf("placement %s after %d refusals, want fold after one", mode, refused.Load())
	}
	waitIndexed(t, g, e)
	c := post(t, e.URL()+"/v1/chat/completions", asChat(t, body, openai.InlineFold), nil)
	found, ok := usageCached([]byte(c.body))
	if !ok || claimed != found || found == 0 {
		t.Fatalf("claimed %d cached, the engine found %d (%s)", claimed, found, c.body)
	}
}
