package engine

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/kvgate/kvgate/internal/openai"
)

// The Responses API (POST /v1/responses, GET /v1/responses/{id}), as vLLM
// serves it for a model without a harmony format: the request's
// instructions and input rendered as a chat request's messages
// (openai.ParseResponses), the answer a response object, or streamed as
// its events. With Config.ResponsesStore the answers are kept, and a
// request may continue one (previous_response_id).

// maxStoredResponses bounds the Responses store: the newest are kept.
const maxStoredResponses = 4096

// storedResponse is one kept answer: the conversation it closes (its
// request's messages but the instructions, then its answer as the
// assistant's message) and the object GET returns.
type storedResponse struct {
	messages []openai.Message
	object   []byte
}

// responseStore keeps the newest answers by id.
type responseStore struct {
	mu    sync.Mutex
	max   int
	byID  map[string]*storedResponse
	order []string // oldest first
}

func newResponseStore(max int) *responseStore {
	return &responseStore{max: max, byID: map[string]*storedResponse{}}
}

func (s *responseStore) get(id string) *storedResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id]
}

func (s *responseStore) put(id string, r *storedResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byID[id]; !ok {
		s.order = append(s.order, id)
	}
	s.byID[id] = r
	for len(s.order) > s.max {
		delete(s.byID, s.order[0])
		s.order = s.order[1:]
	}
}

func (e *Engine) handleResponses(w http.ResponseWriter, r *http.Request) {
	e.serveGeneration(w, r, apiResponses)
}

// handleGetResponse returns a kept answer (404: none by that id, as
// when the store is off).
func (e *Engine) handleGetResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s := e.responses.get(id)
	if s == nil || !e.cfg.ResponsesStore {
		openai.WriteError(w, openai.NotFound("Response with id '%s' not found.", id))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(s.object)
}

// handleCancelResponse is POST /v1/responses/{id}/cancel. The engine
// serves no background response, so a kept one is always finished:
// vLLM's 400 for it ("Cannot cancel a synchronous response."), and its
// 404 for one it does not keep.
func (e *Engine) handleCancelResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if e.responses.get(id) == nil || !e.cfg.ResponsesStore {
		openai.WriteError(w, openai.NotFound("Response with id '%s' not found.", id))
		return
	}
	openai.WriteError(w, openai.BadRequest("Cannot cancel a synchronous response."))
}

// continueResponse puts the conversation of req's previous response, if
// it names one, before its input (after its instructions): the engine
// that kept it serves it; any other answers 404, as vLLM does.
func (e *Engine) continueResponse(req *openai.Request) error {
	id := req.PreviousResponseID
	if id == "" {
		return nil
	}
	prev := e.responses.get(id)
	if prev == nil || !e.cfg.ResponsesStore {
		return openai.NotFound("Response with id '%s' not found.", id).WithParam("previous_response_id")
	}
	k := 0
	if req.Instructions != "" {
		k = 1
	}
	msgs := append([]openai.Message(nil), req.Messages[:k]...)
	msgs = append(msgs, prev.messages...)
	req.Messages = append(msgs, req.Messages[k:]...)
	return nil
}

// responseObject is a response as the Responses API writes it.
type responseObject struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Model              string             `json:"model"`
	Status             string             `json:"status"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    *int64             `json:"max_output_tokens"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Output             []responseItem     `json:"output"`
	Usage              *responseUsage     `json:"usage"`
	requestEcho
}

// requestEcho is what a response repeats of its request, as vLLM's
// (ResponsesResponse.from_request) and OpenAI's do: each member as the
// client sent it, or its default when absent or null.
type requestEcho struct {
	Metadata          json.RawMessage `json:"metadata"`
	Temperature       json.RawMessage `json:"temperature"`
	TopP              json.RawMessage `json:"top_p"`
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls json.RawMessage `json:"parallel_tool_calls"`
	Text              json.RawMessage `json:"text"`
	Reasoning         json.RawMessage `json:"reasoning"`
	Truncation        json.RawMessage `json:"truncation"`
	Background        json.RawMessage `json:"background"`
	User              json.RawMessage `json:"user"`
}

