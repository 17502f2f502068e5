package kvevents

import (
	"bytes"
	"encoding/binary"
	"strconv"

	"github.com/cespare/xxhash/v2"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

// Sink receives what the events mean in kvgate's own block keys.
// *kvindex.Index implements it.
type Sink interface {
	Store(ep kvindex.EndpointID, group int, t kvindex.Tier, keys []tokens.BlockKey)
	Remove(ep kvindex.EndpointID, group int, t kvindex.Tier, keys []tokens.BlockKey)
	ClearEndpoint(ep kvindex.EndpointID)
	SetGroup(model string, group int, kind kvindex.GroupKind, window int)
}

// prefetcher is implemented by sinks that can warm the cache for keys
// about to be stored (*kvindex.Index does).
type prefetcher interface {
	Prefetch(ep kvindex.EndpointID, group int, t kvindex.Tier, keys []tokens.BlockKey)
}

// mapper translates one engine's block hashes to router block keys. It is
// the engine→router key map: for every engine block it remembers the router
// state at the block's end, computed from the BlockStored token ids and the
// parent's state, so that engine hash algorithms and block sizes never
// matter.
//
// Block sizes. Let E be the engine block size and R the router's. For
// every engine block the mapper keeps the key of the last complete router
// block ending at or before the block's end (last) and the tokens after
// that boundary (tail, fewer than R). Storing a block appends its tokens to
// the parent's tail and emits a router key for every R tokens completed;
// those keys are the block's own. So with E = R each engine block is one
// router block; with E = 64, R = 16 one engine block emits 4 router keys;
// with E = 16, R = 64 every 4th engine block emits one key, and the 3
// blocks before it, which contributed tokens to it, record it as "spilled"
// so that removing any of them removes the router block too. Sizes that do
// not divide each other work the same way. A trailing partial router block
// is never indexed (engines cache only full blocks; the router keys only
// full router blocks).
//
// A mapper belongs to one goroutine.
type mapper struct {
	ep       kvindex.EndpointID
	model    string
	routerBS int
	hasher   *tokens.Hasher
	nodes    *nodeTable
	maxNodes int
	sink     Sink
	pf       prefetcher // sink's, or nil
	noFast   bool       // tests: never take storedEqual
	groups   uint32     // groups whose kind was reported to the sink
	keys     []tokens.BlockKey
	buf      []uint32
	st       *EngineStats
}

type node struct {
	last  tokens.BlockKey // router key of the last complete router block at or before the end
	owned tokens.BlockKey // first router key completed inside this block (0: none)
	held  uint64          // bit group*3+tier-1 for every (group, tier) holding the block
	ext   int32           // 1 + index of its nodeExt; 0 (none) when block sizes are equal
}

type nodeExt struct {
	more      []tokens.BlockKey // further router keys completed inside the block
	tail      []uint32          // tokens after last's boundary
	spill     []tokens.BlockKey // router blocks completed later that include tokens of this block
	parent    uint64
	hasParent bool
}

func newMapper(ep kvindex.EndpointID, model string, routerBS, maxNodes int, sink Sink, st *EngineStats) *mapper {
	pf, _ := sink.(prefetcher)
	return &mapper{
		ep: ep, model: model, routerBS: routerBS, hasher: tokens.NewHasher(routerBS),
		nodes: newNodeTable(), maxNodes: maxNodes, sink: sink, pf: pf, st: st,
	}
}

func heldBit(group int, t kvindex.Tier) uint64 {
	return 1 << (uint(group)*3 + uint(t) - 1)
}

// reset drops everything the engine held (restart, AllBlocksCleared).
func (m *mapper) reset() {
	m.nodes.reset()
	m.sink.ClearEndpoint(m.ep)
	// map_blocks says so at once: a restart found at a reconnection
	// applies no batch, and the count stayed the old engine's until the
	// next one (walkthrough, 2026-12-04).
	m.st.mapSize.Store(int64(m.nodes.len()))
}

// apply applies one decoded batch.
func (m *mapper) apply(b *Batch) {
	for i := range b.Events {
		e := &b.Events[i]
		m.st.events.Add(1)
		switch e.Kind {
		case KindBlockStored:
			m.stored(e)
		case KindBlockRemoved:
			m.removed(e)
		case KindAllBlocksCleared:
			m.st.clears.Add(1)
			m.reset()
		default:
			m.st.unknownEvents.Add(1)
		}
	}
}

// chunkBlocks is the most blocks of one event stored at once: the map's
// bound is enforced before each chunk, so an event of any size keeps the
// map within maxNodes, and the key buffers stay small.
const chunkBlocks = 4096

// chain is where a BlockStored event stands in the engine's block chain:
// the router key of the last complete router block, the tokens after it
// and the engine block before the next one.
type chain struct {
	last      tokens.BlockKey
	tail      []uint32
	parent    uint64
	hasParent bool
}

// after moves the chain past known node nd of engine hash h.
func (m *mapper) after(c *chain, h uint64, nd *node) {
	c.last, c.tail = nd.last, nil
	if x := m.nodes.extOf(nd); x != nil {
		c.tail = x.tail
	}
	c.parent, c.hasParent = h, true
}

func (m *mapper) stored(e *Event) {
	n, ebs := len(e.BlockHashes), e.BlockSize
	if n == 0 {
		return
	}
	if ebs <= 0 || len(e.TokenIDs) != n*ebs {
		m.st.badEvents.Add(1)
		return
	}
	if e.HasGroupKind && m.groups&(1<<uint(e.Group)) == 0 {
		m.groups |= 1 << uint(e.Group)
		m.sink.SetGroup(m.model, e.Group, e.GroupKind, e.Window)
	}
	c := chain{last: tokens.RootKey}
	if e.HasParent {
		p, ok := m.nodes.get(e.Parent)
		switch {
		case !ok && e.Parent == 0:
			// Parent 0 never stored: "no parent" in the positional form
			// of publishers that cannot send nil (llm-d-inference-sim).
			// The blocks start a chain.
		case !ok:
			// The parent was stored before we listened, or its event was
			// lost for good: these blocks cannot be placed in the chain.
			m.st.orphans.Add(int64(n))
			return
		default:
			m.after(&c, e.Parent, p)
		}
	}
	extra := eventLoRA(e)
	bit := heldBit(e.Group, e.Medium)
	step := max(1, min(chunkBlocks, m.maxNodes))
	for lo := 0; lo < n; lo += step {
		hi := min(n, lo+step)
		m.makeRoom(hi - lo)
		if len(e.ExtraKeys) == 0 {
			m.storeRange(e, lo, hi, &c, extra, bit)
			continue
		}
		// Runs of blocks with the same extra keys.
		for j := lo; j < hi; {
			x := blockExtra(e, j, extra)
			k := j + 1
			for k < hi && bytes.Equal(blockExtra(e, k, extra), x) {
				k++
			}
			m.storeRange(e, j, k, &c, x, bit)
			j = k
		}
	}
	m.st.storedBlocks.Add(int64(n))
	m.trimBuffers()
}

// eventLoRA is the extra bytes of e's blocks' router keys: its adapter's
// name, as a request naming that adapter mixes in (tokens.LoRAExtra). A
// vLLM older than lora_name sends only the deprecated lora_id, a number
// the engine gave the adapter as it loaded it, which no request names:
// its blocks get an extra no request's keys hold, so that an adapter's KV
// never passes for the base model's (ids start at 1; 0 is no adapter).
func eventLoRA(e *Event) []byte {
	if e.LoRAName == "" && e.HasLoRAID && e.LoRAID > 0 {
		return strconv.AppendInt([]byte("lora-id:"), e.LoRAID, 10)
	}
	return tokens.LoRAExtra(e.LoRAName)
}

// blockExtra is the extra bytes of block j's router key: the LoRA extra
// (lora), plus, when the engine hashed the block with extra keys the
// router cannot know (multimodal input hashes, a cache salt, prompt
// embeddings), a hash of those. Such blocks then never match a lookup of
// the same token ids without them: two images behind equal placeholder
// tokens, or two salts, are different prefixes.
func blockExtra(e *Event, j int, lora []byte) []byte {
	if j >= len(e.ExtraKeys) || e.ExtraKeys[j] == nil || onlyLoRA(e.ExtraKeys[j], e.LoRAName) {
		return lora
	}
	x := append([]byte(nil), lora...)
	x = append(x, "\x00engine-extra-keys\x00"...)
	return binary.LittleEndian.AppendUint64(x, xxhash.Sum64(e.ExtraKeys[j]))
}

// storeRange stores blocks [lo, hi) of e, continuing chain c, and sends
// their router keys to the sink.
func (m *mapper) storeRange(e *Event, lo, hi int, c *chain, extra []byte, bit uint64) {
	ebs, rbs := e.BlockSize, m.routerBS
	m.nodes.reserve(hi - lo)
	if c.hasParent {
		m.nodes.prefetch1(c.parent)
	}
	m.nodes.prefetch(e.BlockHashes[lo:hi])
	keys := m.keys[:0]
	start := lo
	if ebs == rbs && len(c.tail) == 0 && !m.noFast {
		keys, start = m.storedEqual(e, lo, hi, c.last, extra, bit)
		if start < hi {
			// A known block that does not continue our chain: finish
			// with the general loop from there.
			nd, _ := m.nodes.get(e.BlockHashes[start-1])
			m.after(c, e.BlockHashes[start-1], nd)
		} else {
			c.last, c.tail = keys[len(keys)-1], nil
			c.parent, c.hasParent = e.BlockHashes[hi-1], true
		}
	}
	for j := start; j < hi; j++ {
		h := e.BlockHashes[j]
		blk := e.TokenIDs[j*ebs : (j+1)*ebs]
		nd, fresh := m.nodes.upsert(h)
		if !fresh {
			// Known block (another tier or group, or a duplicate): same
			// router keys; just note who holds it.
			nd.held |= bit
			keys = m.appendOwned(keys, nd)
			m.after(c, h, nd)
			continue
		}
		nd.held = bit
		if ebs == rbs && len(c.tail) == 0 {
			k := m.hasher.Key(c.last, blk, extra)
			nd.last, nd.owned = k, k
			keys = append(keys, k)
			c.last = k
		} else {
			buf := append(append(m.buf[:0], c.tail...), blk...)
			first := len(keys)
			off := 0
			for ; off+rbs <= len(buf); off += rbs {
				c.last = m.hasher.Key(c.last, buf[off:off+rbs], extra)
				keys = append(keys, c.last)
			}
			m.buf = buf
			x := m.nodes.ext(nd)
			x.parent, x.hasParent = c.parent, c.hasParent
			if rest := buf[off:]; len(rest) > 0 {
				x.tail = append([]uint32(nil), rest...)
			}
			if own := keys[first:]; len(own) > 0 {
				nd.owned = own[0]
				if len(own) > 1 {
					x.more = append([]tokens.BlockKey(nil), own[1:]...)
				}
				if len(c.tail) > 0 {
					m.spill(c.parent, c.hasParent, own[0])
				}
			}
			nd.last = c.last
			c.tail = x.tail
		}
		c.parent, c.hasParent = h, true
	}
	m.keys = keys
	m.sink.Store(m.ep, e.Group, e.Medium, keys)
}

// storedEqual is stored's fast path for engine block size = router block
// size and a parent without a partial router block (always so when the
// sizes are equal): one router key per block. It computes the key of every
// block of [lo, hi) first, assuming the blocks are new (the common case),
// and asks the sink to prefetch their index slots, then fills the nodes,
// whose slots storeRange prefetched; the cache misses of both tables thus
// overlap the hashing instead of following each other. A block already
// known is kept as it is (its keys are the same when the chain is); if its
// keys are not the ones computed (an engine hash reused under another
// parent, or a block stored earlier with a partial tail), it returns the
// keys of the blocks before it and its index + 1, and storeRange goes on
// from there.
func (m *mapper) storedEqual(e *Event, lo, hi int, last tokens.BlockKey, extra []byte, bit uint64) ([]tokens.BlockKey, int) {
	ebs := e.BlockSize
	keys := m.keys[:0]
	for j := lo; j < hi; j++ {
		last = m.hasher.Key(last, e.TokenIDs[j*ebs:(j+1)*ebs], extra)
		keys = append(keys, last)
	}
	if m.pf != nil {
		m.pf.Prefetch(m.ep, e.Group, e.Medium, keys)
	}
	for j := lo; j < hi; j++ {
		nd, fresh := m.nodes.upsert(e.BlockHashes[j])
		k := keys[j-lo]
		if fresh {
			nd.held, nd.last, nd.owned = bit, k, k
			continue
		}
		nd.held |= bit
		if nd.ext != 0 || nd.last != k || nd.owned != k {
			return m.appendOwned(keys[:j-lo], nd), j + 1
		}
	}
	return keys, hi
}

// spill records router key k in every ancestor whose tail contributed to
// it: walking up from parent while the blocks end inside k's span.
func (m *mapper) spill(parent uint64, hasParent bool, k tokens.BlockKey) {
	for steps := 0; hasParent && steps < 1<<16; steps++ {
		p, ok := m.nodes.get(parent)
		if !ok {
			return
		}
		x := m.nodes.extOf(p)
		if x == nil || len(x.tail) == 0 {
			return
		}
		x.spill = append(x.spill, k)
		parent, hasParent = x.parent, x.hasParent
	}
}

func (m *mapper) appendOwned(keys []tokens.BlockKey, nd *node) []tokens.BlockKey {
	if nd.owned != 0 {
		keys = append(keys, nd.owned)
	}
	if x := m.nodes.extOf(nd); x != nil {
		keys = append(keys, x.more...)
	}
	return keys
}

func (m *mapper) removed(e *Event) {
	bit := heldBit(e.Group, e.Medium)
	keys := m.keys[:0]
	for _, h := range e.BlockHashes {
		nd, ok := m.nodes.get(h)
		if !ok {
			m.st.unknownRemoves.Add(1)
			continue
		}
		keys = m.appendOwned(keys, nd)
		if x := m.nodes.extOf(nd); x != nil {
			keys = append(keys, x.spill...)
		}
		if nd.held &^= bit; nd.held == 0 {
			m.nodes.delete(h)
		}
		if len(keys) >= chunkBlocks {
			m.sink.Remove(m.ep, e.Group, e.Medium, keys)
			keys = keys[:0]
		}
	}
	m.keys = keys
	m.st.removedBlocks.Add(int64(len(e.BlockHashes)))
	if len(keys) > 0 {
		m.sink.Remove(m.ep, e.Group, e.Medium, keys)
	}
	m.nodes.shrinkIfSparse()
	m.trimBuffers()
}

// makeRoom evicts so that n more blocks fit within maxNodes: at least what
// is needed, and about 1/16 of the map so that eviction is not paid for
// every event (random eviction: engine hashes are hashes). Index entries
// of the forgotten blocks stay until the index evicts them.
func (m *mapper) makeRoom(n int) {
	over := m.nodes.len() + n - m.maxNodes
	if over <= 0 {
		return
	}
	m.st.mapEvicted.Add(int64(m.nodes.evict(max(over, m.nodes.len()/16+1))))
}

// maxBufKeep bounds the key and token buffers kept between events.
const maxBufKeep = 1 << 16

// trimBuffers drops buffers an unusual event grew.
func (m *mapper) trimBuffers() {
	if cap(m.keys) > maxBufKeep {
		m.keys = nil
	}
	if cap(m.buf) > maxBufKeep {
		m.buf = nil
	}
}
