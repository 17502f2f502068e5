// Package load is the per-endpoint in-flight accounting that both the
// gateway and the simulator use to fill a scheduling snapshot: which
// requests each endpoint has been sent and not finished, the uncached
// prompt tokens still to prefill, the predicted time its prefill queue
// empties, the blocks its in-flight sequences hold (Dynamo's load terms)
// and its decode streams.
//
// The meaning of every sched.Endpoint load field is defined here, once:
//
//   - QueueWait: predicted seconds before a new prefill could start, from
//     the predicted prefill times of the requests routed and not yet past
//     their prefill (FIFO; corrected when a prefill ends earlier or later
//     than predicted, and while the first in the queue runs past its
//     predicted end: catchUp).
//   - FreeAt: when the prefill queue empties (or emptied).
//   - InflightUncached, ActivePrefillBlocks: uncached tokens and blocks of
//     requests routed and not yet past their prefill (released at the first
//     token).
//   - InflightRequests: requests routed here and not finished.
//   - ActiveDecodeBlocks: distinct blocks of the sequences in flight here.
//   - DecodeStreams: sequences decoding here.
//   - Conversations: conversations opened here (Work.OpensConversation),
//     each counting exp(−age / ConversationMemory).
//
// With a predictor (SetPredictor), PrefillSpeed is each endpoint's
// effective speed for this request as its model predicts it (uncached
// tokens / predicted compute seconds), and the compute time a routed request
// queues is the model's prediction; FirstToken feeds the observed outcome
// back. Without one, PrefillSpeed is the configured speed and the caller
// gives the compute time (Work.PrefillSeconds).
//
// A predictor that also predicts TPOT (predict.DecodePredictor) fills
// DecodeTPOT of every endpoint that decodes: the TPOT its model predicts
// for one more stream, from the endpoint's in-flight sequences and their
// prompt tokens, with the endpoint's analytic step (Info.Decode) as the
// prior. Finished feeds each stream's observed TPOT back.
//
// Time is whatever clock the caller passes (seconds): the simulator's or
// the wall clock's. A Fleet is safe for concurrent use.
package load

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvgate/kvgate/internal/fleet"
	"github.com/kvgate/kvgate/internal/predict"
	"github.com/kvgate/kvgate/internal/sched"
)

// PrefixCache reports how much of a request each endpoint holds: it sets
// matched[i] to the number of leading blocks of keys endpoint i (in
// snapshot order) holds. The simulator's per-instance caches and the
// gateway's KV index both implement it.
type PrefixCache interface {
	CachedBlocks(keys []uint64, matched []int)
}

// CacheSizer is a PrefixCache that also knows how many blocks endpoint i
// (in snapshot order) holds in all; Snapshot then fills HeldTokens.
type CacheSizer interface {
	HeldBlocks(i int) int
}

// Info is what a Fleet knows of an endpoint before any request.
type Info struct {
	Name         string
	Role         fleet.Role
	PrefillSpeed float64 // prompt tokens per second
	// Decode is the analytic decode step, the prior of a learned TPOT
	// (zero: DecodeTPOT is not predicted from the fleet's state).
	Decode predict.DecodeStep
	// StepTokens is the endpoint's chunked-prefill step budget (vLLM's
	// --max-num-batched-tokens; 0: unknown), from which Snapshot tells
	// the last step of its queue (sched.Endpoint.TailRoom).
	StepTokens int
}

// Endpoint is one endpoint's in-flight state. Its fields are guarded by
// the Fleet's lock.
type Endpoint struct {
	info Info
	// pub is info for readers without the fleet's lock (Info).
	pub atomic.Pointer[Info]

	busy float64 // predicted time the prefill queue empties
	// late is how far catchUp has moved the queue since its head's
	// progress was last observed (a prefill's end at the head).
	late     float64
	queue    []*Flight
	head     int
	uncached int
	ublocks  int
	requests int
	streams  int
	dlast    float64 // when the last stream was routed here to decode
	// reprobe is how many streams at once the endpoint is explored with
	// after a surprise (ReprobeStreams; 0: none).
	reprobe    int
	inbound    int // prompt tokens of streams routed here to decode whose prefill has not ended
	lastPicked float64
	convs      float64 // conversations opened here, decayed to convsAt
	convsAt    float64
	lastDone   float64 // the last prefill's end
	// With Info.StepTokens: the flight whose last chunk ends the queue's
	// last step, and the tokens that step holds.
	tail   *Flight
	phase  int
	win    busyWindow    // with batching engines: the open busy window
	model  predict.Model // nil: no predictor
	dmodel predict.DecodeModel
	// ctx is the prompt tokens of the sequences in flight that decode
	// here.
	ctx int
	// active counts in-flight sequences per block; nil unless the fleet
	// tracks active blocks.
	active map[uint64]int32
	gone   bool // removed from the fleet; flights still drain
}

// Info returns the endpoint's configuration.
func (e *Endpoint) Info() Info {
	if p := e.pub.Load(); p != nil {
		return *p
	}
	return Info{}
}

