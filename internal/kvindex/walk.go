package kvindex

import (
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/kvgate/kvgate/internal/kvindex/prefetch"
	"github.com/kvgate/kvgate/internal/tokens"
)

// The lookup walks of a page of a model without further full-attention
// groups (every non-hybrid model): walkPage's general loop made cheap for
// the common cases. Both check each table's home slot inline (a call per
// probe costs as much as the probe), and probe the approximate, CPU and
// storage tables only for keys some still-matching endpoint does not hold
// on GPU, and only when such an endpoint has ever had an entry in that
// table: their bits matter only for those endpoints. So a mostly-GPU fleet
// pays about one probe per key, and approximate or offloaded entries cost
// more probes only where they extend a prefix beyond the GPU entries. Every
// walk prefetches its slots walkAhead keys ahead (see walkAhead).

// walkGPUApprox is the walk when the page has GPU entries and at most
// approximate ones (ap may be nil): the common case of a gateway that
// routes (approximate entries) and hears events (GPU entries). There the
// GPU prefix is the prefix and the tier is always GPU, so it tracks one
// alive set and only whether approximate entries were used. Few live
// values keep the loop in registers.
func walkGPUApprox(gpu, ap *table, keys []tokens.BlockKey, g uint64, blocks *[64]int32, all uint64) (usedApprox uint64) {
	var apMask uint64
	if ap != nil {
		apMask = ap.eps[0].Load()
	}
	if len(gpu.shards) > maxSnap || (ap != nil && len(ap.shards) > maxSnap) {
		return walkGPUApproxLoad(gpu, ap, keys, g, blocks, all, apMask)
	}
	// Snapshot every shard's array (slice and mask) once: the walk then
	// goes from a key to its slot without loading the shard's pointer and
	// following it. Arrays replaced by a rehash during the walk are read
	// as they were, like a walk that started a moment earlier.
	var gs, as [maxSnap]arrSnap
	gsh, ash := gpu.shift1&63, uint(0)
	for i := range gpu.shards {
		a := gpu.shards[i].arr.Load()
		gs[i] = arrSnap{a.w, a.mask}
	}
	if ap != nil {
		ash = ap.shift1 & 63
		for i := range ap.shards {
			a := ap.shards[i].arr.Load()
			as[i] = arrSnap{a.w, a.mask}
		}
	}
	if ap == nil {
		walkGPUSnap(&gs, gsh, keys, blocks, all)
		return 0
	}
	alive := all
	var pf [walkAhead]uintptr
	prefetchSnap(&gs, gsh, preciseStride, keys, 0, &pf)
	if apMask != 0 {
		prefetchSnap(&as, ash, approxStride, keys, 0, &pf)
	}
	for i, k := range keys {
		if i&(walkAhead-1) == 0 {
			prefetchSnap(&gs, gsh, preciseStride, keys, i+walkAhead, &pf)
			if apMask != 0 {
				prefetchSnap(&as, ash, approxStride, keys, i+walkAhead, &pf)
			}
		}
		k = tkey(k, TierGPU)
		var gb uint64
		a := &gs[(k>>1>>gsh)&(maxSnap-1)]
		for p := home(k, a.mask); ; p = (p + 1) & a.mask {
			w := a.w[p*preciseStride : p*preciseStride+2 : p*preciseStride+2]
			kk := w[0].Load()
			if kk == k {
				gb = w[1].Load()
				if w[0].Load() != k {
					gb = 0
				}
				break
			}
			if kk == emptyKey {
				break
			}
		}
		rem := alive &^ gb
		if rem == 0 {
			continue
		}
		if rem&apMask != 0 {
			var ab uint64
			k := k &^ 3 // tbase: the approximate table's key
			a := &as[(k>>1>>ash)&(maxSnap-1)]
			for p := home(k, a.mask); ; p = (p + 1) & a.mask {
				w := a.w[p*approxStride : p*approxStride+4 : p*approxStride+4]
				kk := w[0].Load()
				if kk == k {
					gen, cur, prev := w[1].Load(), w[2].Load(), w[3].Load()
					if w[0].Load() == k {
						ab = approxBits(gen, cur, prev, g)
					}
					break
				}
				if kk == emptyKey {
					break
				}
			}
			gb |= ab
			usedApprox |= rem & ab
		}
		na := alive & gb
		for d := alive &^ na; d != 0; d &= d - 1 {
			blocks[bits.TrailingZeros64(d)] = int32(i)
		}
		alive = na
		if alive == 0 {
			break
		}
	}
	return usedApprox
}

