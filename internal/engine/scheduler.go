package engine

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/engine/kvpub"
	"github.com/kvgate/kvgate/internal/tokens"
)

// catchUpSlack is how late a step may end (timer overshoot, GC) and still
// have the next step start at the modelled end of the previous one rather
// than at the wall clock, so that small delays do not accumulate.
const catchUpSlack = 5 * time.Millisecond

// scheduler is the continuous-batching loop of one engine: one goroutine
// that plans a step (vLLM v1 style: running requests first, then waiting
// ones, sharing one token budget), sleeps for the step's modelled duration
// and then commits its results. Other goroutines talk to it only through
// the inbox.
type scheduler struct {
	cfg     Config
	log     *slog.Logger
	pool    *blockPool
	hasher  *tokens.Hasher
	metrics *metrics
	pub     *kvpub.Publisher // nil without KV events
	// committed are the requests the step just committed has to wake
	// (signalCommitted), after its KV events are published.
	committed []*request
	onHold    func(*request) *kvTransferResponse
	// onTransfer is called when a remote prefill's KV has arrived.
	onTransfer func(*request)

	inboxMu  sync.Mutex
	inbox    []*request
	aborts   []*request
	commands []func()
	wake     chan struct{}

	inflight atomic.Int64 // submitted and not yet finished
	// lag is the real time (ns) the engine fell behind its timing model:
	// the gaps beyond catchUpSlack between a step's modelled end and the
	// start of the next one due at once (the goroutine ran late: a CPU
	// short of cores, a long GC). Modelled time is lost by that much.
	lag atomic.Int64

	waiting      []*request
	running      []*request
	transferring []*request
	holds        map[string]*hold
	lastEnd      time.Time
	timer        *time.Timer
}

// hold keeps the blocks of a request answered for remote decode.
type hold struct {
	blocks  []int32
	expires time.Time
}

type stepItem struct {
	r *request
	n int
}

type plan struct {
	items         []stepItem
	prefillTokens int
	decodes       int
	decodeContext int
}

func newScheduler(cfg Config, lg *slog.Logger, m *metrics, pub *kvpub.Publisher) *scheduler {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &scheduler{
		cfg:     cfg,
		log:     lg,
		pool:    newBlockPool(cfg.NumGPUBlocks, cfg.BlockSize),
		hasher:  tokens.NewHasher(cfg.BlockSize),
		metrics: m,
		pub:     pub,
		wake:    make(chan struct{}, 1),
		holds:   make(map[string]*hold),
		timer:   t,
	}
}

func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// submit hands a request to the scheduler.
func (s *scheduler) submit(r *request) {
	s.inflight.Add(1)
	s.inboxMu.Lock()
	s.inbox = append(s.inbox, r)
	s.inboxMu.Unlock()
	s.poke()
}

// abort cancels a request (client gone); its blocks are freed at the next
// step boundary.
func (s *scheduler) abort(r *request) {
	if r.aborted.Swap(true) {
		return
	}
	s.inboxMu.Lock()
	s.aborts = append(s.aborts, r)
	s.inboxMu.Unlock()
	s.poke()
}

// do runs f on the scheduler goroutine between steps and waits for it.
func (s *scheduler) do(ctx context.Context, f func()) error {
	done := make(chan struct{})
	s.inboxMu.Lock()
	s.commands = append(s.commands, func() { f(); close(done) })
	s.inboxMu.Unlock()
	s.poke()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *scheduler) run(ctx context.Context) {
	defer s.timer.Stop()
	for {
		now := time.Now()
		s.drainInbox()
		s.expire(now)
		p := s.schedule(now)
		s.updateGauges()
		if len(p.items) == 0 {
			s.publish(now)
			s.lastEnd = time.Time{}
			if !s.sleep(ctx, s.nextDeadline()) {
				return
			}
			continue
		}
		start := now
		if !s.lastEnd.IsZero() {
			if gap := now.Sub(s.lastEnd); gap < catchUpSlack {
				start = s.lastEnd
			} else {
				s.lag.Add(int64(gap))
				s.metrics.lag.Add(s.cfg.modelled(gap))
			}
		}
		// Catching up never starts a step before one of its requests
		// arrived (a TTFT shorter than its own prefill).
		for _, it := range p.items {
			if it.r.arrival.After(start) {
				start = it.r.arrival
			}
		}
		end := start.Add(s.cfg.real(s.stepTime(p)))
		if !s.sleepUntil(ctx, end) {
			return
		}
		s.commit(p, end)
		s.lastEnd = end
		s.publish(end)
		s.signalCommitted()
	}
}

