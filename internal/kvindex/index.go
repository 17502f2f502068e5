// Package kvindex is kvgate's global prefix index: which endpoint holds
// which block of which prompt prefix, on which tier (GPU, CPU, storage) and
// in which KV-cache group.
//
// Keys are kvgate's own chained block keys (package tokens) for one router
// block size, fixed per Index. Entries come from two sources:
//
//   - precise entries, written by the KV-event subscriber (package
//     kvevents) from what engines report: Store, Remove, ClearEndpoint;
//   - approximate entries, written by the router for what it sent where
//     (Routed); they expire after a TTL and fill in for engines that publish
//     no events and for the gap between routing a request and seeing its
//     events. A precise Remove or ClearEndpoint also drops them.
//
// # Lookup
//
//	matches := idx.Lookup(model, keys, matches[:0])
//
// walks the request's keys once and fills one Match per endpoint serving
// the model (in endpoint-slot order, the same order as Endpoints(model)):
// the longest usable prefix in blocks and tokens, the part of it held on
// GPU, the slowest tier that prefix needs and whether approximate entries
// were used. Pass the previous result's slice back to make Lookup
// allocation-free. The walk stops as soon as no endpoint matches any more.
//
// # Layout and concurrency
//
// Endpoints get small integer ids (EndpointID) with a name table; inside a
// model each endpoint has a slot, and 64 slots form a page. Registering an
// endpoint costs the same however many there are (ids live in fixed
// chunks, slots are appended, models are in a concurrent map), and
// RemoveEndpoint frees its id and slot for reuse, and its model's tables
// with its last endpoint, so endpoint churn does not grow the index. For every
// (model, KV-cache group, page) there is one precise table mapping a
// (block key, tier) to a 64-bit set of endpoints, the tiers of a block
// sharing a home slot (tkey in table.go), so one probe answers all tiers;
// approximate entries have their own table per page holding two TTL
// generations. A table is an open-addressing
// hash table sharded by the key's top bits. Writers (one goroutine per
// engine stream, any number of them) take the shard's mutex; readers take
// no lock at all: every slot word is read atomically and the key is
// re-checked after the payload, and a rehash publishes a new array through
// an atomic pointer. A lookup therefore costs about one probe per block,
// plus one per other tier where an endpoint still matching lacks the block
// on GPU (walk.go), never blocks and never contends with writers.
//
// # Memory
//
// A precise slot is 16 bytes and tables stay between 3/8 and 3/4 full, so
// one (block, endpoint) entry costs at most ~43 bytes when a block has a
// single holder and proportionally less when several endpoints hold it.
// Config.MaxKeys bounds the keys per table and tier; beyond it a shard
// evicts about 1/16 of that tier's entries (random eviction: keys are
// hashes).
//
// # Hybrid models
//
// Keys are stored per KV-cache group. Group 0 and every group learned as
// full attention must hold the whole prefix. A sliding-window group needs
// only the blocks covering its last window before the end of the prefix,
// and a state group (mamba) only the block at the end; the prefix is cut
// back to the longest length at which every group is satisfied, as vLLM's
// hybrid cache coordinator does. Approximate entries count for all groups.
package kvindex

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/internal/tokens"
)

// EndpointID is a small integer naming one (endpoint, model) pair.
type EndpointID uint16

// Config configures an Index. Zero fields take defaults.
type Config struct {
	// BlockSize is the router block size in tokens the keys are made for
	// (default 16).
	BlockSize int
	// MaxKeys bounds the keys per model, group, page of 64 endpoints and
	// tier (the tiers share a table but are bounded separately); default
	// 4 Mi.
	MaxKeys int
	// Shards is the number of shards per table (power of two, default 32).
	Shards int
	// ApproxTTL is how long an approximate entry lives: between ApproxTTL
	// and twice that after the last Routed call for it (default 2 min).
	ApproxTTL time.Duration
	// MaxEndpoints bounds registered endpoints (default
	// DefaultMaxEndpoints, at most MaxEndpoints); each new model costs
	// about 20 KB of tables.
	MaxEndpoints int
	// Now is the clock (default time.Now); the simulator passes its own.
	Now func() time.Time
}