// Flight is one request's footprint: its prefill on one endpoint and,
// when disaggregated, its decode stream on another.
type Flight struct {
	prefill, decode *Endpoint
	uncached        int
	ublocks         int
	keys            []uint64
	done            float64 // predicted end of the prefill
	routed          float64
	x               predict.Features
	compute         float64 // predicted compute seconds
	ttft            float64 // predicted at routing
	// With Info.StepTokens: when the step holding its last chunk is
	// predicted to start, the tokens that step has free, and the earliest
	// deadline among the requests whose first tokens that step brings and
	// that are predicted on time (0: none).
	lastStart float64
	room      int
	atRisk    float64
	// joined: its first chunk joins the step that ends the prompt ahead
	// of it (it was routed before that step began), so its compute
	// starts when that step does (Queued).
	joined    bool
	prefilled bool
	// touch: Work.Touch (routeTouch); peer: Work.Peer.
	touch, peer bool
	// queued: routed behind another prefill; deadline: Work.Deadline.
	queued   bool
	deadline float64
	inbound  bool // counted in its decode endpoint's inbound
	finished bool
	prompt   int
	seqs     int // sequences it decodes (Work.Sequences, at least 1)
	// The decode prediction for the endpoint that decodes it, and
	// whether its TPOT has trained that endpoint's model (TPOTProbe).
	dx       predict.DecodeFeatures
	dpred    float64
	dtrained bool
	// probing: routed to a decode endpoint whose TPOT was in doubt
	// (stale, or explored after a surprise): its reading decides whether
	// the endpoint is explored further (trainTPOT).
	probing bool
}

// busyWindow is an endpoint's stretch of back-to-back prefills since it
// was last idle (or since the window was last cut), for batching engines
// (SetBatchingEngines): the prefills whose first tokens came in it and when
// it started. Its length is their compute summed, whatever the engine's
// batching did to each one's.
type busyWindow struct {
	open      bool
	start     float64
	xs        []predict.Features
	predicted float64
}

// windowCut is how many prefills a busy window collects before it is
// reported and a new one starts at its last first token, so that an
// endpoint that never goes idle still trains its model. The prefills in
// flight at a cut had part of their compute in the window that is
// reported and are counted in the next one: each window is off by at most
// a batch, and the two errors cancel over successive windows.
const windowCut = 8

// Work describes a request being routed.
type Work struct {
	Uncached       int      // prompt tokens to compute
	Cached         int      // prompt tokens the endpoint holds
	UncachedBlocks int      // blocks to compute
	Keys           []uint64 // the prompt's block keys (held while in flight)
	// PrefillSeconds is the predicted compute time of the uncached part;
	// with a predictor the fleet predicts it and ignores this.
	PrefillSeconds float64
	// OpensConversation: the request starts a conversation
	// (sched.Request.OpensConversation), counted in the endpoint's
	// Conversations.
	OpensConversation bool
	// Deadline is when its first token is due (the caller's clock:
	// arrival + TTFT SLO); 0: none.
	Deadline float64
	// Touch: a touch of a held request's cached prefix (sched.Toucher),
	// not a request: it only takes its place, PrefillSeconds long, in
	// the endpoint's queue (routeTouch).
	Touch bool
	// Sequences is how many sequences it samples (OpenAI's n; 0 counts
	// as 1): a decode endpoint counts each as a stream.
	Sequences int
	// Peer: another gateway replica routed it (internal/replicasync); it
	// loads the endpoint as any request does, but the fleet's Observer
	// does not hear of it (it is the peer's to announce).
	Peer bool
}

// ConversationMemory is how long (seconds, the time constant of an
// exponential decay) a conversation opened on an endpoint counts in its
// Conversations. Nothing tells a router that a conversation ended; one
// that has been quiet this long has most likely ended or lost its cache.
const ConversationMemory = 600.0

// conversations is e's count of conversations opened at time now.
func (e *Endpoint) conversations(now float64) float64 {
	if e.convs == 0 || now <= e.convsAt {
		return e.convs
	}
	return e.convs * math.Exp(-(now-e.convsAt)/ConversationMemory)
}

// Fleet is the set of endpoints a snapshot shows, in a stable order.
type Fleet struct {
	mu          sync.Mutex
	eps         []*Endpoint
	byName      map[string]*Endpoint
	trackActive bool
	pred        predict.Predictor
	// batching: the engines batch prefills (SetBatchingEngines).
	batching bool
	// meanPrefill is the exponential average of routed requests'
	// predicted prefill seconds (sched.Snapshot.MeanPrefill).
	meanPrefill float64
	routedAny   bool
	// stepSlack is the step slack (stepslack.go; seconds) as of
	// lastToken, the latest first token heard.
	stepSlack, lastToken float64
	// slackHalfLife is StepSlackHalfLife (tests set +Inf: no aging);
	// maxStep the longest full step of the endpoints' (Set).
	slackHalfLife, maxStep float64
	// slack, when set, is told of prefill ends that leave slack sooner
	// than predicted (WakeOnSlack).
	slack chan<- struct{}
	// obs, when set, hears of the fleet's own flights (SetObserver).
	obs Observer
}

// Observer hears of the flights routed on a fleet, other than touches and
// Work.Peer ones, as their state changes: what another gateway replica
// needs to load its own view of the endpoints the same way
// (internal/replicasync). Its methods are called under the fleet's lock,
// in order for each flight, and must not block or call the fleet.
type Observer interface {
	// Routed: fl was sent to endpoint for its prefill, with w, and is
	// predicted to compute for compute seconds.
	Routed(fl *Flight, endpoint string, w Work, compute float64)
	// Decoding: fl decodes on endpoint (disaggregated).
	Decoding(fl *Flight, endpoint string)
	// Prefilled: fl's prefill ended; observed when its end was seen (a
	// first token, a prefill leg's answer), not assumed.
	Prefilled(fl *Flight, observed bool)
	// Finished: fl ended; it is not named again.
	Finished(fl *Flight)
}

// SetObserver makes o hear of the fleet's own flights from now on (nil:
// none).
func (f *Fleet) SetObserver(o Observer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.obs = o
}

// Endpoint is the member named name, or nil.
func (f *Fleet) Endpoint(name string) *Endpoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byName[name]
}

// observed reports whether the fleet's Observer hears of fl.
func (f *Fleet) observed(fl *Flight) bool { return f.obs != nil && !fl.peer && !fl.touch }

