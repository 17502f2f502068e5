package engine

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/openai"
)

func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request) {
	e.serveGeneration(w, r, apiCompletions)
}

// handleGenerate serves SGLang's native /generate (openai.ParseGenerate),
// answered as SGLang answers it: the text so far and meta_info.
func (e *Engine) handleGenerate(w http.ResponseWriter, r *http.Request) {
	e.serveGeneration(w, r, apiGenerate)
}

// api is the API a generation request came by.
type api uint8

const (
	apiCompletions api = iota
	apiChat
	apiGenerate
	apiResponses // the Responses API: a chat request in its envelope (responses.go)
	apiMessages  // the Anthropic Messages API: likewise (messages.go)
)

// chatLike: the API's prompt is chat messages.
func (a api) chatLike() bool { return a == apiChat || a == apiResponses || a == apiMessages }

func (e *Engine) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	e.serveGeneration(w, r, apiChat)
}

// vllmChecks refuses what vLLM's request models refuse beyond the
// shared parsing (which a gateway in front of other engines must not):
// stream_options without stream, and a chat's top_logprobs without
// logprobs true.
func vllmChecks(req *openai.Request, a api) error {
	if a != apiCompletions && a != apiChat {
		return nil
	}
	// vLLM's checks run on the raw body and test values for Python's
	// truth (data.get(...)): an empty stream_options, a top_logprobs of 0,
	// a logprobs of 1 pass them (they were refused here).
	if pyTruthy(req.Field("stream_options")) && !req.Stream {
		return openai.BadRequest("Stream options can only be defined when `stream=True`.").WithParam("stream_options")
	}
	if a == apiChat {
		var top float64
		if json.Unmarshal(req.Field("top_logprobs"), &top) == nil && top > 0 && !pyTruthy(req.Field("logprobs")) {
			return openai.BadRequest("when using `top_logprobs`, `logprobs` must be set to true.").WithParam("top_logprobs")
		}
	}
	return nil
}

// pyTruthy is Python's truth of a JSON value (absent: false): null,
// false, 0, "", [] and {} are false.
func pyTruthy(v []byte) bool {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return false
	}
	switch string(v) {
	case "null", "false", `""`:
		return false
	}
	switch v[0] {
	case '[', '{':
		return len(bytes.TrimSpace(v[1:len(v)-1])) > 0
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var f float64
		return json.Unmarshal(v, &f) != nil || f != 0
	}
	return true
}

// completionsDefaultMaxTokens is vLLM's max_tokens of a completion that
// gives none.
const completionsDefaultMaxTokens = 16

// naturalLength is the output length of a request without max_tokens: a
// deterministic 16..256 tokens derived from the prompt, ending with "EOS".
func naturalLength(prompt []uint32) int {
	h := uint32(2166136261)
	for _, t := range prompt[max(0, len(prompt)-64):] {
		h = (h ^ t) * 16777619
	}
	return 16 + int(h%241)
}

