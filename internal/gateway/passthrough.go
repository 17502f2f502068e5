package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/openai"
)

// Passthrough outcomes (kvgate_passthrough_requests_total).
const (
	passOK       = "ok"          // the engine answered (any status below 500)
	passRefused  = "refused"     // kvgate answered: bad body, unknown model, no endpoint
	passUpstream = "upstream"    // no engine answered, or the last one with a 5xx
	passGone     = "client_gone" // the client left before an answer
)

// handlePassthrough forwards a request to one of vLLM's other APIs
// (/v1/embeddings, /tokenize, /v1/score, …) whole to an endpoint of its
// model: no KV-aware choice (these compute no cache a later request
// finds), the endpoint with the fewest such requests in flight, one retry
// elsewhere when the first cannot be reached or answers 5xx. They count
// towards max_inflight with the routed requests.
func (g *Gateway) handlePassthrough(w http.ResponseWriter, r *http.Request) {
	// The answer carries its id, as a routed one does (and the engine is
	// sent it): the SDKs' request id was null on forwarded answers.
	id := g.requestID(r)
	w.Header().Set("X-Request-Id", id)
	if n := g.inflight.Add(1); n > int64(g.cfg.MaxInflight) {
		g.inflight.Add(-1)
		g.met.passthrough.WithLabelValues(passRefused).Inc()
		openai.WriteError(w, openai.TooManyRequests(time.Second, "kvgate: more than %d requests in flight", g.cfg.MaxInflight))
		return
	}
	defer g.inflight.Add(-1)
	body, release, err := g.bodies.Read(w, r)
	if err != nil {
		g.met.passthrough.WithLabelValues(passRefused).Inc()
		openai.WriteError(w, err)
		return
	}
	defer release()
	model, contentType, err := g.passthroughModel(r, body)
	if err != nil {
		g.met.passthrough.WithLabelValues(passRefused).Inc()
		openai.WriteError(w, err)
		return
	}
	ctx := r.Context()
	if g.cfg.UpstreamTimeout > 0 { // one bound for the request, its retry included
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.cfg.UpstreamTimeout)
		defer cancel()
	}
	var tried *member
	for attempt := 0; attempt < 2; attempt++ {
		m, others, err := g.passthroughTarget(model, tried)
		if err != nil {
			if tried != nil {
				err = openai.Errorf(http.StatusBadGateway, "kvgate: endpoint %s failed and no other serves model %q", tried.ep.Name, model)
				g.met.passthrough.WithLabelValues(passUpstream).Inc()
			} else {
				g.met.passthrough.WithLabelValues(passRefused).Inc()
			}
			openai.WriteError(w, err)
			return
		}
		if g.forward(ctx, w, r, m, body, id, contentType, attempt == 1 || others == 0) {
			return
		}
		tried = m
	}
	g.met.passthrough.WithLabelValues(passUpstream).Inc()
	openai.WriteError(w, openai.Errorf(http.StatusBadGateway, "kvgate: no endpoint of model %q could be reached", model))
}

// passthroughModel is the model a passthrough body names, or, when it
// names none (vLLM's /tokenize takes that), the fleet's one base model;
// and the content type it is forwarded with ("": JSON). A multipart form
// (the audio APIs') names it in its "model" field and keeps its own
// content type (its boundary).
func (g *Gateway) passthroughModel(r *http.Request, body []byte) (model, contentType string, err error) {
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		contentType = r.Header.Get("Content-Type")
		model, err = formModel(body, params["boundary"])
	} else {
		var req struct {
			Model *string `json:"model"`
		}
		// The routed APIs' words ("model must be a string, not a
		// number", param model): encoding/json's named a Go struct.
		if err := openai.DecodeObject(body, &req); err != nil {
			return "", "", err
		}
		if req.Model != nil {
			model = *req.Model
		}
	}
	if err != nil || model != "" {
		return model, contentType, err
	}
	model, err = g.onlyBaseModel()
	return model, contentType, err
}