// Metadata bounds (OpenAI's: 16 pairs, keys of at most 64 characters,
// values of at most 512).
const (
	maxMetadataPairs = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// echoOf is the echo of a Responses request's body (parsed before, so
// one JSON object), read once. Its metadata must be an object of strings
// (vLLM's type: a dict of strings) within OpenAI's bounds, else a 400:
// the answer echoes it, and a stored one keeps it (a 1 MB metadata was
// echoed whole, and 30 kept ones took 150 MB).
func echoOf(body []byte) (requestEcho, error) {
	var in map[string]json.RawMessage
	_ = json.Unmarshal(body, &in)
	if err := checkMetadata(in["metadata"]); err != nil {
		return requestEcho{}, err
	}
	pick := func(key, def string) json.RawMessage {
		if v, ok := in[key]; ok && string(v) != "null" {
			return v
		}
		return json.RawMessage(def)
	}
	return requestEcho{
		Metadata: pick("metadata", "{}"), Temperature: pick("temperature", "1.0"), TopP: pick("top_p", "1.0"),
		Tools: pick("tools", "[]"), ToolChoice: pick("tool_choice", `"auto"`), ParallelToolCalls: pick("parallel_tool_calls", "true"),
		Text: pick("text", `{"format":{"type":"text"}}`), Reasoning: pick("reasoning", "null"), Truncation: pick("truncation", `"disabled"`),
		Background: pick("background", "false"), User: pick("user", "null"),
	}, nil
}

// checkMetadata checks a request's metadata member (echoOf).
func checkMetadata(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		return openai.BadRequest("metadata must be an object of strings").WithParam("metadata")
	}
	if len(m) > maxMetadataPairs {
		return openai.BadRequest("metadata has %d pairs; at most %d", len(m), maxMetadataPairs).WithParam("metadata")
	}
	for k, v := range m {
		if n, nv := utf8.RuneCountInString(k), utf8.RuneCountInString(v); n > maxMetadataKey || nv > maxMetadataValue {
			return openai.BadRequest("metadata keys are at most %d characters and values at most %d", maxMetadataKey, maxMetadataValue).WithParam("metadata")
		}
	}
	return nil
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type responseItem struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Content []outputPart `json:"content"`
}

