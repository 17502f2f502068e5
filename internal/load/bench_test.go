package load

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/internal/sched"
)

// BenchmarkSnapshotLateHeads: a snapshot of 64 endpoints, each with a
// queue of n prefills whose first runs late (catchUp) against the same
// queues on time, the baseline. A late head moves its queue only when its
// last prediction passes, not at every snapshot.
func BenchmarkSnapshotLateHeads(b *testing.B) {
	for _, n := range []int{1, 20, 200} {
		for _, late := range []bool{false, true} {
			b.Run(fmt.Sprintf("queue=%d/late=%v", n, late), func(b *testing.B) {
				infos := make([]Info, 64)
				for i := range infos {
					infos[i] = Info{Name: fmt.Sprint(i), PrefillSpeed: 20000}
				}
				f := New(infos, false)
				s := &sched.Snapshot{BlockSize: 16}
				eps := f.Snapshot(0, 100, nil, nil, nil, s)
				for _, e := range eps {
					for range n {
						f.Route(e, 0, Work{Uncached: 100, Cached: 100000, PrefillSeconds: 0.005})
					}
				}
				now := 0.001 // within the first prefill
				if late {
					now = 0.01 // past it: every head late
				}
				b.ResetTimer()
				for range b.N {
					now += 1e-7
					f.Snapshot(now, 100, nil, nil, nil, s)
				}
			})
		}
	}
}
