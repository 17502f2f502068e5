package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/internal/enginemetrics"
	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/openai"
	"github.com/kvgate/kvgate/internal/sched"
	"github.com/kvgate/kvgate/internal/tokens"
)

// defaultOutputTokens is the output length assumed for a request that
// sets no limit (for decode KV room and in-flight accounting).
const defaultOutputTokens = 256

// maxOutputTokens caps the output length kvgate plans for.
const maxOutputTokens = 1 << 24

// maxSequences caps the sequences per request (n) kvgate plans for; the
// engine is sent the client's n.
const maxSequences = 1 << 16

// apiKind is the API a routed request came by.
type apiKind uint8

const (
	apiCompletions apiKind = iota // /v1/completions
	apiChat                       // /v1/chat/completions
	apiGenerate                   // SGLang's native /generate
	apiResponses                  // /v1/responses (responses.go)
	apiMessages                   // /v1/messages (messages.go)
)

// chat reports whether the API's prompt is chat messages (the Responses
// and Messages APIs' are converted to them).
func (a apiKind) chat() bool { return a == apiChat || a == apiResponses || a == apiMessages }

// chat reports whether rt's prompt is chat messages.
func (rt *routed) chat() bool { return rt.api.chat() }

// routed is one request on its way through the gateway.
type routed struct {
	id   string
	path string
	// api is the API it came by; pin, for the Responses API, the
	// endpoint that made the response it continues ("": none known).
	api apiKind
	pin string
	req *openai.Request
	// upstreamBy is when --upstream-timeout ends its proxying, set at its
	// first attempt and kept by its retry and its migrations (zero: not
	// yet, or no timeout).
	upstreamBy time.Time
	// sentAt is when its first attempt was sent (zero before): the time
	// it was held is until then, a retry's included.
	sentAt time.Time
	// admitted: its first attempt was admitted (its retry and its
	// continuations are decided without its TTFT target: schedRequest).
	admitted bool
	// model is the fleet that serves it: req.Model, or a LoRA adapter's
	// base model; lora the adapter ("" for a base model).
	model, lora string
	class       *Class
	// tenant is its fairness header's value (fair.go).
	tenant  string
	prep    tokens.Prepared
	promptN int
	// outN is its output limit (max_tokens, or SGLang's default for
	// /generate; defaultOutputTokens when there is none: outLimited
	// false); outputs, its model's answers' lengths
	// (set when decided), which plan its output within outN.
	outN       int
	outLimited bool
	outputs    *outputLengths
	// seqs is how many sequences it samples (OpenAI's n, at least 1,
	// times the prompts of a batch): its stream interleaves their events.
	seqs int
	// batch is how many prompts an engine batches it into, for the
	// P/D flows (0: one, not a batch): a completion's or /generate's
	// prompts given as a list, a chat's n above 1 (batchOf).
	batch   int
	arrival time.Time
	// opens: a chat request without an assistant message (it starts a
	// conversation; sched.Request.OpensConversation).
	opens bool
	// engineIDs are the prompt's token ids, the engine's own, while the
	// gateway may send a request on a prefix of them: a hold's touch of
	// its cached prefix (touch.go) or, for a request that opens a
	// conversation, a copy of it ahead of the conversation balance
	// (copy.go). Kept only until the request is admitted or rejected.
	engineIDs []uint32
	// continued: a migrated stream's continuation (migrate.go), whose
	// first token is not the client's.
	continued bool
	// ttftSeen: its TTFT is in the metrics (an attempt broken before the
	// client had a byte, then sent again, counted it twice); ttftMet: it
	// met the class's target (counted once the answer is served).
	ttftSeen, ttftMet bool
	// whole: the client did not stream, the engine does; the gateway
	// answers whole (whole.go). nil: the answer goes as it comes.
	whole *wholeAnswer
}

