package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/perfmodel"
	"github.com/kvgate/kvgate/internal/predict"
)

// Headers kvgate sets on responses; a client can never set them on the way
// in (they are stripped with every other internal header).
const (
	hdrPrefill = "X-Kvgate-Prefill-Endpoint"
	hdrDecode  = "X-Kvgate-Decode-Endpoint"
	hdrCached  = "X-Kvgate-Cached-Tokens"
	// hdrPrefillCached is what the prefill engine itself reported cached
	// in a P/D answer (its leg's usage): the decode engine's usage, which
	// the client gets, counts its own.
	hdrPrefillCached = "X-Kvgate-Prefill-Cached-Tokens"
	hdrPredicted     = "X-Kvgate-Predicted-Ttft-Ms"
	hdrReason        = "X-Kvgate-Reason"
	// hdrHeld: milliseconds from the request's arrival to its dispatch
	// (kvgate's hold, plus parsing and deciding): the client's predicted
	// TTFT is this plus hdrPredicted, which is the dispatch decision's.
	hdrHeld = "X-Kvgate-Held-Ms"
)

// dropRoutingHeaders takes back the routing headers proxy set, for an
// answer that is not the routed request's (a yielded investment's 429
// carries what early rejection's would: no endpoint, no prediction).
func dropRoutingHeaders(h http.Header) {
	for _, k := range []string{hdrPrefill, hdrDecode, hdrCached, hdrPrefillCached, hdrPredicted, hdrReason, hdrHeld} {
		h.Del(k)
	}
}

// hdrDPRank pins a request to one data-parallel rank of an engine (vLLM
// and SGLang read it, case-insensitively): kvgate sets it for an
// endpoint that stands for a rank (fleet.Endpoint.Ranked).
const hdrDPRank = "X-Data-Parallel-Rank"

// internalHeader reports whether a client-supplied header must not reach
// an engine: kvgate's own, the ones routers and engines trust to route
// P/D legs (llm-d's prefiller header, Dynamo's and SGLang's bootstrap),
// and the data-parallel rank, which is kvgate's choice.
func internalHeader(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "x-kvgate-") || strings.HasPrefix(n, "x-prefiller") ||
		strings.HasPrefix(n, "x-decoder") || strings.Contains(n, "bootstrap") || n == "x-session-token" ||
		n == "x-data-parallel-rank"
}

// hopHeaders are connection-level headers a proxy must not forward.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length"}

func copyRequestHeaders(dst, src http.Header) {
	for k, vs := range src {
		if internalHeader(k) {
			continue
		}
		dst[k] = append([]string(nil), vs...)
	}
	for _, h := range hopHeaders {
		dst.Del(h)
	}
	if c := src.Get("Connection"); c != "" {
		for _, f := range strings.Split(c, ",") {
			dst.Del(strings.TrimSpace(f))
		}
	}
}

// handle serves /v1/completions and /v1/chat/completions.
func (g *Gateway) handle(w http.ResponseWriter, r *http.Request, api apiKind) {
	if n := g.inflight.Add(1); n > int64(g.cfg.MaxInflight) {
		g.inflight.Add(-1)
		g.met.outcome(outcomeOverloaded, "", "", g.policy)
		openai.WriteError(w, openai.TooManyRequests(time.Second, "kvgate: more than %d requests in flight", g.cfg.MaxInflight))
		return
	}
	defer g.inflight.Add(-1)
	rt, release, err := g.parse(w, r, api)
	if err == nil {
		err = g.prepare(r.Context(), rt)
		release()
	}
	if err != nil {
		if rt != nil {
			w.Header().Set("X-Request-Id", rt.id)
		}
		g.met.outcome(preOutcome(r.Context(), err), g.modelLabel(rt), "", g.policy)
		openai.WriteError(w, err)
		return
	}
	if g.cfg.LogPrompts {
		g.log.Debug("request", "id", rt.id, "body", string(rt.req.Raw))
	}
	g.serve(w, r, rt)
}

// serve decides and proxies, retrying once on the next-best endpoint when
// the chosen one fails before sending anything.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, rt *routed) {
	// Every answer from here on, a rejection or an error as much as a
	// routed response, names the request for the logs.
	w.Header().Set("X-Request-Id", rt.id)
	cw := newClientWriter(w)
	defer cw.commit() // an answer without a body byte still has its status
	out, tap := g.writers(cw, rt)
	if rt.whole != nil {
		defer rt.whole.release()
	}
	exclude := ""
	var release func() // the tenant's tokens in flight (fair.go)
	var failure error  // the first attempt's
	for attempt := 0; attempt < 2; attempt++ {
		p, err := g.decide(rt, exclude)
		if failure != nil && (err != nil || p.prefill == nil) {
			// Nowhere to retry (no other endpoint, none that can serve
			// the request): the client hears the engine's failure, not
			// a 503 of the retry's (the engine's own error answer, when
			// its stream carried one).
			g.met.outcome(outcomeOf(r.Context(), failure), g.modelLabel(rt), rt.class.Name, g.policy)
			if engineErrorAnswer(rt, cw, failure) {
				return
			}
			openai.WriteError(w, clientError(failure))
			return
		}
		if err != nil {
			g.met.outcome(decideOutcome(err), g.modelLabel(rt), rt.class.Name, g.policy)
			openai.WriteError(w, err)
			return
		}
		if p.decode != nil {
			// An API a disaggregated model does not serve is the
			// client's 400, before anything is routed, held, copied or
			// counted (it was refused after, counted upstream_error,
			// its tokens in the hit rate and sent to the peers).
			if err := disaggregatedRefusal(rt, p); err != nil {
				g.met.outcome(outcomeBadRequest, g.modelLabel(rt), rt.class.Name, g.policy)
				openai.WriteError(w, err)
				return
			}
		}
		if failure == nil {
			var ok bool
			if p, ok = g.holdAndAdmit(w, r, rt, p); !ok {
				return
			}
			rt.admitted = true
		} else {
			// The client was admitted: its retry is neither held nor
			// rejected (as a continuation is not), but sent to the best
			// other endpoint now (it was given the engine's failure when
			// the retry would have been held or rejected: a long
			// prompt's, live, with another prefill engine idle).
			p.invests = false
			g.met.retries.Inc()
		}
		if release == nil && !g.cfg.NoFairness { // once, whatever the retries
			release = g.fair.admitted(rt.model, rt.tenant, max(rt.promptN-p.dec.CachedTokens, 0))
			defer release()
		}
		g.copyPrefix(rt, p)
		rt.engineIDs = nil // admitted: nothing more to touch or copy
		failed, err := g.proxy(out, r, rt, p)
		err = g.completed(r, rt, tap, p, err)
		if failed == "" && unsent(r, rt, cw, err) {
			failed, err = p.answering().ep.Name, &upstreamError{endpoint: p.answering().ep.Name, err: err}
			if rt.whole != nil {
				rt.whole.restart()
				out, tap = g.tapOver(rt, rt.whole)
			} else {
				cw.reset()
				out, tap = cw, tap.again()
				if tap != nil {
					out = tap
				}
			}
		}
		if g.ended(cw, r, rt, err, failed == "" || attempt == 1 || r.Context().Err() != nil || rt.timedOut()) {
			return
		}
		g.log.Warn("upstream failed before the client had any byte; retrying elsewhere if another endpoint can take it", "id", rt.id, "endpoint", failed, "err", err)
		exclude, failure = failed, err
	}
}

// holdAndAdmit holds rt when p says so and applies admission to it, and
// reports whether it goes on (with the plan it is released with); false
// when the client was answered (a rejection, a hold that failed).
func (g *Gateway) holdAndAdmit(w http.ResponseWriter, r *http.Request, rt *routed, p *plan) (*plan, bool) {
	if p.dec.Hold {
		var err error
		if p, err = g.hold(r.Context(), rt, p); err != nil {
			g.met.outcome(holdOutcome(r.Context(), err), g.modelLabel(rt), rt.class.Name, g.policy)
			openai.WriteError(w, err)
			return nil, false
		}
	}
	if err := g.admit(rt, p); err != nil {
		g.met.outcome(outcomeRejected, g.modelLabel(rt), rt.class.Name, g.policy)
		g.met.rejections.WithLabelValues(rt.class.Name).Inc()
		openai.WriteError(w, err)
		return nil, false
	}
	return p, true
}