// MeanPrefillRequests is the memory, in requests, of the fleet's mean
// prefill time (sched.Snapshot.MeanPrefill): each routed request weighs
// 1/MeanPrefillRequests of it.
const MeanPrefillRequests = 100

// New returns a fleet of the given endpoints. With trackActive it keeps the
// distinct blocks of in-flight sequences (sched.SignalActiveBlocks), which
// costs a map update per block.
func New(infos []Info, trackActive bool) *Fleet {
	f := &Fleet{byName: map[string]*Endpoint{}, trackActive: trackActive, slackHalfLife: StepSlackHalfLife}
	f.Set(infos)
	return f
}

// Set replaces the fleet's membership: endpoints named in infos are kept
// (with their in-flight state, and their info updated) or added, the rest
// leave the snapshot. Requests in flight on a removed endpoint can still
// complete; their accounting is simply dropped.
func (f *Fleet) Set(infos []Info) {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := make([]*Endpoint, 0, len(infos))
	byName := make(map[string]*Endpoint, len(infos))
	for _, in := range infos {
		e := f.byName[in.Name]
		if e == nil {
			e = &Endpoint{lastPicked: -1}
			if f.trackActive {
				e.active = map[uint64]int32{}
			}
		}
		e.info, e.gone = in, false
		info := in
		e.pub.Store(&info)
		f.setModels(e)
		next = append(next, e)
		byName[in.Name] = e
	}
	for name, e := range f.byName {
		if byName[name] == nil {
			e.gone = true
		}
	}
	f.eps, f.byName = next, byName
	f.maxStep = 0
	for _, e := range next {
		f.maxStep = max(f.maxStep, e.fullStep())
	}
}

// SetBatchingEngines says the engines batch concurrent prefills (vLLM,
// SGLang: continuous batching with chunked prefill) instead of running
// them one after another. A first token then does not tell its own
// prefill's compute (prefills in one step end together; read as FIFO the
// second took 0.1 ms), so the predictor learns from busy windows
// (busyWindow) instead: the prefills an endpoint ran from idle to idle
// again, or windowCut of them, whose time is their compute summed. The
// simulator's FIFO engines leave it unset, where every first token is
// exact. docs/predictor.md has the measurements.
func (f *Fleet) SetBatchingEngines(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batching = on
}

// SetPredictor makes p predict every endpoint's prefill (nil: the
// configured speeds, as without one).
func (f *Fleet) SetPredictor(p predict.Predictor) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pred = p
	for _, e := range f.eps {
		f.setModels(e)
	}
}

// Forget makes the predictor, if it can (a Forget(name) method: the
// learned one), start the named endpoint's models again, and gives the
// endpoint, if in the fleet, its new ones.
func (f *Fleet) Forget(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fp, ok := f.pred.(interface{ Forget(name string) })
	if !ok {
		return
	}
	fp.Forget(name)
	if e := f.byName[name]; e != nil {
		f.setModels(e)
	}
}

// setModels gives e its models from the fleet's predictor.
func (f *Fleet) setModels(e *Endpoint) {
	e.model, e.dmodel = nil, nil
	if f.pred == nil {
		return
	}
	e.model = f.pred.Model(e.info.Name, e.info.PrefillSpeed)
	if dp, ok := f.pred.(predict.DecodePredictor); ok && e.info.Role.CanDecode() {
		e.dmodel = dp.DecodeModel(e.info.Name)
	}
}

// DecodeStats returns the named endpoint's TPOT model statistics, its TPOT
// for one more stream of promptTokens tokens now; false without a TPOT
// predictor or for an endpoint not in the fleet or not decoding.
func (f *Fleet) DecodeStats(name string, promptTokens int) (predict.DecodeStats, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.byName[name]
	if e == nil || e.dmodel == nil {
		return predict.DecodeStats{}, false
	}
	return e.dmodel.Stats(e.decodeFeatures(promptTokens)), true
}

// decodeFeatures describe one more stream of prompt tokens joining e now.
func (e *Endpoint) decodeFeatures(prompt int) predict.DecodeFeatures {
	n, c := e.requests+1, e.ctx+max(prompt, 0)
	return predict.DecodeFeatures{Streams: n, Context: c, Prior: e.info.Decode.Seconds(n, c)}
}

// PredictTPOT is e's TPOT for a stream joining with features x (x.Prior:
// the caller's analytic TPOT); ok is false without a TPOT model. The
// simulator predicts with its decode instances' own state.
func (f *Fleet) PredictTPOT(e *Endpoint, x predict.DecodeFeatures) (predict.Estimate, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.dmodel == nil {
		return predict.Estimate{}, false
	}
	return e.dmodel.TPOT(x), true
}

// PredictorStats returns the named endpoint's predictor statistics; false
// without a predictor or for an endpoint not in the fleet.
func (f *Fleet) PredictorStats(name string) (predict.Stats, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.byName[name]
	if e == nil || e.model == nil {
		return predict.Stats{}, false
	}
	return e.model.Stats(), true
}

// Len returns the number of endpoints.
func (f *Fleet) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.eps)
}

// CachedPrefix is how many of a prompt's tokens an engine serves from
// its cache when blocks of bs tokens of its prefix are cached: whole
// blocks, never the last token (vLLM and SGLang compute at least one
// token of every prompt, whose logits give the first output token), so a
// prompt of a whole number of blocks, all cached, recomputes its last
// block.
func CachedPrefix(blocks, bs, promptTokens int) int {
	if promptTokens <= 0 || bs <= 0 {
		return 0
	}
	return min(satMul(max(blocks, 0), bs), (promptTokens-1)/bs*bs)
}

