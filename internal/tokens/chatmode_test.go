package tokens

import (
	"strings"
	"testing"
)

func TestSegmentsAs(t *testing.T) {
	msgs := []Message{TextMessage("user", "Hi"), TextMessage("assistant", "Hello the")}
	empty := []Message{TextMessage("user", "Hi"), TextMessage("assistant", "")}
	cases := []struct {
		tmpl string
		msgs []Message
		mode ChatMode
		want string
	}{
		{"chatml", msgs, ChatGenerate, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello the<|im_end|>\n<|im_start|>assistant\n"},
		{"chatml", msgs, ChatNoPrompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello the<|im_end|>\n"},
		{"chatml", msgs, ChatContinue, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello the"},
		// transformers cuts after the last occurrence of the final text:
		// an empty one occurs at the end, so nothing is cut.
		{"chatml", empty, ChatContinue, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"},
		{"llama3", msgs, ChatContinue, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello the"},
		{"llama3", msgs, ChatNoPrompt, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello the<|eot_id|>"},
	}
	for _, c := range cases {
		tm, err := LookupTemplate(c.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(tm.SegmentsAs(c.msgs, c.mode), ""); got != c.want {
			t.Errorf("%s mode %d: %q, want %q", c.tmpl, c.mode, got, c.want)
		}
	}
}

// A model's own Jinja template, continued, ends where the built-in
// template of the same shape does.
func TestJinjaContinue(t *testing.T) {
	const chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
	ct, err := NewChatTemplate(chatml, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{TextMessage("system", "Be brief."), TextMessage("user", "Hi"), TextMessage("assistant", "Sure, the")}
	tm, _ := LookupTemplate("chatml")
	for _, mode := range []ChatMode{ChatGenerate, ChatNoPrompt, ChatContinue} {
		text, err := ct.Render(msgs, mode == ChatGenerate)
		if err != nil {
			t.Fatal(err)
		}
		if mode == ChatContinue {
			text = ContinueCut(text, "Sure, the")
		}
		if want := strings.Join(tm.SegmentsAs(msgs, mode), ""); text != want {
			t.Errorf("mode %d: %q, want %q", mode, text, want)
		}
	}
}