// signalCommitted wakes the requests the last commit gave a token or an
// end, once the step's KV events are published: a client that sends its
// next request on the answer finds a router that has heard of the blocks
// the step stored and evicted (TestIndexExactOnAQuietEngine).
func (s *scheduler) signalCommitted() {
	for i, r := range s.committed {
		r.signal()
		s.committed[i] = nil
	}
	s.committed = s.committed[:0]
}

// sleep waits for a poke, the deadline (if not zero) or ctx.
func (s *scheduler) sleep(ctx context.Context, deadline time.Time) bool {
	var tc <-chan time.Time
	if !deadline.IsZero() {
		s.timer.Reset(time.Until(deadline))
		tc = s.timer.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-s.wake:
	case <-tc:
	}
	if tc != nil {
		s.timer.Stop()
	}
	return true
}

// sleepUntil waits for the end of a step, ignoring pokes.
func (s *scheduler) sleepUntil(ctx context.Context, end time.Time) bool {
	d := time.Until(end)
	if d <= 0 {
		return ctx.Err() == nil
	}
	s.timer.Reset(d)
	select {
	case <-ctx.Done():
		s.timer.Stop()
		return false
	case <-s.timer.C:
		return true
	}
}

// nextDeadline is the earliest transfer completion or hold expiry.
func (s *scheduler) nextDeadline() time.Time {
	var t time.Time
	for _, r := range s.transferring {
		if t.IsZero() || r.readyAt.Before(t) {
			t = r.readyAt
		}
	}
	for _, h := range s.holds {
		if t.IsZero() || h.expires.Before(t) {
			t = h.expires
		}
	}
	return t
}

// enqueueByPriority puts r in the waiting queue behind every request that
// comes before it in vLLM's priority policy: by priority (lower first),
// then by arrival. A new request goes behind every request of its
// priority; a preempted one goes back ahead of the later arrivals of its
// priority. One whose KV transfer finished goes to the head whatever its
// priority, as in FCFS.
func (s *scheduler) enqueueByPriority(r *request) {
	k := len(s.waiting)
	for k > 0 && comesBefore(r, s.waiting[k-1]) {
		k--
	}
	s.waiting = slices.Insert(s.waiting, k, r)
}

// comesBefore: a is served before b in vLLM's priority policy (lower
// priority first, then earlier arrival).
func comesBefore(a, b *request) bool {
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	return a.arrival.Before(b.arrival)
}

func (s *scheduler) drainInbox() {
	s.inboxMu.Lock()
	in, ab, cmds := s.inbox, s.aborts, s.commands
	s.inbox, s.aborts, s.commands = nil, nil, nil
	s.inboxMu.Unlock()
	if s.cfg.PriorityScheduling {
		for _, r := range in {
			s.enqueueByPriority(r)
		}
	} else {
		s.waiting = append(s.waiting, in...)
	}
	for _, f := range cmds {
		f()
	}
	for _, r := range ab {
		s.remove(r)
	}
}

// remove drops an aborted request wherever it is.
func (s *scheduler) remove(r *request) {
	found := false
	for _, q := range []*[]*request{&s.waiting, &s.running, &s.transferring} {
		if i := slices.Index(*q, r); i >= 0 {
			*q = slices.Delete(*q, i, i+1)
			found = true
			break
		}
	}
	if !found {
		return // already finished
	}
	s.pool.release(r.blocks)
	r.blocks = nil
	s.inflight.Add(-1)
	s.metrics.finished(finishAbort)
	r.mu.Lock()
	r.out.done, r.out.finishReason = true, finishAbort
	r.mu.Unlock()
	r.signal()
}

