// Package sched is kvgate's scheduling core: the request and fleet-snapshot
// types, the routing policies (kvgate's own and the anchors': random,
// round-robin, least-queue, cache-only, predicted-ttft, sglang-cache-aware,
// sglang-least-load, llmd-token-aware, llmd-weighted-blend, dynamo-kv),
// decode choice and admission (early rejection).
//
// A policy never reads a clock or a socket: it sees a Request and a Snapshot
// and returns a choice. The live gateway and the discrete-event simulator call
// the same code through Scheduler.Decide. A Policy is used by one goroutine
// at a time; callers that decide concurrently serialise around it (a decision
// costs microseconds).
package sched

import "github.com/kvgate/kvgate/internal/fleet"

// SLO holds a request's latency targets in seconds; 0 means none.
type SLO struct {
	TTFT float64
	TPOT float64
}

// Request is what the scheduler knows of one request.
type Request struct {
	ID string
	// Arrival is when the request reached the scheduler (clock seconds).
	Arrival float64
	// PromptTokens is the prompt length in tokens.
	PromptTokens int
	// PromptBlocks is the number of full blocks of the prompt.
	PromptBlocks int
	// OutputTokens is the expected output length (max_tokens or a
	// prediction).
	OutputTokens int
	// Sequences is how many sequences the request samples from its prompt
	// (OpenAI's n; 0 counts as 1): each holds its own output's KV.
	Sequences int
	SLO       SLO
	// Priority: higher is more important; 0 is the default class.
	Priority int
	// OpensConversation: the request starts a conversation whose later
	// turns will extend its prompt (a chat request without an assistant
	// message; a session's first request in the simulator). Where it goes
	// its conversation lives: kvgate places it to keep the conversations
	// each endpoint holds in balance (Endpoint.Conversations). False when
	// unknown.
	OpensConversation bool
	// CanCopy: the fleet can warm a prefix of this request's prompt on an
	// endpoint ahead of later requests (Decision.CopyTokens): the
	// simulator always, the gateway when it holds the engine's own token
	// ids of the prompt.
	CanCopy bool
}

// KVTokens is the KV the request's sequences need at their longest: the
// prompt once (its blocks are shared) and each sequence's output; false
// if that overflows an int.
func (r *Request) KVTokens() (int, bool) {
	out := r.OutputTokens
	if n := r.Sequences; n > 1 {
		if out < 0 || out > int(^uint(0)>>1)/n {
			return 0, false
		}
		out *= n
	}
	return addInts(r.PromptTokens, out)
}