// unsent reports whether an attempt at rt that ended with err is one
// whose engine failed before the client had any byte of its answer, and
// whose client is there: it is sent again from its start elsewhere, as a
// failure before the first byte is. The engine broke its stream inside
// its first line (the tap holds lines back until whole), or broke an
// answer assembled whole, or sent an event that is not JSON into one, or
// a 5xx error event before its answer's first event or into an answer
// assembled whole. An assembly that failed on its own (too large) is not
// sent again.
func unsent(r *http.Request, rt *routed, cw *clientWriter, err error) bool {
	if r.Context().Err() != nil || !errors.Is(err, errStreamBroken) {
		return false
	}
	var ee *engineErrorEvent
	engines := !errors.Is(err, errClientWrite) || errors.Is(err, openai.ErrBadEvent) || errors.As(err, &ee)
	if rt.whole != nil {
		return engines && !rt.whole.sent
	}
	return engines && !cw.committed
}

// engineErrorAnswer answers the client with the engine's own error, when
// err carries one (a 5xx error event) and the client has no byte of the
// answer yet, and reports whether it did.
func engineErrorAnswer(rt *routed, cw *clientWriter, err error) bool {
	var ee *engineErrorEvent
	if !errors.As(err, &ee) {
		return false
	}
	if rt.whole != nil {
		return rt.whole.fail(err)
	}
	if !cw.reset() {
		return false
	}
	ee.writeTo(cw)
	return true
}

// timedOut reports whether rt's --upstream-timeout has run out: no
// retry then, which would fail at once and be blamed on its endpoint.
func (rt *routed) timedOut() bool {
	return !rt.upstreamBy.IsZero() && !time.Now().Before(rt.upstreamBy)
}

// writers are what rt's answer is written through on its way to w: the
// whole answer's assembly (whole.go), when the client did not stream and
// the engine will, then the stream tap (streamtap.go), for a chat or
// completion stream; out is the outermost, tap nil when untapped.
func (g *Gateway) writers(w http.ResponseWriter, rt *routed) (out http.ResponseWriter, tap *streamTap) {
	out = w
	if fresh := g.streamUpstream(rt); fresh != nil {
		rt.whole = newWholeAnswer(w, fresh, &g.wholeBytes)
		out = rt.whole
	}
	return g.tapOver(rt, out)
}

// tapOver puts a stream tap before out when rt's answer is a chat or
// completion stream.
func (g *Gateway) tapOver(rt *routed, out http.ResponseWriter) (http.ResponseWriter, *streamTap) {
	var tap *streamTap
	if tapped(rt) {
		tap = newStreamTap(out, rt.req, rt.promptN, rt.seqs, g.migratable(rt))
		if rt.whole != nil { // every usage the engine sends: the answer's is the last
			tap.final, tap.continuous = true, true
		}
		out = tap
	}
	return out, tap
}

// completed finishes an attempt that proxy ended with err: a tapped
// stream's held last line goes out, a broken stream is continued
// elsewhere (migration), and a whole answer goes to the client. It
// returns the attempt's error, a broken stream's wrapping
// errStreamBroken.
func (g *Gateway) completed(r *http.Request, rt *routed, tap *streamTap, p *plan, err error) error {
	if tap != nil && err == nil {
		tap.eof()
	}
	if tap != nil && tap.keep && tap.broken() && (err == nil || errors.Is(err, errStreamBroken)) && !rt.timedOut() {
		// (Not once --upstream-timeout ran out: a continuation would
		// fail at once, and the client is told of the timeout, a 504.)
		if err = g.migrate(r, rt, tap, p.answering().ep.Name); err != nil {
			err = fmt.Errorf("%w: %w", errStreamBroken, err)
		}
	}
	if tap != nil && err == nil && tap.broken() {
		// The engine's stream ended cleanly but before its answer did
		// (no finish reason, no [DONE]), and was not continued: a
		// broken answer, not a served one.
		err = fmt.Errorf("%w: %s: %w", errStreamBroken, p.answering().ep.Name, errCutShort)
		g.reportFailure(p.answering(), err)
	}
	if rt.whole != nil && err == nil {
		if err = rt.whole.finish(); err != nil {
			err = fmt.Errorf("%w: %w", errStreamBroken, err)
		}
	}
	if ee := (*engineErrorEvent)(nil); errors.As(err, &ee) {
		g.reportFailure(p.answering(), ee) // the engine said it failed
	}
	return err
}

// ended tells the client and the metrics how rt's attempt ended with err
// (nil: served) and reports whether the request is over: served, a
// yielded investment (429), the engine's own refusal (relayed already),
// or, when last, any failure. false: retry elsewhere.
func (g *Gateway) ended(w *clientWriter, r *http.Request, rt *routed, err error, last bool) bool {
	var refused *engineRefused
	switch {
	case err == nil:
		g.met.outcome(outcomeOK, g.modelLabel(rt), rt.class.Name, g.policy)
		if rt.ttftMet {
			g.met.sloMet.WithLabelValues(rt.model, rt.class.Name).Inc()
		}
	case errors.Is(err, errYielded):
		// An investment stopped for a request that can meet its SLO:
		// the 429 early rejection would have sent at once, but after
		// compute: its own outcome, not rejected's "before any compute"
		// (kvgate_hold_yielded_total counts it too).
		g.met.outcome(outcomeYielded, g.modelLabel(rt), rt.class.Name, g.policy)
		dropRoutingHeaders(w.Header())
		e := openai.TooManyRequests(time.Second, "kvgate: request rejected (class %s): it misses its SLO even alone; served late on an idle engine, it gave the engine up to a request that can meet its SLO", rt.class.Name)
		e.NoRetry = true // as rejectErr's
		openai.WriteError(w, e)
	case errors.Is(err, errDisplaced):
		// Displaced from its engine's queue before its prefill by a
		// request of less compute: early rejection's 429, no compute
		// spent, after a wait in the queue.
		g.met.outcome(outcomeDisplaced, g.modelLabel(rt), rt.class.Name, g.policy)
		g.met.rejections.WithLabelValues(rt.class.Name).Inc()
		dropRoutingHeaders(w.Header())
		e := openai.TooManyRequests(time.Second, "kvgate: request rejected (class %s): it was queued to miss no target, but a request of less compute took its place before its prefill started, to serve both it and those still to come (it would have been rejected otherwise)", rt.class.Name)
		e.NoRetry = true // as rejectErr's
		openai.WriteError(w, e)
	case errors.As(err, &refused):
		g.met.outcome(outcomeEngineRefused, g.modelLabel(rt), rt.class.Name, g.policy) // its answer is the client's already
	case !last:
		return false
	case !errors.Is(err, errStreamBroken):
		g.met.outcome(outcomeOf(r.Context(), err), g.modelLabel(rt), rt.class.Name, g.policy)
		openai.WriteError(w, clientError(err))
	default:
		g.met.outcome(outcomeOf(r.Context(), err), g.modelLabel(rt), rt.class.Name, g.policy)
		if engineErrorAnswer(rt, w, err) {
			return true
		}
		if rt.whole != nil && rt.whole.fail(err) {
			return true // the client had nothing of it: a 502 says why
		}
		if rt.whole == nil && w.reset() {
			// Nor had a streaming client (the engine broke inside its
			// first line): the error goes with its status.
			openai.WriteError(w, openai.Errorf(http.StatusBadGateway, "kvgate: the engine's answer broke before the client had any of it: %v", err))
			return true
		}
		if r.Context().Err() == nil && !errors.Is(err, errClientWrite) {
			// The engine's answer broke after the client had part of
			// it: the connection ends without the answer's end, as a
			// proxy ends it, so that the client reads a broken answer
			// (an incomplete body), not a short one.
			g.log.Warn("stream broken after the client had part of it; its answer ends incomplete", "id", rt.id, "endpoint", w.Header().Get(hdrDecode), "err", err)
			panic(http.ErrAbortHandler)
		}
	}
	return true
}

