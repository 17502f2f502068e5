package sim

// MaxStepTokens bounds Truth.StepTokens (vLLM's --max-num-batched-tokens
// rarely exceeds a few hundred thousand).
const MaxStepTokens = 1 << 24

// lastStep is the step an instance's prefill queue ends with, under
// chunked prefill (Truth.StepTokens): when it begins and ends, the tokens
// of its budget still free, and the requests whose last chunk it holds
// (their first tokens come when it ends).
type lastStep struct {
	start, end float64
	room       int
	members    []int
}

// chunked places a prefill of uncached tokens taking compute seconds,
// request ri routed to instance i at time at and starting at start (the
// end of the instance's queue, or at), into the instance's steps, and
// returns when its first token comes.
//
// The queue's last step holds the last chunk of the prompt ahead; if this
// request arrived before that step began and the step has room, the step
// also carries this request's first chunk (vLLM schedules running
// requests first, then waiting ones, within the step's token budget): the
// step, and every first token it ends with, comes that chunk's compute
// later. The rest of the prompt is prefilled in full steps after it, its
// last chunk in a step of its own that the next request may join in turn.
// A chunk's compute is its share of the request's compute, so the
// instance's throughput is unchanged: only first tokens move.
func (tr *truthRun) chunked(i, ri int, at, start float64, uncached int, compute float64) float64 {
	perToken := compute / float64(uncached)
	ls := &tr.last[i]
	joined := 0
	if start > at && at <= ls.start && ls.room > 0 && len(ls.members) > 0 {
		joined = min(ls.room, uncached)
		d := float64(joined) * perToken
		ls.end += d
		for _, m := range ls.members {
			tr.delay(i, m, d, ls.end)
		}
		ls.room -= joined
		if joined == uncached {
			ls.members = append(ls.members, ri)
			return ls.end
		}
	}
	rest := uncached - joined
	lastChunk := rest % tr.t.StepTokens
	if lastChunk == 0 {
		lastChunk = tr.t.StepTokens
	}
	ls.start = start + float64(uncached-lastChunk)*perToken
	ls.end = start + compute
	ls.room = tr.t.StepTokens - lastChunk
	ls.members = append(ls.members[:0], ri)
	return start + compute
}

// delay moves request ri's first token on instance i d seconds later, to
// end: its pending completion (if the router has not heard of it yet)
// and the run's record of it.
func (tr *truthRun) delay(i, ri int, d, end float64) {
	q := tr.pending[i]
	for k := len(q) - 1; k >= 0; k-- {
		if q[k].ri == ri {
			q[k].end = end
			q[k].heardAt += d
			break
		}
	}
	if tr.onDelay != nil && ri >= 0 {
		tr.onDelay(ri, end)
	}
}