// expire moves finished KV transfers to the head of the waiting queue and
// frees expired holds.
func (s *scheduler) expire(now time.Time) {
	if len(s.transferring) > 0 {
		var ready []*request
		s.transferring = slices.DeleteFunc(s.transferring, func(r *request) bool {
			if r.readyAt.After(now) {
				return false
			}
			ready = append(ready, r)
			return true
		})
		for _, r := range ready {
			r.numComputed = r.promptLen - 1
			r.kvLoaded = true
			s.storeFull(r, r.numComputed)
			if s.onTransfer != nil {
				s.onTransfer(r)
			}
		}
		s.waiting = append(ready, s.waiting...)
	}
	for id, h := range s.holds {
		if !h.expires.After(now) {
			s.pool.release(h.blocks)
			delete(s.holds, id)
		}
	}
}

// releaseHold frees the blocks kept for a remote decode of request id.
func (s *scheduler) releaseHold(id string) bool {
	h, ok := s.holds[id]
	if ok {
		s.pool.release(h.blocks)
		delete(s.holds, id)
	}
	return ok
}

func (s *scheduler) blocksFor(tokens int) int {
	return (tokens + s.cfg.BlockSize - 1) / s.cfg.BlockSize
}

// ensureHashes extends r.hashes over every full block of r.tokens.
func (s *scheduler) ensureHashes(r *request) {
	full := len(r.tokens) / s.cfg.BlockSize
	if len(r.hashes) >= full {
		return
	}
	parent := tokens.RootKey
	if len(r.hashes) > 0 {
		parent = r.hashes[len(r.hashes)-1]
	}
	from := len(r.hashes) * s.cfg.BlockSize
	r.hashes = s.hasher.AppendKeys(r.hashes, parent, r.tokens[from:full*s.cfg.BlockSize], r.extra)
}

// preempt frees a running request's blocks and sends it back to the
// waiting queue to be recomputed (vLLM's recompute preemption): to its
// head, or with priority scheduling to its place by priority and arrival.
func (s *scheduler) preempt(r *request) {
	s.pool.release(r.blocks)
	r.blocks = r.blocks[:0]
	r.numComputed, r.storedBlocks, r.kvLoaded = 0, 0, false
	if s.cfg.PriorityScheduling {
		s.enqueueByPriority(r)
	} else {
		s.waiting = append([]*request{r}, s.waiting...)
	}
	s.metrics.preemptions.Inc()
}

// victim is the index in running of the request to preempt for blocks:
// the last scheduled (FCFS), or with priority scheduling the one served
// last by priority and arrival (vLLM's choice in both).
func (s *scheduler) victim() int {
	v := len(s.running) - 1
	if s.cfg.PriorityScheduling {
		for i, r := range s.running {
			if comesBefore(s.running[v], r) {
				v = i
			}
		}
	}
	return v
}

// schedule plans one step: the running requests first, then, unless one
// was preempted, waiting ones while the budget and --max-num-seqs allow
// (vLLM v1's order).
func (s *scheduler) schedule(now time.Time) plan {
	var p plan
	budget, preempted := s.scheduleRunning(&p, s.cfg.MaxNumBatchedTokens)
	if !preempted {
		s.scheduleWaiting(&p, budget, now)
	}
	return p
}

// scheduleRunning plans the running requests' next tokens (a prefill
// chunk or one decode token each) within budget, preempting for blocks,
// and returns the budget left and whether it preempted.
func (s *scheduler) scheduleRunning(p *plan, budget int) (left int, preempted bool) {
	for i := 0; i < len(s.running) && budget > 0; i++ {
		r := s.running[i]
		n := min(len(r.tokens)-r.numComputed, budget)
		if n <= 0 {
			continue
		}
		need := s.blocksFor(r.numComputed+n) - len(r.blocks)
		if need > s.pool.numFree {
			preempted = true
			var self bool
			if i, budget, self = s.preemptFor(p, need, i, budget); self {
				break
			}
		}
		s.allocate(r, need, n)
		p.add(r, n)
		budget -= n
	}
	return budget, preempted
}

