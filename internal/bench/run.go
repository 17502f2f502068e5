package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is how requests are sent.
type Mode struct {
	// Concurrency > 0 runs a closed loop: that many workers, each sending
	// its next item when the previous answer ends. 0: open loop, each item
	// at its At (divided by the client's time scale, in wall time).
	Concurrency int
	// MaxInflight bounds open-loop requests in flight (default 4096); an
	// item due while the bound is reached waits, and its lateness is part
	// of its latencies (a full generator is the server's problem too).
	MaxInflight int
}

// Progress is told of each finished request (done of total).
type Progress func(done, total int)

// Run sends items and returns one Record per item, in item order. It
// stops sending when ctx ends; unsent items are recorded as "not_sent".
func Run(ctx context.Context, c *Client, items []Item, m Mode, progress Progress) ([]Record, time.Duration, error) {
	if m.Concurrency < 0 || m.Concurrency > 100000 {
		return nil, 0, fmt.Errorf("bench: concurrency must be in [0, 100000], got %d", m.Concurrency)
	}
	if m.MaxInflight <= 0 {
		m.MaxInflight = 4096
	}
	recs := make([]Record, len(items))
	for i := range recs {
		recs[i] = Record{Index: i, Session: items[i].Session, Outcome: "not_sent", Error: "the run stopped before its turn"}
	}
	var done atomic.Int64
	finish := func(i int, r Record) {
		recs[i] = r
		n := done.Add(1)
		if progress != nil {
			progress(int(n), len(items))
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	if m.Concurrency > 0 {
		var next atomic.Int64
		for w := 0; w < m.Concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= len(items) || ctx.Err() != nil {
						return
					}
					finish(i, c.Do(ctx, &items[i], i, start))
				}
			}()
		}
		wg.Wait()
		return recs, time.Since(start), nil
	}
	sem := make(chan struct{}, m.MaxInflight)
	timer := time.NewTimer(0)
	defer timer.Stop()
loop:
	for i := range items {
		due := start.Add(time.Duration(items[i].At / c.scale() * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				break loop
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			finish(i, c.Do(ctx, &items[i], i, start))
		}()
	}
	wg.Wait()
	return recs, time.Since(start), nil
}