// plan is a decision turned into endpoints.
type plan struct {
	dec     sched.Decision
	mf      *modelFleet
	prefill *member
	decode  *member // nil: aggregated on prefill
	pEP     *load.Endpoint
	dEP     *load.Endpoint
	reason  string
	// missesAlone: rejected, and admission would reject it on the chosen
	// prefill endpoint even with nothing queued there (its own size).
	missesAlone bool
	// prefillBound: rejected because its prefill endpoint's queue pushed
	// its TTFT over the target (sched.RejectedForPrefill).
	prefillBound bool
	// pessimistic is its pessimistic TTFT on the chosen prefill endpoint
	// (sched.PessimisticTTFT), which admission holds to the SLO.
	pessimistic float64
	// prefillIdle: a prefilling endpoint was idle when it was decided
	// (sched.AnyPrefillIdle).
	prefillIdle bool
	// req is what the scheduler was asked.
	req sched.Request
	// flight, when set, is the request's flight already routed (a
	// release from the hold queue routes at once, so the next release
	// sees the endpoint busy).
	flight *load.Flight
	// invests: released from the hold as an investment
	// (sched.Decision.Invests): it gives its engine up to a request that
	// would be rejected for the load (invest.go).
	invests bool
	// copy, when set, is the prefix to copy ahead of the conversation
	// balance once the request is admitted (sched.Decision.CopyTokens).
	copy *prefixCopy
}

// answering is the endpoint whose answer the client reads: the decode
// endpoint, or the only one.
func (p *plan) answering() *member {
	if p.decode != nil {
		return p.decode
	}
	return p.prefill
}

// parse reads and parses a completion or chat request. The body is
// read under the body limiter (httpserve); release frees its slot once the
// request has been turned into block keys.
func (g *Gateway) parse(w http.ResponseWriter, r *http.Request, api apiKind) (rt *routed, release func(), err error) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return nil, nil, openai.Errorf(http.StatusMethodNotAllowed, "use POST")
	}
	body, release, err := g.bodies.Read(w, r)
	if err != nil {
		return nil, nil, err
	}
	rt, err = g.parseBody(r, body, api)
	if err != nil {
		release()
		return nil, nil, err
	}
	return rt, release, nil
}

func (g *Gateway) parseBody(r *http.Request, body []byte, api apiKind) (*routed, error) {
	var err error
	var req *openai.Request
	switch api {
	case apiChat:
		req, err = openai.ParseChat(body)
	case apiResponses:
		req, err = openai.ParseResponses(body)
	case apiMessages:
		// The model's engines may place system messages inside messages
		// otherwise than in place: convert as they do.
		req, err = openai.ParseMessagesFor(body, func(model string) openai.InlineSystem {
			base, _ := g.resolve(model)
			return g.toks.For(base).InlineSystem()
		})
	case apiGenerate:
		req, err = openai.ParseGenerate(body)
	default:
		req, err = openai.ParseCompletion(body)
	}
	if err != nil {
		return nil, err
	}
	model := req.Model
	if model == "" {
		// SGLang's /generate names no model (an adapter, by lora_path),
		// and vLLM serves a request without one with its model: the
		// fleet's one base model (several: 400).
		if model, err = g.onlyBaseModel(); err != nil {
			if api == apiGenerate { // /generate has no model field to give
				return nil, openai.BadRequest("SGLang's /generate names no model: kvgate serves it when the fleet has one base model, or for an adapter named by lora_path (%s)", strings.TrimPrefix(err.Error(), "model is required: ")).WithParam("lora_path")
			}
			return nil, err
		}
	}
	rt := &routed{path: r.URL.Path, api: api, req: req, arrival: g.now()}
	if req.PreviousResponseID != "" {
		rt.pin = g.holderOf(r.Context(), req.PreviousResponseID)
	}
	rt.model, rt.lora = g.resolve(model)
	rt.id = g.requestID(r)
	if rt.class, err = g.classOf(r); err != nil {
		return nil, err
	}
	rt.tenant = tenantOf(r.Header.Get(g.cfg.FairnessHeader))
	if err := rt.setOutput(); err != nil {
		return nil, err
	}
	return rt, nil
}

// requestID is the client's X-Request-Id (up to 128 bytes), else one of
// kvgate's.
func (g *Gateway) requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 {
		return id
	}
	return fmt.Sprintf("kvgate-%x-%d", g.start.UnixNano(), g.reqSeq.Add(1))
}

