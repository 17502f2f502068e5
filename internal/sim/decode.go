package sim

import (
	"container/heap"
	"context"
	"math"

	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/perfmodel"
)

// decodeInst is one decode instance under continuous batching: every step
// produces one token for each running stream and lasts
// perfmodel.DecodeStepTime(batch, context). Streams join at step
// boundaries once their whole sequence's KV fits; otherwise they wait in
// FIFO order.
type decodeInst struct {
	kvCap, kvUsed int
	step          int64
	running       bool
	batch, ctx    int
	streams       streamHeap
	pending       []int // joined, start with the next step
	pendingCtx    int
	waiting       []int // no KV room yet
	firstStep     []int // streams whose first token ends the current step
	// probes: streams by the step that ends their probe token (held in
	// finishStep; decodePool.onProbe).
	probes streamHeap
	// inbound: requests routed here whose prefill (and transfer) has not
	// ended; they will take inboundKV tokens of KV (and add inboundCtx
	// context) when they join.
	inbound, inboundKV, inboundCtx int
}

type stream struct {
	finishStep int64
	req        int
}

type streamHeap []stream

func (h streamHeap) Len() int           { return len(h) }
func (h streamHeap) Less(i, j int) bool { return h[i].finishStep < h[j].finishStep }
func (h streamHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *streamHeap) Push(x any)        { *h = append(*h, x.(stream)) }
func (h *streamHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type event struct {
	at   float64
	seq  int64
	inst int
	req  int // >= 0: a join; -1: a step ends
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// decodePool runs the decode instances on one event queue.
type decodePool struct {
	model perfmodel.Model
	inst  []decodeInst
	ev    eventHeap
	seq   int64
	// Per request: tokens to produce, prompt length, first-token and finish
	// times.
	out, prompt   []int
	first, finish []float64
	// never[r]: request r's sequence exceeds the instance's whole KV
	// capacity; it is dropped at its join instead of blocking the
	// instance's waiting queue forever.
	never []bool
	// hidden, when set, holds each instance's hidden factor on its step
	// time (Truth.decodeFactor): the router still believes model.
	hidden *Truth
	// onFinish, when set, hears of each request's end (its stream's last
	// token, or its drop) with its TPOT (0: one token or dropped).
	onFinish func(r int, at, tpot float64)
	// onProbe, when set, hears of each stream longer than
	// load.TPOTProbeTokens + 1 tokens at its token that many past its
	// first, with its TPOT so far (load.Fleet.TPOTProbe).
	onProbe func(r int, at, tpot float64)
}

func newDecodePool(n, kvTokens int, m perfmodel.Model, requests int) *decodePool {
	p := &decodePool{model: m, inst: make([]decodeInst, n),
		out: make([]int, requests), prompt: make([]int, requests),
		first: make([]float64, requests), finish: make([]float64, requests), never: make([]bool, requests)}
	for i := range p.inst {
		p.inst[i].kvCap = kvTokens
	}
	for i := range p.first {
		p.first[i] = -1 // not yet
	}
	return p
}

func (p *decodePool) push(at float64, inst, req int) {
	p.seq++
	heap.Push(&p.ev, event{at: at, seq: p.seq, inst: inst, req: req})
}

// join schedules request r (prompt, out tokens) to reach instance d at time at.
func (p *decodePool) join(at float64, d, r, prompt, out int) {
	p.prompt[r], p.out[r] = prompt, max(out, 1)
	in := &p.inst[d]
	in.inbound++
	in.inboundKV = satAdd(in.inboundKV, p.need(r))
	in.inboundCtx = satAdd(in.inboundCtx, prompt)
	p.push(at, d, r)
}

// satAdd adds two non-negative counts, saturating.
func satAdd(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

// need is request r's KV footprint; it saturates rather than overflow.
func (p *decodePool) need(r int) int {
	if p.prompt[r] > math.MaxInt-p.out[r] {
		return math.MaxInt
	}
	return p.prompt[r] + p.out[r]
}

// served reports whether request r produced its first token.
func (p *decodePool) served(r int) bool { return !p.never[r] && p.first[r] >= 0 }

// advance processes every event up to and including time t.
func (p *decodePool) advance(t float64) {
	for len(p.ev) > 0 && p.ev[0].at <= t {
		e := heap.Pop(&p.ev).(event)
		d := &p.inst[e.inst]
		if e.req >= 0 {
			d.inbound--
			d.inboundKV -= p.need(e.req)
			d.inboundCtx -= p.prompt[e.req]
			if p.need(e.req) > d.kvCap {
				p.never[e.req] = true
				if p.onFinish != nil {
					p.onFinish(e.req, e.at, 0)
				}
				continue
			}
			if len(d.waiting) == 0 && d.kvUsed+p.need(e.req) <= d.kvCap {
				d.kvUsed += p.need(e.req)
				d.pending = append(d.pending, e.req)
				d.pendingCtx += p.prompt[e.req]
				if !d.running {
					p.startStep(e.at, e.inst)
				}
			} else {
				d.waiting = append(d.waiting, e.req)
			}
			continue
		}
		p.endStep(e.at, e.inst)
	}
}

func (p *decodePool) startStep(at float64, i int) {
	d := &p.inst[i]
	d.firstStep = d.firstStep[:0]
	for _, r := range d.pending {
		heap.Push(&d.streams, stream{finishStep: d.step + int64(p.out[r]) - 1, req: r})
		d.batch++
		d.ctx += p.prompt[r]
		d.firstStep = append(d.firstStep, r)
		if p.onProbe != nil && p.out[r] > load.TPOTProbeTokens+1 {
			heap.Push(&d.probes, stream{finishStep: d.step + load.TPOTProbeTokens, req: r})
		}
	}
	d.pending, d.pendingCtx = d.pending[:0], 0
	d.running = true
	st := p.model.DecodeStepTime(d.batch, d.ctx)
	if p.hidden != nil {
		st *= p.hidden.decodeFactor(i, at)
	}
	p.push(at+st, i, -1)
}

func (p *decodePool) endStep(at float64, i int) {
	d := &p.inst[i]
	for _, r := range d.firstStep {
		p.first[r] = at
	}
	d.ctx += d.batch
	for len(d.probes) > 0 && d.probes[0].finishStep <= d.step {
		r := heap.Pop(&d.probes).(stream).req
		p.onProbe(r, at, (at-p.first[r])/load.TPOTProbeTokens)
	}
	for len(d.streams) > 0 && d.streams[0].finishStep <= d.step {
		s := heap.Pop(&d.streams).(stream)
		p.finish[s.req] = at
		if p.onFinish != nil {
			tpot := 0.0
			if o := p.out[s.req]; o > 1 {
				tpot = (at - p.first[s.req]) / float64(o-1)
			}
			p.onFinish(s.req, at, tpot)
		}
		d.batch--
		d.ctx -= p.prompt[s.req] + p.out[s.req]
		d.kvUsed -= p.need(s.req)
	}
	for len(d.waiting) > 0 && d.kvUsed+p.need(d.waiting[0]) <= d.kvCap {
		r := d.waiting[0]
		d.waiting = d.waiting[1:]
		d.kvUsed += p.need(r)
		d.pending = append(d.pending, r)
		d.pendingCtx += p.prompt[r]
	}
	d.step++
	if d.batch > 0 || len(d.pending) > 0 {
		p.startStep(at, i)
		return
	}
	d.running = false
}

// drain runs every remaining event, checking ctx now and then.
func (p *decodePool) drain(ctx context.Context) error {
	for i := 0; len(p.ev) > 0; i++ {
		if i&4095 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		p.advance(p.ev[0].at)
	}
	return nil
}

// forecast predicts instance i's free KV tokens at time at (now <= at) and
// the TPOT a stream joining then would see: streams whose remaining tokens
// fit in the steps until then (at the current step time) will have
// finished, queued streams will have joined if they fit.
func (p *decodePool) forecast(i int, now, at float64, prompt int) (kvFree int, tpot float64) {
	kvFree, batch, ctx := p.forecastState(i, now, at, prompt)
	return kvFree, p.model.DecodeStepTime(batch, ctx)
}

// forecastState is forecast's state: the free KV tokens and the batch and
// its context tokens with the joining stream, as the router believes them
// (at the configured step time).
func (p *decodePool) forecastState(i int, now, at float64, prompt int) (kvFree, batch, ctx int) {
	d := &p.inst[i]
	batch, ctx, used := d.batch+len(d.pending), d.ctx+d.pendingCtx, d.kvUsed
	if batch > 0 && at > now {
		steps := int64((at - now) / p.model.DecodeStepTime(batch, ctx))
		for _, s := range d.streams {
			if s.finishStep-d.step < steps {
				batch--
				// Its context now: prompt + tokens made so far.
				ctx -= p.prompt[s.req] + p.out[s.req] - int(s.finishStep-d.step+1)
				used -= p.need(s.req)
			}
		}
		ctx += batch * int(steps)
	}
	for _, r := range d.waiting {
		if used+p.need(r) > d.kvCap {
			break
		}
		used += p.need(r)
		batch++
		ctx += p.prompt[r]
	}
	// Requests routed here and still in their prefill (or transfer) will
	// hold their KV by then too, as Mooncake's Conductor reserves it;
	// unseen, they made the forecast promise room that was gone (8
	// prefill and 4 decode instances at 70 req/s: admitted requests
	// waited for KV, TTFT p99 13 s against a 2 s SLO).
	used = satAdd(used, d.inboundKV)
	batch += d.inbound
	ctx = satAdd(ctx, d.inboundCtx)
	return d.kvCap - used, batch + 1, max(ctx, 0) + prompt
}