// Match is one endpoint's result of a Lookup.
type Match struct {
	Endpoint EndpointID
	// Blocks is the longest usable prefix in router blocks, on any tier;
	// Tokens = Blocks × block size.
	Blocks int
	Tokens int
	// GPUBlocks is the part of that prefix held on GPU (or approximately).
	GPUBlocks int
	// Tier is the slowest tier the prefix of Blocks needs (TierNone when
	// Blocks is 0).
	Tier Tier
	// Approx reports that approximate (routed, unconfirmed) entries were
	// used.
	Approx bool
}

// Index is the global prefix index. Create it with New.
type Index struct {
	cfg Config

	mu      sync.Mutex // registry writes
	byName  map[string]EndpointID
	freeIDs []EndpointID // ids of removed endpoints, for reuse
	nextID  int          // ids handed out so far
	live    int          // registered endpoints
	// eps maps an EndpointID to its endpoint: fixed chunks, so that
	// registering never copies the table and readers take no lock.
	eps    [MaxEndpoints / epChunkLen]atomic.Pointer[epChunk]
	idsHi  atomic.Int32 // nextID, for readers
	models sync.Map     // model name → *model
}

const epChunkLen = 256

type epChunk [epChunkLen]atomic.Pointer[endpoint]

type endpoint struct {
	id     EndpointID
	name   string
	model  *model
	slot   int
	blocks [4]atomic.Int64 // precise (block, group) entries by Tier
}

type model struct {
	name string
	mu   sync.Mutex // view writes, free, live
	view atomic.Pointer[view]
	free []int // slots of removed endpoints
	live int   // endpoints registered
}

// view is an immutable snapshot of a model's endpoints, groups and tables.
// Its eps may share a backing array with later views that appended to it
// (a view never reads beyond its length).
type view struct {
	eps    []*endpoint // by slot; nil for a removed endpoint's slot
	holes  int         // nil entries in eps
	groups []group     // by group index
}

type group struct {
	kind   GroupKind
	window int // tokens, sliding-window groups
	pages  []*page
}

// page holds the tables of 64 endpoint slots of one group.
type page struct {
	prec   *table // precise entries of every tier (slot keys are tkeys)
	approx *table // group 0 only
}

// New returns an empty Index.
func New(cfg Config) *Index {
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 16
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 4 << 20
	}
	if cfg.Shards <= 0 {
		cfg.Shards = 32
	}
	if cfg.ApproxTTL <= 0 {
		cfg.ApproxTTL = 2 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxEndpoints <= 0 {
		cfg.MaxEndpoints = DefaultMaxEndpoints
	}
	cfg.MaxEndpoints = min(cfg.MaxEndpoints, MaxEndpoints)
	return &Index{cfg: cfg, byName: map[string]EndpointID{}}
}

// BlockSize is the router block size of the keys.
func (x *Index) BlockSize() int { return x.cfg.BlockSize }

// MaxEndpoints is the most endpoints an Index can name.
const MaxEndpoints = 1 << 16

// DefaultMaxEndpoints is Config.MaxEndpoints's default.
const DefaultMaxEndpoints = 4096

// ErrTooManyEndpoints is returned by AddEndpoint past Config.MaxEndpoints.
var ErrTooManyEndpoints = errors.New("kvindex: too many endpoints")

// AddEndpoint registers the endpoint name serving model and returns its id;
// it is idempotent. Names are usually "host:port". Its cost does not grow
// with the number of endpoints or models.
func (x *Index) AddEndpoint(name, modelName string) (EndpointID, error) {
	return x.AddEndpointLimited(name, modelName, x.cfg.MaxEndpoints)
}