// clientError is what the client is told: an engine's own 5xx answer
// as the engine gave it (its status, message and Retry-After, in an
// OpenAI error body), an engine that could not be reached or broke a 502,
// not an error of the gateway's own (500); timeouts keep their 504.
func clientError(err error) error {
	var ue *upstreamError
	switch {
	case !errors.As(err, &ue) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return err
	case ue.answer != nil:
		return ue.answer
	}
	return openai.Errorf(http.StatusBadGateway, "%v", err)
}

// preOutcome names, in the outcome metric, a request that failed before
// it was routed: while its body was read (under the body limiter), parsed
// or tokenized.
func preOutcome(ctx context.Context, err error) string {
	var te *tokenizerError
	var ne *noEndpoint
	status := openai.AsError(err).Status
	switch {
	case errors.As(err, &ne):
		return outcomeUnavailable
	case status == http.StatusRequestTimeout:
		// Its body came too slowly (net/http cancels the request's
		// context on the read deadline, but the client is there to
		// read the 408).
		return outcomeBadRequest
	case ctx.Err() != nil:
		// Hung up meanwhile: whatever the error says, nobody is there
		// to read it.
		return outcomeClientGone
	case errors.As(err, &te):
		return outcomeTokenizerError
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		return outcomeOverloaded // no large-body slot freed within its wait
	}
	return outcomeBadRequest // the rest is the client's: 400, 405, 413, ...
}

// decideOutcome names a request the scheduler could not be asked about:
// a model nobody serves is the client's error (404), no endpoint to take
// it is unavailable.
func decideOutcome(err error) string {
	if openai.AsError(err).Status < http.StatusInternalServerError {
		return outcomeBadRequest
	}
	return outcomeUnavailable
}

func outcomeOf(ctx context.Context, err error) string {
	var ee *engineErrorEvent
	if ctx.Err() != nil {
		return outcomeClientGone
	}
	if errors.As(err, &ee) { // the engine's error before the client had a byte
		return outcomeUpstreamError
	}
	if errors.Is(err, errStreamBroken) {
		return outcomeBrokenStream
	}
	return outcomeUpstreamError
}

// admit applies the scheduler's rejection and class shedding.
func (g *Gateway) admit(rt *routed, p *plan) error {
	now := g.clock()
	if g.traffic != nil && p.dec.Prefill >= 0 {
		ttftMiss := !p.dec.Admit && strings.Contains(p.dec.Reason, "TTFT")
		g.traffic.Routed(now, rt.promptN, p.dec.CachedTokens, rt.outN, ttftMiss, !p.dec.Admit && !ttftMiss)
	}
	if !p.dec.Admit {
		// Rejected by admission (not for lack of endpoints) because of the
		// load: shed the class. A request that misses its SLO even on an
		// idle endpoint says nothing about the load, and must not let one
		// long prompt a second turn its whole class away.
		if p.dec.Prefill >= 0 && !p.missesAlone {
			g.shed.reject(rt.model, rt.class.Priority, now)
			if slo := p.dec.SLO.TTFT; !g.cfg.NoFairness && slo > 0 {
				g.fair.deny(rt.model, rt.tenant, rt.class.Priority, now, max(p.pessimistic-slo, 0))
			}
		}
		if p.prefillBound {
			// Short of prefill compute (or, with an endpoint idle, of
			// copies of the prefix): what misses alone waits for a quiet
			// fleet, and kvgate prices compute first (or at nothing).
			p.mf.hold.q.NoteLoadRejection(now, p.prefillIdle)
			kind := "short"
			if p.prefillIdle {
				kind = "idle"
			}
			g.met.loadRejections.WithLabelValues(kind).Inc()
		}
		return g.rejectErr(rt, p.dec.Reason, p.dec.PredictedTTFT)
	}
	if g.sched.Load().EarlyReject && g.shed.shedding(rt.model, rt.class.Priority, now) {
		return g.rejectErr(rt, "a class of higher priority is being rejected", 0)
	}
	if slo := p.dec.SLO.TTFT; g.sched.Load().EarlyReject && !g.cfg.NoFairness && slo > 0 {
		if room := g.fair.room(rt.model, rt.tenant, rt.class.Priority, now); room > 0 && p.pessimistic > slo-room {
			g.met.fairRejections.Inc()
			return g.rejectErr(rt, fmt.Sprintf("a tenant with less in flight was rejected for the load: this one is admitted only with %.3f s of its SLO left", room), 0)
		}
	}
	return nil
}

// errEmptyAnswer: an engine answered 200 with no body (no engine does
// when it works): a failure before the first byte, retried elsewhere.
var errEmptyAnswer = errors.New("the engine answered 200 with an empty body")

// errCutShort: a stream ended without its answer's end.
var errCutShort = errors.New("the engine's stream ended before its answer did")

// errStreamBroken: the upstream failed after the client got bytes; the
// response cannot be replaced.
var errStreamBroken = errors.New("upstream stream broken")

// errClientWrite: a broken stream's failure was writing to the client.
var errClientWrite = errors.New("client")

// upstreamError is a failure worth retrying on another endpoint.
type upstreamError struct {
	endpoint string
	err      error
	// answer is the engine's own 5xx answer, when it sent one: with
	// nowhere to retry, the client gets it (clientError).
	answer *openai.Error
}

func (e *upstreamError) Error() string { return fmt.Sprintf("endpoint %s: %v", e.endpoint, e.err) }
func (e *upstreamError) Unwrap() error { return e.err }

// route records in the load accounting that rt goes where p says.
func (g *Gateway) route(rt *routed, p *plan) *load.Flight {
	uncached := max(rt.promptN-p.dec.CachedTokens, 0)
	var deadline float64
	if s := p.dec.SLO.TTFT; s > 0 {
		// On the fleet's clock: the arrival, plus the SLO.
		deadline = max(rt.arrival.Sub(g.start).Seconds(), 0) + s
	}
	return p.mf.load.Route(p.pEP, g.clock(), load.Work{Uncached: uncached, Cached: min(p.dec.CachedTokens, rt.promptN),
		UncachedBlocks: max(len(rt.prep.Keys)-p.dec.CachedTokens/g.cfg.BlockSize, 0),
		Keys:           rt.prep.Keys, OpensConversation: rt.opens, Deadline: deadline, Sequences: rt.seqs}) // the fleet's predictor times the prefill
}

// upstreamContext bounds an attempt at rt by --upstream-timeout: one bound
// for the whole request, so that a retry or a migration has what the
// attempts before it left.
func (g *Gateway) upstreamContext(ctx context.Context, rt *routed) (context.Context, context.CancelFunc) {
	if g.cfg.UpstreamTimeout <= 0 {
		return ctx, func() {}
	}
	if rt.upstreamBy.IsZero() {
		rt.upstreamBy = time.Now().Add(g.cfg.UpstreamTimeout)
	}
	return context.WithDeadline(ctx, rt.upstreamBy)
}