// onlyBaseModel is the fleet's base model when it serves exactly one, for
// a request that names none; else a 400.
func (g *Gateway) onlyBaseModel() (string, error) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	base, n := "", 0
	for _, m := range g.members {
		if n == 0 || m.ep.Model != base {
			base, n = m.ep.Model, n+1
		}
		if n > 1 {
			break
		}
	}
	if n == 1 {
		return base, nil
	}
	if n > 1 { // the error's count: only now are the models counted
		set := map[string]bool{}
		for _, m := range g.members {
			set[m.ep.Model] = true
		}
		n = len(set)
	}
	return "", openai.BadRequest("model is required: kvgate serves %d models", n).WithParam("model")
}

// maxFormModel bounds the model field of a multipart form.
const maxFormModel = 1024

// formModel is the "model" field of a multipart form ("" without one).
func formModel(body []byte, boundary string) (string, error) {
	if boundary == "" {
		return "", openai.BadRequest("multipart/form-data without a boundary")
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", openai.BadRequest("the multipart form does not parse: %v", err)
		}
		if p.FormName() != "model" || p.FileName() != "" {
			continue
		}
		v, err := io.ReadAll(io.LimitReader(p, maxFormModel+1))
		if err != nil {
			return "", openai.BadRequest("the multipart form does not parse: %v", err)
		}
		if len(v) > maxFormModel {
			return "", openai.BadRequest("model: longer than %d bytes", maxFormModel).WithParam("model")
		}
		return strings.TrimSpace(string(v)), nil
	}
}

// passthroughTarget picks, among the healthy endpoints serving model
// (its adapter's, for an adapter) that run whole requests (not decode
// only), the one with the fewest passthrough requests in flight, other
// than avoid; ties go to each in turn. others counts the other
// candidates (0: the answer, whatever it is, is the client's).
func (g *Gateway) passthroughTarget(model string, avoid *member) (best *member, others int, err error) {
	base, lora := g.resolve(model)
	g.mu.RLock()
	mf := g.models[base]
	var members []*member
	if mf != nil {
		members = mf.members
	}
	g.mu.RUnlock()
	if mf == nil {
		return nil, 0, openai.NotFound("The model `%s` does not exist.", model).WithParam("model")
	}
	start := int(g.passTurn.Add(1) % uint64(max(len(members), 1))) // ties in turn
	n := 0
	for i := range members {
		m := members[(start+i)%len(members)]
		if m == avoid || !m.ep.Role.CanPrefill() || lora != "" && !m.serves(lora) {
			continue
		}
		n++
		if best == nil || m.passing.Load() < best.passing.Load() {
			best = m
		}
	}
	if best == nil {
		return nil, 0, noHealthyEndpoint(model)
	}
	return best, n - 1, nil
}

// forward sends body to m at the request's path under ctx (the client's,
// bounded by --upstream-timeout) and relays the answer; false, with
// nothing written, when m could not be reached, or answered 5xx and this
// is not the last attempt (the caller may retry elsewhere).
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, m *member, body []byte, id, contentType string, last bool) bool {
	m.passing.Add(1)
	defer m.passing.Add(-1)
	resp, err := g.post(ctx, r, m, r.URL.RequestURI(), body, id, contentType)
	if err != nil {
		switch {
		case r.Context().Err() != nil:
			g.met.passthrough.WithLabelValues(passGone).Inc()
			return true
		case ctx.Err() != nil: // --upstream-timeout: no time for a retry
			g.met.passthrough.WithLabelValues(passUpstream).Inc()
			openai.WriteError(w, openai.Errorf(http.StatusGatewayTimeout, "kvgate: endpoint %s did not answer within --upstream-timeout (%v)", m.ep.Name, g.cfg.UpstreamTimeout))
			return true
		}
		return false
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 500:
		g.reportFailure(m, errors.New(resp.Status))
		if !last {
			return false
		}
	case g.health != nil:
		g.health.ReportSuccess(m.ep.Name)
	}
	w.Header().Set(hdrPrefill, m.ep.Name)
	writeHeaders(w, http.NewResponseController(w), resp)
	outcome := passOK
	if resp.StatusCode >= 500 {
		outcome = passUpstream
	}
	g.met.passthrough.WithLabelValues(outcome).Inc()
	g.copyFlushing(w, resp.Body)
	return true
}

// copyFlushing relays src to w, flushing after every read, so that a
// streamed answer is not held back.
func (g *Gateway) copyFlushing(w http.ResponseWriter, src io.Reader) {
	rc := http.NewResponseController(w)
	bp := g.copyBuffer()
	defer g.bufs.Put(bp)
	buf := *bp
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}
