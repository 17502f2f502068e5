package kvindex

import (
	"slices"
	"sync"

	"github.com/kvgate/kvgate/internal/tokens"
)

// Matcher answers "how much of this request does each endpoint hold" for a
// fixed list of endpoints of one model, in the caller's order: it is the
// index side of the snapshot builder's PrefixCache (internal/load), which
// the simulator's caches implement too. A Matcher is immutable and safe
// for concurrent use; build a new one when the endpoint list changes.
type Matcher struct {
	idx   *Index
	model string
	ids   []EndpointID // in the caller's order
	pos   map[EndpointID]int
	bufs  sync.Pool // *[]Match
}

// NewMatcher returns a Matcher for endpoints (in snapshot order) of model.
func (x *Index) NewMatcher(model string, endpoints []EndpointID) *Matcher {
	m := &Matcher{idx: x, model: model, ids: slices.Clone(endpoints), pos: make(map[EndpointID]int, len(endpoints))}
	for i, id := range endpoints {
		m.pos[id] = i
	}
	return m
}

// CachedBlocks sets matched[i] to the longest usable prefix, in router
// blocks, that endpoint i holds of keys (any tier, approximate entries
// included); endpoints the index does not know get 0.
func (m *Matcher) CachedBlocks(keys []tokens.BlockKey, matched []int) {
	clear(matched)
	bp, _ := m.bufs.Get().(*[]Match)
	if bp == nil {
		bp = new([]Match)
	}
	*bp = m.idx.Lookup(m.model, keys, (*bp)[:0])
	for _, r := range *bp {
		if i, ok := m.pos[r.Endpoint]; ok && i < len(matched) {
			matched[i] = r.Blocks
		}
	}
	m.bufs.Put(bp)
}

// HeldBlocks is how many blocks endpoint i (in the caller's order) holds
// on the GPU tier in all (precise entries, all groups): the snapshot's
// HeldTokens (load.CacheSizer). 0 for an endpoint the index does not
// know.
func (m *Matcher) HeldBlocks(i int) int {
	if i < 0 || i >= len(m.ids) {
		return 0
	}
	e := m.idx.endpoint(m.ids[i])
	if e == nil {
		return 0
	}
	return int(max(e.blocks[TierGPU].Load(), 0))
}