// setOutput reads rt's output limit (outN, outLimited) and sequences.
func (rt *routed) setOutput() error {
	limName, nName, least := "max_tokens", "n", int64(1)
	rt.outN = defaultOutputTokens
	if rt.api == apiGenerate {
		// SGLang's default max_new_tokens bounds the output as a sent one;
		// SGLang takes 0 (a prefill-only request: scoring, prompt
		// logprobs, warming a cache), which was refused here as vLLM
		// refuses a max_tokens of 0.
		rt.outN, rt.outLimited, limName, nName, least = openai.GenerateDefaultMaxNewTokens, true, "sampling_params.max_new_tokens", "sampling_params.n", 0
	}
	if lim := rt.req.OutputLimit(rt.api.chat()); lim != nil {
		if *lim < least {
			return openai.BadRequest("%s must be at least %d, got %d", limName, least, *lim).WithParam(limName)
		}
		rt.outN, rt.outLimited = int(min(*lim, maxOutputTokens)), true
	}
	rt.seqs = 1
	if n := rt.req.N; n != nil {
		if *n < 1 {
			return openai.BadRequest("%s must be at least 1, got %d", nName, *n).WithParam(nName)
		}
		rt.seqs = int(min(*n, maxSequences))
	}
	return nil
}

// classOf picks the request's SLO class from its header.
// maxClassEcho bounds the unknown class name an error repeats.
const maxClassEcho = 80

func (g *Gateway) classOf(r *http.Request) (*Class, error) {
	cs := g.classes.Load()
	name := r.Header.Get(cs.header)
	if name == "" {
		name = cs.def
	}
	for i := range cs.classes {
		if cs.classes[i].Name == name {
			return &cs.classes[i], nil
		}
	}
	names := make([]string, len(cs.classes))
	for i, c := range cs.classes {
		names[i] = c.Name
	}
	if len(name) > maxClassEcho { // a class name is at most 64 bytes: the rest need not come back
		name = name[:maxClassEcho] + "…"
	}
	return nil, openai.BadRequest("unknown SLO class %q in %s (known: %s)", name, cs.header, strings.Join(names, ", "))
}

// defaultTokenizeTimeout bounds tokenizing one request
// (Options.TokenizeTimeout).
const defaultTokenizeTimeout = 10 * time.Second

// tokenizerError is a failure of a model's tokenizer (an engine's
// /tokenize that failed, could not be reached or did not answer in time):
// the gateway's side, not the client's. It unwraps to the *openai.Error
// the client is told (502, or 504 for a timeout) and to its cause.
type tokenizerError struct {
	resp  *openai.Error
	cause error
}

func (e *tokenizerError) Error() string   { return e.resp.Error() }
func (e *tokenizerError) Unwrap() []error { return []error{e.resp, e.cause} }

// tokenizerFailed is the error of a tokenization of model that failed
// with err under tctx, the request's ctx bounded by timeout. An engine's
// 400 to the tokenization is the client's: its answer is relayed as a 400
// (a prompt beyond max_model_len, which vLLM itself would refuse so).
func tokenizerFailed(ctx, tctx context.Context, model string, timeout time.Duration, err error) error {
	if se, ok := tokens.PromptRefused(err); ok {
		return openai.EngineError(http.StatusBadRequest, "", []byte(se.Body))
	}
	resp := openai.Errorf(http.StatusBadGateway, "tokenizer for model %q: %v", model, err)
	if ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
		resp = openai.Errorf(http.StatusGatewayTimeout, "tokenizer for model %q: no answer within %v: %v", model, timeout, err)
	}
	return &tokenizerError{resp: resp, cause: err}
}

// noHealthyEndpoint is the answer to a request for model when none of its
// endpoints is up.
func noHealthyEndpoint(model string) *openai.Error {
	return openai.Unavailable(5*time.Second, "no healthy endpoint serves model %q", model)
}

// noEndpoint is a request that no endpoint of its model can take, found
// before it was tokenized (outcome unavailable).
type noEndpoint struct{ err *openai.Error }

func (e *noEndpoint) Error() string { return e.err.Error() }
func (e *noEndpoint) Unwrap() error { return e.err }

// tokenMessages is a request's messages as its tokenizer takes them:
// each with its object when it has one (its tool calls too).
func tokenMessages(ms []openai.Message) ([]tokens.Message, error) {
	msgs := make([]tokens.Message, len(ms))
	for i, m := range ms {
		text, err := m.Content.Text()
		if err != nil {
			return nil, openai.BadRequest("messages[%d].content: %v", i, err).WithParam("messages")
		}
		msgs[i] = tokens.TextMessage(m.Role, text)
		if m.Raw != nil {
			msgs[i] = tokens.ObjectMessage(m.Role, text, m.Raw)
		}
	}
	return msgs, nil
}