// proxy runs the plan: aggregated, or the two NixlConnector legs. It
// returns the endpoint to avoid on a retry ("" when a retry makes no
// sense) with the error.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request, rt *routed, p *plan) (string, error) {
	lf := p.mf.load
	fl := p.flight
	if fl == nil {
		fl = g.route(rt, p)
	}
	defer func() { lf.Finish(fl, g.clock()) }()
	endPrefill := func() {} // the adapter's place on the prefill endpoint
	if rt.lora != "" {
		endPrefill = g.loraStart(p.prefill, rt.lora)
		defer endPrefill()
		if p.decode != nil {
			defer g.loraStart(p.decode, rt.lora)()
		}
	}
	g.routed(p.prefill, rt.prep.Keys)
	if p.decode != nil {
		g.routed(p.decode, rt.prep.Keys)
	}
	var got reached
	defer g.withdraw(p, rt.prep.Keys, &got)
	g.announce(w.Header(), rt, p)
	ctx, cancel := g.upstreamContext(r.Context(), rt)
	defer cancel()
	ctx, unwatch := g.watchAttempt(ctx, p.prefill, p.decode)
	defer unwatch()
	body := rt.req.StripRoutingParams()
	target := p.prefill
	var start func() bool // nil: the answer's headers go at once
	if p.invests && p.decode == nil {
		ictx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		inv := &stoppable{m: p.prefill, flight: fl, cancel: cancel, keys: rt.prep.Keys}
		p.mf.investing.add(inv)
		defer p.mf.investing.remove(inv)
		ctx = ictx
		start = func() bool { return p.mf.investing.remove(inv) }
	}
	displaceable := false
	if start == nil {
		var unqueue func()
		ctx, start, unqueue = g.queue(ctx, rt, p, fl)
		defer unqueue()
		displaceable = start != nil
	}
	if p.decode != nil {
		if err := disaggregatedRefusal(rt, p); err != nil {
			dropRoutingHeaders(w.Header())
			return "", err
		}
		w.Header().Set(hdrDecode, p.decode.ep.Name)
		lf.Decode(fl, p.dEP)
		if p.prefill.ep.BootstrapPort > 0 {
			return g.proxySGLang(ctx, w, r, rt, p, fl, &got)
		}
		var avoid string
		var err error
		body, avoid, err = g.prefillFirst(ctx, w.Header(), r, rt, p, fl, &got)
		endPrefill() // its leg is done: the decode engine runs it now
		if err != nil {
			return avoid, err
		}
		target = p.decode
	} else {
		w.Header().Set(hdrDecode, p.prefill.ep.Name)
		// A non-streamed answer says nothing about when its prefill
		// ended: take the prediction, unless the answer comes first.
		if !rt.req.Stream {
			t := g.prefillEndsAsPredicted(lf, fl)
			defer t.Stop()
		}
	}
	resp, err := g.send(ctx, r, target, rt, body)
	if err != nil {
		if c := context.Cause(ctx); errors.Is(c, errYielded) || errors.Is(c, errDisplaced) {
			return "", c
		}
		return target.ep.Name, err
	}
	defer resp.Body.Close()
	var check func(int, bool, bool)
	if p.decode == nil { // a decode answer's cached count is its own, after the transfer
		check = g.staleCheck(p, rt)
	}
	avoid, err := g.answer(w, resp, rt, target, lf, fl, &got, start, check)
	if displaceable && errors.Is(err, errYielded) {
		// Its start hook found it taken out of the queued requests:
		// displaced (displaceFor takes it out before it cancels it).
		err = errDisplaced
	}
	return avoid, err
}

// staleCheck is the check of the prefill engine's cached count (an
// aggregated answer's, or a P/D prefill leg's) against the approximate
// entries it was routed by (nil: none to make): the prefill endpoint has
// no KV events, and the index claimed at least
// staleBlocks blocks of the prompt there. An engine that found none of
// them cached has lost what kvgate's routing recorded of it (a restart
// too quick for the health checks: every request after it was claimed
// cached, predicted in 3 ms for 130, and the predictor learned the
// engine 20× slow from the misses): its approximate entries are dropped
// (this prompt's kept: the engine holds it now) and its learned speed
// forgotten.
func (g *Gateway) staleCheck(p *plan, rt *routed) func(n int, reported, usage bool) {
	m := p.prefill
	if m.ep.Events != "" || g.cfg.BindEvents != "" {
		return nil
	}
	claimed := p.dec.CachedTokens
	return func(n int, reported, usage bool) {
		if reported {
			m.reportsCached.Store(true)
		} else if usage && m.reportsCached.Load() {
			// vLLM's chat leaves prompt_tokens_details out when it
			// found nothing cached: from an engine that reports them,
			// a usage without them is 0 (the check never fired on
			// chat traffic).
			reported, n = true, 0
		}
		if !reported || claimed < staleBlocks*g.cfg.BlockSize || m.removed.Load() {
			return
		}
		if n > 0 {
			m.staleAnswers.Store(0)
			return
		}
		// Two in a row, no hit between: a conversation evicted whole
		// (the approximate entries cannot see evictions) misses once; a
		// restarted engine misses every claim.
		if m.staleAnswers.Add(1) < staleAnswers {
			return
		}
		m.staleAnswers.Store(0)
		g.log.Info("the engine found none of the prompt cached where kvgate's routing had it: it may have restarted; its approximate index entries are dropped and its learned speed forgotten",
			"endpoint", m.ep.Name, "claimed_tokens", claimed)
		g.idx.ClearEndpoint(m.kvID)
		g.routed(m, rt.prep.Keys)
		p.mf.load.Forget(m.ep.Name)
	}
}

// staleBlocks is the fewest blocks claimed cached whose absence says an
// engine lost its cache (a conversation evicted whole is likelier with
// fewer), and staleAnswers how many such answers in a row say it.
const (
	staleBlocks  = 4
	staleAnswers = 2
)

// disaggregatedRefusal is why rt cannot run on p's disaggregated
// endpoints (nil: it can): vLLM's and SGLang's P/D flows run completions,
// so a Responses or Messages request's prefill leg has no form, and
// vLLM's (NixlConnector, no bootstrap_port) has no /generate.
func disaggregatedRefusal(rt *routed, p *plan) error {
	switch {
	case rt.api == apiResponses || rt.api == apiMessages:
		return openai.BadRequest("%s runs on aggregated endpoints; model %q is served disaggregated here: use /v1/chat/completions", rt.path, rt.model)
	case rt.api == apiGenerate && p.prefill.ep.BootstrapPort == 0:
		return openai.BadRequest("/generate is SGLang's API; this model's prefill endpoint %s runs vLLM's P/D flow (no bootstrap_port): use /v1/completions", p.prefill.ep.Name)
	}
	return nil
}

// prefillEndsAsPredicted ends fl's prefill in lf at its predicted end,
// once the timer it returns fires: at that end, or at the gateway's clock
// if that reads earlier. The timer runs on the machine's time, the load
// accounting on the gateway's clock (Options.Now); a prefill recorded as
// ending after the clock would leave its endpoint's queue predicted busy
// until then, and on a clock that lags (a test's, stopped) busy for good,
// holding back every held request that needs the endpoint idle.
func (g *Gateway) prefillEndsAsPredicted(lf *load.Fleet, fl *load.Flight) *time.Timer {
	end := lf.PredictedPrefillEnd(fl)
	return time.AfterFunc(time.Duration(max(end-g.clock(), 0)*float64(time.Second)), func() {
		lf.PrefillDone(fl, min(end, g.clock()))
	})
}

// announce counts the routed prompt and sets the answer's routing headers.
func (g *Gateway) announce(h http.Header, rt *routed, p *plan) {
	if !rt.continued { // a continuation's prompt was counted as the client's
		g.met.promptTokens.Add(float64(rt.promptN))
		g.met.hitTokens.Add(float64(min(p.dec.CachedTokens, rt.promptN)))
	}
	h.Set(hdrPrefill, p.prefill.ep.Name)
	h.Set(hdrCached, strconv.Itoa(p.dec.CachedTokens))
	h.Set(hdrPredicted, fmtMillis(p.dec.PredictedTTFT))
	if rt.sentAt.IsZero() { // a retry was not held meanwhile: it was on the failed engine
		rt.sentAt = g.now()
	}
	h.Set(hdrHeld, fmtMillis(max(rt.sentAt.Sub(rt.arrival).Seconds(), 0)))
	h.Set(hdrReason, p.reason)
}

