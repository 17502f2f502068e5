package load

// The step slack: how much later than predicted the first tokens of
// requests admitted near their SLO come, on engines that prefill in steps
// (Info.StepTokens).
//
// A prompt's first token comes at the end of the step that holds its last
// chunk, and that step also carries the first chunks of the prompts routed
// behind it before it begins: an additive delay of up to a step's compute
// that depends on requests not yet arrived, so no prediction of the
// request's own compute holds it, and no ratio of observed to predicted
// compute (the pessimistic margin) measures it. The fleet learns it as it
// comes: a running quantile (StepSlackQuantile) of observed minus predicted
// TTFT over the requests that queued behind another and were routed within
// one step's compute of their deadline, the requests admission judges at
// its edge. Requests with more slack are left out: the tail rule lets
// later requests join their steps (sched.HarmsTail), which would teach a
// delay the requests at the edge are spared. Admission adds it to the
// pessimistic TTFT of a request that would queue (sched.Endpoint.StepSlack),
// at most one step's compute, the most a join can add.

// StepSlackQuantile is the quantile of the step slack, the pessimistic
// margin's (predict.Options.Quantile's default).
const StepSlackQuantile = 0.9

// stepSlackStep is the quantile tracker's step, as a fraction of one full
// step's compute: from 0 it reaches a delay of half a step in about 35
// delays above it.
const stepSlackStep = 1.0 / 64

// fullStep is the compute of one full step of e's (seconds; 0: e does not
// prefill in steps, or has no speed).
func (e *Endpoint) fullStep() float64 {
	if e.info.StepTokens <= 0 || e.info.PrefillSpeed <= 0 {
		return 0
	}
	return float64(e.info.StepTokens) / e.info.PrefillSpeed
}

// noteStepSlack learns from flight fl's first token at time at, on e
// (under the lock): a request that queued behind another and was routed
// within a step's compute of its deadline moves the quantile by
// stepSlackStep of a step, up if its TTFT exceeded the prediction by more
// than the slack, down otherwise.
func (f *Fleet) noteStepSlack(e *Endpoint, fl *Flight, at float64) {
	step := e.fullStep()
	if step <= 0 || !fl.queued || fl.deadline <= 0 || fl.deadline-(fl.routed+fl.ttft) >= step {
		return
	}
	d := stepSlackStep * step
	if r := (at - fl.routed) - fl.ttft; r > f.stepSlack {
		f.stepSlack += d * StepSlackQuantile
	} else {
		f.stepSlack -= d * (1 - StepSlackQuantile)
	}
	f.stepSlack = min(max(f.stepSlack, 0), step)
}

// StepSlack is the fleet's step slack (seconds; 0 until a request at the
// edge came late, and on engines that do not prefill in steps).
func (f *Fleet) StepSlack() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stepSlack
}