// foldedAlternative is, for a Messages request whose system messages
// inside messages are kept in place while the model's placement is auto
// and unsettled, its conversation with them folded, for the tokenizer to
// try if the engine or the template refuses them in place (nil
// otherwise).
func (g *Gateway) foldedAlternative(rt *routed) func() []tokens.Message {
	if rt.api != apiMessages || !openai.HasInlineSystem(rt.req.Messages) {
		return nil
	}
	if tk := g.toks.For(rt.model); !tk.InlineAuto() || tk.InlineSystem() != openai.InlinePreserve {
		return nil
	}
	raw := rt.req.Raw
	return func() []tokens.Message {
		r, err := openai.ParseMessagesAs(raw, openai.InlineFold)
		if err != nil {
			return nil
		}
		msgs, err := tokenMessages(r.Messages)
		if err != nil {
			return nil
		}
		return msgs
	}
}

// prepare computes the request's tokens and block keys.
func (g *Gateway) prepare(ctx context.Context, rt *routed) error {
	g.mu.RLock()
	mf := g.models[rt.model]
	down := mf != nil && len(mf.members) == 0 // an unknown model is a 404, later
	g.mu.RUnlock()
	if down {
		// Nothing to serve it, nor (source=engine) to tokenize it: an
		// outage, not a tokenizer's fault.
		return &noEndpoint{noHealthyEndpoint(rt.model)}
	}
	in := tokens.Input{LoRA: rt.lora}
	req := rt.req
	switch {
	case rt.chat():
		msgs, err := tokenMessages(req.Messages)
		if err != nil {
			return err
		}
		in.Messages = msgs
		in.Chat = tokens.ChatOptions{Mode: chatMode(req), Tools: req.Tools, Kwargs: req.ChatTemplateKwargs,
			Alternative: g.foldedAlternative(rt)}
		// A response that continues another is its conversation's
		// next turn, whose start the engine keeps.
		rt.opens = openai.OpensConversation(req.Messages) && req.PreviousResponseID == ""
	case req.Prompt.Kind == openai.PromptText || req.Prompt.Kind == openai.PromptTexts:
		// A batch is routed as one request by its first prompt (the
		// engine serves the batch together); its size counts them all.
		in.Prompt = &req.Prompt.Texts[0]
		in.NoSpecialTokens = req.NoSpecialTokens()
	default:
		in.TokenIDs = req.Prompt.Tokens[0]
	}
	tctx, cancel := context.WithTimeout(ctx, g.tokenizeTimeout)
	defer cancel()
	p, err := g.toks.Prepare(tctx, rt.model, in, g.cfg.BlockSize)
	if err != nil {
		return tokenizerFailed(ctx, tctx, rt.model, g.tokenizeTimeout, err)
	}
	if p.Alternative && g.toks.For(rt.model).FoldInline() {
		g.log.Info("the model's engines refuse system messages inside messages in place: they are folded from now on, as vLLM's --anthropic-inline-system auto folds them (set inline_system= in its tokenizer spec to choose)",
			"model", rt.model)
	}
	rt.prep = p
	rt.promptN = len(p.Tokens)
	for i := 1; i < req.Prompt.Len(); i++ {
		if req.Prompt.Kind == openai.PromptTokenLists {
			rt.promptN += len(req.Prompt.Tokens[i])
		} else {
			rt.promptN += len(req.Prompt.Texts[i]) / 4
		}
	}
	if k := req.Prompt.Len(); k > 1 {
		// Each prompt of a batch samples n sequences, their events one
		// stream's.
		rt.seqs = min(max(rt.seqs, 1)*k, maxSequences)
	}
	rt.batch = batchOf(req)
	// From here on the counts, the keys and the raw body are all a request
	// needs: let the parsed prompt go, so that once its large-body slot is
	// released a request holds about its body, not 3 times it (16 Mi token
	// ids are a 32 MiB body but 64 MiB parsed). Only a request the hold
	// may touch or whose prefix may be copied keeps its ids (4 bytes a
	// token), until it is admitted or rejected.
	if sc := g.sched.Load(); p.EngineIDs && (sc.Touches() || rt.opens && sc.Copies()) {
		rt.engineIDs = p.Tokens
	}
	rt.prep.Tokens = nil
	req.Prompt, req.Messages = openai.Prompt{}, nil
	return nil
}

// chatMode is how req's conversation ends, as the engine renders it.
func chatMode(req *openai.Request) tokens.ChatMode {
	switch {
	case req.ContinueFinalMessage:
		return tokens.ChatContinue
	case req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt:
		return tokens.ChatNoPrompt
	}
	return tokens.ChatGenerate
}