// buildRequest validates a generation request body and turns it into an
// engine request.
func (e *Engine) buildRequest(r *http.Request, body []byte, a api, role fleet.Role) (*request, *openai.Request, error) {
	chat := a.chatLike()
	req, toks, lora, err := e.parseGeneration(body, a)
	if err != nil {
		return nil, nil, err
	}
	if a == apiGenerate && role != fleet.RoleBoth {
		return nil, nil, openai.BadRequest("the emulator serves /generate aggregated only (its P/D flow is vLLM's); this engine's role is %s", role)
	}
	if (a == apiResponses || a == apiMessages) && role != fleet.RoleBoth {
		return nil, nil, openai.BadRequest("the emulator serves %s aggregated only (vLLM's P/D flow runs completions); this engine's role is %s", r.URL.Path, role)
	}
	var echo requestEcho
	if a == apiResponses {
		if echo, err = echoOf(req.Raw); err != nil {
			return nil, nil, err
		}
	}
	kv, err := kvTransferFor(req, role)
	if err != nil {
		return nil, nil, err
	}
	remoteDecode := kv != nil && kv.DoRemoteDecode
	if a == apiCompletions && req.OutputLimit(false) == nil && !remoteDecode {
		// vLLM's completions default max_tokens to 16 (within the room
		// the prompt leaves); its chat runs to the end of the answer.
		// The emulator ran 16–256 tokens (walkthrough against vLLM's
		// source, 2026-12-04).
		n := min(completionsDefaultMaxTokens, max(int64(e.cfg.MaxModelLen)-int64(len(toks)), 1))
		req.MaxTokens = &n
	}
	if lim := req.OutputLimit(chat); a == apiGenerate && lim != nil && *lim <= 0 {
		// SGLang's own words and field; 0 (prefill only) is SGLang's but
		// not emulated (docs/engine.md, "Not emulated").
		const name = "sampling_params.max_new_tokens"
		if *lim < 0 {
			return nil, nil, openai.BadRequest("max_new_tokens must be at least 0, got %d", *lim).WithParam(name)
		}
		return nil, nil, openai.BadRequest("max_new_tokens 0 (a prefill-only request) is not emulated: kvgate engine answers at least one token").WithParam(name)
	}
	maxTokens, natural, err := e.outputLength(req, chat, toks, remoteDecode, a == apiMessages)
	if err != nil {
		return nil, nil, err
	}
	if a == apiGenerate && natural {
		maxTokens = min(maxTokens, openai.GenerateDefaultMaxNewTokens) // SGLang's default max_new_tokens
	}
	prio, err := e.priority(req)
	if err != nil {
		return nil, nil, err
	}
	rq := e.newRequest(r, req, chat, toks, maxTokens)
	rq.echo = echo
	if a == apiResponses {
		// vLLM's is resp_ and a random UUID, whatever X-Request-Id says:
		// a stored response is fetched, continued and cancelled by its id
		// alone, so an id from the header (the gateway's are sequential)
		// let one client read another's, and two with one header share
		// one.
		rq.id = "resp_" + randomHex(16)
	}
	rq.setCacheKey(lora, req.Model, req.CacheSalt)
	rq.priority = prio
	rq.naturalEnd = natural
	rq.continues = continuesText(req, chat)
	rq.remoteDecode = remoteDecode
	if kv != nil && kv.DoRemotePrefill {
		rq.remotePrefill = &remotePrefill{
			engineID: kv.RemoteEngineID, host: kv.RemoteHost, port: kv.RemotePort,
			blockIDs: kv.RemoteBlockIDs, requestID: kv.RemoteRequestID,
		}
	}
	return rq, req, nil
}

// continuesText reports whether the answer continues a word the request
// ends with: a chat's final message it continues (continue_final_message),
// or a completion's text prompt (a real tokenizer's next word token then
// starts with a space, as the gateway's migration relies on).
func continuesText(req *openai.Request, chat bool) bool {
	var t string
	switch {
	case chat && req.ContinueFinalMessage && len(req.Messages) > 0:
		var err error
		if t, err = req.Messages[len(req.Messages)-1].Content.Text(); err != nil {
			return false
		}
	case !chat && req.Prompt.Kind == openai.PromptText:
		t = req.Prompt.Texts[0]
	}
	if t == "" {
		return false
	}
	last := t[len(t)-1]
	return last != ' ' && last != '\n' && last != '\t'
}

// priority is req's priority: any 32-bit integer when the engine
// schedules by priority; otherwise only 0, as vLLM refuses any other
// without --scheduling-policy priority.
func (e *Engine) priority(req *openai.Request) (int, error) {
	if req.Priority == nil || *req.Priority == 0 {
		return 0, nil
	}
	p := *req.Priority
	if !e.cfg.PriorityScheduling {
		return 0, openai.BadRequest("got priority %d but priority scheduling is not enabled (kvgate engine --scheduling-policy priority)", p).WithParam("priority")
	}
	if p < math.MinInt32 || p > math.MaxInt32 {
		return 0, openai.BadRequest("priority must be in [%d, %d], got %d", math.MinInt32, math.MaxInt32, p).WithParam("priority")
	}
	return int(p), nil
}