// Snapshot fills dst with the fleet at time now for a request of
// promptTokens tokens whose block keys are keys: identity and load fields
// for every endpoint, and CachedTokens from pc (nil: nothing cached).
// matched is scratch of at least the fleet's size (nil: allocated). It
// returns the endpoints in snapshot order, for Route.
func (f *Fleet) Snapshot(now float64, promptTokens int, keys []uint64, pc PrefixCache, matched []int, dst *sched.Snapshot) []*Endpoint {
	f.mu.Lock()
	eps := f.eps
	if cap(dst.Endpoints) < len(eps) {
		dst.Endpoints = make([]sched.Endpoint, len(eps))
	}
	dst.Endpoints = dst.Endpoints[:len(eps)]
	dst.Now = now
	dst.MeanPrefill = f.meanPrefill
	slack := f.slackAt(now)
	for i, e := range eps {
		e.catchUp(now)
		e.fill(now, &dst.Endpoints[i], slack)
	}
	predicted := f.pred != nil
	f.mu.Unlock()
	if pc != nil {
		if len(matched) < len(eps) {
			matched = make([]int, len(eps))
		}
		pc.CachedBlocks(keys, matched[:len(eps)])
		bs := max(dst.BlockSize, 1)
		for i := range eps {
			dst.Endpoints[i].CachedTokens = CachedPrefix(matched[i], bs, promptTokens)
		}
		if cs, ok := pc.(CacheSizer); ok {
			for i := range eps {
				dst.Endpoints[i].HeldTokens = satMul(max(cs.HeldBlocks(i), 0), bs)
			}
		}
	}
	if predicted {
		f.predictSpeeds(eps, now, promptTokens, dst.Endpoints)
	}
	return eps
}

// predictTPOT sets DecodeTPOT and DecodeUnproven (at now) of each
// endpoint with a TPOT model and an analytic step (under the lock).
func (e *Endpoint) predictTPOT(now float64, prompt int, d *sched.Endpoint) {
	if e.dmodel == nil || e.info.Decode == (predict.DecodeStep{}) {
		return
	}
	if est := e.dmodel.TPOT(e.decodeFeatures(prompt)); est.Seconds > 0 {
		d.DecodeTPOT, d.DecodeUnproven = est.Seconds, e.unproven(now, est)
	}
}

// TPOTStaleAfter is how long (seconds) a decode endpoint whose TPOT was
// learned from its own streams may go without being sent one before its
// TPOT is unproven again (sched.Endpoint.DecodeUnproven 1): a model only
// learns from the streams it is sent, and an endpoint learned slow is
// sent none while others are faster, so an engine that was slow for a
// while (warming up, sharing its GPU) would stay predicted slow for good.
// As unproven it is tried, one stream, before a request is rejected for
// another endpoint's TPOT (sched.ExploreDecode).
const TPOTStaleAfter = 30.0

// ReprobeStreams is how many streams at once a decode endpoint is
// explored with (as unproven, sched.Endpoint.DecodeUnproven) while the
// readings of the streams sent to test it are under half their
// prediction: a stale endpoint's one stream showed it recovered, and one
// reading every TPOTStaleAfter did not move its model for 30 s more. Two
// of four decode instances 4× slow for the first 20 s (20 ms target, 60
// req/s, seeds 0-1): 69.7 / 72.0 % attained with one stream, 79.8 / 82.1
// % with 2, 81.7 / 82.4 % with 4, 82.2 / 83.0 % with 16; 4 is the fewest
// with which recovery is as quick, since on an endpoint that changed for
// the worse each explored stream misses.
const ReprobeStreams = 4

// stale: e has decoded nothing for TPOTStaleAfter (under the lock).
func (e *Endpoint) stale(now float64) bool {
	return e.streams == 0 && e.dlast > 0 && now-e.dlast > TPOTStaleAfter
}

// unproven is e's DecodeUnproven at now given its model's estimate est
// (under the lock): est's; else ReprobeStreams while a test reading
// showed it faster (trainTPOT); else 1 once e has decoded nothing for
// TPOTStaleAfter.
func (e *Endpoint) unproven(now float64, est predict.Estimate) int {
	switch {
	case est.Unproven > 0:
		return est.Unproven
	case e.reprobe > 0:
		return e.reprobe
	case e.stale(now):
		return 1
	}
	return 0
}

// DecodeUnproven is e's sched.Endpoint.DecodeUnproven at now, its model
// asked about a stream with features x (the simulator's, which predicts
// TPOT from its own decode state); 0 without a TPOT model.
func (f *Fleet) DecodeUnproven(e *Endpoint, now float64, x predict.DecodeFeatures) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.dmodel == nil {
		return 0
	}
	return e.unproven(now, e.dmodel.TPOT(x))
}

// predictSpeeds sets each prefilling endpoint's PrefillSpeed to the
// effective speed its model predicts for this request.
func (f *Fleet) predictSpeeds(eps []*Endpoint, now float64, promptTokens int, ds []sched.Endpoint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, e := range eps {
		d := &ds[i]
		e.predictTPOT(now, promptTokens, d)
		if e.model == nil || d.Role == fleet.RoleDecode {
			continue
		}
		x := e.features(max(promptTokens-d.CachedTokens, 0), d.CachedTokens)
		if x.Uncached == 0 {
			x.Uncached = predict.RefTokens
		}
		if est := e.model.Prefill(x); est.Seconds > 0 {
			d.PrefillSpeed = float64(x.Uncached) / est.Seconds
			d.PrefillSlack = est.Pessimistic / est.Seconds
			if f.batching {
				// Busy windows measure the endpoint's throughput: its
				// error holds for the queue too (sched.Endpoint.QueueSlack).
				d.QueueSlack = d.PrefillSlack
			}
		}
	}
}

