package gateway

import (
	"errors"
	"net/http"

	"github.com/kvgate/kvgate/internal/openai"
)

// Migration (Config.MigrationLimit, Dynamo's migration_limit): a stream
// whose engine fails after the client had part of it (the connection
// breaks, or the body ends with neither a finish reason nor [DONE]) is
// continued on another engine. The gateway asks it for the rest of the
// answer (openai.Request.Continuation: the text so far as the answer's
// start) and relays that stream's events as the same answer's: its role
// event dropped, its id the first engine's, its usage the whole answer's.
// The client sees one stream, slower for a moment.
//
// Only what the gateway can continue exactly is migrated: streamed chat
// and completions of one sequence, with a text prompt for completions,
// whose events so far brought only text (no reasoning, no tool calls),
// in text (the engine tokenizes it afresh).

// maxMigrations bounds Config.MigrationLimit.
const maxMigrations = 8

// tapped reports whether rt's answer goes through a streamTap: a stream
// of chat or completions (SGLang's /generate counts its tokens in its own
// events, the Responses and Messages APIs' are events of another shape).
func tapped(rt *routed) bool {
	return rt.req.Stream && (rt.api == apiCompletions || rt.api == apiChat)
}

// migratable reports whether rt's stream is one the gateway may continue
// elsewhere should its engine fail.
func (g *Gateway) migratable(rt *routed) bool {
	if g.cfg.MigrationLimit <= 0 || !tapped(rt) {
		return false
	}
	if rt.chat() {
		return true
	}
	_, ok := rt.req.TextPrompt()
	return ok
}

// errMigrationFailed: the stream broke and no continuation finished it.
var errMigrationFailed = errors.New("stream broken; continuing it on another engine failed")

// migrate continues rt's answer, which broke on failed (its engine) after
// the client had part of it through t, on other engines, up to
// Config.MigrationLimit times. It returns nil once the client has the
// whole answer.
func (g *Gateway) migrate(r *http.Request, rt *routed, t *streamTap, failed string) error {
	for range g.cfg.MigrationLimit {
		if !t.broken() || r.Context().Err() != nil {
			break
		}
		next, p, err := g.continuation(rt, t, failed)
		if err != nil {
			g.log.Warn("stream broken; not continued", "id", rt.id, "endpoint", failed, "err", err)
			break
		}
		g.log.Warn("stream broken; continuing on another engine", "id", rt.id, "endpoint", failed, "to", p.prefill.ep.Name, "tokens", t.tokens)
		t.continueOn()
		_, err = g.proxy(t, r, next, p)
		if err == nil {
			t.eof()
		}
		if err == nil && t.done {
			g.met.migrations.WithLabelValues("ok").Inc()
			if rt.whole != nil && !rt.whole.sent {
				// Answered whole, its headers still to go: they name
				// the engine that finished it.
				rt.whole.Header().Set(hdrDecode, p.answering().ep.Name)
			}
			return nil
		}
		failed = p.answering().ep.Name
	}
	if r.Context().Err() == nil { // a client gone is not a failed migration
		g.met.migrations.WithLabelValues("failed").Inc()
	}
	return errMigrationFailed
}

// continuation is rt continued after the answer t has so far, and the
// plan that serves it: decided as any request but without failed, and
// neither held nor rejected (the client was admitted and has part of its
// answer).
func (g *Gateway) continuation(rt *routed, t *streamTap, failed string) (*routed, *plan, error) {
	if t.stuck != "" {
		return nil, nil, errors.New(t.stuck)
	}
	req := rt.req // nothing came yet: the request as it was
	if t.tokens > 0 || t.text.Len() > 0 {
		body, err := rt.req.Continuation(rt.chat(), t.text.String(), t.tokens)
		if err != nil {
			return nil, nil, err
		}
		if req, err = openai.ParseRequest(body); err != nil {
			return nil, nil, err
		}
	}
	next := *rt
	next.req, next.continued = req, true
	next.promptN = rt.promptN + t.tokens // the original prompt's blocks stay its keys
	next.outN = max(rt.outN-t.tokens, 1)
	next.opens, next.engineIDs = false, nil
	p, err := g.decide(&next, failed)
	if err != nil {
		return nil, nil, err
	}
	if p.prefill == nil {
		return nil, nil, errors.New("no other endpoint")
	}
	p.invests = false
	return &next, p, nil
}