// decide builds the snapshot and asks the scheduler; exclude names
// endpoints a retry must avoid.
func (g *Gateway) decide(rt *routed, exclude string) (*plan, error) {
	g.mu.RLock()
	mf := g.models[rt.model]
	g.mu.RUnlock()
	if mf == nil {
		if rt.api == apiGenerate { // /generate names an adapter by lora_path
			return nil, openai.NotFound("The LoRA adapter `%s` (lora_path) does not exist.", rt.req.Model).WithParam("lora_path")
		}
		return nil, openai.NotFound("The model `%s` does not exist.", rt.req.Model).WithParam("model")
	}
	fs, err := g.fleetFor(mf, rt, exclude, g.clock())
	if err != nil {
		return nil, err
	}
	rt.outputs = &mf.outputs
	sreq := g.schedRequest(rt, fs.snap.Now)
	mf.hold.q.NoteArrival(fs.snap.Now, rt.prep.Keys)
	start := time.Now()
	d := g.sched.Load().Decide(&sreq, &fs.snap)
	if !d.Admit && !d.Hold && sched.RejectedForPrefill(&sreq, &fs.snap, &d) && (g.stopFor(fs, &sreq) || g.displaceFor(fs, rt, &sreq)) {
		// An investment gave its engine up, or a queued request its
		// place: decide on the fleet as it is now.
		if fs, err = g.fleetFor(mf, rt, exclude, g.clock()); err != nil {
			return nil, err
		}
		sreq = g.schedRequest(rt, fs.snap.Now)
		d = g.sched.Load().Decide(&sreq, &fs.snap)
	}
	g.met.decision.Observe(time.Since(start).Seconds())
	p := g.planFor(rt, fs, &sreq, d)
	if d.Prefill >= 0 && d.Prefill < len(fs.snap.Endpoints) {
		p.pessimistic = sched.PessimisticTTFT(&sreq, &fs.snap.Endpoints[d.Prefill])
	}
	if d.Prefill >= 0 && !d.Admit {
		p.missesAlone = !sched.RejectedForLoad(&sreq, &fs.snap, &d)
		p.prefillBound = sched.RejectedForPrefill(&sreq, &fs.snap, &d)
		p.prefillIdle = sched.AnyPrefillIdle(&fs.snap)
	}
	return p, nil
}

// fleetView is one model fleet as seen for one request: the members and
// their load endpoints in snapshot order, and the snapshot.
type fleetView struct {
	mf      *modelFleet
	members []*member
	eps     []*load.Endpoint
	snap    sched.Snapshot
	// decodeAlone: no prefill endpoint is up, and the decode endpoints
	// are in snap as serving requests alone.
	decodeAlone bool
}

// fleetFor builds the snapshot of mf for rt now (the load accounting, the
// KV index, the engines' metrics, what the hold queue holds); exclude names
// an endpoint a retry must avoid.
func (g *Gateway) fleetFor(mf *modelFleet, rt *routed, exclude string, now float64) (*fleetView, error) {
	fs := &fleetView{mf: mf, snap: sched.Snapshot{BlockSize: g.cfg.BlockSize}}
	g.mu.RLock()
	members, matcher := mf.members, mf.matcher
	eps := mf.load.Snapshot(now, rt.promptN, rt.prep.Keys, matcher, nil, &fs.snap)
	g.mu.RUnlock()
	if len(eps) != len(members) {
		return nil, openai.Unavailable(time.Second, "the fleet of model %q is changing; retry", rt.req.Model)
	}
	g.fillEngineState(members, &fs.snap)
	if exclude != "" || rt.lora != "" || rt.pin != "" {
		members, eps = keepEndpoints(members, eps, &fs.snap, func(_ int, m *member) bool {
			return m.ep.Name != exclude && (rt.lora == "" || m.serves(rt.lora)) && (rt.pin == "" || m.ep.Name == rt.pin)
		})
		if len(fs.snap.Endpoints) == 0 && rt.pin != "" {
			return nil, openai.Unavailable(5*time.Second, "response %s, which this request continues, is kept by endpoint %s, which is not available", rt.req.PreviousResponseID, rt.pin)
		}
	}
	if rt.lora != "" && !g.cfg.NoLoRASlots {
		members, eps = g.keepLoRASlots(rt.lora, members, eps, &fs.snap)
	}
	members, eps, err := g.keepContextFits(rt, members, eps, &fs.snap)
	if err != nil {
		return nil, err
	}
	if len(fs.snap.Endpoints) == 0 {
		return nil, noHealthyEndpoint(rt.req.Model)
	}
	g.mu.RLock()
	decodeAlone, why := g.servable(rt.model, members)
	g.mu.RUnlock()
	switch {
	case decodeAlone:
		// No prefill endpoint is up: the decode endpoints compute their
		// requests' prompts themselves, as in conditional disaggregation
		// (and Dynamo's decode workers without prefill workers).
		for i := range fs.snap.Endpoints {
			fs.snap.Endpoints[i].Role = fleet.RoleBoth
		}
		fs.decodeAlone = true
	case why != "":
		// An outage, not the load: 503 (the client may retry), never
		// early rejection's 429.
		return nil, openai.Unavailable(5*time.Second, "model %q cannot be served now: %s", rt.req.Model, why)
	}
	fs.snap.HeldCompute = mf.hold.q.Compute()
	mf.hold.q.FillRejections(&fs.snap)
	fs.members, fs.eps = members, eps
	return fs, nil
}

