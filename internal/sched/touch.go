package sched

import "math"

// Keeping held requests' prefixes warm (docs/policies.md, "Held
// requests' prefixes kept warm").
//
// A held request (without early rejection) is certain to be served, and
// its prompt's prefix is often cached on an endpoint: its conversation's
// last turn left it there. But it waits for minutes under overload while
// its endpoint computes other prompts, and an engine evicts the least
// recently used blocks first: once the endpoint has computed about as
// many tokens as its cache holds (the fleet's turnover), the prefix is
// gone and the request computes it again when it is served. A touch is
// the cheapest request that keeps it: the prefix and one more token of
// the prompt, one output token. The engine finds the prefix cached,
// computes one token, and its blocks become the most recently used.
//
// Touches cost engine work, so the hold touches only what the caches can
// keep: walking the held requests in the order it serves them, it keeps
// warm on each endpoint at most half of what that endpoint's cache holds
// (the other half stays for the requests that flow through), touching
// each one again once half a turnover has passed since the last, and only
// once the held requests' caches are at risk (the oldest has waited
// longer than the turnover, as for cacheFirst).
//
// Experimental and off by default (Scheduler.HoldTouch): the simulator
// gains with touches, but live they lost, touching prefixes the engines
// had already evicted while the index still reported them, each touch
// then computing them again (docs/policies.md).

// TouchCandidates is how many of the oldest held requests a touch pass
// walks (each due one costs a snapshot), so the most touches one pass
// sends.
const TouchCandidates = 256

// touchCacheShare is the share of an endpoint's cache that the held
// prefixes kept warm on it may fill.
const touchCacheShare = 0.5

// Toucher is a hold fleet that can touch a held request's cached prefix
// (TouchHeld).
type Toucher interface {
	HoldFleet
	// Touch sends, to endpoint i of the snapshot SnapshotFor last gave
	// for h, a request for the first tokens tokens of h's prompt (its
	// cached prefix, one token more when the prompt has it) and one
	// output token. Only the release pass's goroutine calls it.
	Touch(h *Held, i, tokens int)
}

// touchState is what the hold remembers of a held request's touches. It
// is read and written only by the goroutine making touch passes.
type touchState struct {
	at       float64 // last touched, or last found with nothing to touch
	ever     bool
	endpoint string // where its prefix was kept warm
	tokens   int    // the cached tokens touched there
}

// TouchHeld runs one touch pass at now (without early rejection; with it
// nothing is held long): it returns how many touches it sent. s is
// scratch for the snapshots.
func (sc *Scheduler) TouchHeld(q *HoldQueue, now float64, f Toucher, s *Snapshot) int {
	if !sc.Touches() {
		return 0
	}
	cands := q.oldest(TouchCandidates, make([]*Held, 0, TouchCandidates))
	if len(cands) == 0 {
		return 0
	}
	interval, riskAt := q.touchTimes()
	if now < riskAt || !anyDue(cands, now, interval) {
		return 0
	}
	f.SnapshotFor(cands[0], now, s)
	t := turnover(s)
	if t <= 0 || now-cands[0].Req.Arrival <= t {
		// Not at risk before the head has waited the turnover (a later
		// head arrived later still).
		q.setTurnover(t, cands[0].Req.Arrival+t)
		return 0
	}
	q.setTurnover(t, now)
	budget := touchBudgets(s)
	n := 0
	for _, c := range cands {
		ts := &c.touch
		if ts.ever && now-ts.at < t/2 {
			budget[ts.endpoint] -= float64(ts.tokens) // kept warm already
			continue
		}
		if c != cands[0] {
			f.SnapshotFor(c, now, s) // s holds the first's already
		}
		if touch(c, now, f, s, budget) {
			n++
		}
	}
	return n
}

// touchBudgets are the tokens the held prefixes kept warm may fill on
// each prefilling endpoint of s: touchCacheShare of what its cache holds.
func touchBudgets(s *Snapshot) map[string]float64 {
	budget := make(map[string]float64, len(s.Endpoints))
	for i := range s.Endpoints {
		if e := &s.Endpoints[i]; e.Role.CanPrefill() {
			budget[e.Name] = touchCacheShare * float64(max(e.HeldTokens, 0))
		}
	}
	return budget
}

// touch touches c's longest cached prefix on the endpoint of s (c's
// snapshot) holding it, if its budget has room, and records when: a
// request found with nothing to touch is looked at again only as late.
func touch(c *Held, now float64, f Toucher, s *Snapshot, budget map[string]float64) bool {
	ts := &c.touch
	*ts = touchState{at: now, ever: true}
	i := holdingMost(s)
	if i < 0 {
		return false
	}
	e := &s.Endpoints[i]
	if float64(e.CachedTokens) > budget[e.Name] {
		return false
	}
	budget[e.Name] -= float64(e.CachedTokens)
	ts.endpoint, ts.tokens = e.Name, e.CachedTokens
	f.Touch(c, i, min(e.CachedTokens+1, c.Req.PromptTokens))
	return true
}

// Touches reports whether the scheduler touches held requests' prefixes:
// it holds, without early rejection, with HoldTouch on.
func (sc *Scheduler) Touches() bool { return sc.Hold && !sc.EarlyReject && sc.HoldTouch }

// anyDue reports whether a candidate is due a touch at now, interval
// seconds after its last (interval 0: not known yet, every one is due).
func anyDue(cands []*Held, now, interval float64) bool {
	for _, c := range cands {
		if !c.touch.ever || now-c.touch.at >= interval {
			return true
		}
	}
	return false
}

// holdingMost is the prefilling endpoint of s holding the longest cached
// prefix of the snapshot's request, at least one block of it (ties to the
// first; -1: none).
func holdingMost(s *Snapshot) int {
	best, most := -1, max(s.BlockSize, 1)-1
	for i := range s.Endpoints {
		if e := &s.Endpoints[i]; e.Role.CanPrefill() && e.CachedTokens > most {
			best, most = i, e.CachedTokens
		}
	}
	return best
}

// touchTimes are half the turnover the last touch pass saw (0 before one
// saw it: every request is due) and the time before which no held
// request is at risk (that pass's head's arrival plus the turnover).
func (q *HoldQueue) touchTimes() (interval, riskAt float64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.turnover > 0 && !math.IsInf(q.turnover, 1) {
		interval = q.turnover / 2
	}
	return interval, q.riskAt
}

// setTurnover records a touch pass's turnover and the time before which
// nothing held is at risk.
func (q *HoldQueue) setTurnover(t, riskAt float64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.turnover, q.riskAt = t, riskAt
}
