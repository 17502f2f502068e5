package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"

	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/tokens"
)

// Body caps: without --max-body-bytes the engine accepts bodies up to
// bodyBytesPerToken bytes per token of MaxModelLen plus bodySlack, and at
// least minBodyCap. A token costs at most about 7 bytes as an id ("149999,")
// and typically 4 as text; 64 leaves room for JSON escapes, chat messages
// and white space.
const (
	bodyBytesPerToken = 64
	bodySlack         = 1 << 20
	minBodyCap        = 1 << 20
)

// defaultBodyCap is the body cap derived from the model length.
func defaultBodyCap(maxModelLen int) int64 {
	return max(minBodyCap, int64(maxModelLen)*bodyBytesPerToken+bodySlack)
}

// readBody reads a request body under the engine's cap; release frees its
// large-body slot once the body has been made into tokens.
func (e *Engine) readBody(w http.ResponseWriter, r *http.Request) ([]byte, func(), error) {
	return e.bodies.Read(w, r)
}

// decodeObject reads a small admin body (one JSON object) into v.
func (e *Engine) decodeObject(w http.ResponseWriter, r *http.Request, v any) error {
	body, release, err := e.readBody(w, r)
	defer release()
	if err != nil {
		return err
	}
	return openai.DecodeObject(body, v)
}

// checkModel finds the model a request names: the base model ("" or its
// name: lora 0), or a LoRA adapter (lora its place in LoRAModules from 1,
// vLLM's lora_int_id).
func (e *Engine) checkModel(model string) (lora int, err error) {
	if model == "" || model == e.cfg.Model {
		return 0, nil
	}
	if i := slices.Index(e.cfg.LoRAModules, model); i >= 0 {
		return i + 1, nil
	}
	return 0, openai.NotFound("The model `%s` does not exist.", model).WithParam("model")
}

// chatPrompt renders a chat request's messages through the chat template,
// with its tools (toolsText) and each assistant message's tool calls
// (toolCallsText), as a model's template renders them. With
// continueFinal (vLLM's continue_final_message) the final message is left
// open, as vLLM leaves it: the template's text after its content is cut
// (tokens.ContinueCut: nothing, for an empty content), and no generation
// prompt follows.
func chatPrompt(req *openai.Request) (string, error) {
	msgs, addGen, continueFinal := req.Messages, req.AddGenerationPrompt, req.ContinueFinalMessage
	if err := openai.CheckMessages(msgs); err != nil {
		return "", err
	}
	cm := make([]ChatMessage, len(msgs))
	for i, m := range msgs {
		text, err := m.Content.Text()
		if err != nil {
			return "", openai.BadRequest("messages[%d].content: %v", i, err).WithParam("messages")
		}
		calls, err := toolCallsText(m)
		if err != nil {
			return "", openai.BadRequest("messages[%d].tool_calls: %v", i, err).WithParam("messages")
		}
		cm[i] = ChatMessage{Role: m.Role, Content: text + calls}
	}
	if tools, err := toolsText(req.Tools); err != nil {
		return "", openai.BadRequest("tools: %v", err).WithParam("tools")
	} else if tools != "" {
		if cm[0].Role == "system" {
			cm[0].Content += "\n\n" + tools
		} else {
			cm = append([]ChatMessage{{Role: "system", Content: tools}}, cm...)
		}
	}
	if continueFinal {
		return tokens.ContinueCut(RenderChat(cm, false), cm[len(cm)-1].Content), nil
	}
	return RenderChat(cm, addGen == nil || *addGen), nil
}

// vocabEnd is one past the largest token id of the emulated vocabulary.
const vocabEnd = firstTokenID + vocabSize

// promptTokens tokenizes a completion prompt: one string or one list of
// token ids (a batch of one is accepted). Token ids must be in the
// vocabulary, as vLLM requires.
func promptTokens(p openai.Prompt) ([]uint32, error) {
	if n := p.Len(); n > 1 {
		return nil, openai.BadRequest("batched prompts are not supported: send one prompt per request (got %d)", n).WithParam("prompt")
	}
	switch p.Kind {
	case openai.PromptText, openai.PromptTexts:
		return Tokenize(p.Texts[0]), nil
	case openai.PromptTokens, openai.PromptTokenLists:
		ids := p.Tokens[0]
		for _, id := range ids {
			if id >= vocabEnd {
				return nil, openai.BadRequest("Token id %d is out of vocabulary (vocabulary size %d)", id, vocabEnd).WithParam("prompt")
			}
		}
		return ids, nil
	}
	return nil, openai.BadRequest("prompt is required").WithParam("prompt")
}

