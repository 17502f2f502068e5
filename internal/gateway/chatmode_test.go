package gateway

import (
	"testing"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/tokens"
)

// The gateway tokenizes a conversation as the engine renders it: the
// request's add_generation_prompt and continue_final_message decide how
// its prompt ends.
func TestChatMode(t *testing.T) {
	cases := []struct {
		extra string
		want  tokens.ChatMode
	}{
		{``, tokens.ChatGenerate},
		{`,"add_generation_prompt":true`, tokens.ChatGenerate},
		{`,"add_generation_prompt":null`, tokens.ChatGenerate},
		{`,"add_generation_prompt":false`, tokens.ChatNoPrompt},
		{`,"continue_final_message":true,"add_generation_prompt":false`, tokens.ChatContinue},
		{`,"continue_final_message":true`, tokens.ChatContinue},
		{`,"continue_final_message":false,"add_generation_prompt":false`, tokens.ChatNoPrompt},
	}
	for _, c := range cases {
		req, err := openai.ParseRequest([]byte(`{"messages":[{"role":"user","content":"x"}]` + c.extra + `}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := chatMode(req); got != c.want {
			t.Errorf("%s: mode %d, want %d", c.extra, got, c.want)
		}
	}
}
