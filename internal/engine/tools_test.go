package engine

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/openai"
)

// TestToolsRenderedFromValues: the emulated template renders tools and
// tool calls from their decoded values, as transformers' tojson does in
// vLLM, not from the bytes sent: the same tools with other escapes (Go's
// \u003c, \/, \u00e9) and other white space render the same prompt, the
// members in their order and numbers as written.
func TestToolsRenderedFromValues(t *testing.T) {
	body := func(tools, call string) string {
		return `{"model":"m","messages":[{"role":"user","content":"q"},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":` + call + `}]}],"tools":` + tools + `}`
	}
	plain := body(`[{"type":"function","function":{"name":"a<b","description":"x/y é & z","parameters":{"n":1.50,"z":[true,null]}}}]`,
		`{"name":"a<b","arguments":"{\"p\": \"<x>\"}"}`)
	escaped := body(`[ {"type" : "function", "function":{"name":"a\u003cb","description":"x\/y \u00e9 \u0026 z","parameters":{"n":1.50, "z":[ true, null ]}}}]`,
		`{"name": "a\u003cb", "arguments": "{\"p\": \"\u003cx\u003e\"}"}`)
	var prompts []string
	for _, b := range []string{plain, escaped} {
		req, err := openai.ParseRequest([]byte(b))
		if err != nil {
			t.Fatal(err)
		}
		p, err := chatPrompt(req)
		if err != nil {
			t.Fatal(err)
		}
		prompts = append(prompts, p)
	}
	if prompts[0] != prompts[1] {
		t.Fatalf("escapes change the prompt:\n%q\n%q", prompts[0], prompts[1])
	}
	for _, want := range []string{`{"type":"function","function":{"name":"a<b","description":"x/y é & z","parameters":{"n":1.50,"z":[true,null]}}}`,
		`<tool_call>` + "\n" + `{"name":"a<b","arguments":"{\"p\": \"<x>\"}"}`} {
		if !strings.Contains(prompts[0], want) {
			t.Errorf("prompt lacks %s:\n%s", want, prompts[0])
		}
	}
}
