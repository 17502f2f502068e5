package engine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request) {
	e.serveGeneration(w, r, false)
}

func (e *Engine) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	e.serveGeneration(w, r, true)
}

// naturalLength is the output length of a request without max_tokens: a
// deterministic 16..256 tokens derived from the prompt, ending with "EOS".
func naturalLength(prompt []uint32) int {
	h := uint32(2166136261)
	for _, t := range prompt[max(0, len(prompt)-64):] {
		h = (h ^ t) * 16777619
	}
	return 16 + int(h%241)
}

// buildRequest validates a generation request and turns it into an engine
// request.
func (e *Engine) buildRequest(r *http.Request, chat bool, role Role) (*request, *genRequest, error) {
	var req genRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, nil, err
	}
	if err := e.checkModel(req.Model); err != nil {
		return nil, nil, err
	}
	var toks []uint32
	if chat {
		if req.Messages == nil {
			return nil, nil, errBad("messages is required")
		}
		text, err := chatPrompt(req.Messages, req.AddGenerationPrompt)
		if err != nil {
			return nil, nil, err
		}
		toks = Tokenize(text)
	} else {
		var err error
		if toks, err = promptTokens(req.Prompt); err != nil {
			return nil, nil, err
		}
	}
	if len(toks) == 0 {
		return nil, nil, errBad("the prompt is empty")
	}
	if req.N != nil && *req.N != 1 {
		return nil, nil, errBad("n=%d is not supported; only n=1", *req.N)
	}
	mode, rp, err := parseKVTransferParams(req.KVTransferParams)
	if err != nil {
		return nil, nil, errBad("%v", err)
	}
	switch {
	case mode == kvRemoteDecode && role == RoleDecode:
		return nil, nil, errBad("kv_transfer_params.do_remote_decode=true needs a prefill engine; this engine's role is decode")
	case mode == kvRemotePrefill && role == RolePrefill:
		return nil, nil, errBad("kv_transfer_params.do_remote_prefill=true needs a decode engine; this engine's role is prefill")
	}

	p := len(toks)
	mt := req.MaxTokens
	if chat && req.MaxCompletionTokens != nil {
		mt = req.MaxCompletionTokens
	}
	var maxTokens int
	natural := false
	switch {
	case mode == kvRemoteDecode:
		maxTokens = 1 // the prefill leg samples one token, as vLLM does
	case mt != nil:
		if *mt < 1 {
			return nil, nil, errBad("max_tokens must be at least 1, got %d", *mt)
		}
		maxTokens = *mt
		if req.MinTokens != nil && *req.MinTokens > maxTokens {
			return nil, nil, errBad("min_tokens (%d) must be less than or equal to max_tokens (%d)", *req.MinTokens, maxTokens)
		}
	case req.IgnoreEOS:
		maxTokens = e.cfg.MaxModelLen - p
	default:
		natural = true
		maxTokens = naturalLength(toks)
		if req.MinTokens != nil && *req.MinTokens > maxTokens {
			maxTokens = *req.MinTokens
		}
		maxTokens = min(maxTokens, e.cfg.MaxModelLen-p)
	}
	if p+maxTokens > e.cfg.MaxModelLen || maxTokens < 1 {
		return nil, nil, errBad("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.",
			e.cfg.MaxModelLen, p+maxTokens, p, maxTokens)
	}
	if need := (p + maxTokens + e.cfg.BlockSize - 1) / e.cfg.BlockSize; need > e.cfg.NumGPUBlocks {
		return nil, nil, errBad("request needs %d KV blocks (%d prompt + %d output tokens) but the engine has %d blocks of %d tokens",
			need, p, maxTokens, e.cfg.NumGPUBlocks, e.cfg.BlockSize)
	}

	base := r.Header.Get("X-Request-Id")
	if base == "" {
		base = fmt.Sprintf("%016x", uint64(time.Now().UnixNano())^e.reqSeq.Add(1)<<48)
	}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	rq := &request{
		id:            prefix + base,
		arrival:       time.Now(),
		tokens:        toks,
		promptLen:     p,
		maxTokens:     maxTokens,
		naturalEnd:    natural,
		seed:          toks[p-1],
		stream:        req.Stream,
		remotePrefill: rp,
		remoteDecode:  mode == kvRemoteDecode,
		notify:        make(chan struct{}, 1),
	}
	if req.CacheSalt != "" {
		rq.extra = []byte(req.CacheSalt)
	}
	return rq, &req, nil
}

func (e *Engine) serveGeneration(w http.ResponseWriter, r *http.Request, chat bool) {
	role, err := e.admit()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	rq, req, err := e.buildRequest(r, chat, role)
	if err != nil {
		writeErr(w, err)
		return
	}
	if h := r.Header.Get("X-Request-Id"); h != "" {
		w.Header().Set("X-Request-Id", h)
	}
	// Re-check after parsing: a role switch may have started meanwhile.
	if _, err := e.admit(); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	e.sched.submit(rq)
	resp := newResponder(e.cfg.Model, rq, chat, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
	if req.Stream {
		e.stream(w, r, rq, resp)
		return
	}
	for {
		select {
		case <-r.Context().Done():
			e.sched.abort(rq)
			return
		case <-rq.notify:
		}
		if out := rq.snapshot(); out.done {
			if out.finishReason == finishAbort {
				return
			}
			writeJSON(w, http.StatusOK, resp.full(out))
			return
		}
	}
}

func (e *Engine) stream(w http.ResponseWriter, r *http.Request, rq *request, resp *responder) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		e.sched.abort(rq)
		return
	}
	sent := 0
	buf := make([]byte, 0, 1024)
	for {
		select {
		case <-r.Context().Done():
			e.sched.abort(rq)
			return
		case <-rq.notify:
		}
		out := rq.snapshot()
		if out.finishReason == finishAbort {
			return
		}
		buf = buf[:0]
		if sent == 0 && out.generated > 0 && resp.chat {
			buf = resp.roleChunk(buf)
		}
		for ; sent < out.generated; sent++ {
			last := out.done && sent == out.generated-1
			reason := ""
			if last {
				reason = out.finishReason
			}
			buf = resp.tokenChunk(buf, sent, reason)
		}
		if out.done {
			if resp.includeUsage {
				buf = resp.usageChunk(buf, out)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				e.sched.abort(rq)
				return
			}
			if err := rc.Flush(); err != nil {
				e.sched.abort(rq)
				return
			}
		}
		if out.done {
			return
		}
	}
}