// walkGPUSnap is walkGPUApprox when the page has GPU entries only: one
// exact probe per key over its snapshot. A loop of its own, without the
// approximate probe's values, has fewer live values (GPU-only lookups
// measured 0–10 % faster than with the shared loop).
func walkGPUSnap(gs *[maxSnap]arrSnap, gsh uint, keys []tokens.BlockKey, blocks *[64]int32, all uint64) {
	alive := all
	var pf [walkAhead]uintptr
	prefetchSnap(gs, gsh, preciseStride, keys, 0, &pf)
	for i, k := range keys {
		if i&(walkAhead-1) == 0 {
			prefetchSnap(gs, gsh, preciseStride, keys, i+walkAhead, &pf)
		}
		k = tkey(k, TierGPU)
		var gb uint64
		a := &gs[(k>>1>>gsh)&(maxSnap-1)]
		for p := home(k, a.mask); ; p = (p + 1) & a.mask {
			w := a.w[p*preciseStride : p*preciseStride+2 : p*preciseStride+2]
			kk := w[0].Load()
			if kk == k {
				gb = w[1].Load()
				if w[0].Load() != k {
					gb = 0
				}
				break
			}
			if kk == emptyKey {
				break
			}
		}
		na := alive & gb
		if na == alive {
			continue
		}
		for d := alive &^ na; d != 0; d &= d - 1 {
			blocks[bits.TrailingZeros64(d)] = int32(i)
		}
		alive = na
		if alive == 0 {
			break
		}
	}
}

// walkAhead is how many keys ahead of the probes a walk prefetches their
// home slots, in batches of as many keys (a power of two). A walk over a
// prompt whose slots are not in the CPU's caches otherwise takes one cache
// miss per key, one after another: the probe loop's branches depend on the
// loaded key, so the core does not run ahead to the next key's load.
// Prefetching keeps between walkAhead and 2×walkAhead misses in flight.
const walkAhead = 32

// prefetchSnap prefetches the home slots of keys[from:from+walkAhead]
// (as many as there are) in the snapshot gs of a table with the given
// slot stride. The home slot and the shard of a key do not depend on its
// low three bits, so block keys, tkeys and tbases share them.
func prefetchSnap(gs *[maxSnap]arrSnap, gsh uint, stride uint64, keys []tokens.BlockKey, from int, pf *[walkAhead]uintptr) {
	prefetchSnapOff(gs, gsh, stride, keys, from, pf, 0)
}

// prefetchSnapOff is prefetchSnap at off bytes past each home slot.
func prefetchSnapOff(gs *[maxSnap]arrSnap, gsh uint, stride uint64, keys []tokens.BlockKey, from int, pf *[walkAhead]uintptr, off uintptr) {
	if from >= len(keys) {
		return
	}
	ks := keys[from:min(len(keys), from+walkAhead)]
	for j, k := range ks {
		a := &gs[(k>>1>>gsh)&(maxSnap-1)]
		pf[j] = uintptr(unsafe.Pointer(&a.w[home(k, a.mask)*stride])) + off
	}
	prefetch.Addrs(pf[:len(ks)])
}

// prefetchKeys is prefetchSnap loading each shard's array (tables with
// more than maxSnap shards, and the general walk). A nil table has nothing
// to prefetch.
func (t *table) prefetchKeys(keys []tokens.BlockKey, from int, pf *[walkAhead]uintptr) {
	if t == nil || from >= len(keys) {
		return
	}
	ks := keys[from:min(len(keys), from+walkAhead)]
	st := uint64(t.stride)
	for j, k := range ks {
		a := t.shards[t.shardIndex(k)].arr.Load()
		pf[j] = uintptr(unsafe.Pointer(&a.w[home(k, a.mask)*st]))
	}
	prefetch.Addrs(pf[:len(ks)])
}

// maxSnap is the most shards per table whose arrays a walk snapshots.
const maxSnap = 64

type arrSnap struct {
	w    []atomic.Uint64
	mask uint64
}

// walkGPUApproxLoad is walkGPUApprox for tables with more than maxSnap
// shards: each probe loads the shard's array.
func walkGPUApproxLoad(gpu, ap *table, keys []tokens.BlockKey, g uint64, blocks *[64]int32, all, apMask uint64) (usedApprox uint64) {
	alive := all
	var pf [walkAhead]uintptr
	for i, k := range keys {
		if i&(walkAhead-1) == 0 {
			if i == 0 {
				gpu.prefetchKeys(keys, 0, &pf)
				ap.prefetchKeys(keys, 0, &pf)
			}
			gpu.prefetchKeys(keys, i+walkAhead, &pf)
			ap.prefetchKeys(keys, i+walkAhead, &pf)
		}
		k = tkey(k, TierGPU)
		// The GPU probe, inlined by hand and without calls (a call makes
		// the compiler spill the loop's values on every iteration).
		var gb uint64
		a := gpu.shards[k>>1>>(gpu.shift1&63)].arr.Load()
		for p := home(k, a.mask); ; p = (p + 1) & a.mask {
			w := a.w[p*preciseStride : p*preciseStride+2 : p*preciseStride+2]
			kk := w[0].Load()
			if kk == k {
				gb = w[1].Load()
				if w[0].Load() != k {
					gb = 0
				}
				break
			}
			if kk == emptyKey {
				break
			}
		}
		rem := alive &^ gb
		if rem == 0 {
			continue
		}
		if rem&apMask != 0 {
			// ap.getApprox(k, g), likewise.
			var ab uint64
			k := k &^ 3
			a := ap.shards[k>>1>>(ap.shift1&63)].arr.Load()
			for p := home(k, a.mask); ; p = (p + 1) & a.mask {
				w := a.w[p*approxStride : p*approxStride+4 : p*approxStride+4]
				kk := w[0].Load()
				if kk == k {
					gen, cur, prev := w[1].Load(), w[2].Load(), w[3].Load()
					if w[0].Load() == k {
						ab = approxBits(gen, cur, prev, g)
					}
					break
				}
				if kk == emptyKey {
					break
				}
			}
			gb |= ab
			usedApprox |= rem & ab
		}
		na := alive & gb
		for d := alive &^ na; d != 0; d &= d - 1 {
			blocks[bits.TrailingZeros64(d)] = int32(i)
		}
		alive = na
		if alive == 0 {
			break
		}
	}
	return usedApprox
}