// requestTokens are the prompt tokens of a parsed request: the rendered
// messages when given (chat, or /tokenize's chat form), else the prompt.
func (e *Engine) requestTokens(req *openai.Request) ([]uint32, error) {
	if req.Messages != nil {
		text, err := chatPrompt(req)
		if err != nil {
			return nil, err
		}
		return Tokenize(text), nil
	}
	ids, err := promptTokens(req.Prompt)
	if err == nil && e.cfg.BOS && (req.Prompt.Kind == openai.PromptText || req.Prompt.Kind == openai.PromptTexts) && !req.NoSpecialTokens() {
		ids = append([]uint32{bosTokenID}, ids...)
	}
	return ids, err
}

// bosTokenID is the BOS token Config.BOS adds (ids below firstTokenID
// are the special tokens').
const bosTokenID = 1

// counted reads a request to count (/tokenize, count_tokens): its body
// parsed by parse, its model this engine's, and its prompt's tokens.
func (e *Engine) counted(w http.ResponseWriter, r *http.Request, parse func([]byte) (*openai.Request, error)) ([]uint32, error) {
	body, release, err := e.readBody(w, r)
	defer release()
	if err != nil {
		return nil, err
	}
	req, err := parse(body)
	if err != nil {
		return nil, err
	}
	if _, err := e.checkModel(req.Model); err != nil {
		return nil, err
	}
	return e.requestTokens(req)
}

// tokenizeRequest parses a /tokenize body: a chat's messages, or a
// prompt (an empty text tokenizes to nothing, as vLLM's does).
func tokenizeRequest(body []byte) (*openai.Request, error) {
	req, err := openai.ParseRequest(body)
	if err == nil && req.Messages == nil && !(req.Prompt.Kind == openai.PromptText && req.Prompt.Texts[0] == "") {
		err = req.Prompt.Check()
	}
	return req, err
}

func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	toks, err := e.counted(w, r, tokenizeRequest)
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	if toks == nil {
		toks = []uint32{}
	}
	openai.WriteJSON(w, http.StatusOK, map[string]any{
		"count":         len(toks),
		"max_model_len": e.cfg.MaxModelLen,
		"tokens":        toks,
		"token_strs":    nil,
	})
}

// toolsText is the emulated template's rendering of a request's tools
// (as Qwen's templates put them into the system message): a "# Tools"
// header, then each tool's JSON, compacted, on a line of its own between
// <tools> tags ("": no tools).
func toolsText(tools json.RawMessage) (string, error) {
	if len(tools) == 0 {
		return "", nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(tools, &list); err != nil {
		return "", errors.New("must be a list of tools")
	}
	var b bytes.Buffer
	b.WriteString("# Tools\n<tools>")
	for _, t := range list {
		b.WriteByte('\n')
		if err := writeValue(&b, t); err != nil {
			return "", err
		}
	}
	b.WriteString("\n</tools>")
	return b.String(), nil
}

// writeValue writes the JSON value raw as a template renders it from the
// value decoded (transformers' tojson: Python's json.dumps of what the
// engine parsed), not from the bytes sent: compact, members in their
// order, numbers as written, strings encoded anew, so that an escape the
// sender chose (Go's \u003c for <, \/ for /) renders as the character
// it stands for, as it does in vLLM.
func writeValue(b *bytes.Buffer, raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	type frame struct {
		object bool
		n      int // tokens written inside it
	}
	var stack []frame
	str := json.NewEncoder(b)
	str.SetEscapeHTML(false)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			b.WriteByte(byte(d))
			continue
		}
		if n := len(stack); n > 0 {
			f := &stack[n-1]
			switch {
			case f.object && f.n%2 == 1:
				b.WriteByte(':')
			case f.n > 0:
				b.WriteByte(',')
			}
			f.n++
		}
		switch t := tok.(type) {
		case json.Delim:
			b.WriteByte(byte(t))
			stack = append(stack, frame{object: t == '{'})
		case string:
			_ = str.Encode(t)
			b.Truncate(b.Len() - 1) // the encoder's newline
		case json.Number:
			b.WriteString(string(t))
		case bool:
			b.WriteString(strconv.FormatBool(t))
		case nil:
			b.WriteString("null")
		}
	}
}

// toolCallsText is the emulated template's rendering of an assistant
// message's tool calls: each call's function, its JSON compacted,
// between <tool_call> tags after the content ("": none).
func toolCallsText(m openai.Message) (string, error) {
	if m.Role != "assistant" || !bytes.Contains(m.Raw, []byte(`"tool_calls"`)) {
		return "", nil // (most messages: not decoded again)
	}
	var msg struct {
		ToolCalls []struct {
			Function json.RawMessage `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(m.Raw, &msg); err != nil {
		return "", errors.New("must be a list of tool calls")
	}
	var b bytes.Buffer
	for _, c := range msg.ToolCalls {
		b.WriteString("\n<tool_call>\n")
		if len(c.Function) > 0 {
			if err := writeValue(&b, c.Function); err != nil {
				return "", err
			}
		}
		b.WriteString("\n</tool_call>")
	}
	return b.String(), nil
}