// prefillFirst runs the NixlConnector prefill leg of a disaggregated
// plan and returns the decode leg's body (its kv_transfer_params from
// the prefill's answer), or the endpoint a retry should avoid ("": none)
// with the error. The prefill's answer is its observed end.
func (g *Gateway) prefillFirst(ctx context.Context, h http.Header, r *http.Request, rt *routed, p *plan, fl *load.Flight, got *reached) ([]byte, string, error) {
	params, cached, err := g.prefillLeg(ctx, r, rt, p)
	if oe := (*openai.Error)(nil); errors.As(err, &oe) && oe.Status >= 400 && oe.Status < 500 {
		return nil, "", err // the engine refused the request itself: another would too
	}
	if err != nil {
		return nil, p.prefill.ep.Name, err
	}
	got.prefill = true
	if cached >= 0 {
		h.Set(hdrPrefillCached, strconv.Itoa(cached))
	}
	if check := g.staleCheck(p, rt); check != nil {
		// The prefill engine's count: a quick restart of a P/D prefill
		// engine without events went unnoticed, as an aggregated one's
		// did.
		check(max(cached, 0), cached >= 0, true)
	}
	p.mf.load.FirstToken(fl, g.clock()) // the prefill leg's answer: an observed prefill
	if params == nil {
		// Its first token ended it (a stop): the prefill kept no KV for
		// a remote decode, and the decode engine computes the prompt, as
		// vLLM's own P/D proxy has it do. Until 2026-12-05 this was a
		// 502 (with two prefill endpoints) or a retry on the decode alone.
		return rt.req.StripRoutingParams(), "", nil
	}
	body, err := rt.req.DecodeBody(params)
	if err != nil {
		return nil, "", openai.Errorf(http.StatusBadGateway, "prefill endpoint %s: %v", p.prefill.ep.Name, err)
	}
	return body, "", nil
}

// answer relays target's response resp to the client and feeds the
// flight's first token and TPOT back to the load accounting lf.
func (g *Gateway) answer(w http.ResponseWriter, resp *http.Response, rt *routed, target *member, lf *load.Fleet, fl *load.Flight, got *reached, start func() bool, cached func(int, bool, bool)) (string, error) {
	// An engine that refuses the request (vLLM's 400 for a prompt longer
	// than the model's context, say) answers at once: relayed as is, but
	// its first byte is no prefill and must not train the predictor.
	refused := resp.StatusCode >= 400
	hooks := g.feedback(rt, lf, fl, got, refused)
	hooks.start = start
	if !refused {
		hooks.cached = cached
	}
	tpot, err := g.relay(w, resp, rt, target, hooks)
	if err == nil && refused {
		return "", &engineRefused{endpoint: target.ep.Name, status: resp.StatusCode}
	}
	var ue *upstreamError
	if errors.As(err, &ue) { // failed before its first byte: retry elsewhere
		return target.ep.Name, err
	}
	if err == nil && tpot > 0 {
		lf.Finished(fl, g.clock(), tpot) // the stream's TPOT trains its decode endpoint's model
	}
	return "", err
}

// relayHooks are what relay calls as the answer comes (each may be nil
// but firstByte): firstByte at its first body bytes, probe with a
// stream's TPOT at its token load.TPOTProbeTokens past the first (per
// sequence), and start, when set, before its headers go (relay).
type relayHooks struct {
	firstByte func()
	probe     func(tpot float64)
	start     func() bool
	// cached, when set, is called at the answer's end with the prompt
	// tokens its engine reported cached (reported: it did), and whether
	// the answer had a chat or completion usage (prompt_tokens).
	cached func(n int, reported, usage bool)
}

// feedback is the relay's feedback to the load accounting lf for the
// flight fl: the answer's first byte ends the prefill (an observed one,
// which the predictor learns from, when streamed), and a stream's early
// TPOT reading trains its decode endpoint's model (load.Fleet.TPOTProbe).
// A refused answer (the engine's 4xx, at once) ends the prefill and
// teaches nothing, nor counts as reached (got).
func (g *Gateway) feedback(rt *routed, lf *load.Fleet, fl *load.Flight, got *reached, refused bool) relayHooks {
	h := relayHooks{firstByte: func() { lf.PrefillDone(fl, g.clock()) }}
	if refused {
		return h
	}
	if rt.req.Stream { // the first streamed byte is an observed TTFT: the predictor learns
		h.firstByte = func() { lf.FirstToken(fl, g.clock()) }
	}
	h.firstByte = got.on(h.firstByte)
	h.probe = func(tpot float64) { lf.TPOTProbe(fl, tpot) }
	return h
}

// engineRefused: the engine answered with a 4xx, relayed to the client
// as is (outcome engine_refused).
type engineRefused struct {
	endpoint string
	status   int
}

func (e *engineRefused) Error() string {
	return fmt.Sprintf("endpoint %s refused the request: status %d", e.endpoint, e.status)
}

// Predictor names (Config.Predictor).
const (
	PredictorLearned  = "learned"
	PredictorAnalytic = "analytic"
)

// newPredictor is a model fleet's predictor: "learned" online from
// observed first tokens and stream TPOTs, starting from the configured
// speeds and decodeStep; or "analytic".
func newPredictor(name string) (predict.Predictor, error) {
	switch name {
	case PredictorLearned:
		return predict.NewLearned(predict.LiveOptions())
	case PredictorAnalytic:
		return predict.NewAnalytic(predict.Options{})
	}
	return nil, fmt.Errorf("unknown predictor %q (learned or analytic)", name)
}

// decodeStep is the analytic decode step the learned TPOT starts from
// (perfmodel's default engine); the analytic predictor uses the observed
// mean TPOT instead.
func decodeStep(predictor string) predict.DecodeStep {
	if predictor != PredictorLearned {
		return predict.DecodeStep{}
	}
	m := perfmodel.Default()
	return predict.DecodeStep{Base: m.DecodeStepBase, PerSeq: m.DecodeStepPerSeq, PerKContext: m.DecodeStepPerKContext}
}

// routed records approximately that m will hold keys (its KV events
// confirm or correct it).
func (g *Gateway) routed(m *member, keys []uint64) {
	if !m.removed.Load() {
		g.idx.Routed(m.kvID, keys)
		if g.sync != nil {
			g.sync.Prefix(m.ep.Model, m.ep.Name, keys, true)
		}
	}
}

// unrouted withdraws what routed recorded for m and keys (the request
// ended before m computed them: kvindex.Index.Unrouted).
func (g *Gateway) unrouted(m *member, keys []uint64) {
	if !m.removed.Load() {
		g.idx.Unrouted(m.kvID, keys)
		if g.sync != nil {
			g.sync.Prefix(m.ep.Model, m.ep.Name, keys, false)
		}
	}
}

// reached records which of a request's engines came to hold its prompt:
// the prefill engine once its prefill ended (the prefill leg's answer, or
// the first byte of an aggregated answer), the decode engine at the first
// byte of its answer.
type reached struct{ prefill, decode bool }

// on wraps a first-byte callback of the answering engine (the decode
// engine, or the only one): it then holds the prompt, and so does the
// prefill engine.
func (r *reached) on(firstByte func()) func() {
	return func() {
		r.prefill, r.decode = true, true
		firstByte()
	}
}

// withdraw takes back, when a request ends, the approximate index entries
// routed wrote for engines it never reached: a request aborted before its
// prefill ended (a yielded investment, a client gone, an upstream
// failure) leaves on its engine only the blocks it computed, which the
// engine's KV events report. Left in place, its routed entries claimed
// the whole prompt for up to twice the index's ApproxTTL: replaying a
// long-prompt trace live, the next turn of a conversation whose
// investment had yielded was routed to that engine believing 53 584 of
// its 54 995 tokens cached (the engine held 3 584), and it and the eight
// requests queued behind it were late.
func (g *Gateway) withdraw(p *plan, keys []uint64, got *reached) {
	if !got.prefill {
		g.unrouted(p.prefill, keys)
	}
	if p.decode != nil && !got.decode {
		g.unrouted(p.decode, keys)
	}
}

