package sim

import "testing"

// TestRouterViewEventsAtPrefill: a store reported from a later time (a
// request queued until its prefill starts) reaches the view then, in time
// order with the others, while the router's own approximate entry knows
// it at once; a block the view sees evicted loses its approximate entry
// too, as kvindex drops one on a KV event's removal.
func TestRouterViewEventsAtPrefill(t *testing.T) {
	const a, b, c, d = 11, 12, 13, 14
	v := newRouterView(1, 2, EvictTailFirst, 0, 100)
	m := make([]int, 1)
	held := func(at float64, keys ...uint64) int {
		v.advance(at)
		v.match(at, keys, m)
		return m[0]
	}
	v.stored(0, 0, 0, []uint64{a})
	if got := held(0, a); got != 1 {
		t.Fatalf("a after its store: %d, want 1", got)
	}
	v.stored(1, 5, 0, []uint64{b, c}) // queued until 5
	v.stored(2, 3, 0, []uint64{d})    // routed later, starts sooner
	if got := held(1, b, c); got != 2 {
		t.Errorf("b, c right after routing: %d, want 2 (approximately)", got)
	}
	if got := held(1, a); got != 1 {
		t.Errorf("a before the queued request starts: %d, want 1", got)
	}
	// At 3 d is stored (the cache holds a, d); at 5 b and c evict both.
	if got := held(3, d); got != 1 {
		t.Errorf("d at its prefill: %d, want 1", got)
	}
	if got := held(4.9, a); got != 1 {
		t.Errorf("a before the evicting prefill: %d, want 1", got)
	}
	if got := held(5, a); got != 0 {
		t.Errorf("a after b and c evicted it: %d, want 0 (its approximate entry dropped with it)", got)
	}
	if got := held(5, b, c); got != 2 {
		t.Errorf("b, c after their prefill: %d, want 2", got)
	}
	// Without approximate entries the order of reports shows alone: the
	// request routed later but starting sooner is seen first.
	w := newRouterView(1, 4, EvictTailFirst, 0, 0)
	w.stored(1, 5, 0, []uint64{b})
	w.stored(2, 3, 0, []uint64{d})
	w.advance(3)
	if w.match(3, []uint64{d}, m); m[0] != 1 {
		t.Errorf("d at its prefill (3), stored after b (5): %d, want 1", m[0])
	}
	if w.match(3, []uint64{b}, m); m[0] != 0 {
		t.Errorf("b before its prefill: %d, want 0", m[0])
	}
}