// preemptFor preempts running requests (victim) until need blocks are
// free for running[i], and returns i and the budget as they then are
// (a victim scheduled earlier in the step moves i and gives its tokens
// back) and whether running[i] itself was preempted.
func (s *scheduler) preemptFor(p *plan, need, i, budget int) (int, int, bool) {
	r := s.running[i]
	for need > s.pool.numFree {
		v := s.victim()
		victim := s.running[v]
		s.running = slices.Delete(s.running, v, v+1)
		if v < i {
			// Scheduled earlier in this step (priority scheduling only):
			// its tokens leave the step.
			budget += p.remove(victim)
			i--
		}
		s.preempt(victim)
		if victim == r {
			return i, budget, true
		}
	}
	return i, budget, false
}

// scheduleWaiting admits waiting requests in queue order while budget,
// free blocks and --max-num-seqs allow: a new prompt's prefill skips its
// longest cached prefix; a decode-side request starts its KV transfer.
//
// A request for a LoRA adapter that would make more than --max-loras
// adapters run at once is passed over, and the ones behind it go first,
// as vLLM's scheduler skips it.
func (s *scheduler) scheduleWaiting(p *plan, budget int, now time.Time) {
	loras := s.runningLoRAs()
	kept := s.waiting[:0]
	i := 0
	for ; i < len(s.waiting) && budget > 0 && len(s.running) < s.cfg.MaxNumSeqs; i++ {
		r := s.waiting[i]
		if r.lora > 0 && !slices.Contains(loras, r.lora) && len(loras) >= s.cfg.MaxLoRAs {
			kept = append(kept, r)
			continue
		}
		if r.remotePrefill != nil && !r.transferred {
			if !s.startTransfer(r, now) {
				break
			}
			continue
		}
		n, ok := s.admit(r, budget)
		if !ok {
			break
		}
		p.add(r, n)
		budget -= n
		if r.scheduledAt.IsZero() {
			r.scheduledAt = now
		}
		s.running = append(s.running, r)
		if r.lora > 0 && !slices.Contains(loras, r.lora) {
			loras = append(loras, r.lora)
		}
	}
	s.waiting = append(kept, s.waiting[i:]...)
}

// runningLoRAs are the adapters of the running requests (their
// lora_int_ids, each once).
func (s *scheduler) runningLoRAs() []int {
	var out []int
	if len(s.cfg.LoRAModules) == 0 {
		return out // no request has one: spare the scan every step
	}
	for _, r := range s.running {
		if r.lora > 0 && !slices.Contains(out, r.lora) {
			out = append(out, r.lora)
		}
	}
	return out
}

// admit gives waiting request r its blocks for its first n tokens of the
// step (at most budget), or false if the free blocks do not allow.
func (s *scheduler) admit(r *request, budget int) (n int, ok bool) {
	if len(r.blocks) > 0 {
		// KV already in place (received from a remote prefill).
		n = min(len(r.tokens)-r.numComputed, budget)
		need := s.blocksFor(r.numComputed+n) - len(r.blocks)
		if need > s.pool.numFree {
			return 0, false
		}
		s.allocate(r, need, n)
		return n, true
	}
	total := len(r.tokens)
	need, ok := s.claimPrefix(r, total, func(cached int) int { return min(total, cached+budget) })
	if !ok {
		return 0, false
	}
	n = min(total-r.numComputed, budget)
	s.allocate(r, need, n)
	return n, true
}

// claimPrefix gives request r, with total tokens, its longest cached
// prefix (not its last token) and reports how many more blocks it needs
// for its first upTo(cached tokens) tokens, or false, claiming nothing,
// when the free blocks do not allow. r's computed and stored counts then
// start after the prefix, whose hit is recorded.
func (s *scheduler) claimPrefix(r *request, total int, upTo func(cached int) int) (need int, ok bool) {
	s.ensureHashes(r)
	bs := s.cfg.BlockSize
	hit, hitFree := s.pool.lookup(r.hashes, (total-1)/bs)
	need = s.blocksFor(upTo(hit*bs)) - hit
	if need > s.pool.numFree-hitFree {
		return 0, false
	}
	r.blocks = s.pool.acquireCached(r.blocks, r.hashes[:hit])
	r.numComputed, r.storedBlocks = hit*bs, hit
	s.recordHit(r, hit*bs)
	return need, true
}