// walkFlat is the walk when CPU or storage entries exist too; its probes are
// inlined by hand in the same way. Since all tiers of a block lie in one
// probe run of the precise table (tkey), one probe per key gives the GPU,
// CPU and storage bits; only the approximate table is a second one. It
// fills blocks and gpuBlocks for the endpoints of all and returns
// walkPage's tier and approximation bits.
func walkFlat(r *pageReader, keys []tokens.BlockKey, g uint64, blocks, gpuBlocks *[64]int32, all uint64) (needCPU, needSto, usedApprox uint64) {
	prec := r.prec
	var apMask uint64
	if r.approx != nil {
		apMask = r.approx.eps[0].Load()
	}
	// Tiers with entries: the probe stops once it has seen that many.
	want := 1
	if r.cpu {
		want++
	}
	if r.sto {
		want++
	}
	var ps [maxSnap]arrSnap
	psh := prec.shift1 & 63
	for i := range prec.shards {
		a := prec.shards[i].arr.Load()
		ps[i] = arrSnap{a.w, a.mask}
	}
	var as [maxSnap]arrSnap
	var ash uint
	if r.approx != nil && len(r.approx.shards) <= maxSnap {
		ash = r.approx.shift1 & 63
		for i := range r.approx.shards {
			a := r.approx.shards[i].arr.Load()
			as[i] = arrSnap{a.w, a.mask}
		}
	}
	pfApprox := apMask != 0 && len(r.approx.shards) <= maxSnap
	var pf [walkAhead]uintptr
	alive, gpuAlive := all, all
	for i, bk := range keys {
		if i&(walkAhead-1) == 0 {
			if i == 0 {
				prefetchSnap(&ps, psh, preciseStride, keys, 0, &pf)
				prefetchSnapOff(&ps, psh, preciseStride, keys, 0, &pf, 64)
				if pfApprox {
					prefetchSnap(&as, ash, approxStride, keys, 0, &pf)
				}
			}
			prefetchSnap(&ps, psh, preciseStride, keys, i+walkAhead, &pf)
			prefetchSnapOff(&ps, psh, preciseStride, keys, i+walkAhead, &pf, 64)
			if pfApprox {
				prefetchSnap(&as, ash, approxStride, keys, i+walkAhead, &pf)
			}
		}
		base := tbase(bk)
		var tb [4]uint64
		a := &ps[(base>>1>>psh)&(maxSnap-1)]
		left := want
		for p := home(base, a.mask); ; p = (p + 1) & a.mask {
			w := a.w[p*preciseStride : p*preciseStride+2 : p*preciseStride+2]
			kk := w[0].Load()
			if kk&^3 == base {
				b := w[1].Load()
				if w[0].Load() != kk {
					b = 0
				}
				tb[kk&3] = b
				if left--; left == 0 {
					break
				}
				continue
			}
			if kk == emptyKey {
				break
			}
		}
		gb, cb, sb := tb[TierGPU], tb[TierCPU], tb[TierStorage]
		rem := alive &^ gb
		if rem == 0 {
			continue // every alive endpoint holds k on GPU: nothing changes
		}
		var ab uint64
		if rem&apMask != 0 {
			k := base
			a := r.approx.shards[k>>1>>(r.approx.shift1&63)].arr.Load()
			for p := home(k, a.mask); ; p = (p + 1) & a.mask {
				w := a.w[p*approxStride : p*approxStride+4 : p*approxStride+4]
				kk := w[0].Load()
				if kk == k {
					gen, cur, prev := w[1].Load(), w[2].Load(), w[3].Load()
					if w[0].Load() == k {
						ab = approxBits(gen, cur, prev, g)
					}
					break
				}
				if kk == emptyKey {
					break
				}
			}
		}
		fast := gb | ab
		present := fast | cb | sb
		na := alive & present
		for d := alive &^ na; d != 0; d &= d - 1 {
			blocks[bits.TrailingZeros64(d)] = int32(i)
		}
		ng := gpuAlive & fast
		for d := gpuAlive &^ ng; d != 0; d &= d - 1 {
			gpuBlocks[bits.TrailingZeros64(d)] = int32(i)
		}
		alive, gpuAlive = na, ng
		if alive == 0 {
			break
		}
		needCPU |= na &^ fast & cb
		needSto |= na &^ (fast | cb) & sb
		usedApprox |= na &^ (gb | cb | sb) & ab
	}
	return needCPU, needSto, usedApprox
}