func (e *Endpoint) features(uncached, cached int) predict.Features {
	return predict.Features{Uncached: uncached, Cached: cached, QueuedTokens: e.uncached, Running: e.requests}
}

func satMul(a, b int) int {
	if a > 0 && b > math.MaxInt/a {
		return math.MaxInt
	}
	return a * b
}

// fill sets d to e's state at time now; stepSlack is the fleet's step
// slack, which a request that would queue on e meets.
func (e *Endpoint) fill(now float64, d *sched.Endpoint, stepSlack float64) {
	*d = sched.Endpoint{
		Name:                e.info.Name,
		Role:                e.info.Role,
		PrefillSpeed:        e.info.PrefillSpeed,
		QueueWait:           max(e.busy-now, 0),
		FreeAt:              e.busy,
		InflightUncached:    e.uncached,
		InflightRequests:    e.requests,
		ActivePrefillBlocks: e.ublocks,
		ActiveDecodeBlocks:  len(e.active),
		DecodeStreams:       e.streams,
		InboundKVTokens:     e.inbound,
		LastPicked:          e.lastPicked,
		Conversations:       e.conversations(now),
	}
	if t := e.tail; t != nil && !t.prefilled && t.room > 0 && t.atRisk > 0 && now <= t.lastStart {
		d.TailRoom, d.TailSlack = t.room, t.atRisk-t.done
	}
	if d.QueueWait > 0 {
		d.StepSlack = min(stepSlack, e.fullStep())
	}
}

// NextIdle is the earliest time after now at which a prefilling
// endpoint's queue is predicted to run empty (+Inf if none is busy): when
// a router holding requests (sched.HoldQueue) should look for slack again.
func (f *Fleet) NextIdle(now float64) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := math.Inf(1)
	for _, e := range f.eps {
		e.catchUp(now)
		if e.info.Role.CanPrefill() && e.busy > now {
			t = min(t, e.busy)
		}
	}
	return t
}

// WakeOnSlack has the fleet tell c, without blocking (c should be
// buffered), whenever a prefill ends and leaves its endpoint sooner free
// than predicted: its queue ran empty, the head ended earlier than
// predicted and the rest moved with it, or a flight behind the head left
// the queue (its client gone). A router holding requests
// (sched.HoldQueue) looks for slack at NextIdle; such an end makes slack
// before it. Prefill ends that keep to the prediction or run late say
// nothing new. A nil c stops the signals.
func (f *Fleet) WakeOnSlack(c chan<- struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slack = c
}

// signalSlack tells the WakeOnSlack channel, if any, without blocking
// (under the lock).
func (f *Fleet) signalSlack() {
	if f.slack == nil {
		return
	}
	select {
	case f.slack <- struct{}{}:
	default:
	}
}

// notePrefill adds a routed request's predicted prefill seconds to the
// fleet's mean (under the lock).
func (f *Fleet) notePrefill(seconds float64) {
	if math.IsNaN(seconds) || math.IsInf(seconds, 0) || seconds < 0 {
		return
	}
	if !f.routedAny {
		f.meanPrefill, f.routedAny = seconds, true
		return
	}
	f.meanPrefill += (seconds - f.meanPrefill) / MeanPrefillRequests
}

// Route records that a request was sent to e for its prefill at time now
// and returns its flight.
func (f *Fleet) Route(e *Endpoint, now float64, w Work) *Flight {
	f.mu.Lock()
	defer f.mu.Unlock()
	e.catchUp(now) // what it queues behind
	if w.Touch {
		return f.routeTouch(e, now, max(w.PrefillSeconds, 0))
	}
	fl := &Flight{prefill: e, uncached: max(w.Uncached, 0), ublocks: max(w.UncachedBlocks, 0), keys: w.Keys, routed: now,
		seqs: max(w.Sequences, 1), peer: w.Peer}
	fl.prompt = fl.uncached + max(w.Cached, 0)
	fl.x = e.features(fl.uncached, max(w.Cached, 0))
	if e.info.Role.CanDecode() {
		// Aggregated unless Decode moves it: the stream decodes here.
		f.decodeOn(fl, e, e.decodeFeatures(fl.prompt))
	}
	fl.compute = max(w.PrefillSeconds, 0)
	if e.model != nil {
		fl.compute = e.model.Prefill(fl.x).Seconds
	}
	if e.head == len(e.queue) {
		// An idle endpoint starts a busy window.
		e.win = busyWindow{open: true, start: now, xs: e.win.xs[:0]}
	}
	f.notePrefill(fl.compute)
	start := max(e.busy, now)
	e.busy = start + fl.compute
	fl.done = e.busy
	fl.ttft = fl.done - now
	fl.queued, fl.deadline = start > now, w.Deadline
	e.steps(fl)
	e.queue = append(e.queue, fl)
	e.uncached += fl.uncached
	e.ublocks += fl.ublocks
	e.requests++
	e.lastPicked = now
	if w.OpensConversation {
		e.convs, e.convsAt = e.conversations(now)+1, max(now, e.convsAt)
	}
	if e.active != nil {
		for _, k := range w.Keys {
			e.active[k]++
		}
	}
	if f.observed(fl) {
		f.obs.Routed(fl, e.info.Name, w, fl.compute)
	}
	return fl
}