// responder formats the answers of one request.
type responder struct {
	chat         bool
	includeUsage bool
	id, model    string
	created      int64
	rq           *request
	head         string // `data: {"id":...,"model":...,"choices":[{"index":0,`
}

func newResponder(model string, rq *request, chat, includeUsage bool) *responder {
	s := &responder{chat: chat, includeUsage: includeUsage, id: rq.id, model: model, created: time.Now().Unix(), rq: rq}
	obj := "text_completion"
	if chat {
		obj = "chat.completion.chunk"
	}
	id, _ := json.Marshal(s.id)
	m, _ := json.Marshal(model)
	s.head = `data: {"id":` + string(id) + `,"object":"` + obj + `","created":` + strconv.FormatInt(s.created, 10) + `,"model":` + string(m) + `,"choices":[`
	return s
}

func (s *responder) roleChunk(b []byte) []byte {
	b = append(b, s.head...)
	return append(b, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
}

// tokenChunk appends the SSE chunk of output token i (filler words are
// plain ASCII letters, so they need no JSON escaping).
func (s *responder) tokenChunk(b []byte, i int, reason string) []byte {
	b = append(b, s.head...)
	if s.chat {
		b = append(b, `{"index":0,"delta":{"content":"`...)
	} else {
		b = append(b, `{"index":0,"text":"`...)
	}
	if i > 0 {
		b = append(b, ' ')
	}
	b = append(b, fillerWords[fillerIndex(s.rq.seed, i)]...)
	if s.chat {
		b = append(b, `"},"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `","logprobs":null,"finish_reason":`...)
	}
	if reason == "" {
		b = append(b, "null"...)
	} else {
		b = append(b, '"')
		b = append(b, reason...)
		b = append(b, '"')
	}
	return append(b, `,"stop_reason":null}]}`+"\n\n"...)
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	TotalTokens         int `json:"total_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (s *responder) usage(out requestOutput) usage {
	u := usage{PromptTokens: s.rq.promptLen, CompletionTokens: out.generated, TotalTokens: s.rq.promptLen + out.generated}
	u.PromptTokensDetails.CachedTokens = out.cachedTokens
	return u
}

func (s *responder) usageChunk(b []byte, out requestOutput) []byte {
	u, _ := json.Marshal(s.usage(out))
	b = append(b, s.head...)
	b = append(b, `],"usage":`...)
	b = append(b, u...)
	return append(b, "}\n\n"...)
}

func (s *responder) text(n int) string {
	var b strings.Builder
	outputText(&b, s.rq.seed, 0, n)
	return b.String()
}

// full is the non-streaming answer.
func (s *responder) full(out requestOutput) any {
	u := s.usage(out)
	if s.chat {
		type message struct {
			Role      string `json:"role"`
			Content   string `json:"content"`
			ToolCalls []any  `json:"tool_calls"`
		}
		type choice struct {
			Index        int     `json:"index"`
			Message      message `json:"message"`
			Logprobs     any     `json:"logprobs"`
			FinishReason string  `json:"finish_reason"`
			StopReason   any     `json:"stop_reason"`
		}
		return struct {
			ID               string              `json:"id"`
			Object           string              `json:"object"`
			Created          int64               `json:"created"`
			Model            string              `json:"model"`
			Choices          []choice            `json:"choices"`
			Usage            usage               `json:"usage"`
			PromptLogprobs   any                 `json:"prompt_logprobs"`
			KVTransferParams *kvTransferResponse `json:"kv_transfer_params"`
		}{s.id, "chat.completion", s.created, s.model,
			[]choice{{Message: message{Role: "assistant", Content: s.text(out.generated), ToolCalls: []any{}}, FinishReason: out.finishReason}},
			u, nil, out.kvParams}
	}
	type choice struct {
		Index          int    `json:"index"`
		Text           string `json:"text"`
		Logprobs       any    `json:"logprobs"`
		FinishReason   string `json:"finish_reason"`
		StopReason     any    `json:"stop_reason"`
		PromptLogprobs any    `json:"prompt_logprobs"`
	}
	return struct {
		ID               string              `json:"id"`
		Object           string              `json:"object"`
		Created          int64               `json:"created"`
		Model            string              `json:"model"`
		Choices          []choice            `json:"choices"`
		Usage            usage               `json:"usage"`
		KVTransferParams *kvTransferResponse `json:"kv_transfer_params"`
	}{s.id, "text_completion", s.created, s.model,
		[]choice{{Text: s.text(out.generated), FinishReason: out.finishReason}},
		u, out.kvParams}
}