// Endpoint is one instance as seen for one request.
type Endpoint struct {
	Name string
	Role fleet.Role
	// PrefillSpeed is the instance's prompt tokens per second (learned or
	// configured).
	PrefillSpeed float64
	// CachedTokens is the longest prefix of this request held by the
	// instance (from the KV index), in tokens.
	CachedTokens int
	// HeldTokens is how many tokens of prefix cache the instance holds in
	// all, whatever the request (SGLang's tree size): the simulator's
	// per-instance cache occupancy, the gateway's KV-index block count for
	// the endpoint; 0 when unknown.
	HeldTokens int
	// QueueWait is the predicted time before a new prefill could start here
	// (seconds of queued and running prefill work).
	QueueWait float64
	// FreeAt is when the endpoint's prefill queue runs (or ran) empty, in
	// clock seconds: Now+QueueWait when busy, the last completion when idle.
	// It orders idle endpoints by how long they have been idle.
	FreeAt float64
	// InflightUncached is the sum of uncached prompt tokens of requests sent
	// here and not yet past their prefill (llm-d's token load).
	InflightUncached int
	// InflightRequests counts requests sent here and not finished.
	InflightRequests int
	// ActivePrefillBlocks and ActiveDecodeBlocks are Dynamo's load terms:
	// blocks still to prefill, and distinct blocks held by the sequences in
	// flight (a prefix shared by several counts once).
	ActivePrefillBlocks int
	ActiveDecodeBlocks  int
	// InboundKVTokens is the prompt tokens of the requests routed here to
	// decode whose prefill has not ended: their KV arrives then, and
	// KVFreeTokens read from the engine does not count it yet (the
	// gateway subtracts it; the simulator's forecaster reserves it).
	InboundKVTokens int
	// DecodeStreams is the number of sequences decoding here.
	DecodeStreams int
	// KVUsage is the fraction of KV blocks in use (0..1).
	KVUsage float64
	// KVFreeTokens is how many more tokens of KV fit.
	KVFreeTokens int
	// DecodeTPOT is the predicted time per output token if one more stream
	// joined (seconds); 0 if unknown.
	DecodeTPOT float64
	// DecodeUnproven is how many more streams of its own this endpoint
	// needs before DecodeTPOT is learned from them (0: it is; until then
	// it is its predictor's pool's, or the prior's; the load accounting
	// also sets 1 on an endpoint sent no stream for a while, whose TPOT
	// is stale). TPOT admission does not reject by an unproven TPOT, and
	// sends an unproven endpoint requests, but no more at once than it
	// needs: judged by other endpoints' streams it could be predicted to
	// miss, sent nothing, and never observed; sent everything while
	// unproven, a slow one would take every stream until the first of
	// them report (docs/predictor.md, PickDecode, ExploreDecode).
	DecodeUnproven int
	// PrefillSlack, when > 1, is how much longer than predicted the
	// prefill may take at the predictor's pessimistic quantile (a new or
	// erratic endpoint is not over-trusted): admission judges by queue
	// wait + compute × PrefillSlack. 0 or 1: the prediction is trusted.
	PrefillSlack float64
	// QueueSlack, when > 1, stretches the queue wait the same way: set
	// where the predictor learns from busy windows (batching engines),
	// whose error is the endpoint's throughput as a whole and so holds
	// for the prefills queued ahead as for the request's own. 0 or 1:
	// the queue wait is trusted (where each prefill is observed, its
	// errors are its own and a queue's sum is the more accurate).
	QueueSlack float64
	// TailRoom and TailSlack describe the chunked-prefill step that ends
	// the endpoint's queue (load.Info.StepTokens), if a request routed
	// now would share it: the tokens it has free (0: none, or no request
	// there to protect), which the new prompt's first chunk would fill,
	// and how many seconds the first tokens that step brings may slip
	// before the earliest of them misses its SLO. Sharing the step
	// delays them by that chunk's compute.
	TailRoom  int
	TailSlack float64
	// StepSlack is how much later than predicted, on engines that
	// prefill in steps, the first token of a request that queues here
	// may come (seconds; load.Fleet.StepSlack: the steps it shares with
	// requests routed after it): PessimisticTTFT adds it.
	StepSlack float64
	// LastPicked is when this endpoint was last chosen (clock seconds), for
	// LRU-style scorers; negative if never.
	LastPicked float64
	// Conversations is how many conversations were opened here recently
	// (Request.OpensConversation routed here, a count that decays with
	// time: load.ConversationMemory): the cache and the turns they will
	// claim.
	Conversations float64
}

// Snapshot is the fleet as seen for one request. Endpoints are in a stable
// order; choices are indices into it. Deciding never writes to a snapshot.
type Snapshot struct {
	Now       float64
	BlockSize int
	Endpoints []Endpoint
	// Forecast, when set, predicts decode endpoints' state at a future
	// time; the scheduler uses it to judge decode room and TPOT when the
	// request's prefill will finish rather than now.
	Forecast DecodeForecaster
	// HeldCompute is the predicted compute (seconds) of the requests held
	// at the router (HoldQueue.Compute): part of the fleet's backlog.
	HeldCompute float64
	// SinceLoadRejection is how long ago (seconds, > 0) the fleet last
	// rejected a request because a prefill queue pushed its TTFT over the
	// SLO (RejectedForPrefill) while no prefilling endpoint stood idle
	// (LoadRejections); 0: never, or unknown. While it is recent the
	// fleet is compute-bound, and kvgate prices compute so
	// (Options.KVGatePressure).
	SinceLoadRejection float64
	// SinceIdleRejection is the same for a rejection while a prefilling
	// endpoint stood idle: the fleet had the compute, not where the
	// request's prefix was cached. While it is recent (and no
	// SinceLoadRejection is), kvgate prices compute at nothing: requests
	// go where their TTFT is lowest, and the prefixes they share are
	// copied to the endpoints that were idle.
	SinceIdleRejection float64
	// MeanPrefill is the mean predicted prefill time (seconds) of the
	// requests the fleet was sent lately (load.Fleet: an exponential
	// average over about the last MeanPrefillRequests requests); 0:
	// unknown. Under pressure kvgate spends no more than this on
	// recomputing, on one endpoint, a prefix another endpoint holds.
	MeanPrefill float64
}

