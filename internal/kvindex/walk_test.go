package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// refMatch is the lookup's definition, computed the slow way from what
// was stored: per endpoint, the prefix of keys held on any tier (or
// approximately), the part held on GPU or approximately, the slowest tier
// the prefix needs when approximate entries count as GPU, and whether a
// block of it was held only approximately.
func refMatch(held [][4]bool) Match {
	var m Match
	gpuDone := false
	for i, h := range held {
		gpu, cpu, sto, ap := h[0], h[1], h[2], h[3]
		if !(gpu || cpu || sto || ap) {
			break
		}
		m.Blocks = i + 1
		if !gpuDone && (gpu || ap) {
			m.GPUBlocks = i + 1
		} else {
			gpuDone = true
		}
		switch {
		case gpu || ap:
		case cpu:
			m.Tier = max(m.Tier, TierCPU)
		default:
			m.Tier = TierStorage
		}
		if ap && !gpu && !cpu && !sto {
			m.Approx = true
		}
	}
	if m.Blocks > 0 && m.Tier == TierNone {
		m.Tier = TierGPU
	}
	return m
}

// TestLookupWalksAgainstReference fills indexes with random holdings
// (runs and holes on every tier, over two pages of endpoints) in the
// shapes each walk handles — GPU only, GPU and approximate, all tiers —
// and checks every Match against refMatch.
func TestLookupWalksAgainstReference(t *testing.T) {
	for _, shape := range []string{"gpu", "gpu+approx", "all"} {
		t.Run(shape, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(len(shape))))
			for round := 0; round < 20; round++ {
				clk := &fakeClock{t: time.Unix(1000, 0)}
				// Up to 128 shards: more than maxSnap takes the walks that
				// load shard arrays. 100 keys: several prefetch batches.
				x := New(Config{ApproxTTL: time.Minute, Now: clk.Now, Shards: 1 << r.IntN(8)})
				keys := chain(100, uint32(round))
				const eps = 70
				held := make([][][4]bool, eps)
				for e := 0; e < eps; e++ {
					id := mustAdd(t, x, fmt.Sprintf("e%d", e), "m")
					held[e] = make([][4]bool, len(keys))
					tiers := 1
					switch shape {
					case "gpu+approx":
						tiers = 4
					case "all":
						tiers = 4
					}
					for tier := 0; tier < tiers; tier++ {
						if shape == "gpu+approx" && (tier == 1 || tier == 2) {
							continue
						}
						if r.IntN(3) == 0 {
							continue
						}
						// A run from 0 (or from a random start) with holes.
						lo, hi := 0, r.IntN(len(keys)+1)
						if tier > 0 && r.IntN(2) == 0 {
							lo = r.IntN(hi + 1)
						}
						var ks []uint64
						for i := lo; i < hi; i++ {
							if r.IntN(12) == 0 {
								continue
							}
							ks = append(ks, keys[i])
							held[e][i][tier] = true
						}
						if tier == 3 {
							x.Routed(id, ks)
						} else {
							x.Store(id, 0, Tier(tier+1), ks)
						}
					}
				}
				ms := x.Lookup("m", keys, nil)
				for e := 0; e < eps; e++ {
					want := refMatch(held[e])
					want.Endpoint = ms[e].Endpoint
					want.Tokens = want.Blocks * 16
					if ms[e] != want {
						t.Fatalf("round %d endpoint %d: got %+v, want %+v", round, e, ms[e], want)
					}
				}
			}
		})
	}
}
