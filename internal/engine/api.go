package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 64 << 20

// genRequest is the union of the completion and chat request fields the
// emulator honours; unknown fields are ignored as vLLM does.
type genRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []rawMessage    `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	MinTokens           *int            `json:"min_tokens"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
	CacheSalt           string          `json:"cache_salt"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
}

type rawMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// badRequest is a client error with its HTTP status.
type badRequest struct {
	status int
	msg    string
}

func (b *badRequest) Error() string { return b.msg }

func errBad(format string, args ...any) error {
	return &badRequest{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func writeErr(w http.ResponseWriter, err error) {
	var br *badRequest
	if errors.As(err, &br) {
		writeError(w, br.status, br.msg)
		return
	}
	writeError(w, http.StatusInternalServerError, err.Error())
}

func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes))
	if err != nil {
		return errBad("cannot read request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return errBad("request body is empty; expected a JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return errBad("invalid JSON body: %v", err)
	}
	return nil
}

func (e *Engine) checkModel(model string) error {
	if model != "" && model != e.cfg.Model {
		return &badRequest{http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model)}
	}
	return nil
}

// messageText flattens a chat message content: a string, null or a list of
// parts of which the text parts are joined with newlines.
func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or a list of content parts")
	}
	var b strings.Builder
	for i, p := range parts {
		if p.Type != "text" && p.Type != "" {
			return "", fmt.Errorf("content part type %q is not supported (text only)", p.Type)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// chatPrompt renders messages through the chat template.
func chatPrompt(msgs []rawMessage, addGen *bool) (string, error) {
	if len(msgs) == 0 {
		return "", errBad("messages must be a non-empty list")
	}
	cm := make([]ChatMessage, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return "", errBad("messages[%d].role is required", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return "", errBad("messages[%d].content: %v", i, err)
		}
		cm[i] = ChatMessage{Role: m.Role, Content: text}
	}
	return RenderChat(cm, addGen == nil || *addGen), nil
}

// promptTokens tokenizes a completion prompt: a string, a list of one
// string, a list of token ids or a list of one list of token ids.
func promptTokens(raw json.RawMessage) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errBad("prompt is required")
	}
	if s, ok := plainJSONString(raw); ok {
		return Tokenize(s), nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return Tokenize(s), nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return nil, errBad("batched prompts are not supported: send one prompt per request (got %d)", len(ss))
		}
		return Tokenize(ss[0]), nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil {
		return ids, nil
	}
	var idss [][]uint32
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) != 1 {
			return nil, errBad("batched prompts are not supported: send one prompt per request (got %d)", len(idss))
		}
		return idss[0], nil
	}
	return nil, errBad("prompt must be a string, a list of one string or a list of token ids")
}

func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req genRequest
	if err := decodeBody(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if err := e.checkModel(req.Model); err != nil {
		writeErr(w, err)
		return
	}
	var toks []uint32
	var err error
	if req.Messages != nil {
		var text string
		text, err = chatPrompt(req.Messages, req.AddGenerationPrompt)
		toks = Tokenize(text)
	} else {
		toks, err = promptTokens(req.Prompt)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	if toks == nil {
		toks = []uint32{}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"count":         len(toks),
		"max_model_len": e.cfg.MaxModelLen,
		"tokens":        toks,
		"token_strs":    nil,
	})
}

// plainJSONString returns the contents of a JSON string literal without
// escapes or control characters (the common case for prompts) without a
// second pass of the JSON decoder.
func plainJSONString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	body := raw[1 : len(raw)-1]
	for _, c := range body {
		if c == '\\' || c == '"' || c < 0x20 {
			return "", false
		}
	}
	if !utf8.Valid(body) {
		return "", false
	}
	return string(body), true
}