// routeTouch queues a touch (Work.Touch) on e, taking compute seconds: it
// takes its place in the FIFO queue, but is no request of the endpoint's
// (not in its requests, uncached tokens, decode streams, steps or the
// mean prefill), and the predictor neither times it nor learns from it
// (FirstToken). Counted as a request, a touch of a 30 000-token prefix
// weighed on its endpoint as a 30 000-token decode stream.
func (f *Fleet) routeTouch(e *Endpoint, now, compute float64) *Flight {
	fl := &Flight{prefill: e, routed: now, touch: true, compute: compute}
	if e.head == len(e.queue) {
		e.win = busyWindow{open: true, start: now, xs: e.win.xs[:0]}
	}
	start := max(e.busy, now)
	e.busy = start + compute
	fl.done, fl.ttft, fl.queued = e.busy, e.busy-now, start > now
	e.queue = append(e.queue, fl)
	return fl
}

// steps places flight fl, just routed to e (behind other prefills if
// fl.queued; due at fl.deadline, 0: none), into e's chunked-prefill steps
// (Info.StepTokens): the engine
// runs its queue in steps of at most StepTokens tokens, first come first
// served, so a prompt's last chunk shares its step with the first chunk
// of the prompt queued behind it, if that one arrives before the step
// begins, and its first token waits for that chunk too. The queue's last
// step is the tail's: when it is predicted to begin, the tokens it has
// free, and the earliest on-time deadline among the requests it ends.
func (e *Endpoint) steps(fl *Flight) {
	b := e.info.StepTokens
	if b <= 0 || fl.uncached <= 0 {
		return
	}
	prev := e.tail
	// A prompt joins the step its predecessor ends only if it is routed
	// before that step begins: the engine fills a step when it starts it.
	if !fl.queued || prev == nil || prev.prefilled || fl.routed > prev.lastStart {
		e.phase, prev = 0, nil
	}
	total := e.phase + fl.uncached
	last := total % b
	if last == 0 {
		last = b
	}
	fl.room = b - last
	perToken := fl.compute / float64(fl.uncached)
	fl.lastStart = fl.done - float64(min(last, fl.uncached))*perToken
	onTime := func(deadline float64) float64 {
		if deadline > 0 && deadline >= fl.done {
			return deadline
		}
		return 0
	}
	fl.atRisk = onTime(fl.deadline)
	fl.joined = prev != nil
	if prev != nil && total <= b {
		// The whole prompt joins the step its predecessor ends: that step
		// brings both first tokens.
		fl.lastStart = prev.lastStart
		if r := onTime(prev.atRisk); r > 0 && (fl.atRisk == 0 || r < fl.atRisk) {
			fl.atRisk = r
		}
	}
	e.phase = total % b
	e.tail = fl
}

// Decode records that the flight's sequence decodes on d (disaggregated
// serving); the prefill endpoint's request then ends at the prefill.
func (f *Fleet) Decode(fl *Flight, d *Endpoint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d != nil {
		f.decode(fl, d, d.decodeFeatures(fl.prompt))
	}
}

// DecodeWith is Decode with the caller's decode features: the TPOT
// observed at Finished trains d's model on x (the simulator predicts from
// its decode instances' state, not the fleet's).
func (f *Fleet) DecodeWith(fl *Flight, d *Endpoint, x predict.DecodeFeatures) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d != nil {
		f.decode(fl, d, x)
	}
}

func (f *Fleet) decode(fl *Flight, d *Endpoint, x predict.DecodeFeatures) {
	if fl.finished || fl.decode != nil {
		return
	}
	if p := fl.prefill; p.info.Role.CanDecode() {
		p.ctx -= fl.prompt
	}
	fl.decode = d
	if f.observed(fl) {
		f.obs.Decoding(fl, d.info.Name)
	}
	fl.probing = d.reprobe > 0 || d.stale(fl.routed)
	d.streams += fl.seqs
	d.requests++
	if !fl.prefilled && d != fl.prefill {
		// Its KV arrives when the prefill ends: reserved until then.
		d.inbound += fl.prompt
		fl.inbound = true
	}
	f.decodeOn(fl, d, x)
}

// decodeOn records the decode prediction of fl on e (which holds its
// context).
func (f *Fleet) decodeOn(fl *Flight, e *Endpoint, x predict.DecodeFeatures) {
	e.ctx += fl.prompt
	fl.dx, fl.dpred = x, 0
	e.dlast = max(e.dlast, fl.routed)
	if e.dmodel != nil {
		fl.dpred = e.dmodel.TPOT(x).Seconds
	}
}

// decoder is the endpoint the flight decodes on (nil: a prefill-only
// endpoint with no decode endpoint).
func (fl *Flight) decoder() *Endpoint {
	if fl.decode != nil {
		return fl.decode
	}
	if fl.prefill.info.Role.CanDecode() {
		return fl.prefill
	}
	return nil
}

// PredictedPrefillEnd returns when the flight's prefill is predicted to
// end.
func (f *Fleet) PredictedPrefillEnd(fl *Flight) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fl.done
}

// Queued returns when the flight's prefill is predicted to start (FIFO:
// its predicted end less its compute; on an endpoint that prefills in
// steps, when the step ending the prompt ahead begins if its first chunk
// joins that step) and its predicted compute, and whether it is queued:
// not its endpoint's head, its prefill not ended. Until 2026-12-05 a
// whole step was taken off every start, which on a slow engine (a step
// of 8 192 tokens is 4.1 s at 2 000 tokens/s) counted every queued
// request as started, and nothing was ever displaced there.
func (f *Fleet) Queued(fl *Flight) (start, compute float64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := fl.prefill
	if fl.prefilled || fl.touch || e.head >= len(e.queue) || e.queue[e.head] == fl {
		return 0, 0, false
	}
	start = fl.done - fl.compute
	if fl.joined {
		if i := slices.Index(e.queue[e.head+1:], fl); i >= 0 {
			start = min(start, e.queue[e.head+i].lastStart)
		}
	}
	return start, fl.compute, true
}