// AddEndpointLimited is AddEndpoint refusing a new endpoint when limit
// (or Config.MaxEndpoints, if smaller) are already registered; for
// registrations a client asks for.
func (x *Index) AddEndpointLimited(name, modelName string, limit int) (EndpointID, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	key := name + "\x00" + modelName
	if id, ok := x.byName[key]; ok {
		return id, nil
	}
	if limit = min(limit, x.cfg.MaxEndpoints); x.live >= limit {
		return 0, fmt.Errorf("%w: %d registered, the limit is %d", ErrTooManyEndpoints, x.live, limit)
	}
	var id EndpointID
	if k := len(x.freeIDs); k > 0 {
		id, x.freeIDs = x.freeIDs[k-1], x.freeIDs[:k-1]
	} else {
		id = EndpointID(x.nextID)
		x.nextID++
		x.idsHi.Store(int32(x.nextID))
	}
	var m *model
	if v, ok := x.models.Load(modelName); ok {
		m = v.(*model)
	} else {
		m = &model{name: modelName}
		m.view.Store(&view{groups: []group{{kind: GroupFullAttention}}})
		x.models.Store(modelName, m)
	}
	e := &endpoint{id: id, name: name, model: m}
	m.mu.Lock()
	v := m.view.Load()
	nv := &view{groups: v.groups, holes: v.holes}
	if k := len(m.free); k > 0 {
		e.slot, m.free = m.free[k-1], m.free[:k-1]
		nv.eps = slices.Clone(v.eps)
		nv.eps[e.slot] = e
		nv.holes--
	} else {
		e.slot = len(v.eps)
		nv.eps = append(v.eps, e) // in place when there is room: no view reads past its length
	}
	x.ensurePages(m, nv)
	m.view.Store(nv)
	m.live++
	m.mu.Unlock()
	x.setEndpoint(id, e)
	x.byName[key] = id
	x.live++
	return id, nil
}

func (x *Index) setEndpoint(id EndpointID, e *endpoint) {
	c := x.eps[id/epChunkLen].Load()
	if c == nil {
		c = new(epChunk)
		x.eps[id/epChunkLen].Store(c)
	}
	c[id%epChunkLen].Store(e)
}

// RemoveEndpoint unregisters id: its entries, precise and approximate, are
// dropped, and its id and slot are reused by later registrations; a model
// whose last endpoint goes is dropped with its tables. The caller must have
// stopped writing for id (Store, Remove, Routed) and must not use id again.
func (x *Index) RemoveEndpoint(id EndpointID) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.endpoint(id)
	if e == nil {
		return fmt.Errorf("kvindex: no endpoint %d", id)
	}
	x.ClearEndpoint(id)
	m := e.model
	m.mu.Lock()
	v := m.view.Load()
	nv := &view{eps: slices.Clone(v.eps), holes: v.holes + 1, groups: v.groups}
	nv.eps[e.slot] = nil
	m.view.Store(nv)
	m.free = append(m.free, e.slot)
	m.live--
	empty := m.live == 0
	m.mu.Unlock()
	if empty {
		x.models.CompareAndDelete(m.name, m)
	}
	x.eps[id/epChunkLen].Load()[id%epChunkLen].Store(nil)
	x.freeIDs = append(x.freeIDs, id)
	delete(x.byName, e.name+"\x00"+m.name)
	x.live--
	return nil
}

// NumEndpoints is the number of registered endpoints.
func (x *Index) NumEndpoints() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.live
}

// ensurePages gives every group of nv a page for every 64 slots, copying
// the slices it changes. Caller holds m.mu.
func (x *Index) ensurePages(m *model, nv *view) {
	want := (len(nv.eps) + 63) / 64
	groups := make([]group, len(nv.groups))
	copy(groups, nv.groups)
	for gi := range groups {
		g := &groups[gi]
		if len(g.pages) >= want {
			continue
		}
		pages := make([]*page, len(g.pages), want)
		copy(pages, g.pages)
		for p := len(pages); p < want; p++ {
			pages = append(pages, x.newPage(m, p, gi == 0))
		}
		g.pages = pages
	}
	nv.groups = groups
}

func (x *Index) newPage(m *model, p int, withApprox bool) *page {
	pg := &page{}
	pg.prec = newTable(preciseStride, x.cfg.Shards, x.cfg.MaxKeys, func(tier Tier, b uint64) {
		v := m.view.Load()
		for ; b != 0; b &= b - 1 {
			if s := p*64 + bits.TrailingZeros64(b); s < len(v.eps) && v.eps[s] != nil {
				v.eps[s].blocks[tier].Add(-1)
			}
		}
	})
	if withApprox {
		pg.approx = newTable(approxStride, x.cfg.Shards, x.cfg.MaxKeys, nil)
	}
	return pg
}

// Endpoint returns the name and model of id.
func (x *Index) Endpoint(id EndpointID) (name, modelName string, ok bool) {
	e := x.endpoint(id)
	if e == nil {
		return "", "", false
	}
	return e.name, e.model.name, true
}

