package sched

import (
	"math"
	"sync"
)

// Returns tracks whether the hold's investments come back (see
// docs/policies.md, "The hold queue"). With early rejection the hold
// serves late, on an idle endpoint, a request that misses its SLO even
// alone: a miss, bought for what it leaves in the cache, worth its compute
// only if a later request extends its prompt (its conversation's next
// turn). On a workload of long conversations most do; on one whose long
// prompts are seldom extended (the Mooncake trace at 4× its rate: 95 of
// its 592 prompts that miss alone within the quiet window) few do, and
// the compute is mostly lost.
//
// An investment comes back when a request arrives within the horizon
// whose prompt extends it: it has more full blocks and the same chained
// key at the investment's last full block (the same prompt again, as a
// retry, does not count). The share that came back is counted with a
// Laplace prior, (came + 1) / (came + lost + 2), over a memory of
// ReturnsMemory seconds: old outcomes fade, so a verdict that stopped the
// investing is forgotten and the workload tried again. It is safe for
// concurrent use; its zero value is ready.
type Returns struct {
	mu         sync.Mutex
	pending    []investment
	came, lost float64 // outcomes, each weighing exp(−age / ReturnsMemory)
	at         float64 // clock time of the weights
}

type investment struct {
	key   uint64  // the prompt's last full block's chained key
	n     int     // its full blocks
	until float64 // the horizon: lost if nothing extends it by then
}

// ReturnsMemory is the time constant (seconds) over which the hold's
// investment outcomes fade, the same as a conversation's weight on its
// endpoint (load.ConversationMemory): nothing tells a router a workload
// changed.
const ReturnsMemory = 600.0

// maxPendingInvestments caps the investments awaiting their outcome; past
// it the oldest is counted lost.
const maxPendingInvestments = 256

// fade ages the outcomes' weights to now. r.mu is held.
func (r *Returns) fade(now float64) {
	if now > r.at {
		f := math.Exp(-(now - r.at) / ReturnsMemory)
		r.came *= f
		r.lost *= f
		r.at = now
	}
}

// Invest records that the prompt with these chained block keys was served
// late at now, to come back by now + horizon. A prompt without a full
// block cannot be recognised and is not recorded.
func (r *Returns) Invest(now float64, keys []uint64, horizon float64) {
	if len(keys) == 0 || math.IsNaN(now) || !(horizon > 0) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fade(now)
	if len(r.pending) >= maxPendingInvestments {
		r.pending = r.pending[1:]
		r.lost++
	}
	r.pending = append(r.pending, investment{key: keys[len(keys)-1], n: len(keys), until: now + horizon})
}

// NoteArrival settles the investments a request arriving at now with these
// chained block keys decides: the ones its prompt extends came back, the
// ones past their horizon were lost.
func (r *Returns) NoteArrival(now float64, keys []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pending) == 0 {
		return
	}
	r.fade(now)
	kept := r.pending[:0]
	for _, v := range r.pending {
		switch {
		case len(keys) > v.n && keys[v.n-1] == v.key:
			r.came++
		case now > v.until:
			r.lost++
		default:
			kept = append(kept, v)
		}
	}
	r.pending = kept
}

// Rate is the share of investments that came back as of now, with a
// Laplace prior: ½ before any outcome.
func (r *Returns) Rate(now float64) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fade(now)
	return (r.came + 1) / (r.came + r.lost + 2)
}