// send posts body to the endpoint; a connect error or a 5xx status is an
// *upstreamError (retryable), reported to health.
func (g *Gateway) send(ctx context.Context, r *http.Request, m *member, rt *routed, body []byte) (*http.Response, error) {
	resp, err := g.post(ctx, r, m, rt.path, body, rt.id, "")
	if err != nil {
		return nil, &upstreamError{endpoint: m.ep.Name, err: err}
	}
	if resp.StatusCode >= 500 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		err := fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		g.reportFailure(m, err)
		answer := openai.EngineError(resp.StatusCode, "endpoint "+m.ep.Name+": ", bytes.TrimSpace(msg))
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			answer.RetryAfter = time.Duration(min(secs, 3600)) * time.Second
		}
		return nil, &upstreamError{endpoint: m.ep.Name, err: err, answer: answer}
	}
	if resp.StatusCode == http.StatusNotFound && rt.lora != "" {
		g.adapterGone(m, rt.lora)
		if g.servedElsewhere(m, rt.lora) {
			// The engine does not have the adapter (unloaded, or
			// declared and never loaded) and another endpoint does:
			// the client has no byte yet, so it is retried there, its
			// 404 the answer if that fails too (it reached the client
			// until 2026-12-04).
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			return nil, &upstreamError{endpoint: m.ep.Name, err: fmt.Errorf("status 404: adapter %s not on the engine: %s", rt.lora, bytes.TrimSpace(msg)),
				answer: openai.EngineError(http.StatusNotFound, "endpoint "+m.ep.Name+": ", bytes.TrimSpace(msg))}
		}
	}
	if g.health != nil {
		g.health.ReportSuccess(m.ep.Name)
	}
	return resp, nil
}

// post sends a JSON body to m at uri (a path, and its query) with the
// client's headers but kvgate's internal ones, X-Request-Id id (when
// set) and m's data-parallel rank. A connect error is reported to health
// unless ctx was called off (its client gone, or the other leg of
// SGLang's P/D failed: not the engine's failure; running out of
// upstream_timeout is). The answer's status is the caller's to judge.
func (g *Gateway) post(ctx context.Context, r *http.Request, m *member, uri string, body []byte, id, contentType string) (*http.Response, error) {
	if m.ep.URL == "" {
		return nil, errors.New("endpoint has no url")
	}
	up, err := http.NewRequestWithContext(ctx, http.MethodPost, m.ep.URL+uri, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	copyRequestHeaders(up.Header, r.Header)
	if contentType == "" {
		contentType = "application/json"
	}
	up.Header.Set("Content-Type", contentType)
	if id != "" {
		up.Header.Set("X-Request-Id", id)
	}
	if m.ep.Ranked() {
		up.Header.Set(hdrDPRank, strconv.Itoa(m.ep.DPRank))
	}
	up.ContentLength = int64(len(body))
	resp, err := g.client.Do(up)
	if err != nil && errors.Is(context.Cause(ctx), errEngineOut) {
		err = fmt.Errorf("%w: %w", errEngineOut, err)
	}
	if err != nil && !errors.Is(ctx.Err(), context.Canceled) {
		g.reportFailure(m, err)
	}
	return resp, err
}

func (g *Gateway) reportFailure(m *member, err error) {
	if g.health != nil {
		g.health.ReportFailure(m.ep.Name, err)
		if !g.health.Available(m.ep.Name) {
			// Ejected: leave the snapshot now, not at the next refresh
			// tick (a failing engine builds no load, so policies would
			// keep choosing it meanwhile).
			g.refresh()
		}
	}
}

// prefillLeg runs leg 1 on the prefill endpoint and returns the
// kv_transfer_params its answer carries for leg 2 (nil: the answer ended
// at its first token, for a reason of its own, and kept no KV for a
// remote decode), and the prompt tokens its usage reports cached (-1: not
// reported).
func (g *Gateway) prefillLeg(ctx context.Context, r *http.Request, rt *routed, p *plan) (params []byte, cached int, err error) {
	data, err := g.prefillAnswer(ctx, r, rt, p.prefill, rt.req.PrefillBody())
	if err != nil {
		return nil, -1, err
	}
	params, err = openai.ResponseKVTransferParams(data)
	if err != nil || params == nil && !openai.ResponseEndedAtFirstToken(data) {
		return nil, -1, openai.Errorf(http.StatusBadGateway, "prefill endpoint %s answered without kv_transfer_params (is it running with a KV connector?)", p.prefill.ep.Name)
	}
	cached = -1
	if n, ok := openai.ResponseCachedTokens(data); ok {
		cached = n
	}
	return params, cached, nil
}

// maxPrefillAnswer bounds what is read of a prefill leg's answer.
const maxPrefillAnswer = 8 << 20

// prefillAnswer sends a prefill leg (vLLM's or SGLang's) to m and reads
// its answer to the end. An engine that refuses the request itself (4xx)
// is the client's error, passed through with its message.
func (g *Gateway) prefillAnswer(ctx context.Context, r *http.Request, rt *routed, m *member, body []byte) ([]byte, error) {
	resp, err := g.send(ctx, r, m, rt, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer))
	if err != nil {
		return nil, &upstreamError{endpoint: m.ep.Name, err: err}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, openai.EngineError(resp.StatusCode, "prefill endpoint "+m.ep.Name+": ", data)
	}
	return data, nil
}

// relay copies the upstream answer to the client as it arrives (SSE is
// flushed chunk by chunk), calls firstByte when the first body bytes come,
// and records what it observed.
//
// The answer is complete once the client has its end: the upstream body's
// EOF, or for a stream its data: [DONE] line. What fails after that (the
// client hanging up at once, so that the rest of the upstream body is
// never read) fails nothing: relay succeeds.
//
// A stream's token load.TPOTProbeTokens past its first (per sequence,
// with n > 1) calls probe, if set, with the TPOT so far
// (load.Fleet.TPOTProbe).
//
// The answer's headers wait for its first body bytes (or its end): an
// engine that fails before them (vLLM sends a stream's headers before
// its prefill, so an engine that dies in its prefill has sent them) has
// written the client nothing, and its failure is an *upstreamError a
// retry elsewhere may mend. With start, the headers go only if start then
// reports true: an investment stopped before its first byte (invest.go)
// ends in errYielded, nothing written.
//
// It returns the stream's observed TPOT (0: not a stream of more than two
// tokens a sequence). A stream's tokens are the engine's count where it
// gives one (the usage a streamTap asked for, a /generate event's
// meta_info, a Responses stream's final usage), else its SSE events that
// bring text (streamEnd), never the reads that bring them: a read can
// bring several when the gateway lags, and counted as one token each they
// made the TPOT read high. A non-streamed answer's completion tokens go
// to the planner's traffic.
func (g *Gateway) relay(w http.ResponseWriter, resp *http.Response, rt *routed, m *member, h relayHooks) (float64, error) {
	r := g.newRelayed(w, resp, rt, m, h)
	bp := g.copyBuffer()
	defer g.bufs.Put(bp)
	buf := *bp
	watch := attemptWatchOf(resp.Request.Context())
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			watch.touch()
		}
		p := buf[:n]
		r.empty = r.empty && n == 0
		if err == io.EOF && r.empty && r.deferred && resp.StatusCode == http.StatusOK {
			return 0, r.broke(errEmptyAnswer)
		}
		if r.hold {
			p = r.holdBack(p, err == io.EOF)
		}
		if r.deferred && (len(p) > 0 || err == io.EOF) {
			r.deferred = false
			if !r.begin() {
				return 0, errYielded
			}
		}
		if len(p) > 0 {
			if werr := r.chunk(p); werr != nil {
				if r.done() {
					break
				}
				return 0, fmt.Errorf("%w: %w: %w", errStreamBroken, errClientWrite, werr)
			}
		}
		if err == io.EOF {
			if r.cutShort() {
				return 0, r.broke(errCutShort)
			}
			break
		}
		if err != nil {
			if r.done() {
				break
			}
			return 0, r.broke(err)
		}
	}
	return r.finish(), nil
}

