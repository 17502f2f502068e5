package gateway

import (
	"bytes"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// The Responses API (POST /v1/responses) is routed as the chat request it
// amounts to (openai.ParseResponses): its instructions and input are the
// prompt's messages, tokenized, keyed and scored as a chat request's. An
// engine with a response store (vLLM's VLLM_ENABLE_RESPONSES_API_STORE)
// keeps each answer in its own memory: a request continuing one
// (previous_response_id), a GET of one or its cancel must reach the
// engine that made it. The gateway learns each answer's id and engine
// (responseHolders) and sends those requests there.

// maxResponseHolders bounds the response ids remembered (the newest).
const maxResponseHolders = 1 << 16

// maxResponseID bounds a response id kept (vLLM's are "resp_" and 32
// hex digits).
const maxResponseID = 128

// responseHolders maps a response id to the endpoint that made it.
type responseHolders struct {
	mu    sync.Mutex
	byID  map[string]string
	order []string // oldest first
}

func newResponseHolders() *responseHolders {
	return &responseHolders{byID: map[string]string{}}
}

// learn records that endpoint made response id.
func (h *responseHolders) learn(id, endpoint string) {
	if id == "" || len(id) > maxResponseID {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.byID[id]; !ok {
		h.order = append(h.order, id)
	}
	h.byID[id] = endpoint
	for len(h.order) > maxResponseHolders { // append reallocates only the live ids
		delete(h.byID, h.order[0])
		h.order = h.order[1:]
	}
}

// learnResponse records that m made the Responses API answer id to rt,
// here and on the replica's peers.
func (g *Gateway) learnResponse(rt *routed, m *member, id string) {
	g.respHolders.learn(id, m.ep.Name)
	if g.sync != nil {
		g.sync.Response(rt.model, m.ep.Name, id)
	}
}

// holder is the endpoint that made response id ("": unknown).
func (h *responseHolders) holder(id string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byID[id]
}

// responseID reads an answer's first bytes for the response's id: the
// first "id" member's string (a response object's own, first in vLLM's;
// in a stream, its response.created event's response). It keeps at most
// the first 4 KiB.
type responseID struct {
	head []byte
	id   string
	done bool
}

const responseIDHead = 4 << 10

func (r *responseID) scan(p []byte) {
	if r.done {
		return
	}
	r.head = append(r.head, p[:min(len(p), responseIDHead-len(r.head))]...)
	full := len(r.head) >= responseIDHead
	const key = `"id":`
	i := bytes.Index(r.head, []byte(key))
	if i < 0 {
		r.done = full
		return
	}
	v := bytes.TrimLeft(r.head[i+len(key):], " ")
	switch {
	case len(v) == 0: // the value comes in the next read
		r.done = full
		return
	case v[0] != '"': // not a string: no id
		r.done, r.head = true, nil
		return
	}
	j := bytes.IndexByte(v[1:], '"')
	if j < 0 {
		r.done = full
		return
	}
	if id, err := strconv.Unquote(string(v[:j+2])); err == nil {
		r.id = id
	}
	r.done, r.head = true, nil
}

// handleResponseByID serves GET /v1/responses/{id} and POST
// /v1/responses/{id}/cancel on the endpoint that made the response.
func (g *Gateway) handleResponseByID(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	name := g.holderOf(r.Context(), id)
	m := g.memberNamed(name)
	switch {
	case name == "":
		openai.WriteError(w, openai.NotFound("Response with id '%s' not found: kvgate routed no answer of that id, and none of its engines keeps one", id))
		return
	case m == nil:
		openai.WriteError(w, openai.Unavailable(5*time.Second, "Response with id '%s' is kept by endpoint %s, which is not available", id, name))
		return
	}
	body, release, err := g.bodies.Read(w, r)
	if err != nil {
		openai.WriteError(w, err)
		return
	}
	defer release()
	up, err := http.NewRequestWithContext(r.Context(), r.Method, m.ep.URL+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		openai.WriteError(w, openai.Errorf(http.StatusBadGateway, "endpoint %s: %v", name, err))
		return
	}
	copyRequestHeaders(up.Header, r.Header)
	resp, err := g.client.Do(up)
	if err != nil {
		if r.Context().Err() == nil {
			g.reportFailure(m, err)
		}
		openai.WriteError(w, openai.Errorf(http.StatusBadGateway, "endpoint %s: %v", name, err))
		return
	}
	defer resp.Body.Close()
	w.Header().Set(hdrPrefill, name)
	writeHeaders(w, http.NewResponseController(w), resp)
	g.copyFlushing(w, resp.Body)
}

// memberNamed is the endpoint named name that may take traffic now (nil:
// none).
func (g *Gateway) memberNamed(name string) *member {
	if name == "" {
		return nil
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, mf := range g.models {
		for _, m := range mf.members {
			if m.ep.Name == name {
				return m
			}
		}
	}
	return nil
}
