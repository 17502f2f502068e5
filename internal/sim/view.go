package sim

import "slices"

// routerView is what a gateway's KV index would know of the prefill
// instances' caches: the engines' KV events arrive lag seconds after the
// blocks are stored, and meanwhile the gateway's own routing decisions
// stand in as approximate entries that live ttl seconds (kvindex's
// approximate tier). Policies decide on this view; the engines compute
// against their true caches.
type routerView struct {
	lag, ttl float64
	precise  *fleetCache // the true caches as of lag seconds ago
	pending  []viewEvent // stores not yet seen, in time order
	head     int
	approx   []map[uint64]float64 // per instance: key → expiry
	scratch  []int
}

type viewEvent struct {
	at   float64
	inst int
	keys []uint64
}

func newRouterView(n, capBlocks int, order Eviction, lag, ttl float64) *routerView {
	v := &routerView{lag: lag, ttl: ttl, precise: newFleetCache(n, capBlocks, order), approx: make([]map[uint64]float64, n),
		scratch: make([]int, n)}
	for i := range v.approx {
		v.approx[i] = map[uint64]float64{}
	}
	// A block the engine reports evicted is no longer approximately
	// there either (kvindex.Index.Remove).
	v.precise.onEvict = func(i int, k uint64) { delete(v.approx[i], k) }
	return v
}

// stored records that instance i stores keys, routed at time at: the
// engine reports them from time from (at, or with Config.EventsAtPrefill
// the start of the request's prefill) and the router hears of it lag
// later; it knows approximately from at.
func (v *routerView) stored(at, from float64, i int, keys []uint64) {
	e := viewEvent{at: max(from, at) + v.lag, inst: i, keys: keys}
	// Reports come in time order but for prefill starts, which a queue
	// delays: kept sorted (stably, so that equal times keep their order).
	k, _ := slices.BinarySearchFunc(v.pending[v.head:], e.at, func(p viewEvent, t float64) int {
		if p.at <= t {
			return -1
		}
		return 1
	})
	v.pending = slices.Insert(v.pending, v.head+k, e)
	if v.ttl > 0 {
		exp := at + v.ttl
		for _, k := range keys {
			v.approx[i][k] = exp
		}
	}
}

// advance applies the events that have arrived by time t.
func (v *routerView) advance(t float64) {
	for v.head < len(v.pending) && v.pending[v.head].at <= t {
		e := v.pending[v.head]
		v.precise.insert(e.inst, e.keys)
		v.pending[v.head] = viewEvent{}
		v.head++
	}
	if v.head > 1024 && v.head*2 > len(v.pending) {
		n := copy(v.pending, v.pending[v.head:])
		v.pending, v.head = v.pending[:n], 0
	}
}

// match sets matched[i] to the prefix instance i holds per the view: the
// longer of the precise (lagged) match and the unexpired approximate one.
func (v *routerView) match(t float64, keys []uint64, matched []int) {
	v.precise.match(keys, matched)
	if v.ttl <= 0 {
		return
	}
	for i, ap := range v.approx {
		n := 0
		for _, k := range keys {
			exp, ok := ap[k]
			if !ok || exp <= t {
				break
			}
			n++
		}
		matched[i] = max(matched[i], n)
		if len(ap) > 4*len(v.precise.inst[i].key)+1024 {
			for k, exp := range ap {
				if exp <= t {
					delete(ap, k)
				}
			}
		}
	}
}