// parseGeneration parses a completion or chat body for this engine's model
// and returns it with its prompt tokens (at least one) and its LoRA
// adapter (checkModel).
func (e *Engine) parseGeneration(body []byte, a api) (*openai.Request, []uint32, int, error) {
	parse := openai.ParseCompletion
	switch a {
	case apiChat:
		parse = openai.ParseChat
	case apiGenerate:
		parse = openai.ParseGenerate // its lora_path is its Model
	case apiResponses:
		parse = openai.ParseResponses
	case apiMessages:
		parse = func(b []byte) (*openai.Request, error) { return openai.ParseMessagesAs(b, e.inlineSystem()) }
	}
	req, err := parse(body)
	if err != nil {
		return nil, nil, 0, err
	}
	if err := vllmChecks(req, a); err != nil {
		return nil, nil, 0, err
	}
	if a == apiResponses {
		if err := e.continueResponse(req); err != nil {
			return nil, nil, 0, err
		}
	}
	lora, err := e.checkModel(req.Model)
	if err != nil {
		return nil, nil, 0, err
	}
	toks, err := e.requestTokens(req)
	if err != nil {
		return nil, nil, 0, err
	}
	if len(toks) == 0 {
		return nil, nil, 0, openai.BadRequest("prompt must not be empty: it has no tokens").WithParam("prompt")
	}
	if req.N != nil && *req.N != 1 {
		return nil, nil, 0, openai.BadRequest("n=%d is not supported; only n=1", *req.N).WithParam("n")
	}
	return req, toks, lora, nil
}

// kvTransferFor parses the request's kv_transfer_params (nil without them)
// and checks that an engine of this role can run its P/D leg.
func kvTransferFor(req *openai.Request, role fleet.Role) (*openai.KVTransferParams, error) {
	kv, err := openai.ParseKVTransferParams(req.KVTransferParams)
	if err != nil || kv == nil {
		return nil, err
	}
	switch {
	case kv.DoRemoteDecode && role == fleet.RoleDecode:
		return nil, openai.BadRequest("kv_transfer_params.do_remote_decode=true needs a prefill engine; this engine's role is decode")
	case kv.DoRemotePrefill && role == fleet.RolePrefill:
		return nil, openai.BadRequest("kv_transfer_params.do_remote_prefill=true needs a decode engine; this engine's role is prefill")
	}
	return kv, nil
}

// satAdd is a + b for non-negative a and b, saturating instead of
// overflowing (for messages only: checks never add client numbers).
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// outputLength decides how many tokens the request may generate and
// checks that prompt and output fit the model and the KV cache. Client
// numbers are compared, never added: max_tokens may be 2^63-1. With
// capOnly max_tokens is only a cap on the natural length (the Messages
// API requires it: Claude Code sends 32 000), though one that must fit
// beside the prompt as every max_tokens must, unless ignore_eos (which
// vLLM's Messages API does not read; kvgate bench sends it); otherwise
// the answer runs to it, which lets a benchmark set output lengths.
func (e *Engine) outputLength(req *openai.Request, chat bool, toks []uint32, remoteDecode, capOnly bool) (maxTokens int64, natural bool, err error) {
	p, limit := int64(len(toks)), int64(e.cfg.MaxModelLen)
	if req.MinTokens != nil && *req.MinTokens < 0 {
		return 0, false, openai.BadRequest("min_tokens must be at least 0, got %d", *req.MinTokens).WithParam("min_tokens")
	}
	room := limit - p // tokens left for the output; negative when the prompt alone is too long
	mt := req.OutputLimit(chat)
	switch {
	case remoteDecode:
		maxTokens = 1 // the prefill leg samples one token, as vLLM does
	case mt != nil:
		if *mt < 1 {
			return 0, false, openai.BadRequest("max_tokens must be at least 1, got %d", *mt).WithParam("max_tokens")
		}
		maxTokens = *mt
		// A cap still has to fit: vLLM's Messages API is its chat, whose
		// max_tokens beyond the room left by the prompt is a 400 (it
		// was served here, the cap cut to the room).
		if n := int64(naturalLength(toks)); capOnly && !req.IgnoreEOS && n <= maxTokens && maxTokens <= room {
			maxTokens, natural = n, true
		}
		if req.MinTokens != nil && *req.MinTokens > maxTokens {
			return 0, false, openai.BadRequest("min_tokens (%d) must be less than or equal to max_tokens (%d)", *req.MinTokens, maxTokens).WithParam("min_tokens")
		}
	case req.MinTokens != nil && *req.MinTokens > room:
		// max_tokens defaults to what the model has room for.
		return 0, false, openai.BadRequest("min_tokens (%d) must be less than or equal to max_tokens (%d, the room left by the prompt)", *req.MinTokens, max(room, 0)).WithParam("min_tokens")
	case req.IgnoreEOS:
		maxTokens = room
	default:
		natural = true
		maxTokens = int64(naturalLength(toks))
		if req.MinTokens != nil && *req.MinTokens > maxTokens {
			maxTokens = *req.MinTokens
		}
		maxTokens = min(maxTokens, room)
	}
	if maxTokens > room || maxTokens < 1 {
		return 0, false, openai.BadRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.",
			limit, satAdd(p, max(maxTokens, 0)), p, max(maxTokens, 0))
	}
	// p + maxTokens <= MaxModelLen from here on.
	bs := int64(e.cfg.BlockSize)
	if total := p + maxTokens; (total+bs-1)/bs > int64(e.cfg.NumGPUBlocks) {
		return 0, false, openai.BadRequest("request needs %d KV blocks (%d prompt + %d output tokens) but the engine has %d blocks of %d tokens",
			(total+bs-1)/bs, p, maxTokens, e.cfg.NumGPUBlocks, e.cfg.BlockSize)
	}
	return maxTokens, natural, nil
}

