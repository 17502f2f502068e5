package tokens

import (
	"encoding/json"
	"testing"
)

// toolsTemplate renders tools and tool calls as Qwen's templates do (in
// short): the tools after the system prompt, one tojson line each, an
// assistant's tool calls after its content, and chat_template_kwargs'
// enable_thinking.
const toolsTemplate = `{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}
{{- messages[0].content + '\n\n' }}
{%- endif %}
{{- '# Tools\n<tools>' }}
{%- for tool in tools %}
{{- '\n' }}{{- tool | tojson }}
{%- endfor %}
{{- '\n</tools><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if not (tools and loop.first and message.role == 'system') %}
{{- '<|im_start|>' + message.role + '\n' + message.content }}
{%- for tc in message.tool_calls or [] %}
{{- '\n<tool_call>\n{"name": "' + tc.function.name + '", "arguments": ' }}{{- tc.function.arguments | tojson }}{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and not enable_thinking %}
{{- '<think>\n\n</think>\n\n' }}
{%- endif %}
{%- endif %}`

// TestRenderChatTools: a model's own template is given the request's
// tools as vLLM gives them (each tool's type and function first; the
// function's name, description and parameters first, null when absent,
// then its other members in the order sent: tojson writes them as
// Python's json.dumps would), every message as the client sent it (its
// tool calls), and chat_template_kwargs as variables.
func TestRenderChatTools(t *testing.T) {
	ct, err := NewChatTemplate(toolsTemplate, nil)
	if err != nil {
		t.Fatal(err)
	}
	call := json.RawMessage(`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\": \"a.go\"}"}}]}`)
	msgs := []Message{TextMessage("system", "Be terse."), TextMessage("user", "read a.go"), ObjectMessage("assistant", "", call),
		ObjectMessage("tool", "package a", json.RawMessage(`{"role":"tool","tool_call_id":"c1","content":"package a"}`))}
	tools := json.RawMessage(`[{"function":{"name":"read_file","parameters":{"type":"object","properties":{"path":{"type":"string"}}},"strict":true},"type":"function"}]`)
	got, err := ct.RenderChat(msgs, ChatOptions{Mode: ChatGenerate, Tools: tools, Kwargs: json.RawMessage(`{"enable_thinking":false}`)})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nBe terse.\n\n# Tools\n<tools>\n" +
		`{"type": "function", "function": {"name": "read_file", "description": null, "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}, "strict": true}}` +
		"\n</tools><|im_end|>\n<|im_start|>user\nread a.go<|im_end|>\n<|im_start|>assistant\n\n<tool_call>\n" +
		`{"name": "read_file", "arguments": {"path": "a.go"}}` +
		"\n</tool_call><|im_end|>\n<|im_start|>tool\npackage a<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	if got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
	// Without tools or kwargs the same template renders the plain chat.
	plain, err := ct.Render(msgs[:2], true)
	if err != nil || plain != "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nread a.go<|im_end|>\n<|im_start|>assistant\n" {
		t.Fatalf("%q %v", plain, err)
	}
	// Malformed tools or kwargs (which the engine refuses itself) are
	// left out: the request is still rendered, and routed on it.
	without, _ := ct.RenderChat(msgs, ChatOptions{Mode: ChatGenerate})
	for _, bad := range []ChatOptions{{Tools: json.RawMessage(`{}`)}, {Tools: json.RawMessage(`[5]`)}, {Tools: json.RawMessage(`[{"type":"function"}]`)}, {Kwargs: json.RawMessage(`[1]`)}} {
		bad.Mode = ChatGenerate
		if got, err := ct.RenderChat(msgs, bad); err != nil || got != without {
			t.Errorf("%s %s: %v, or not rendered without them", bad.Tools, bad.Kwargs, err)
		}
	}
}

