package tokens_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/kvgate/kvgate/internal/engine"
	"github.com/kvgate/kvgate/internal/engine/enginetest"
	"github.com/kvgate/kvgate/internal/tokens"
)

// TestChatModesAgainstEngine: for add_generation_prompt false and
// continue_final_message, the gateway's ids of a conversation are the
// engine emulator's own (its /tokenize), whether the engine renders the
// conversation (exact chat) or the gateway renders it with the built-in
// template and tokenizes its segments.
func TestChatModesAgainstEngine(t *testing.T) {
	e := enginetest.Start(t, 1, func(c *engine.Config) {
		c.LoRAModules = []string{"exact", "segments"} // names the engine answers to, one per way of tokenizing
	})
	no := false
	set, err := tokens.NewSet([]tokens.Spec{
		{Model: "exact", Source: "engine", URL: e.URL()},
		{Model: "segments", Source: "engine", URL: e.URL(), ExactChat: &no},
	}, tokens.NewCache(0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []tokens.Message{tokens.TextMessage("system", "You answer in verse."),
		tokens.TextMessage("user", "Tell me of the sea"), tokens.TextMessage("assistant", "The sea is wide and")}
	want := map[tokens.ChatMode]string{
		tokens.ChatGenerate: engine.RenderChat([]engine.ChatMessage{{Role: "system", Content: "You answer in verse."}, {Role: "user", Content: "Tell me of the sea"}, {Role: "assistant", Content: "The sea is wide and"}}, true),
		tokens.ChatNoPrompt: engine.RenderChat([]engine.ChatMessage{{Role: "system", Content: "You answer in verse."}, {Role: "user", Content: "Tell me of the sea"}, {Role: "assistant", Content: "The sea is wide and"}}, false),
		tokens.ChatContinue: "<|im_start|>system\nYou answer in verse.<|im_end|>\n<|im_start|>user\nTell me of the sea<|im_end|>\n<|im_start|>assistant\nThe sea is wide and",
	}
	for mode, text := range want {
		for _, model := range []string{"exact", "segments"} {
			ids, err := set.For(model).ChatAs(context.Background(), msgs, tokens.ChatOptions{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			if w := engine.Tokenize(text); !reflect.DeepEqual(ids, w) {
				t.Errorf("%s, mode %d: %d ids, want the engine's %d", model, mode, len(ids), len(w))
			}
		}
	}
}