// newRequest builds the engine request of a validated generation request.
func (e *Engine) newRequest(r *http.Request, req *openai.Request, chat bool, toks []uint32, maxTokens int64) *request {
	base := r.Header.Get("X-Request-Id")
	if base == "" {
		base = fmt.Sprintf("%016x", uint64(time.Now().UnixNano())^e.reqSeq.Add(1)<<48)
	}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	rq := &request{
		id:        prefix + base,
		arrival:   time.Now(),
		tokens:    toks,
		promptLen: len(toks),
		maxTokens: int(maxTokens),
		seed:      toks[len(toks)-1],
		stream:    req.Stream,
		notify:    make(chan struct{}, 1),
	}
	return rq
}

func (e *Engine) serveGeneration(w http.ResponseWriter, r *http.Request, a api) {
	role, err := e.admit()
	if err != nil {
		openai.WriteError(w, openai.Unavailable(time.Second, "%v", err))
		return
	}
	body, release, err := e.readBody(w, r)
	if err != nil {
		release()
		openai.WriteError(w, err)
		return
	}
	rq, req, err := e.buildRequest(r, body, a, role)
	release() // the body is now tokens; its large-body slot is free
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	if h := r.Header.Get("X-Request-Id"); h != "" {
		w.Header().Set("X-Request-Id", h)
	}
	// Re-check after parsing: a role switch may have started meanwhile.
	if _, err := e.admit(); err != nil {
		openai.WriteError(w, openai.Unavailable(time.Second, "%v", err))
		return
	}
	e.sched.submit(rq)
	name := e.cfg.Model
	if rq.loraName != "" {
		name = rq.loraName // vLLM answers with the adapter's name
	}
	resp := newResponder(name, rq, a, req)
	resp.details = e.cfg.PromptTokensDetails
	if a == apiResponses {
		resp.responses = newResponsesState(req, rq.id, e.cfg.ResponsesStore, rq.echo)
	}
	if req.Stream {
		switch {
		case resp.responses != nil:
			e.streamResponses(w, r, rq, resp)
		case a == apiMessages:
			e.streamMessages(w, r, rq, resp)
		default:
			e.stream(w, r, rq, resp)
		}
		return
	}
	for {
		out, ok := e.wake(r, rq)
		if !ok {
			return
		}
		if out.done {
			if resp.responses != nil {
				text := resp.text(out.generated)
				o := resp.object(out, text)
				e.keep(resp, o, text)
				openai.WriteJSON(w, http.StatusOK, o)
				return
			}
			if a == apiMessages {
				openai.WriteJSON(w, http.StatusOK, resp.message(out, out.generated))
				return
			}
			openai.WriteJSON(w, http.StatusOK, resp.full(out))
			return
		}
	}
}