type outputPart struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type responseUsage struct {
	InputTokens         int                        `json:"input_tokens"`
	InputTokensDetails  openai.PromptTokensDetails `json:"input_tokens_details"`
	OutputTokens        int                        `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// responsesState is what a responder of the Responses API keeps.
type responsesState struct {
	req *openai.Request
	// conv is the conversation the answer closes, without the
	// instructions (storedResponse.messages).
	conv   []openai.Message
	itemID string
	seq    int // the next event's sequence_number
	store  bool
	echo   requestEcho
}

func newResponsesState(req *openai.Request, id string, store bool, echo requestEcho) *responsesState {
	k := 0
	if req.Instructions != "" {
		k = 1
	}
	return &responsesState{req: req, conv: req.Messages[k:], itemID: "msg_" + strings.TrimPrefix(id, "resp_"),
		store: store && (req.Store == nil || *req.Store), echo: echo}
}

// object is the response with out's answer (done: complete or cut at
// its limit; else in progress, no output yet).
func (s *responder) object(out requestOutput, text string) *responseObject {
	rs := s.responses
	o := &responseObject{ID: s.id, Object: "response", CreatedAt: s.created, Model: s.model, Status: "in_progress",
		MaxOutputTokens: rs.req.MaxTokens, Output: []responseItem{}, requestEcho: rs.echo}
	if rs.req.Instructions != "" {
		o.Instructions = &rs.req.Instructions
	}
	if rs.req.PreviousResponseID != "" {
		o.PreviousResponseID = &rs.req.PreviousResponseID
	}
	if !out.done {
		return o
	}
	o.Status = "completed"
	if out.finishReason == finishLength && !s.rq.naturalEnd {
		o.Status, o.IncompleteDetails = "incomplete", &incompleteDetails{Reason: "max_output_tokens"}
	}
	o.Output = []responseItem{s.item(text, "completed")}
	u := &responseUsage{InputTokens: s.rq.promptLen, OutputTokens: out.generated, TotalTokens: s.rq.promptLen + out.generated}
	u.InputTokensDetails.CachedTokens = out.cachedTokens
	o.Usage = u
	return o
}

func (s *responder) item(text, status string) responseItem {
	it := responseItem{ID: s.responses.itemID, Type: "message", Role: "assistant", Status: status, Content: []outputPart{}}
	if status == "completed" {
		it.Content = []outputPart{{Type: "output_text", Text: text, Annotations: []any{}}}
	}
	return it
}

// keep stores a finished answer when the store is on.
func (e *Engine) keep(s *responder, o *responseObject, text string) {
	if !s.responses.store {
		return
	}
	b, err := json.Marshal(o)
	if err != nil {
		return
	}
	msgs := append(append([]openai.Message(nil), s.responses.conv...), openai.Message{Role: "assistant", Content: openai.Content{String: text}})
	e.responses.put(s.id, &storedResponse{messages: msgs, object: b})
}

// event appends one Responses stream event of type typ: ev's fields
// and its sequence number (namedEvent).
func (s *responder) event(b []byte, typ string, ev map[string]any) []byte {
	ev["sequence_number"] = s.responses.seq
	s.responses.seq++
	return namedEvent(b, typ, ev)
}

// namedEvent appends one event of a stream of named events (the
// Responses and Messages APIs'): its name and ev, whose type it is.
func namedEvent(b []byte, typ string, ev map[string]any) []byte {
	ev["type"] = typ
	data, _ := json.Marshal(ev)
	b = append(b, "event: "...)
	b = append(b, typ...)
	b = append(b, "\ndata: "...)
	b = append(b, data...)
	return append(b, "\n\n"...)
}

// streamResponses streams rq's answer as the Responses API's events:
// response.created and response.in_progress at once, before the first
// token (as vLLM sends them), the output item and its text part with the
// first tokens, a text delta an event (the tokens since the last at a
// stream interval above 1), then the text's, part's and item's done
// events and response.completed, which ends the stream (no [DONE]).
func (e *Engine) streamResponses(w http.ResponseWriter, r *http.Request, rq *request, resp *responder) {
	start := resp.object(requestOutput{}, "")
	head := resp.event(nil, "response.created", map[string]any{"response": start})
	head = resp.event(head, "response.in_progress", map[string]any{"response": start})
	var text strings.Builder
	sent := 0
	e.sseStream(w, r, rq, head, func(buf []byte, out requestOutput) []byte {
		buf = resp.responsesEvents(buf, &text, &sent, out, e.cfg.StreamInterval)
		if out.done {
			o := resp.object(out, text.String())
			buf = resp.event(buf, "response.completed", map[string]any{"response": o})
			e.keep(resp, o, text.String())
		}
		return buf
	})
}

// responsesEvents appends the events of out's tokens past sent (the
// item's opening with the first, its closing with the last).
func (s *responder) responsesEvents(b []byte, text *strings.Builder, sent *int, out requestOutput, interval int) []byte {
	loc := func(ev map[string]any) map[string]any {
		ev["item_id"], ev["output_index"], ev["content_index"] = s.responses.itemID, 0, 0
		return ev
	}
	if *sent == 0 && out.generated > 0 {
		b = s.event(b, "response.output_item.added", map[string]any{"output_index": 0, "item": s.item("", "in_progress")})
		b = s.event(b, "response.content_part.added", loc(map[string]any{"part": outputPart{Type: "output_text", Annotations: []any{}}}))
	}
	eachDelta(sent, out.generated, interval, func(from, to int) {
		var d strings.Builder
		outputText(&d, s.rq, from, to) // a space before every word but the first
		delta := d.String()
		text.WriteString(delta)
		b = s.event(b, "response.output_text.delta", loc(map[string]any{"delta": delta, "logprobs": []any{}}))
	})
	if out.done && out.generated > 0 {
		full := text.String()
		b = s.event(b, "response.output_text.done", loc(map[string]any{"text": full, "logprobs": []any{}}))
		b = s.event(b, "response.content_part.done", loc(map[string]any{"part": outputPart{Type: "output_text", Text: full, Annotations: []any{}}}))
		b = s.event(b, "response.output_item.done", map[string]any{"output_index": 0, "item": s.item(full, "completed")})
	}
	return b
}
