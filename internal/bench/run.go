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
	// of its latencies (a full generator is the server's problem too):
	// they count from when it was due (Record.Late is the wait), not from
	// when it was sent, which would leave out the time the slowest
	// answers made the next requests wait (coordinated omission).
	MaxInflight int
}

// Progress is told of each finished request (done of total).
type Progress func(done, total int)

// Run sends items and returns one Record per item, in item order. It
// stops sending when ctx ends; unsent items are recorded as "not_sent".
// A closed loop's latencies count from each request's sending, an open
// loop's from when it was due (Mode.MaxInflight).
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
	if m.Concurrency > 0 {
		closedLoop(ctx, c, items, m.Concurrency, start, finish)
	} else {
		openLoop(ctx, c, items, m.MaxInflight, start, finish)
	}
	return recs, time.Since(start), nil
}

// closedLoop sends items from workers, each sending its next item when
// the previous answer ends, until the items or ctx end.
func closedLoop(ctx context.Context, c *Client, items []Item, workers int, start time.Time, finish func(int, Record)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
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
}

// openLoop sends each item at its At (scaled), at most inflight at once,
// until the items or ctx end.
func openLoop(ctx context.Context, c *Client, items []Item, inflight int, start time.Time, finish func(int, Record)) {
	sem := make(chan struct{}, inflight)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range items {
		due := start.Add(time.Duration(items[i].At / c.scale() * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			finish(i, c.do(ctx, &items[i], i, start, due))
		}()
	}
}