// stream streams rq's answer as completions, chat or /generate events.
func (e *Engine) stream(w http.ResponseWriter, r *http.Request, rq *request, resp *responder) {
	sent := 0
	e.sseStream(w, r, rq, nil, func(buf []byte, out requestOutput) []byte {
		if sent == 0 && out.generated > 0 && resp.chat {
			buf = resp.roleChunk(buf)
		}
		eachDelta(&sent, out.generated, e.cfg.StreamInterval, func(from, to int) {
			reason := ""
			if out.done && to == out.generated {
				reason = out.finishReason
			}
			if resp.generate {
				buf = resp.generateChunk(buf, from, to, reason, out)
			} else {
				buf = resp.tokenChunk(buf, from, to, reason)
			}
		})
		if out.done {
			if resp.includeUsage && !resp.generate {
				buf = resp.usageChunk(buf, out)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		return buf
	})
}

// eachDelta calls f with the token range [from, to) of each event that
// streams the tokens past *sent of the generated so far, and moves *sent
// past them: vLLM's --stream-interval N sends the tokens since its last
// event as one event (the first token at once); at 1, one event a
// token.
func eachDelta(sent *int, generated, interval int, f func(from, to int)) {
	step := 1
	if interval > 1 {
		step = generated - *sent
	}
	for *sent < generated {
		to := min(*sent+step, generated)
		f(*sent, to)
		*sent = to
	}
}

// wake waits for rq's next output: false when its client left (rq
// aborted) or the engine aborted it.
func (e *Engine) wake(r *http.Request, rq *request) (requestOutput, bool) {
	select {
	case <-r.Context().Done():
		e.sched.abort(rq)
		return requestOutput{}, false
	case <-rq.notify:
	}
	out := rq.snapshot()
	return out, out.finishReason != finishAbort
}

// sseStream runs one streamed answer of rq: the stream's headers and head
// (the events sent before the first token; nil: none) at once, then at
// each wake of rq what events appends for its output so far, until the
// answer is done; a client that leaves, or a write that fails, aborts
// rq.
func (e *Engine) sseStream(w http.ResponseWriter, r *http.Request, rq *request, head []byte, events func(b []byte, out requestOutput) []byte) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(b []byte) bool {
		if len(b) > 0 {
			if _, err := w.Write(b); err != nil {
				e.sched.abort(rq)
				return false
			}
		}
		if err := rc.Flush(); err != nil {
			e.sched.abort(rq)
			return false
		}
		return true
	}
	if !send(head) {
		return
	}
	buf := make([]byte, 0, 1024)
	for {
		out, ok := e.wake(r, rq)
		if !ok {
			return
		}
		buf = events(buf[:0], out)
		if len(buf) > 0 && !send(buf) {
			return
		}
		if out.done {
			return
		}
	}
}

// responder formats the answers of one request.
type responder struct {
	chat     bool
	generate bool // SGLang's /generate
	// generateBatch: /generate's prompt was a list (of one): answered
	// with a list; maxNew is its max_new_tokens, finish_reason's length.
	generateBatch bool
	maxNew        int64
	sofar         []byte // /generate: the text streamed so far
	includeUsage  bool
	// continuous: every event carries the usage so far
	// (continuous_usage_stats).
	continuous bool
	// responses: the Responses API's (nil: another API's).
	responses *responsesState
	id, model string
	created   int64
	rq        *request
	head      string // `data: {"id":...,"model":...,"choices":[{"index":0,`
	// details: usage reports prompt_tokens_details (vLLM's
	// --enable-prompt-tokens-details).
	details bool
}

func newResponder(model string, rq *request, a api, req *openai.Request) *responder {
	chat := a == apiChat
	s := &responder{chat: chat, generate: a == apiGenerate, id: rq.id, model: model, created: time.Now().Unix(), rq: rq}
	if s.generate {
		// SGLang answers a list of prompts, one included, with a list,
		// and names an answer by the request's rid when it gives one.
		s.generateBatch = req.Prompt.Kind == openai.PromptTexts || req.Prompt.Kind == openai.PromptTokenLists
		var rid string
		if json.Unmarshal(req.Field("rid"), &rid) == nil && rid != "" {
			s.id = rid
		}
		s.maxNew = int64(rq.maxTokens)
	}
	s.includeUsage, s.continuous = req.UsageEvents()
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
	b = append(b, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
	return s.end(b, 0)
}

// end closes an event whose choices end b, with the usage of the
// answer's first generated tokens when continuous (vLLM's
// continuous_usage_stats).
func (s *responder) end(b []byte, generated int) []byte {
	if s.continuous {
		// vLLM's usage in an event: the counts alone (its cache hits come
		// with the final usage only).
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(s.rq.promptLen), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(s.rq.promptLen+generated), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(generated), 10)
		b = append(b, '}')
	}
	return append(b, "}\n\n"...)
}

// tokenChunk appends the SSE chunk of output tokens [from, to) (filler
// words are plain ASCII letters, so they need no JSON escaping).
func (s *responder) tokenChunk(b []byte, from, to int, reason string) []byte {
	b = append(b, s.head...)
	if s.chat {
		b = append(b, `{"index":0,"delta":{"content":"`...)
	} else {
		b = append(b, `{"index":0,"text":"`...)
	}
	for i := from; i < to; i++ {
		if s.rq.spaceBefore(i) {
			b = append(b, ' ')
		}
		b = append(b, fillerWords[fillerIndex(s.rq.seed, i)]...)
	}
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
	b = append(b, `,"stop_reason":null}]`...)
	return s.end(b, to)
}

func (s *responder) usage(out requestOutput) openai.Usage {
	u := openai.Usage{PromptTokens: s.rq.promptLen, CompletionTokens: out.generated, TotalTokens: s.rq.promptLen + out.generated}
	// As vLLM: only with --enable-prompt-tokens-details, and a chat's
	// only when some were cached (the emulator always sent them until
	// 2026-12-04; a gateway tested on it met none from a default vLLM).
	if s.details && (!s.chat || out.cachedTokens > 0) {
		u.PromptTokensDetails = &openai.PromptTokensDetails{CachedTokens: out.cachedTokens}
	}
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
	outputText(&b, s.rq, 0, n)
	return b.String()
}

// generateAnswer is SGLang's /generate answer, and each of its streamed
// events (with the text so far).
type generateAnswer struct {
	Text     string       `json:"text"`
	MetaInfo generateMeta `json:"meta_info"`
}

type generateMeta struct {
	ID               string        `json:"id"`
	PromptTokens     int           `json:"prompt_tokens"`
	CompletionTokens int           `json:"completion_tokens"`
	CachedTokens     int           `json:"cached_tokens"`
	FinishReason     *finishReason `json:"finish_reason"`
}

// finishReason is SGLang's: a length stop says the length it stopped at.
type finishReason struct {
	Type   string `json:"type"`
	Length int64  `json:"length,omitempty"`
}

func (s *responder) generateMeta(n int, reason string, out requestOutput) generateMeta {
	m := generateMeta{ID: s.id, PromptTokens: s.rq.promptLen, CompletionTokens: n, CachedTokens: out.cachedTokens}
	if reason != "" {
		m.FinishReason = &finishReason{Type: reason}
		if reason == "length" {
			m.FinishReason.Length = s.maxNew
		}
	}
	return m
}

// generateChunk appends /generate's SSE event of output tokens [from,
// to): the text so far, as SGLang streams it.
func (s *responder) generateChunk(b []byte, from, to int, reason string, out requestOutput) []byte {
	for i := from; i < to; i++ {
		if s.rq.spaceBefore(i) {
			s.sofar = append(s.sofar, ' ')
		}
		s.sofar = append(s.sofar, fillerWords[fillerIndex(s.rq.seed, i)]...)
	}
	ev, _ := json.Marshal(generateAnswer{Text: string(s.sofar), MetaInfo: s.generateMeta(to, reason, out)})
	b = append(b, "data: "...)
	b = append(b, ev...)
	return append(b, "\n\n"...)
}

// full is the non-streaming answer.
func (s *responder) full(out requestOutput) any {
	if s.generate {
		a := generateAnswer{Text: s.text(out.generated), MetaInfo: s.generateMeta(out.generated, out.finishReason, out)}
		if s.generateBatch {
			return []generateAnswer{a}
		}
		return a
	}
	if s.chat {
		return openai.ChatCompletion{
			ID: s.id, Object: "chat.completion", Created: s.created, Model: s.model,
			Choices: []openai.ChatChoice{{
				Message:      openai.ChatAnswerText{Role: "assistant", Content: s.text(out.generated), ToolCalls: []any{}},
				FinishReason: out.finishReason,
			}},
			Usage: s.usage(out), KVTransferParams: out.kvParams,
		}
	}
	return openai.Completion{
		ID: s.id, Object: "text_completion", Created: s.created, Model: s.model,
		Choices: []openai.CompletionChoice{{Text: s.text(out.generated), FinishReason: out.finishReason}},
		Usage:   s.usage(out), KVTransferParams: out.kvParams,
	}
}

// randomHex is n random bytes in hex (crypto/rand: an id that must not be
// guessed).
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}