// DecodeForecaster predicts a decode endpoint's state at a future clock
// time: the KV tokens free then and the TPOT the request would see if it
// joined then.
type DecodeForecaster interface {
	ForecastDecode(endpoint int, at float64, req *Request) (kvFreeTokens int, tpot float64)
}

// Uncached is the number of prompt tokens endpoint e would compute.
func Uncached(req *Request, e *Endpoint) int {
	u := req.PromptTokens - e.CachedTokens
	if u < 0 {
		return 0
	}
	return u
}

// PessimisticTTFT is PredictTTFT with the compute part stretched by the
// endpoint's PrefillSlack, the queue wait by its QueueSlack, and the
// StepSlack added: what admission judges by.
func PessimisticTTFT(req *Request, e *Endpoint) float64 {
	return e.QueueWait*max(e.QueueSlack, 1) + computeSeconds(req, e)*max(e.PrefillSlack, 1) + max(e.StepSlack, 0)
}

// HarmsTail reports whether req's first chunk, routed to e now, would
// share the step that ends e's queue and push a first token due in that
// step past its SLO (Endpoint.TailRoom, TailSlack): a request already
// admitted would be lost for this one.
func HarmsTail(req *Request, e *Endpoint) bool {
	if e.TailRoom <= 0 || e.PrefillSpeed <= 0 {
		return false
	}
	u := Uncached(req, e)
	return u > 0 && float64(min(e.TailRoom, u))/e.PrefillSpeed > e.TailSlack
}

// PredictTTFT is queue wait plus the time to compute the uncached part.
func PredictTTFT(req *Request, e *Endpoint) float64 {
	return e.QueueWait + computeSeconds(req, e)
}

// computeSeconds is the time e takes to compute req's uncached part (0
// without a speed).
func computeSeconds(req *Request, e *Endpoint) float64 {
	if e.PrefillSpeed <= 0 {
		return 0
	}
	return float64(Uncached(req, e)) / e.PrefillSpeed
}

// Choice is a policy's answer: indices of the prefill and decode endpoints.
// Decode is -1 when the prefill endpoint also decodes (aggregated serving)
// or when no decode pool is modelled.
type Choice struct {
	Prefill int
	Decode  int
}

// Decision is the scheduler's full answer for one request.
type Decision struct {
	Admit   bool
	Prefill int
	Decode  int
	// Reason explains a rejection or a hold ("" when admitted).
	Reason string
	// Hold: not admitted now but held at the router (Scheduler.Hold)
	// until HoldUntil at the latest; HoldCompute is its predicted compute
	// on the endpoint that would compute the least.
	Hold        bool
	HoldUntil   float64
	HoldCompute float64
	// PredictedTTFT is the prediction for the chosen prefill endpoint.
	PredictedTTFT float64
	// PredictedTPOT is the prediction for the chosen decode endpoint (0 if
	// none).
	PredictedTPOT float64
	// CachedTokens is the chosen endpoint's cached prefix.
	CachedTokens int
	// Invests: a release from the hold that serves late, on an idle
	// endpoint, a request that misses its SLO even alone (early
	// rejection): an investment, which gives its endpoint up to a request
	// that would otherwise be rejected for the load (YieldFor).
	Invests bool
	// CopyTokens > 0: warm the first CopyTokens tokens of the prompt on
	// endpoint CopyTo too, ahead of the requests that will share them (a
	// one-token request; kvgate's conversation balance, "Copies ahead of
	// the balance" in docs/policies.md).
	CopyTo, CopyTokens int
	// SLO is the SLO the request was judged by: its own, with the
	// scheduler's defaults filled in.
	SLO SLO
	// Costs, when the scheduler explains and the policy reports costs,
	// holds each endpoint's cost (lower is better; NaN: not a candidate).
	Costs []float64
}