// servable says how model's endpoints ms can serve a request: why they
// cannot ("": they can; a prefill endpoint needs a decode endpoint beside
// it, unless one serves both), or decodeAlone, when only decode endpoints
// are up, which then serve requests alone, in vLLM's P/D flow (an SGLang
// fleet's, one with a bootstrap port up or not, cannot). g.mu is held.
func (g *Gateway) servable(model string, ms []*member) (decodeAlone bool, why string) {
	var prefill, decode bool
	for _, m := range ms {
		switch m.ep.Role {
		case fleet.RoleBoth:
			return false, ""
		case fleet.RolePrefill:
			prefill = true
		case fleet.RoleDecode:
			decode = true
		}
	}
	switch {
	case prefill && !decode:
		return false, "its prefill endpoints are up, but none of its decode endpoints is"
	case !decode || prefill:
		return false, ""
	}
	for _, m := range g.members {
		if m.ep.Model == model && m.ep.BootstrapPort > 0 {
			return false, "its decode endpoints are up, but none of its prefill endpoints is (SGLang's decode engines do not compute a prompt alone)"
		}
	}
	return true, ""
}

// schedRequest is what the scheduler knows of rt: its output planned at
// what its model's answers have been (outputLengths), within its limit.
func (g *Gateway) schedRequest(rt *routed, now float64) sched.Request {
	out := rt.outN
	if rt.outputs != nil {
		out = rt.outputs.planned(rt.outN, rt.outLimited)
	}
	slo := rt.class.slo(rt.promptN)
	if rt.admitted {
		// Its retry or continuation: the client was admitted, so no
		// TTFT target holds or rejects it again; the fastest endpoint
		// serves it (a long prompt's was held again, found no endpoint
		// and failed with another engine idle).
		slo.TTFT = 0
	}
	return sched.Request{ID: rt.id, Arrival: now, PromptTokens: rt.promptN, PromptBlocks: len(rt.prep.Keys),
		OutputTokens: out, Sequences: rt.seqs, SLO: slo, Priority: rt.class.Priority, OpensConversation: rt.opens,
		CanCopy: rt.opens && rt.engineIDs != nil}
}

// planFor turns a decision on fs into endpoints.
func (g *Gateway) planFor(rt *routed, fs *fleetView, sreq *sched.Request, d sched.Decision) *plan {
	p := &plan{dec: d, mf: fs.mf, req: *sreq}
	if d.Prefill >= 0 {
		p.prefill, p.pEP = fs.members[d.Prefill], fs.eps[d.Prefill]
	}
	local, batch := false, false
	if d.Decode >= 0 {
		p.decode, p.dEP = fs.members[d.Decode], fs.eps[d.Decode]
		// vLLM's P/D flow carries one prompt's KV: its prefill answers a
		// batch of prompts with the first one's kv_transfer_params, which
		// would send every prompt of the batch to read that one's blocks.
		batch = rt.batch > 1 && rt.api != apiChat && p.prefill != nil && p.prefill.ep.BootstrapPort == 0
		if batch || g.cfg.LocalPrefillTokens > 0 && rt.promptN-fs.snap.Endpoints[d.Decode].CachedTokens <= g.cfg.LocalPrefillTokens {
			// Conditional disaggregation (or a batch): the decode
			// endpoint computes the short uncached part itself.
			p.prefill, p.pEP, p.decode, p.dEP = p.decode, p.dEP, nil, nil
			p.dec.CachedTokens = fs.snap.Endpoints[d.Decode].CachedTokens
			local = true
		}
	}
	if d.Admit && d.CopyTokens > 0 {
		to := &fs.snap.Endpoints[d.CopyTo]
		p.copy = &prefixCopy{to: fs.members[d.CopyTo], ep: fs.eps[d.CopyTo], tokens: d.CopyTokens, cached: to.CachedTokens, speed: to.PrefillSpeed}
	}
	p.reason = g.explain(&fs.snap, &d, rt.promptN)
	if fs.decodeAlone {
		p.reason = "no prefill endpoint is up: decode endpoints serve requests alone; " + p.reason
	}
	switch {
	case batch:
		p.reason = fmt.Sprintf("decode endpoint %s computes the batch of %d prompts itself: vLLM's P/D flow carries one prompt's KV", p.prefill.ep.Name, rt.batch)
	case local:
		p.reason = fmt.Sprintf("decode endpoint %s computes the prompt itself: it holds %d of its %d tokens, the rest within local_prefill_tokens %d",
			p.prefill.ep.Name, p.dec.CachedTokens, rt.promptN, g.cfg.LocalPrefillTokens)
	}
	if d.Admit && d.Reason != "" {
		p.reason = d.Reason + "; " + p.reason // released from the hold queue
	}
	return p
}

