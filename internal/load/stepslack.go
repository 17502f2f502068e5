package load

import "math"

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

// While no first token comes for longer than a step's compute (the fleet
// idle), the step slack halves every StepSlackHalfLife seconds: it is the delay prompts joining a step
// add under load, and a load that has ended left none (until 2026-12-04 it
// stayed as the last load left it, and an idle fleet turned away a burst
// it could serve: a walkthrough's bursts of 16 had 2 to 4 fewer
// admitted after an overload than with the slack off).

// StepSlackHalfLife is the step slack's half-life while the fleet is idle
// (seconds; slackAt).
const StepSlackHalfLife = 10.0

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

// slackAt is the step slack at time now (under the lock): halved every
// StepSlackHalfLife seconds of the fleet's idleness, the time since the
// last first token beyond one full step's compute (the longest of its
// endpoints'). Under load first tokens come within a step of each other
// and nothing ages (aging every gap biased the quantile down: with a
// 10 s half-life on every gap, the long-documents shape lost 0.85 points
// of attainment in the simulator).
func (f *Fleet) slackAt(now float64) float64 {
	if f.stepSlack <= 0 || f.slackHalfLife <= 0 {
		return f.stepSlack
	}
	if idle := now - f.lastToken - f.maxStep; idle > 0 {
		return f.stepSlack * math.Exp2(-idle/f.slackHalfLife)
	}
	return f.stepSlack
}

// heardToken ages the step slack to at, a first token's time (under the
// lock).
func (f *Fleet) heardToken(at float64) {
	f.stepSlack = f.slackAt(at)
	f.lastToken = max(f.lastToken, at)
}

// StepSlack is the fleet's step slack as of its last first token
// (seconds; 0 until a request at the edge came late, and on engines that
// do not prefill in steps); StepSlackAt is it at a time.
func (f *Fleet) StepSlack() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stepSlack
}

// StepSlackAt is the fleet's step slack at time now (the fleet idle since
// its last first token ages it).
func (f *Fleet) StepSlackAt(now float64) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slackAt(now)
}
