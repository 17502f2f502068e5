package sim

import (
	"github.com/kvgate/kvgate/internal/load"
	"github.com/kvgate/kvgate/internal/sched"
)

// Touch implements sched.Toucher: a one-token request on held request h's
// cached prefix, sent to prefill instance i at the current time. It is
// routed as any request (behind the instance's queue, on the true engine
// when there is one) and, as a dispatch does, refreshes the prefix's
// blocks in the instance's cache; it has no decode leg and counts in no
// request's result. Its compute is its token's prefill plus what one more
// sequence of its context adds to a step (the model's per-sequence and
// per-context decode costs): the query reads the whole cached prefix. The
// router picked the prefix by what it knows of the caches; where the
// instance no longer holds all of it (events lag, --event-lag), the touch
// computes the rest, as an engine does.
func (r *run) Touch(h *sched.Held, i, tokens int) {
	if i < 0 || i >= r.n {
		return
	}
	r.touchComputed += r.prefixRequest(h.Value.(int), i, tokens, false)
	r.touches++
}

// copyPrefix warms the first tokens tokens of request ri's prompt on
// instance i (sched.Decision.CopyTokens), with a one-token request on
// them and one token more, as the gateway sends it: it computes whatever
// of the prefix the instance lacks. Unlike a touch, whose one token is
// not what the router's predictor models, a copy is an ordinary prefill
// in the load accounting: timed by the predictor, and observed by it
// (in a busy window, a touch's compute is negligible, a copy's is not).
func (r *run) copyPrefix(ri, i, tokens int) {
	if i < 0 || i >= r.n {
		return
	}
	tokens = min(tokens+1, r.tr.Requests[ri].PromptTokens)
	r.copyComputed += r.prefixRequest(ri, i, tokens, true)
	r.copies++
}

// prefixRequest sends, to instance i at the current time, a one-token
// request on the first tokens tokens of request ri's prompt (Touch, or
// copyPrefix when asPrefill: accounted as an ordinary prefill), and
// returns the prompt tokens it computes.
func (r *run) prefixRequest(ri, i, tokens int, asPrefill bool) int {
	q := &r.tr.Requests[ri]
	bs := r.tr.BlockSize
	blocks := min(tokens/bs, len(q.Keys))
	held := 0 // the leading blocks the instance truly holds
	for held < blocks && r.cache.inst[i].has(q.Keys[held]) {
		held++
	}
	cached := held * bs
	unc := max(tokens-cached, 1)
	t := r.snap.Now
	freeAt := r.snap.Endpoints[i].FreeAt
	m := r.cfg.Model
	compute := m.PrefillTime(unc) + m.DecodeStepPerSeq + m.DecodeStepPerKContext*float64(tokens)/1000
	w := load.Work{Uncached: unc, Cached: cached, PrefillSeconds: compute, Touch: true}
	if asPrefill {
		w = load.Work{Uncached: unc, Cached: cached, UncachedBlocks: blocks - held, Keys: q.Keys[:blocks], PrefillSeconds: compute}
	}
	fl := r.load.Route(r.eps[i], t, w)
	if r.truth != nil {
		r.touchSeq++
		r.truth.route(r.load, fl, -r.touchSeq, i, unc, cached, t, freeAt)
	}
	if r.view != nil && held < blocks {
		// The blocks it computed are reported as any prefill's.
		from := t
		if r.cfg.EventsAtPrefill {
			from = freeAt
		}
		r.view.stored(t, from, i, q.Keys[held:blocks])
	}
	r.cache.insert(i, q.Keys[:blocks])
	return unc
}

// touchHeld runs a touch pass at the current time.
func (r *run) touchHeld() {
	if r.hold.Len() > 0 {
		r.sc.TouchHeld(r.hold, r.snap.Now, r, &r.snap)
	}
}