// keepContextFits keeps the endpoints whose context (the max_model_len
// their engine listed) holds rt: its prompt and the output it allows
// (vLLM refuses prompt + max_tokens beyond max_model_len, and a prompt
// that fills it when max_tokens is absent). In a fleet of engines of
// different context lengths a long request went wherever routing chose
// and about half got the shorter engines' 400. Engines that listed none
// are kept; when none fits, or those that fit cannot serve the request
// (a prefill engine without a decode one that fits), every endpoint is,
// and the engine's own 400 says why.
func (g *Gateway) keepContextFits(rt *routed, members []*member, eps []*load.Endpoint, s *sched.Snapshot) ([]*member, []*load.Endpoint, error) {
	if g.health == nil {
		return members, eps, nil
	}
	need := int64(rt.promptN) + 1
	if rt.outLimited {
		need = int64(rt.promptN) + int64(rt.outN)
	}
	fits := func(m *member) bool {
		l, ok := g.health.MaxModelLen(m.ep.Name)
		return !ok || need <= int64(l)
	}
	// Most fleets' engines all hold most requests: counted first, nothing
	// is allocated then.
	n := 0
	for _, m := range members {
		if fits(m) {
			n++
		}
	}
	if n == 0 && rt.prep.EngineIDs {
		return nil, nil, g.contextTooLong(rt, members)
	}
	if n == len(members) || n == 0 {
		return members, eps, nil
	}
	fitting := make([]*member, 0, n)
	for _, m := range members {
		if fits(m) {
			fitting = append(fitting, m)
		}
	}
	g.mu.RLock()
	_, why := g.servable(rt.model, fitting)
	g.mu.RUnlock()
	if why != "" {
		return members, eps, nil
	}
	ms, es := keepEndpoints(members, eps, s, func(_ int, m *member) bool { return fits(m) })
	return ms, es, nil
}

// contextTooLong is the 400 vLLM answers a request longer than its
// context, for rt, which no member's context holds, counted in the
// engine's own tokens (rt.prep.EngineIDs): answered by the gateway, it
// is not sent (until 2026-12-05 it was, and an engine that caps its body
// below the gateway's reset the connection mid-send: the prompt of 16 Mi
// token ids of the attack replay got 502 and had engines ejected).
func (g *Gateway) contextTooLong(rt *routed, members []*member) error {
	most := 0
	for _, m := range members {
		if l, ok := g.health.MaxModelLen(m.ep.Name); ok {
			most = max(most, l)
		}
	}
	out := 0
	if rt.outLimited {
		out = rt.outN
	}
	return openai.BadRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.",
		most, rt.promptN+out, rt.promptN, out)
}

// keepEndpoints keeps in a snapshot the endpoints whose member (i-th in
// members) keep accepts: all but the one a retry avoids, those serving a request's LoRA
// adapter. members and eps are copied, not changed.
func keepEndpoints(members []*member, eps []*load.Endpoint, s *sched.Snapshot, keep func(i int, m *member) bool) ([]*member, []*load.Endpoint) {
	ms := make([]*member, 0, len(members))
	es := make([]*load.Endpoint, 0, len(eps))
	n := 0
	for i, m := range members {
		if keep(i, m) {
			ms, es = append(ms, m), append(es, eps[i])
			s.Endpoints[n] = s.Endpoints[i]
			n++
		}
	}
	s.Endpoints = s.Endpoints[:n]
	return ms, es
}

