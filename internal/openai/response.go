package openai

// Usage is a response's token accounting.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// PromptTokensDetails is absent unless the engine reports cache hits
	// (vLLM with --enable-prompt-tokens-details).
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails reports prefix-cache hits.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// Completion is a non-streamed /v1/completions response.
type Completion struct {
	ID               string             `json:"id"`
	Object           string             `json:"object"` // "text_completion"
	Created          int64              `json:"created"`
	Model            string             `json:"model"`
	Choices          []CompletionChoice `json:"choices"`
	Usage            Usage              `json:"usage"`
	KVTransferParams *KVTransferAnswer  `json:"kv_transfer_params"`
}

// CompletionChoice is one choice of a Completion.
type CompletionChoice struct {
	Index          int    `json:"index"`
	Text           string `json:"text"`
	Logprobs       any    `json:"logprobs"`
	FinishReason   string `json:"finish_reason"`
	StopReason     any    `json:"stop_reason"`
	PromptLogprobs any    `json:"prompt_logprobs"`
}

// ChatCompletion is a non-streamed /v1/chat/completions response.
type ChatCompletion struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"` // "chat.completion"
	Created          int64             `json:"created"`
	Model            string            `json:"model"`
	Choices          []ChatChoice      `json:"choices"`
	Usage            Usage             `json:"usage"`
	PromptLogprobs   any               `json:"prompt_logprobs"`
	KVTransferParams *KVTransferAnswer `json:"kv_transfer_params"`
}

// ChatChoice is one choice of a ChatCompletion.
type ChatChoice struct {
	Index        int            `json:"index"`
	Message      ChatAnswerText `json:"message"`
	Logprobs     any            `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
	StopReason   any            `json:"stop_reason"`
}

// ChatAnswerText is the assistant message of a ChatChoice.
type ChatAnswerText struct {
	Role      string `json:"role"`
	Content   string `json:"content"`
	ToolCalls []any  `json:"tool_calls"`
}

// ModelList is the /v1/models response.
type ModelList struct {
	Object string  `json:"object"` // "list"
	Data   []Model `json:"data"`
}

// Model is one entry of ModelList.
type Model struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"` // "model"
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}