// TestConversationKeysTools: the cache of exact conversations keys the
// tools, the kwargs and each message as sent, so a conversation with
// other tools or other tool calls is never served another's ids.
func TestConversationKeysTools(t *testing.T) {
	tk := &Tokenizer{}
	msgs := []Message{TextMessage("user", "q"), ObjectMessage("assistant", "", json.RawMessage(`{"role":"assistant","tool_calls":[{"function":{"name":"a"}}]}`))}
	other := []Message{msgs[0], ObjectMessage("assistant", "", json.RawMessage(`{"role":"assistant","tool_calls":[{"function":{"name":"b"}}]}`))}
	base := tk.conversationKeys(msgs, ChatOptions{})
	for name, k := range map[string][]uint64{
		"tools":      tk.conversationKeys(msgs, ChatOptions{Tools: json.RawMessage(`[{"function":{"name":"f"}}]`)}),
		"kwargs":     tk.conversationKeys(msgs, ChatOptions{Kwargs: json.RawMessage(`{"enable_thinking":false}`)}),
		"tool calls": tk.conversationKeys(other, ChatOptions{}),
	} {
		if k[len(k)-1] == base[len(base)-1] {
			t.Errorf("%s: the same key", name)
		}
	}
	if again := tk.conversationKeys(msgs, ChatOptions{}); again[2] != base[2] || base[1] != tk.conversationKeys(other, ChatOptions{})[1] {
		t.Error("keys not stable, or a shared first message keyed apart")
	}
}

// TestEachOtherMember: a message object's members but role and content,
// in order, its values whole (strings with quotes, braces and escapes,
// nesting, white space), its keys unescaped.
func TestEachOtherMember(t *testing.T) {
	obj := ` { "role" : "assistant", "content":"a \"}{\" \\ b", "tool_calls" : [{"function":{"name":"f","arguments":"{\"x\": [1, {}]}"}}],` +
		` "n\u0061me":"x", "k": 1.5e3 , "z":null, "b":true }`
	var got []string
	eachOtherMember([]byte(obj), func(key string, v []byte) { got = append(got, key+"="+string(v)) })
	want := []string{`tool_calls=[{"function":{"name":"f","arguments":"{\"x\": [1, {}]}"}}]`, `name="x"`, `k=1.5e3`, `z=null`, `b=true`}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("member %d: %q, want %q", i, got[i], want[i])
		}
	}
	for _, none := range []string{``, `[]`, `"x"`, `{}`, `{"role":"user","content":"q"}`} {
		eachOtherMember([]byte(none), func(key string, _ []byte) { t.Errorf("%q: member %q", none, key) })
	}
}

func FuzzEachOtherMember(f *testing.F) {
	f.Add([]byte(`{"role":"a","content":"b","tool_calls":[{"x":"}"}],"n":1}`))
	f.Add([]byte(`{"k`))
	f.Fuzz(func(t *testing.T, obj []byte) {
		eachOtherMember(obj, func(key string, v []byte) {
			if json.Valid(obj) && !json.Valid(v) {
				t.Fatalf("%q: member %q = %q is not JSON", obj, key, v)
			}
		})
	})
}

// TestRenderChatReasoning: an assistant message's reasoning reaches the
// template under both names, as vLLM gives it (Qwen's templates read
// reasoning_content, newer ones reasoning); the older name alone counts
// as the newer, which wins over it; another role's is left as sent.
func TestRenderChatReasoning(t *testing.T) {
	ct, err := NewChatTemplate(`{% for m in messages %}{{ m.role }}:`+
		`{% if m.reasoning is defined %}{{ m.reasoning }}{% else %}-{% endif %}/`+
		`{% if m.reasoning_content is defined %}{{ m.reasoning_content }}{% else %}-{% endif %};{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	obj := func(role, members string) Message {
		return ObjectMessage(role, "x", json.RawMessage(`{"role":"`+role+`","content":"x"`+members+`}`))
	}
	msgs := []Message{
		obj("assistant", `,"reasoning":"r1"`),
		obj("assistant", `,"reasoning_content":"r2"`),
		obj("assistant", `,"reasoning":null,"reasoning_content":"r3"`),
		obj("assistant", `,"reasoning":"r4","reasoning_content":"old"`),
		obj("assistant", ``),
		obj("user", `,"reasoning":"u"`),
	}
	got, err := ct.RenderChat(msgs, ChatOptions{Mode: ChatNoPrompt})
	if err != nil {
		t.Fatal(err)
	}
	if want := "assistant:r1/r1;assistant:r2/r2;assistant:r3/r3;assistant:r4/r4;assistant:-/-;user:u/-;"; got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}