func (p *plan) add(r *request, n int) {
	p.items = append(p.items, stepItem{r, n})
	if r.decoding(n) {
		p.decodes++
		p.decodeContext += r.numComputed + 1
	} else {
		p.prefillTokens += n
	}
}

// remove takes r out of the plan (before its blocks are freed: its
// numComputed still says what add counted) and returns the tokens it had.
func (p *plan) remove(r *request) int {
	for k, it := range p.items {
		if it.r != r {
			continue
		}
		p.items = slices.Delete(p.items, k, k+1)
		if r.decoding(it.n) {
			p.decodes--
			p.decodeContext -= r.numComputed + 1
		} else {
			p.prefillTokens -= it.n
		}
		return it.n
	}
	return 0
}

// stepTime is the modelled duration of a step: the prefill work of its
// chunks plus one decode step over its decoding sequences.
func (s *scheduler) stepTime(p plan) float64 {
	return s.cfg.Perf.StepTime(p.prefillTokens, p.decodes, p.decodeContext)
}

// recordHit counts prefix-cache queries and hits once per request.
func (s *scheduler) recordHit(r *request, hitTokens int) {
	if r.queried {
		return
	}
	r.queried = true
	s.metrics.cacheQueries.Add(float64(r.promptLen))
	s.metrics.cacheHits.Add(float64(hitTokens))
	r.mu.Lock()
	r.out.cachedTokens = hitTokens
	r.mu.Unlock()
}

// startTransfer allocates blocks for a remote-prefilled prompt and starts
// the modelled KV transfer of its uncached part. It reports false when the
// KV cache has no room yet.
func (s *scheduler) startTransfer(r *request, now time.Time) bool {
	need, ok := s.claimPrefix(r, r.promptLen, func(int) int { return r.promptLen })
	if !ok {
		return false
	}
	r.blocks, _ = s.pool.allocate(r.blocks, need)
	r.transferred = true
	r.scheduledAt = now
	r.readyAt = now.Add(s.cfg.real(s.cfg.Perf.TransferTime(r.promptLen - r.numComputed)))
	s.transferring = append(s.transferring, r)
	return true
}

// allocate gives r need more blocks for its next n tokens, planned in
// this step, and registers the step's full blocks in the prefix cache
// (storeFull). The caller has checked that need blocks are free.
func (s *scheduler) allocate(r *request, need, n int) {
	r.blocks, _ = s.pool.allocate(r.blocks, need)
	s.storeFull(r, r.numComputed+n)
}

// storeFull registers r's full blocks of its first upTo tokens in the
// prefix cache (those not registered yet). A step's blocks are registered
// when the step is planned, not when it ends, as vLLM v1 does
// (KVCacheManager.allocate_slots caches the blocks of the tokens it
// schedules): a request admitted later in the same step, or in the next,
// finds them, as it finds a prompt whose last chunk shares its step.
func (s *scheduler) storeFull(r *request, upTo int) {
	full := min(upTo, len(r.tokens)) / s.cfg.BlockSize
	if full <= r.storedBlocks {
		return
	}
	s.ensureHashes(r)
	var parent *uint64
	if r.storedBlocks > 0 {
		h := r.hashes[r.storedBlocks-1]
		parent = &h
	}
	bs := s.cfg.BlockSize
	s.pool.store(r.blocks[r.storedBlocks:full], r.hashes[r.storedBlocks:full], parent, r.tokens[r.storedBlocks*bs:full*bs], r.lora, r.loraName)
	r.storedBlocks = full
}