// cutShort reports whether a stream the relay reads for its end (a
// Responses, Messages or /generate stream: a chat or completion stream's
// tap judges its own) ended cleanly before it: no response.completed,
// .incomplete, .failed or error, no message_stop or error, no [DONE].
// Passed on as whole, such a stream read as served to the client's SDK.
func (r *relayed) cutShort() bool {
	return r.resp.StatusCode == http.StatusOK && r.end != nil && !r.end.done()
}

// relayed is one answer on its way through relay.
type relayed struct {
	g    *Gateway
	w    http.ResponseWriter
	rc   *http.ResponseController
	resp *http.Response
	rt   *routed
	m    *member
	h    relayHooks
	// deferred: the headers wait for the first body bytes; hold: a
	// Responses stream's wait for its first text delta, its bytes until
	// then in pending (holdBack).
	deferred, hold bool
	pending        []byte
	// empty: no body byte came yet.
	empty bool
	// firstAt is when the first body bytes came (zero: none yet).
	firstAt time.Time
	// end reads an SSE answer the client's writer does not read
	// (streamReader) for its tokens and its [DONE] line, once the client
	// has it; usage a non-streamed answer for its completion tokens (the
	// planner's traffic), or a /generate or Responses stream's events for
	// theirs. Either may be nil.
	end   *streamEnd
	usage *openai.AnswerUsage
	// cached reads the answer for its engine's cached count, and prompt
	// for its prompt tokens (nil: not asked, relayHooks.cached).
	cached, prompt *openai.AnswerUsage
	// rid reads a Responses API answer for its id (nil: another API's),
	// learned once read.
	rid     *responseID
	learned bool
	// tokens is how many tokens a sequence of the stream has had; done,
	// whether the client has the stream's end ([DONE]).
	tokens func() int
	done   func() bool
}

func (g *Gateway) newRelayed(w http.ResponseWriter, resp *http.Response, rt *routed, m *member, h relayHooks) *relayed {
	r := &relayed{g: g, w: w, rc: http.NewResponseController(w), resp: resp, rt: rt, m: m, h: h, deferred: true, empty: true}
	ok := resp.StatusCode == http.StatusOK
	stream := rt.req.Stream && ok
	switch tap, tapped := w.(streamReader); {
	case stream && tapped:
		// The tap reads every event already: their tokens (the
		// engine's own count) and the [DONE] the client has.
		r.tokens, r.done = tap.tokensSent, tap.doneSent
	case stream:
		r.end = &streamEnd{named: namedEventsOf(rt)}
		r.tokens, r.done = func() int { return r.end.tokens(rt.seqs) }, r.end.done
		switch {
		case rt.api == apiGenerate && rt.seqs == 1: // its events count its tokens (meta_info)
			r.usage = &openai.AnswerUsage{}
		case rt.api == apiResponses || rt.api == apiMessages: // its response.completed or message_delta event does
			r.usage = openai.OutputTokensUsage()
		}
		if r.usage != nil {
			r.tokens = func() int {
				// (A message_start event counts 0 output tokens.)
				if n, ok := r.usage.Last(); ok && n > 0 {
					return n
				}
				return r.end.tokens(rt.seqs)
			}
		}
	default:
		r.tokens, r.done = func() int { return 0 }, func() bool { return false }
		r.h.probe = nil
		if ok && g.traffic != nil && !rt.continued {
			r.usage = &openai.AnswerUsage{}
			if rt.api == apiResponses || rt.api == apiMessages {
				r.usage = openai.OutputTokensUsage()
			}
		}
	}
	if ok && rt.api == apiResponses {
		r.rid = &responseID{}
	}
	if ok && h.cached != nil {
		r.cached, r.prompt = openai.CachedTokensUsage(), openai.PromptTokensUsage()
	}
	r.hold = ok && r.end != nil && r.end.named != 0
	return r
}

// maxHoldBack bounds the bytes of a stream of named events held back
// before its first token's event (a Responses stream's created and
// in_progress events echo the request's instructions and tools);
// beyond, they go.
const maxHoldBack = 256 << 10

// holdBack keeps the bytes p of a stream of named events until its first
// token's event (or its end, eof): vLLM sends a Responses stream's
// created and in_progress events before the prefill (an engine may send
// a message_start so too), so an engine that dies in its prefill has
// then sent the client nothing and the request is retried elsewhere, as
// a chat stream's is. It returns the bytes to pass on now.
func (r *relayed) holdBack(p []byte, eof bool) []byte {
	r.pending = append(r.pending, p...)
	if !eof && !r.end.named.hasTokenEvent(r.pending) && len(r.pending) < maxHoldBack {
		return nil
	}
	out := r.pending
	r.hold, r.pending = false, nil
	return out
}

// begin sends the answer's headers, unless start says no.
func (r *relayed) begin() bool {
	if r.h.start != nil && !r.h.start() {
		return false
	}
	r.h.start = nil
	writeHeaders(r.w, r.rc, r.resp)
	return true
}

// chunk passes the next body bytes p to the client and reads them.
func (r *relayed) chunk(p []byte) error {
	// The first bytes are the first token's, but for a stream of named
	// events, whose first events (response.created, in_progress) vLLM
	// may send before its prefill: there the first token's event is.
	deltas := r.end != nil && r.end.named != 0
	var at time.Time // when these bytes came, before the client has them
	if r.firstAt.IsZero() {
		at = r.g.now()
		if !deltas {
			r.first(at)
		}
	}
	if err := writeFlush(r.w, r.rc, p); err != nil {
		return err
	}
	r.end.scan(p)
	if r.usage != nil {
		r.usage.Scan(p)
	}
	if r.cached != nil {
		r.cached.Scan(p)
		r.prompt.Scan(p)
	}
	if r.rid != nil && !r.learned {
		if r.rid.scan(p); r.rid.id != "" {
			r.g.learnResponse(r.rt, r.m, r.rid.id)
			r.learned = true
		}
	}
	if r.firstAt.IsZero() && deltas && r.end.events > 0 {
		r.first(at)
	}
	if r.h.probe != nil {
		if t := r.tokens(); t > load.TPOTProbeTokens {
			r.h.probe(r.g.tpotSince(r.firstAt, t))
			r.h.probe = nil
		}
	}
	return nil
}

// first records the answer's first token, come at at.
func (r *relayed) first(at time.Time) {
	r.firstAt = at
	r.h.firstByte()
	if r.resp.StatusCode == http.StatusOK && r.rt.req.Stream && !r.rt.continued && !r.rt.ttftSeen {
		r.rt.ttftSeen = true
		ttft := r.firstAt.Sub(r.rt.arrival).Seconds()
		r.g.met.ttft.WithLabelValues(r.rt.model, r.rt.class.Name).Observe(ttft)
		// Counted met once the answer is served whole (ended): a
		// stream broken after its first byte was counted met.
		target := r.rt.class.slo(r.rt.promptN).TTFT
		r.rt.ttftMet = target <= 0 || ttft <= target
	}
}

// broke is the error of an answer whose body failed with err before its
// end.
func (r *relayed) broke(err error) error {
	if r.deferred && r.h.start != nil && !r.h.start() {
		return errYielded // stopped, nothing written: the 429 goes
	}
	ctx := r.resp.Request.Context()
	if errors.Is(context.Cause(ctx), errEngineOut) {
		err = errEngineOut // health knows; the read's own error says "context canceled"
	} else if idled(ctx) {
		err = errStreamIdle
		r.g.reportFailure(r.m, err)
	} else if !errors.Is(ctx.Err(), context.Canceled) {
		// The engine broke its answer (its client is still there): a
		// failure, as a refused connection is.
		r.g.reportFailure(r.m, err)
	}
	if r.deferred { // nothing written yet: a retry may mend it
		return &upstreamError{endpoint: r.m.ep.Name, err: err}
	}
	return fmt.Errorf("%w: %s: %w", errStreamBroken, r.m.ep.Name, err)
}

