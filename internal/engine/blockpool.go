package engine

import "github.com/kvgate/kvgate/internal/engine/kvpub"

// blockPool is the KV cache of one engine with vLLM's block-pool semantics:
// a fixed number of blocks, each with a reference count; full blocks carry
// a chained hash and are found again through the prefix cache; blocks
// nobody references sit in a free queue ordered for eviction (least
// recently freed first, and a request's blocks freed tail first), keeping
// their cached contents until a new allocation takes them. Blocks of running
// requests (ref > 0) are never evicted.
//
// Cache changes are collected as KV events until takeEvents. Owned by the
// scheduler goroutine; not safe for concurrent use.
type blockPool struct {
	blockSize int
	blocks    []block
	cached    map[uint64]int32 // block hash -> block id
	// free queue: doubly linked through block.prev/next, head evicted first.
	head, tail int32
	numFree    int

	events []kvpub.Event
}

type block struct {
	ref        int32
	prev, next int32 // free-queue links, -1 for none
	inFree     bool
	isCached   bool
	hash       uint64
}

const none = int32(-1)

func newBlockPool(numBlocks, blockSize int) *blockPool {
	p := &blockPool{
		blockSize: blockSize,
		blocks:    make([]block, numBlocks),
		cached:    make(map[uint64]int32),
		head:      none,
		tail:      none,
	}
	for i := range p.blocks {
		p.blocks[i].prev, p.blocks[i].next = none, none
		p.pushTail(int32(i))
	}
	return p
}

func (p *blockPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.inFree, b.prev, b.next = true, p.tail, none
	if p.tail != none {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.numFree++
}

func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev != none {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next != none {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.inFree, b.prev, b.next = false, none, none
	p.numFree--
}

// total is the number of blocks.
func (p *blockPool) total() int { return len(p.blocks) }

// usage is the fraction of blocks referenced by requests (vLLM's
// kv_cache_usage_perc): cached free blocks count as free.
func (p *blockPool) usage() float64 {
	return float64(len(p.blocks)-p.numFree) / float64(len(p.blocks))
}

// lookup returns how many leading hashes are cached (at most max), and how
// many of those blocks currently sit in the free queue.
func (p *blockPool) lookup(hashes []uint64, max int) (hit, hitFree int) {
	for hit < len(hashes) && hit < max {
		id, ok := p.cached[hashes[hit]]
		if !ok {
			break
		}
		if p.blocks[id].inFree {
			hitFree++
		}
		hit++
	}
	return hit, hitFree
}

// acquireCached takes a reference on the cached blocks of hashes (all must
// be cached) and appends their ids to dst.
func (p *blockPool) acquireCached(dst []int32, hashes []uint64) []int32 {
	for _, h := range hashes {
		id := p.cached[h]
		if p.blocks[id].inFree {
			p.unlink(id)
		}
		p.blocks[id].ref++
		dst = append(dst, id)
	}
	return dst
}

// allocate takes n fresh blocks from the head of the free queue, evicting
// their cached contents, and appends their ids to dst. ok is false (and
// nothing changes) when fewer than n blocks are free.
func (p *blockPool) allocate(dst []int32, n int) ([]int32, bool) {
	if n > p.numFree {
		return dst, false
	}
	for range n {
		id := p.head
		p.unlink(id)
		b := &p.blocks[id]
		if b.isCached {
			delete(p.cached, b.hash)
			b.isCached = false
			p.removed(b.hash)
		}
		b.ref = 1
		dst = append(dst, id)
	}
	return dst, true
}

// release drops one reference on each block, tail first, so that the tail
// of a sequence is evicted before its (more shareable) head.
func (p *blockPool) release(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			p.pushTail(id)
		}
	}
}

// store registers full blocks ids (holding the tokens of one sequence, in
// order, the first chained to parent) in the prefix cache and records one
// BlockStored event. A block whose hash another block already holds stays
// uncached, as in vLLM. lora is the sequence's LoRA adapter (its id, 0 for
// the base model, and name), which the events carry.
func (p *blockPool) store(ids []int32, hashes []uint64, parent *uint64, tokens []uint32, lora int, loraName string) {
	ev := &kvpub.BlockStored{Parent: parent, BlockSize: p.blockSize, LoRAID: lora, LoRAName: loraName}
	for i, id := range ids {
		h := hashes[i]
		b := &p.blocks[id]
		if b.isCached {
			continue
		}
		if _, dup := p.cached[h]; dup {
			if len(ev.Hashes) > 0 {
				p.events = append(p.events, ev)
			}
			parentHash := h
			ev = &kvpub.BlockStored{Parent: &parentHash, BlockSize: p.blockSize, LoRAID: lora, LoRAName: loraName}
			continue
		}
		b.isCached, b.hash = true, h
		p.cached[h] = id
		ev.Hashes = append(ev.Hashes, h)
		ev.TokenIDs = append(ev.TokenIDs, tokens[i*p.blockSize:(i+1)*p.blockSize]...)
	}
	if len(ev.Hashes) > 0 {
		p.events = append(p.events, ev)
	}
}

func (p *blockPool) removed(h uint64) {
	if n := len(p.events); n > 0 {
		if rm, ok := p.events[n-1].(*kvpub.BlockRemoved); ok {
			rm.Hashes = append(rm.Hashes, h)
			return
		}
	}
	p.events = append(p.events, &kvpub.BlockRemoved{Hashes: []uint64{h}})
}

// reset drops every cached hash (blocks in use stay allocated, uncached)
// and records AllBlocksCleared. It reports how many hashes were dropped.
func (p *blockPool) reset() int {
	n := len(p.cached)
	for _, id := range p.cached {
		p.blocks[id].isCached = false
	}
	clear(p.cached)
	p.events = append(p.events, kvpub.AllBlocksCleared{})
	return n
}

// takeEvents returns and forgets the events recorded so far.
func (p *blockPool) takeEvents() []kvpub.Event {
	ev := p.events
	p.events = nil
	return ev
}

// cachedHashes lists the hashes in the prefix cache (for tests).
func (p *blockPool) cachedHashes() map[uint64]bool {
	out := make(map[uint64]bool, len(p.cached))
	for h := range p.cached {
		out[h] = true
	}
	return out
}