// commit applies a finished step: computed tokens, cached blocks, sampled
// tokens, finished requests.
func (s *scheduler) commit(p plan, end time.Time) {
	generated := 0
	finishedAny := false
	for _, it := range p.items {
		r := it.r
		r.numComputed += it.n // its full blocks were registered when planned (storeFull)
		if r.numComputed < len(r.tokens) {
			continue // more prefill chunks to go
		}
		// The step sampled one token.
		r.tokens = append(r.tokens, fillerIDs[fillerIndex(r.seed, r.generated)])
		r.generated++
		generated++
		if r.generated == 1 {
			r.firstTokenAt = end
			s.metrics.promptTokens.Add(float64(r.promptLen))
			s.metrics.ttft.Observe(s.cfg.modelled(end.Sub(r.arrival)))
			s.metrics.queueTime.Observe(s.cfg.modelled(r.scheduledAt.Sub(r.arrival)))
			s.metrics.prefillTime.Observe(s.cfg.modelled(end.Sub(r.scheduledAt)))
		} else {
			itl := s.cfg.modelled(end.Sub(r.lastTokenAt))
			s.metrics.itl.Observe(itl)
			s.metrics.tpot.Observe(itl)
		}
		r.lastTokenAt = end
		done := r.generated >= r.maxTokens
		var kv *kvTransferResponse
		if done {
			finishedAny = true
			s.inflight.Add(-1)
			if r.remoteDecode && s.onHold != nil {
				s.releaseHold(r.id) // a reused request id replaces its hold
				s.holds[r.id] = &hold{blocks: r.blocks, expires: end.Add(s.cfg.real(s.cfg.KVHoldTimeout.Seconds()))}
				kv = s.onHold(r)
			} else {
				s.pool.release(r.blocks)
			}
			r.blocks = nil
			reason := finishLength
			if r.naturalEnd {
				reason = finishStop
			}
			s.metrics.finished(reason)
			s.metrics.e2e.Observe(s.cfg.modelled(end.Sub(r.arrival)))
			s.metrics.decodeTime.Observe(s.cfg.modelled(end.Sub(r.firstTokenAt)))
			r.mu.Lock()
			r.out.generated, r.out.done, r.out.finishReason, r.out.kvParams = r.generated, true, reason, kv
			r.mu.Unlock()
			s.committed = append(s.committed, r)
			continue
		}
		r.mu.Lock()
		r.out.generated = r.generated
		r.mu.Unlock()
		if r.stream && (r.generated == 1 || r.generated%s.cfg.StreamInterval == 0) {
			s.committed = append(s.committed, r)
		}
	}
	if generated > 0 {
		s.metrics.generationTokens.Add(float64(generated))
	}
	if finishedAny {
		s.running = slices.DeleteFunc(s.running, func(r *request) bool { return r.generated >= r.maxTokens })
	}
}

// publish sends the KV events recorded since the last batch as one batch.
func (s *scheduler) publish(at time.Time) {
	ev := s.pool.takeEvents()
	if s.pub == nil || len(ev) == 0 {
		return
	}
	if err := s.pub.Publish(float64(at.UnixNano())/1e9, ev); err != nil {
		s.log.Warn("publish kv events", "err", err)
	}
}

func (s *scheduler) updateGauges() {
	waiting := len(s.waiting) + len(s.transferring)
	s.metrics.running.Set(float64(len(s.running)))
	s.metrics.waiting.Set(float64(waiting))
	u := s.pool.usage()
	s.metrics.kvUsage.Set(u)
	s.metrics.gpuUsage.Set(u)
	if len(s.cfg.LoRAModules) > 0 {
		s.metrics.setLoRA(loraNames(s.running), loraNames(s.waiting, s.transferring), time.Now())
	}
}

// loraNames lists the adapters of the requests in queues, each once, in
// the order met, comma-separated.
func loraNames(queues ...[]*request) string {
	var names []string
	for _, q := range queues {
		for _, r := range q {
			if r.lora > 0 && !slices.Contains(names, r.loraName) {
				names = append(names, r.loraName)
			}
		}
	}
	return strings.Join(names, ",")
}