// finish records the whole answer and returns a stream's TPOT.
func (r *relayed) finish() float64 {
	if r.cached != nil {
		n, ok := r.cached.Count()
		_, usage := r.prompt.Count()
		r.h.cached(n, ok, usage)
	}
	t := r.tokens()
	if t > 0 && r.rt.outputs != nil {
		r.rt.outputs.observe(t)
	}
	if t > 2 {
		return r.g.streamed(r.rt, r.m, r.firstAt, t)
	}
	if r.usage != nil && !r.rt.req.Stream {
		if n, ok := r.usage.Count(); ok && n > 0 {
			if t == 0 && r.rt.outputs != nil {
				r.rt.outputs.observe(n / max(r.rt.seqs, 1))
			}
			r.g.traffic.AnsweredOutput(r.g.clock(), n)
		}
	}
	return 0
}

// streamReader is a client writer that reads the stream it passes on
// (streamTap): how many tokens a sequence had (the engine's usage, when
// it reports one), and whether the client has the stream's [DONE].
type streamReader interface {
	tokensSent() int
	doneSent() bool
}

// copyBuffer is a 32 KiB relay buffer from the pool; Put it back.
func (g *Gateway) copyBuffer() *[]byte {
	if bp, _ := g.bufs.Get().(*[]byte); bp != nil {
		return bp
	}
	b := make([]byte, 32<<10)
	return &b
}

// writeHeaders sends resp's status and headers, without the hop-by-hop
// ones, to the client.
func writeHeaders(w http.ResponseWriter, rc *http.ResponseController, resp *http.Response) {
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = append([]string(nil), vs...)
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
	w.WriteHeader(resp.StatusCode)
	_ = rc.Flush()
}

// streamed records a stream of tokens per sequence relayed from m whose
// first came at firstAt (the endpoint's observed TPOT, the planner's
// traffic) and returns its TPOT.
func (g *Gateway) streamed(rt *routed, m *member, firstAt time.Time, tokens int) float64 {
	tpot := g.tpotSince(firstAt, tokens)
	m.obs.addTPOT(tpot)
	if g.traffic != nil && !rt.continued {
		slo := rt.class.slo(rt.promptN)
		ttft := firstAt.Sub(rt.arrival).Seconds()
		g.traffic.Answered(g.clock(), ttft, tpot, tokens*max(rt.seqs, 1), slo.TTFT > 0 && ttft > slo.TTFT, slo.TPOT > 0 && tpot > slo.TPOT)
	}
	return tpot
}

// tpotSince is the TPOT of a sequence whose first of tokens (at least 2)
// came at firstAt and its last now.
func (g *Gateway) tpotSince(firstAt time.Time, tokens int) float64 {
	return g.now().Sub(firstAt).Seconds() / float64(tokens-1)
}

// writeFlush writes p to the client and flushes it: a failed flush is a
// failed write (p did not leave the gateway), unless w cannot flush.
func writeFlush(w http.ResponseWriter, rc *http.ResponseController, p []byte) error {
	if _, err := w.Write(p); err != nil {
		return err
	}
	if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// streamEnd finds the end of an OpenAI stream in the bytes written to the
// client: a line "data: [DONE]" (SSE allows "data:[DONE]") ended by a line
// break. It counts the stream's other data lines that bring tokens
// (bringsToken), one per event (a token, or one decode step's tokens, as
// the engine streams them): counting the role, finish and usage events
// too made a stream's TPOT read about 1/(n-1) low. Its count is relay's
// when the client's writer reads none (streamReader: a streamTap reads
// the engine's usage). A nil *streamEnd never ends (not a stream).
type streamEnd struct {
	n      int              // bytes of the current line so far
	line   [sseLineCap]byte // its first bytes
	end    bool
	events int // token events before [DONE] the client has
	// named: a stream of named events (the Responses or Messages
	// API's), whose token events and end its event lines name (an
	// "event: …" line names the data line after it); delta and last
	// say what the event line before named.
	named       namedEvents
	delta, last bool
}

const sseDoneLine = "data: [DONE]"

// sseLineCap bounds the bytes of a line kept to classify it: an event
// without a token is short (its id, model name and an empty field), so a
// longer line brings text.
const sseLineCap = 1024

// scan reads the next bytes written.
func (s *streamEnd) scan(p []byte) {
	for s != nil && !s.end && len(p) > 0 {
		i := lineBreak(p)
		if i < 0 {
			s.add(p)
			return
		}
		s.add(p[:i])
		s.endLine()
		s.n, p = 0, p[i+1:]
	}
}

// lineBreak is the index of p's first '\r' or '\n', or -1: two byte
// scans, a fifth of bytes.IndexAny's cost on a stream's lines.
func lineBreak(p []byte) int {
	i := bytes.IndexByte(p, '\n')
	before := p
	if i >= 0 {
		before = p[:i]
	}
	if k := bytes.IndexByte(before, '\r'); k >= 0 {
		return k
	}
	return i
}

// endLine classifies the line just read.
func (s *streamEnd) endLine() {
	line := s.line[:min(s.n, len(s.line))]
	if s.n <= len(sseDoneLine) && (string(line) == sseDoneLine || string(line) == "data:[DONE]") {
		s.end = true
		return
	}
	if s.named != 0 {
		s.namedLine(line)
		return
	}
	if !bytes.HasPrefix(line, []byte("data:")) {
		return
	}
	if s.n > len(s.line) || bringsToken(line) {
		s.events++
	}
}

// namedLine classifies a line of a stream of named events.
func (s *streamEnd) namedLine(line []byte) {
	if name, ok := bytes.CutPrefix(line, []byte("event:")); ok {
		name = bytes.TrimSpace(name)
		s.delta = s.named.token(name)
		s.last = s.last || s.named.last(name)
		return
	}
	if !bytes.HasPrefix(line, []byte("data:")) {
		return
	}
	if s.delta {
		s.events++
	}
	s.end = s.last
	s.delta = false
}

// bringsToken reports whether the data line carries generated text: a
// non-empty string under "content" or "text", or under a reasoning
// model's "reasoning_content" or "reasoning", or a tool call's
// "arguments". The events without one are the chat API's role event (vLLM
// and SGLang send {"role":"assistant","content":""}, llm-d-inference-sim
// {"role":"assistant"}), a finish reason alone and the usage event. It
// looks at each colon's key and value (spaces between allowed, as
// Python's json writes them by default).
func bringsToken(line []byte) bool {
	for i := 0; ; {
		j := bytes.IndexByte(line[i:], ':')
		if j < 0 {
			return false
		}
		j += i
		i = j + 1
		v := line[i:]
		for len(v) > 0 && v[0] == ' ' {
			v = v[1:]
		}
		if len(v) < 2 || v[0] != '"' || v[1] == '"' {
			continue // not a non-empty string
		}
		key := bytes.TrimRight(line[:j], " ")
		for _, k := range [...]string{`"content"`, `"text"`, `_content"`, `"reasoning"`, `"arguments"`} {
			if bytes.HasSuffix(key, []byte(k)) {
				return true
			}
		}
	}
}

func (s *streamEnd) add(p []byte) {
	if s.n < len(s.line) {
		copy(s.line[s.n:], p)
	}
	s.n += len(p)
}

// tokens is how many tokens each of a stream's seqs sequences has had:
// their events interleave in one stream (vLLM sends one choice an event),
// so a TPOT counted over all events read n times low (0: not a stream).
func (s *streamEnd) tokens(seqs int) int {
	if s == nil {
		return 0
	}
	return s.events / max(seqs, 1)
}

// done reports whether the client has the stream's [DONE] line.
func (s *streamEnd) done() bool { return s != nil && s.end }