// PrefillDone records that the flight's prefill ended at time at (its
// first token, or the prefill leg's response). Calling it again, or after
// Finish, does nothing.
func (f *Fleet) PrefillDone(fl *Flight, at float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !fl.prefilled && f.observed(fl) {
		f.obs.Prefilled(fl, false)
	}
	f.unobserved(fl)
	f.prefillDone(fl, at)
}

// unobserved closes, unreported, the busy window of a flight whose prefill
// ends without an observed first token (a predicted end, a failure, a
// client gone): its compute's end is not known, so the window's is not
// either.
func (f *Fleet) unobserved(fl *Flight) {
	if !fl.prefilled {
		fl.prefill.win.open = false
	}
}

// FirstToken is PrefillDone for an observed end of the prefill (a first
// streamed token, a prefill leg's response): the predictor, if any, learns
// from it. The compute time observed is at minus the prefill's start, the
// later of its routing and the endpoint's previous prefill end (the FIFO
// model of the queue).
func (f *Fleet) FirstToken(fl *Flight, at float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl.prefilled {
		return
	}
	if fl.touch {
		// A touch's one token is not what the predictor models (a
		// prompt's prefill): it ends inside its busy window, unobserved,
		// without closing it.
		f.prefillDone(fl, at)
		return
	}
	if f.observed(fl) {
		f.obs.Prefilled(fl, true)
	}
	e := fl.prefill
	start := max(fl.routed, e.lastDone)
	f.heardToken(at)
	f.noteStepSlack(e, fl, at)
	f.prefillDone(fl, at)
	if e.model == nil {
		return
	}
	if !f.batching {
		e.model.Observe(predict.Observation{X: fl.x, Compute: at - start, Predicted: fl.compute,
			TTFT: at - fl.routed, PredictedTTFT: fl.ttft})
		return
	}
	e.observeWindow(fl, at)
}

// observeWindow adds fl's first token at time at to e's busy window and
// reports the window to e's model when it ends: e went idle (a lone
// prefill is a window of one) or the window holds windowCut prefills.
func (e *Endpoint) observeWindow(fl *Flight, at float64) {
	w := &e.win
	if !w.open || at < w.start {
		return
	}
	w.xs = append(w.xs, fl.x)
	w.predicted += fl.compute
	idle := e.head == len(e.queue)
	if !idle && len(w.xs) < windowCut {
		return
	}
	last := len(w.xs) - 1
	e.model.Observe(predict.Observation{X: w.xs[last], Also: w.xs[:last], Compute: at - w.start, Predicted: w.predicted,
		TTFT: at - fl.routed, PredictedTTFT: fl.ttft})
	*w = busyWindow{open: !idle, start: at, xs: w.xs[:0]}
}

func (f *Fleet) prefillDone(fl *Flight, at float64) {
	if fl.prefilled {
		return
	}
	fl.prefilled = true
	if fl.inbound {
		fl.decode.inbound -= fl.prompt
		fl.inbound = false
	}
	e := fl.prefill
	e.lastDone = max(e.lastDone, at)
	e.uncached -= fl.uncached
	e.ublocks -= fl.ublocks
	head := e.head < len(e.queue) && e.queue[e.head] == fl
	if head {
		e.queue[e.head] = nil
		e.head++
	} else {
		for i := e.head; i < len(e.queue); i++ {
			if e.queue[i] == fl {
				copy(e.queue[i:], e.queue[i+1:])
				e.queue[len(e.queue)-1] = nil
				e.queue = e.queue[:len(e.queue)-1]
				break
			}
		}
	}
	if head {
		e.late = 0 // the queue's progress is observed again
	}
	switch {
	case e.head == len(e.queue):
		// Idle: the queue emptied at the end of this prefill.
		e.busy, e.late = at, 0
		e.queue, e.head = e.queue[:0], 0
		f.signalSlack()
	case head && at != fl.done:
		// The head ended earlier or later than predicted: the rest of
		// the queue moves with it.
		if at < fl.done {
			f.signalSlack()
		}
		e.move(at - fl.done)
	case !head:
		f.signalSlack() // the queue behind the head shortened
	}
	if e.head > 1024 && e.head*2 > len(e.queue) {
		n := copy(e.queue, e.queue[e.head:])
		clear(e.queue[n:])
		e.queue, e.head = e.queue[:n], 0
	}
	if fl.decode != nil {
		// Disaggregated: the prefill endpoint's part is over.
		e.requests--
		f.release(e, fl.keys)
	}
}

// dropQueued takes out of e's queue the compute of fl, a flight behind
// the head whose request ended before its prefill did (its client gone,
// the engine's error): an engine drops a request it has not run (vLLM
// and SGLang abort a request whose client disconnected), so every prefill
// queued behind it ends that much sooner. What of it was predicted to
// have run by at stays. The head's end moves the queue itself
// (prefillDone). Until 2026-12-05 such a flight left the queue but its
// compute stayed in it until the endpoint went idle: under overload with
// clients that time out, the waits predicted grew past the engine's.
func (e *Endpoint) dropQueued(fl *Flight, at float64) {
	if e.head >= len(e.queue) || e.queue[e.head] == fl {
		return
	}
	i := slices.Index(e.queue[e.head+1:], fl)
	left := min(fl.compute, fl.done-at)
	if i < 0 || !(left > 0) { // NaN-safe
		return
	}
	for _, q := range e.queue[e.head+1+i+1:] {
		q.done -= left
		q.lastStart -= left
	}
	e.busy -= left
}

