package bench

import (
	"math"
	"slices"
)

// Inter-token latencies are reported over every gap between two chunks of
// every streamed answer, as vLLM's benchmark reports them: a request's
// mean gap (Record.MeanITL) is its TPOT again and hides a stall that one
// gap in a hundred shows. Keeping every gap of a long run would cost 8
// bytes a token (a million answers of a thousand tokens: 8 GB), so each
// request counts its gaps in fine logarithmic buckets instead: 1 % wide
// from 1 µs to 10^6 s, a bucket's value its geometric middle, within
// 0.5 % of every gap in it. A request keeps one entry per bucket it used
// (a steady stream uses a few tens), at most itlBuckets however long it
// runs, and a run's percentiles are read from the requests' buckets
// merged. The mean and the maximum are exact (from each request's sum and
// maximum).
const (
	itlMin     = 1e-6 // seconds; shorter gaps (two chunks in one read) count in the first bucket
	itlGrowth  = 1.01 // each bucket's upper bound is its lower bound × itlGrowth
	itlBuckets = 2777 // ⌈log(1e6 / itlMin) / log(itlGrowth)⌉: up to 10^6 s
)

// gapCount is how many of a request's gaps fell in one bucket.
type gapCount struct {
	bucket uint16
	n      uint32
}

// itlBucket is the bucket of a gap of g seconds.
func itlBucket(g float64) uint16 {
	if !(g > itlMin) {
		return 0
	}
	return uint16(min(math.Log(g/itlMin)/math.Log(itlGrowth), itlBuckets-1))
}

// itlValue is the value a bucket stands for: its geometric middle.
func itlValue(b int) float64 {
	return itlMin * math.Pow(itlGrowth, float64(b)+0.5)
}

// gapTally counts one stream's gaps by bucket while it is read.
type gapTally map[uint16]uint32

func (t gapTally) add(g float64) { t[itlBucket(g)]++ }

// counts is the tally as a request keeps it, sorted by bucket.
func (t gapTally) counts() []gapCount {
	if len(t) == 0 {
		return nil
	}
	out := make([]gapCount, 0, len(t))
	for b, n := range t {
		out = append(out, gapCount{b, n})
	}
	slices.SortFunc(out, func(a, b gapCount) int { return int(a.bucket) - int(b.bucket) })
	return out
}

// itlPercentiles merges the gaps of the records given into one
// distribution: percentiles interpolated between closest ranks as pct
// does (each rank's value its bucket's, at most the exact maximum), the
// mean and the maximum exact; N is the number of gaps.
func itlPercentiles(recs []*Record) Percentiles {
	var counts []uint64
	var n uint64
	sum, top := 0.0, 0.0
	for _, r := range recs {
		for _, c := range r.gaps {
			if counts == nil {
				counts = make([]uint64, itlBuckets)
			}
			counts[c.bucket] += uint64(c.n)
			n += uint64(c.n)
			sum += r.MeanITL * float64(c.n)
		}
		top = max(top, r.MaxITL)
	}
	if n == 0 {
		return Percentiles{}
	}
	// rank is the value of the k-th smallest gap (from 0).
	rank := func(k uint64) float64 {
		seen := uint64(0)
		for b, c := range counts {
			if seen += c; seen > k {
				return min(itlValue(b), top)
			}
		}
		return top
	}
	at := func(q float64) float64 {
		pos := q * float64(n-1)
		lo := uint64(pos)
		v := rank(lo)
		if lo+1 < n {
			v += (pos - float64(lo)) * (rank(lo+1) - v)
		}
		return v
	}
	return Percentiles{N: int(n), P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: top, Mean: sum / float64(n)}
}