// fillEngineState adds what the engines' metrics and observed latencies
// say: KV room and usage, and decode TPOT where the predictor gave none
// (the analytic predictor: the observed mean).
func (g *Gateway) fillEngineState(members []*member, s *sched.Snapshot) {
	now := g.now()
	for i, m := range members {
		e := &s.Endpoints[i]
		e.KVFreeTokens = math.MaxInt32 // unknown: do not reject for room
		if e.DecodeTPOT == 0 {
			e.DecodeTPOT = m.obs.tpot()
		}
		if g.health == nil {
			continue
		}
		mt, ok := g.health.Metrics(m.ep.Name)
		if !ok || !mt.Fresh(now, metricsStaleness) || !mt.Has(enginemetrics.FieldKVUsage) {
			continue
		}
		e.KVUsage = min(max(mt.KVUsage, 0), 1)
		if c := mt.CapacityTokens(); c > 0 {
			// What is routed here and still in its prefill holds no KV
			// yet, but will: reserved, as Mooncake's Conductor does.
			e.KVFreeTokens = max(int(float64(c)*(1-e.KVUsage))-e.InboundKVTokens, 0)
		}
	}
}

// explain is the policy's reason, for the response headers.
func (g *Gateway) explain(s *sched.Snapshot, d *sched.Decision, promptN int) string {
	if !d.Admit {
		return d.Reason
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s cached %d of %d tokens, predicted TTFT %.0f ms", g.policy, s.Endpoints[d.Prefill].Name,
		d.CachedTokens, promptN, d.PredictedTTFT*1000)
	// A choice kept on its prefix's holder beyond the conversation
	// balance has its cost at +Inf there (the copy clause says why):
	// "cost +Inf vs next best" read as the worst endpoint chosen.
	if d.Costs != nil && !math.IsInf(d.Costs[d.Prefill], 1) {
		second, sc := -1, math.Inf(1)
		for i, c := range d.Costs {
			if i != d.Prefill && !math.IsNaN(c) && c < sc {
				second, sc = i, c
			}
		}
		if second >= 0 {
			fmt.Fprintf(&b, "; cost %.4g vs next best %s %.4g", d.Costs[d.Prefill], s.Endpoints[second].Name, sc)
		}
	}
	if d.CopyTokens > 0 {
		fmt.Fprintf(&b, "; kept on its prefix's holder, its first %d tokens copied to %s ahead of the conversation balance",
			d.CopyTokens, s.Endpoints[d.CopyTo].Name)
	}
	return b.String()
}

// rejectErr is an early rejection: a 429 with a Retry-After (when the
// request might fit again), and X-Should-Retry: false, so that an OpenAI
// SDK tells its caller at once instead of sending the request again by
// itself (its default, twice): a request sent again after a second has
// spent that second of its SLO, and admitted, takes the room of one that
// could still meet its own (docs/serve.md, "Early rejection and client
// retries").
func (g *Gateway) rejectErr(rt *routed, reason string, predicted float64) *openai.Error {
	retry := time.Second
	if slo := rt.class.slo(rt.promptN).TTFT; predicted > slo && slo > 0 {
		retry = time.Duration(min(predicted-slo, 60) * float64(time.Second))
	}
	retry = max(retry, time.Second)
	e := openai.TooManyRequests(retry, "kvgate: request rejected before any compute (class %s): %s", rt.class.Name, reason)
	e.NoRetry = true
	return e
}

func fmtMillis(s float64) string { return strconv.FormatFloat(s*1000, 'f', 1, 64) }

// batchOf is how many prompts SGLang's router counts req as a batch of,
// for its P/D bootstrap fields (0: not a batch): a completion's prompt
// given as a list, /generate's text or input_ids given as lists of
// prompts (SGLang's mini_lb counts both; its Rust router input_ids), a
// chat's n above 1.
func batchOf(req *openai.Request) int {
	switch req.Prompt.Kind {
	case openai.PromptTexts, openai.PromptTokenLists:
		return min(req.Prompt.Len(), maxSequences)
	}
	if len(req.Messages) > 0 && req.N != nil && *req.N > 1 {
		return int(min(*req.N, maxSequences))
	}
	return 0
}