// catchUp moves e's queue later when its head runs late at now (under
// the lock): the head's prefill was predicted to end at its due time
// (its predicted end less what catchUp moved it, e.late), and no first
// token has come since. FIFO, nothing behind it has
// started, so the queue empties no earlier than the head's end plus the
// rest's compute; without this the queue would be predicted to drain as
// if the head had ended on time, and every request routed here while it
// runs late would be predicted to start at once. A prefix the router
// counted cached but the engine had evicted is the common cause: the
// engine computes it again.
//
// Once the head's predicted end has passed, it is predicted anew, to end
// as late again as it already is (the longer it has overrun, the more is
// likely left), and the queue behind it moves with it. Each new
// prediction stands until it passes in turn, so a head that runs late
// moves its queue a few times (its overrun doubles each time), not at
// every snapshot. Its first token sets the queue right (prefillDone).
// On an engine that prefills in steps (Info.StepTokens) a first token
// comes up to one step's compute late by design, the step that ends the
// prompt also starting the next one's (steps): the queue behind has
// started, and the head counts as late only past that.
func (e *Endpoint) catchUp(now float64) {
	if e.head >= len(e.queue) {
		return
	}
	h := e.queue[e.head]
	due := h.done - e.late + e.fullStep()
	if h.prefilled || !(now > due && now > h.done) { // NaN-safe: a NaN prediction moves nothing
		return
	}
	d := now + (now - due) - h.done
	e.move(d)
	e.late += d
}

// move moves e's queue d seconds later (earlier if negative): when it
// empties, and when each prefill in it ends and its last step starts.
func (e *Endpoint) move(d float64) {
	e.busy += d
	for _, q := range e.queue[e.head:] {
		q.done += d
		q.lastStart += d
	}
}

// Finish records that the request ended at time at (completed, failed or
// abandoned by its client). It releases everything the flight still holds;
// calling it again does nothing.
func (f *Fleet) Finish(fl *Flight, at float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.finish(fl, at)
}

// Finished is Finish for a stream that ended normally with the observed
// TPOT (seconds per output token after the first): the decode endpoint's
// TPOT model, if any, learns from it, unless TPOTProbe already taught it
// this stream's. A TPOT <= 0 (one token, unknown) does not train.
func (f *Fleet) Finished(fl *Flight, at, tpot float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl.finished {
		return
	}
	f.trainTPOT(fl, tpot)
	f.finish(fl, at)
}

// TPOTProbeTokens is how many tokens past its first a stream runs before
// it reports its TPOT so far (TPOTProbe): about two seconds of decoding
// at 20 ms a token (docs/predictor.md, "Why token 96").
const TPOTProbeTokens = 96

// TPOTProbe records the TPOT a stream has shown over its first
// TPOTProbeTokens tokens after the first: its decode endpoint's model, if
// any, learns from it now, and not again at the stream's end (Finished).
// A stream of hundreds of tokens ends tens of seconds after it starts; a
// decode endpoint slower than its prior would take that long to be
// known, and every stream sent to it meanwhile would miss its TPOT. A
// TPOT <= 0 does not train; a second probe, or one after Finish, does
// nothing.
func (f *Fleet) TPOTProbe(fl *Flight, tpot float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !fl.finished {
		f.trainTPOT(fl, tpot)
	}
}

// trainTPOT has fl's decode endpoint's model learn the stream's TPOT,
// once per flight (under the lock).
func (f *Fleet) trainTPOT(fl *Flight, tpot float64) {
	if fl.dtrained || !(tpot > 0) {
		return
	}
	if d := fl.decoder(); d != nil && d.dmodel != nil {
		fl.dtrained = true
		d.dmodel.ObserveTPOT(predict.DecodeObservation{X: fl.dx, TPOT: tpot, Predicted: fl.dpred})
		if fl.probing && fl.dpred > 0 {
			// A stream sent to test the endpoint: it is explored
			// further while such readings show it more than twice as
			// fast as its model says (slower, it is sent nothing more
			// than its prediction earns).
			d.reprobe = 0
			if tpot < fl.dpred/2 {
				d.reprobe = ReprobeStreams
			}
		}
	}
}

func (f *Fleet) finish(fl *Flight, at float64) {
	if fl.finished {
		return
	}
	f.unobserved(fl)
	if !fl.prefilled {
		fl.prefill.dropQueued(fl, at)
	}
	f.prefillDone(fl, at)
	fl.finished = true
	if f.observed(fl) {
		f.obs.Finished(fl)
	}
	if fl.touch {
		return // it held nothing else (routeTouch)
	}
	if d := fl.decoder(); d != nil {
		d.ctx -= fl.prompt
	}
	if d := fl.decode; d != nil {
		d.streams -= fl.seqs
		d.requests--
		return
	}
	fl.prefill.requests--
	f.release(fl.prefill, fl.keys)
}

func (f *Fleet) release(e *Endpoint, keys []uint64) {
	if e.active == nil {
		return
	}
	for _, k := range keys {
		if c := e.active[k]; c <= 1 {
			delete(e.active, k)
		} else {
			e.active[k] = c - 1
		}
	}
}

// Expire finishes, at their predicted times, the flights of every endpoint
// whose predicted prefill end is at or before now: the simulator's engines
// run exactly as predicted, and a prefill instance's part of a request is
// over when its prefill is.
func (f *Fleet) Expire(now float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.eps {
		for e.head < len(e.queue) && e.queue[e.head].done <= now {
			fl := e.queue[e.head]
			at := fl.done
			f.unobserved(fl)
			f.prefillDone(fl, at)
			if fl.decode == nil {
				fl.finished = true
				e.requests--
				if e.info.Role.CanDecode() {
					e.ctx -= fl.prompt
				}
				f.release(e, fl.keys)
			}
		}
	}
}

// NeedsActive reports whether a policy reads the active-block counts, so a
// Fleet for it should track them.
func NeedsActive(p sched.Policy) bool { return sched.Needs(p)&sched.SignalActiveBlocks != 0 }
