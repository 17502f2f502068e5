package kvevents

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

// TestSetEnginesAtRunTime: engines added while the subscriber runs are
// heard; removed ones stop (their loop has ended when SetEngines returns)
// and leave the stats (issue 8: pod churn must not leak streams).
func TestSetEnginesAtRunTime(t *testing.T) {
	ep1 := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	ep2 := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	const n1, n2 = "127.0.0.1:9001", "127.0.0.1:9002"
	p1 := startPub(t, ep1, "", "kv@"+n1+"@m", false, true)
	defer p1.close()
	p2 := startPub(t, ep2, "", "kv@"+n2+"@m", false, true)
	defer p2.close()
	idx := kvindex.New(kvindex.Config{BlockSize: 16})
	sub, err := New(Config{Engines: []EngineConfig{{Name: n1, Model: "m", Events: ep1}}, Logger: quietLogger()}, idx)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	}()
	eventually(t, "engine 1 heard", func() bool {
		p1.publish(pEmpty(t), false)
		return statsOf(sub, n1).LastSeq != nil
	})
	// Add engine 2 at run time.
	if err := sub.SetEngines([]EngineConfig{{Name: n1, Model: "m", Events: ep1}, {Name: n2, Model: "m", Events: ep2}}); err != nil {
		t.Fatal(err)
	}
	toks := seqTokens(64, 7)
	eventually(t, "engine 2 heard", func() bool {
		p2.publish(pStored(t, toks, 1, nil), false)
		return lookupMax(idx, toks) == 4
	})
	// Remove engine 1: its stream is gone from the stats at once.
	if err := sub.SetEngines([]EngineConfig{{Name: n2, Model: "m", Events: ep2}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range sub.Stats() {
		if s.Endpoint == n1 {
			t.Fatalf("removed engine still listed: %+v", s)
		}
	}
	before := statsOf(sub, n2).Batches
	p1.publish(pEmpty(t), false)
	p2.publish(pEmpty(t), false)
	eventually(t, "engine 2 still heard", func() bool { return statsOf(sub, n2).Batches > before })
	if err := sub.SetEngines([]EngineConfig{{Name: "", Model: "m"}}); err == nil {
		t.Fatal("an engine without a name was accepted")
	}
}

// lookupMax is the longest match any endpoint of model m has.
func lookupMax(idx *kvindex.Index, toks []uint32) int {
	best := 0
	for _, m := range idx.Lookup("m", tokens.NewHasher(16).Keys(toks, nil), nil) {
		best = max(best, m.Blocks)
	}
	return best
}
