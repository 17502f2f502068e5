package tokens

import (
	"context"
	"errors"
	"fmt"
)

// DefaultBlockSize is vLLM's default KV block size in tokens, and the
// default block size of kvgate's router keys wherever one is not given
// (the gateway, kvindex, the engine emulator). The simulator's baseline
// scenario (seed-routing) uses the baseline chapter's 64.
const DefaultBlockSize = 16

// Input is a request's prompt in one of the three forms an OpenAI-style
// request carries it: completion text, chat messages, or token ids.
// Exactly one must be set.
type Input struct {
	Prompt   *string
	Messages []Message
	TokenIDs []uint32
	// LoRA is the adapter the request is served with ("" for the base
	// model); it is mixed into every block key.
	LoRA string
	// NoSpecialTokens: Prompt is tokenized without the tokenizer's
	// special tokens (a request's add_special_tokens: false); by default
	// with them, as engines tokenize a completion's prompt.
	NoSpecialTokens bool
	// Chat is how Messages' prompt ends (add_generation_prompt,
	// continue_final_message) and the tools and template kwargs it is
	// rendered with.
	Chat ChatOptions
}

// Prepared is a request's token ids and the chained keys of its full
// blocks.
type Prepared struct {
	Tokens []uint32
	Keys   []BlockKey
	// EngineIDs: Tokens are the engine's own ids (given by the client, or
	// from the model's real tokenizer and, for a conversation, its own
	// chat template), so a request of these ids finds the blocks this
	// request leaves cached; not so with the estimate.
	EngineIDs bool
	// Alternative: the conversation was refused and Tokens are its
	// Input.Chat.Alternative rendering's.
	Alternative bool
}

// ErrNoInput is returned when an Input holds none or more than one form.
var ErrNoInput = errors.New(`give exactly one of "prompt", "messages" or token ids`)

// Prepare is the one way from a request's prompt to its block keys: the
// model's tokenizer (token ids are taken as given), then chained keys at
// blockSize tokens per block. Every caller that needs block keys (the
// gateway, the kvindex admin API) goes through it, so they agree.
func (s *Set) Prepare(ctx context.Context, model string, in Input, blockSize int) (Prepared, error) {
	if blockSize <= 0 {
		return Prepared{}, fmt.Errorf("tokens: block size %d must be > 0", blockSize)
	}
	given := 0
	for _, set := range []bool{in.Prompt != nil, in.Messages != nil, in.TokenIDs != nil} {
		if set {
			given++
		}
	}
	if given != 1 {
		return Prepared{}, ErrNoInput
	}
	ids, engine, alt := in.TokenIDs, true, false
	if ids == nil {
		tk := s.For(model)
		var err error
		if in.Prompt != nil {
			ids, err = tk.PromptAs(ctx, *in.Prompt, !in.NoSpecialTokens)
		} else {
			ids, alt, err = tk.chatAs(ctx, in.Messages, in.Chat)
		}
		engine = tk.engineIDs(in.Prompt == nil)
		if err != nil {
			return Prepared{}, fmt.Errorf("tokenize: %w", err)
		}
	}
	return Prepared{Tokens: ids, Keys: NewHasher(blockSize).Keys(ids, LoRAExtra(in.LoRA)), EngineIDs: engine, Alternative: alt}, nil
}