// model returns the model named name, or nil.
func (x *Index) model(name string) *model {
	if v, ok := x.models.Load(name); ok {
		return v.(*model)
	}
	return nil
}

// Endpoints returns the ids serving model in slot order: the order of the
// Matches of Lookup.
func (x *Index) Endpoints(modelName string) []EndpointID {
	m := x.model(modelName)
	if m == nil {
		return nil
	}
	v := m.view.Load()
	ids := make([]EndpointID, 0, len(v.eps)-v.holes)
	for _, e := range v.eps {
		if e != nil {
			ids = append(ids, e.id)
		}
	}
	return ids
}

// Models returns the models with registered endpoints.
func (x *Index) Models() []string {
	var out []string
	x.models.Range(func(k, _ any) bool {
		out = append(out, k.(string))
		return true
	})
	return out
}

func (x *Index) endpoint(id EndpointID) *endpoint {
	c := x.eps[id/epChunkLen].Load()
	if c == nil {
		return nil
	}
	return c[id%epChunkLen].Load()
}

// SetGroup records the kind of a model's KV-cache group (learned from
// BlockStored events); window is the sliding window in tokens.
func (x *Index) SetGroup(modelName string, groupIdx int, kind GroupKind, window int) {
	m := x.model(modelName)
	if m == nil || groupIdx < 0 || groupIdx >= maxGroups {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v := m.view.Load()
	if groupIdx < len(v.groups) && v.groups[groupIdx].kind == kind && v.groups[groupIdx].window == window {
		return
	}
	x.setGroupLocked(m, v, groupIdx, kind, window)
}

// maxGroups bounds the KV-cache groups per model.
const maxGroups = 16

func (x *Index) setGroupLocked(m *model, v *view, groupIdx int, kind GroupKind, window int) *view {
	nv := &view{eps: v.eps, holes: v.holes, groups: make([]group, len(v.groups), groupIdx+1)}
	copy(nv.groups, v.groups)
	for len(nv.groups) <= groupIdx {
		nv.groups = append(nv.groups, group{kind: GroupFullAttention})
	}
	if groupIdx > 0 || kind != GroupFullAttention || window != 0 {
		nv.groups[groupIdx].kind = kind
		nv.groups[groupIdx].window = window
	}
	x.ensurePages(m, nv)
	m.view.Store(nv)
	return nv
}

// pageFor returns e's page of group g, creating the group when new.
func (x *Index) pageFor(e *endpoint, g int) *page {
	v := e.model.view.Load()
	if g < len(v.groups) {
		if p := e.slot / 64; p < len(v.groups[g].pages) {
			return v.groups[g].pages[p]
		}
	}
	if g < 0 || g >= maxGroups {
		return nil
	}
	m := e.model
	m.mu.Lock()
	v = m.view.Load()
	if g >= len(v.groups) {
		v = x.setGroupLocked(m, v, g, GroupFullAttention, 0)
	}
	m.mu.Unlock()
	return v.groups[g].pages[e.slot/64]
}

// Store records that endpoint ep holds keys in KV-cache group g on tier t.
func (x *Index) Store(ep EndpointID, g int, t Tier, keys []tokens.BlockKey) {
	e := x.endpoint(ep)
	if e == nil || t < TierGPU || t > TierStorage {
		return
	}
	pg := x.pageFor(e, g)
	if pg == nil {
		return
	}
	bit := uint64(1) << (e.slot % 64)
	e.blocks[t].Add(pg.prec.setBits(keys, t, bit))
}

// Prefetch asks the CPU for the slots that Store(ep, g, t, keys) will
// touch, without changing anything. A writer that computes keys before
// storing them (the KV-event mapper) calls it early so that the cache
// misses overlap with its other work.
func (x *Index) Prefetch(ep EndpointID, g int, t Tier, keys []tokens.BlockKey) {
	e := x.endpoint(ep)
	if e == nil || t < TierGPU || t > TierStorage {
		return
	}
	v := e.model.view.Load()
	if g < 0 || g >= len(v.groups) {
		return
	}
	if p := e.slot / 64; p < len(v.groups[g].pages) {
		v.groups[g].pages[p].prec.prefetch(keys, t)
	}
}

// Remove records that ep no longer holds keys in group g on tier t. It
// also drops ep's approximate entries for those keys.
func (x *Index) Remove(ep EndpointID, g int, t Tier, keys []tokens.BlockKey) {
	e := x.endpoint(ep)
	if e == nil || t < TierGPU || t > TierStorage {
		return
	}
	pg := x.pageFor(e, g)
	if pg == nil {
		return
	}
	bit := uint64(1) << (e.slot % 64)
	tb := pg.prec
	var removed int64
	var ap *table
	if g0 := x.pageFor(e, 0); g0 != nil && g0.approx.n.Load() > 0 {
		ap = g0.approx
	}
	for _, k := range keys {
		if tb.clearBit(tkey(k, t), bit) {
			removed++
		}
		if ap != nil {
			ap.clearApprox(tbase(k), bit)
		}
	}
	e.blocks[t].Add(-removed)
}

// ClearEndpoint drops everything ep holds, precise and approximate (the
// engine restarted or cleared its cache).
func (x *Index) ClearEndpoint(ep EndpointID) {
	e := x.endpoint(ep)
	if e == nil {
		return
	}
	v := e.model.view.Load()
	bit := uint64(1) << (e.slot % 64)
	p := e.slot / 64
	for _, g := range v.groups {
		if p >= len(g.pages) {
			continue
		}
		pg := g.pages[p]
		n := pg.prec.clearBitAll(bit)
		for t := TierGPU; t <= TierStorage; t++ {
			e.blocks[t].Add(-int64(n[t]))
		}
		if pg.approx != nil {
			pg.approx.clearBitAll(bit)
		}
	}
}

func (x *Index) gen() uint64 {
	return uint64(x.cfg.Now().UnixNano()) / uint64(x.cfg.ApproxTTL)
}

// Routed records approximately that the router sent a request with keys to
// ep, so ep will soon hold them on GPU.
func (x *Index) Routed(ep EndpointID, keys []tokens.BlockKey) {
	e := x.endpoint(ep)
	if e == nil {
		return
	}
	pg := x.pageFor(e, 0)
	bit := uint64(1) << (e.slot % 64)
	g := x.gen()
	for _, k := range keys {
		pg.approx.setApprox(tbase(k), bit, g)
	}
}

// Unrouted withdraws what Routed recorded for ep and keys: the request
// sent there ended before its prefill did (aborted, yielded, failed), so
// ep holds of keys only what it computed, which its KV events report as
// precise entries. Precise entries are left as they are.
func (x *Index) Unrouted(ep EndpointID, keys []tokens.BlockKey) {
	e := x.endpoint(ep)
	if e == nil {
		return
	}
	pg := x.pageFor(e, 0)
	if pg == nil || pg.approx.n.Load() == 0 {
		return
	}
	bit := uint64(1) << (e.slot % 64)
	for _, k := range keys {
		pg.approx.clearApprox(tbase(k), bit)
	}
}

// Lookup fills dst (reset to length 0 and grown as needed) with one Match
// per endpoint of model, in slot order, for the request's chained keys.
func (x *Index) Lookup(modelName string, keys []tokens.BlockKey, dst []Match) []Match {
	dst = dst[:0]
	m := x.model(modelName)
	if m == nil {
		return dst
	}
	v := m.view.Load()
	n := len(v.eps)
	if cap(dst) < n {
		dst = make([]Match, n)
	} else {
		dst = dst[:n]
	}
	for i, e := range v.eps {
		dst[i] = Match{}
		if e != nil {
			dst[i].Endpoint = e.id
		}
	}
	if len(keys) > 0 && n > 0 {
		g := x.gen()
		for p := 0; p*64 < n; p++ {
			x.walkPage(v, p, keys, g, dst[p*64:min(n, p*64+64)])
		}
		bs := x.cfg.BlockSize
		for i := range dst {
			dst[i].Tokens = dst[i].Blocks * bs
		}
	}
	if v.holes > 0 { // drop the slots of removed endpoints
		j := 0
		for i, e := range v.eps {
			if e != nil {
				dst[j] = dst[i]
				j++
			}
		}
		dst = dst[:j]
	}
	return dst
}

// presence is one key's endpoint bits per tier on one page.
type presence struct{ gpu, cpu, sto, approx uint64 }

type pageReader struct {
	prec     *table
	cpu, sto bool   // prec had CPU, storage entries at the start of the lookup
	approx   *table // nil when empty at the start of the lookup
}

func readerOf(pg *page) pageReader {
	r := pageReader{prec: pg.prec}
	r.cpu = pg.prec.nt[TierCPU].Load() > 0
	r.sto = pg.prec.nt[TierStorage].Load() > 0
	if pg.approx != nil && pg.approx.n.Load() > 0 {
		r.approx = pg.approx
	}
	return r
}

// read returns the bits of block key k.
func (r *pageReader) read(k, g uint64) presence {
	tb := r.prec.getTiers(tbase(k))
	p := presence{gpu: tb[TierGPU], cpu: tb[TierCPU], sto: tb[TierStorage]}
	if r.approx != nil {
		p.approx = r.approx.getApprox(tbase(k), g)
	}
	return p
}

// prefetch prefetches the slots of keys[from:from+walkAhead] in r's tables
// and the precise tables of fa (walk.go).
func (r *pageReader) prefetch(fa []pageReader, keys []tokens.BlockKey, from int, pf *[walkAhead]uintptr) {
	r.prec.prefetchKeys(keys, from, pf)
	r.approx.prefetchKeys(keys, from, pf)
	for j := range fa {
		fa[j].prec.prefetchKeys(keys, from, pf)
	}
}

func (p presence) any() uint64 { return p.gpu | p.cpu | p.sto | p.approx }

// walkPage computes the matches of one page of 64 endpoint slots.
func (x *Index) walkPage(v *view, p int, keys []tokens.BlockKey, g uint64, out []Match) {
	cnt := len(out)
	all := uint64(1)<<cnt - 1
	if cnt == 64 {
		all = ^uint64(0)
	}
	r0 := readerOf(v.groups[0].pages[p])
	// Further full-attention groups must hold the whole prefix too; others
	// are checked afterwards.
	var fa []pageReader
	var win []int
	for gi := 1; gi < len(v.groups); gi++ {
		if v.groups[gi].kind == GroupFullAttention {
			fa = append(fa, readerOf(v.groups[gi].pages[p]))
		} else {
			win = append(win, gi)
		}
	}
	var blocks, gpuBlocks [64]int32
	nk := int32(len(keys))
	for i := 0; i < cnt; i++ {
		blocks[i], gpuBlocks[i] = nk, nk
	}
	alive, gpuAlive := all, all
	var needCPU, needSto, usedApprox uint64
	start := 0
	switch {
	case len(fa) == 0 && !r0.cpu && !r0.sto:
		// GPU and maybe approximate entries (walk.go).
		usedApprox = walkGPUApprox(r0.prec, r0.approx, keys, g, &blocks, all)
		gpuBlocks = blocks
		start = len(keys)
	case len(fa) == 0 && len(r0.prec.shards) <= maxSnap:
		// Every tier (walk.go); more shards than it snapshots take the
		// general loop below.
		needCPU, needSto, usedApprox = walkFlat(&r0, keys, g, &blocks, &gpuBlocks, all)
		start = len(keys)
	}
	var pf [walkAhead]uintptr
	if start == 0 {
		r0.prefetch(fa, keys, 0, &pf)
	}
	for i := start; i < len(keys); i++ {
		if i&(walkAhead-1) == 0 {
			r0.prefetch(fa, keys, i+walkAhead, &pf)
		}
		k := keys[i]
		pr := r0.read(k, g)
		fast := pr.gpu | pr.approx
		present := fast | pr.cpu | pr.sto
		for j := range fa {
			present &= fa[j].read(k, g).any() | pr.approx
		}
		na := alive & present
		for d := alive &^ na; d != 0; d &= d - 1 {
			blocks[bits.TrailingZeros64(d)] = int32(i)
		}
		ng := gpuAlive & fast & present
		for d := gpuAlive &^ ng; d != 0; d &= d - 1 {
			gpuBlocks[bits.TrailingZeros64(d)] = int32(i)
		}
		alive, gpuAlive = na, ng
		if alive == 0 {
			break
		}
		needCPU |= alive &^ fast & pr.cpu
		needSto |= alive &^ (fast | pr.cpu) & pr.sto
		usedApprox |= alive &^ (pr.gpu | pr.cpu | pr.sto) & pr.approx
	}
	for _, gi := range win {
		x.cutToWindow(v.groups[gi], p, keys, g, &blocks, cnt, r0)
	}
	for i := 0; i < cnt; i++ {
		b := int(blocks[i])
		m := &out[i]
		m.Blocks = b
		m.GPUBlocks = min(int(gpuBlocks[i]), b)
		if b == 0 {
			continue
		}
		bit := uint64(1) << i
		// Tier flags were gathered over the full-attention prefix; a
		// shorter windowed prefix may need less, which we ignore.
		switch {
		case needSto&bit != 0:
			m.Tier = TierStorage
		case needCPU&bit != 0:
			m.Tier = TierCPU
		default:
			m.Tier = TierGPU
		}
		m.Approx = usedApprox&bit != 0
	}
}

// cutToWindow shortens each endpoint's prefix to the longest length at which
// the windowed group gr holds the blocks it needs: the last ceil((window-1)
// / blockSize) blocks (at least 1) before the end of the prefix, or all of
// them when the prefix is shorter.
func (x *Index) cutToWindow(gr group, p int, keys []tokens.BlockKey, g uint64, blocks *[64]int32, cnt int, r0 pageReader) {
	need := 1
	if gr.kind == GroupSlidingWindow && gr.window > 1 {
		need = (gr.window - 1 + x.cfg.BlockSize - 1) / x.cfg.BlockSize
	}
	rd := readerOf(gr.pages[p])
	maxB := int32(0)
	for i := 0; i < cnt; i++ {
		maxB = max(maxB, blocks[i])
	}
	if maxB == 0 {
		return
	}
	have := make([]uint64, maxB)
	for i := range have {
		k := keys[i]
		have[i] = rd.read(k, g).any()
		if r0.approx != nil {
			have[i] |= r0.approx.getApprox(tbase(k), g)
		}
	}
	for e := 0; e < cnt; e++ {
		end := int(blocks[e])
		bit := uint64(1) << e
		run := 0
		for i := end - 1; i >= 0 && run < need; i-- {
			if have[i]&bit != 0 {
				run++
			} else {
				end, run = i, 0
			}
		}
		blocks[e] = int32(end)
	}
}

// EndpointStats is one endpoint's view in the index.
type EndpointStats struct {
	ID            EndpointID `json:"id"`
	Endpoint      string     `json:"endpoint"`
	Model         string     `json:"model"`
	GPUBlocks     int64      `json:"gpu_blocks"`
	CPUBlocks     int64      `json:"cpu_blocks"`
	StorageBlocks int64      `json:"storage_blocks"`
}

// Stats returns per-endpoint block counts (precise entries, all groups).
func (x *Index) Stats() []EndpointStats {
	hi := int(x.idsHi.Load())
	out := make([]EndpointStats, 0, hi)
	for id := 0; id < hi; id++ {
		e := x.endpoint(EndpointID(id))
		if e == nil {
			continue
		}
		out = append(out, EndpointStats{
			ID: e.id, Endpoint: e.name, Model: e.model.name,
			GPUBlocks:     e.blocks[TierGPU].Load(),
			CPUBlocks:     e.blocks[TierCPU].Load(),
			StorageBlocks: e.blocks[TierStorage].Load(),
		})
	}
	return out
}

// MemStats is the memory held by the index's tables.
type MemStats struct {
	Keys    int64 `json:"keys"`    // live (group, key) entries over all tables
	Bytes   int64 `json:"bytes"`   // bytes of slot arrays
	Evicted int64 `json:"evicted"` // entries evicted for the memory bound
	Approx  int64 `json:"approx"`  // approximate entries (some may be expired)
}

// Mem reports table sizes.
func (x *Index) Mem() MemStats {
	var s MemStats
	x.models.Range(func(_, mv any) bool {
		v := mv.(*model).view.Load()
		for _, g := range v.groups {
			for _, pg := range g.pages {
				s.Keys += pg.prec.n.Load()
				s.Bytes += pg.prec.memBytes()
				s.Evicted += pg.prec.evicted.Load()
				if pg.approx != nil {
					s.Approx += pg.approx.n.Load()
					s.Bytes += pg.approx.memBytes()
					s.Evicted += pg.approx.evicted.Load()
				}
			}
		}
		return true
	})
	return s
}
