package kvevents

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/kvindex"
)

// bufferReplayer answers a replay from its batches (seq i holds
// batches[i]), as an engine's replay ROUTER does from its buffer.
type bufferReplayer struct{ batches [][]byte }

func (b *bufferReplayer) request(_ context.Context, from uint64, fn func(uint64, []byte) bool) error {
	for i := from; i < uint64(len(b.batches)); i++ {
		if !fn(i, b.batches[i]) {
			break
		}
	}
	return nil
}

// TestResyncAtConnection: a reconnection to the same engine applies what
// it sent meanwhile and takes the live frames queued during the replay as
// the duplicates they are, not as a restart; a reconnection to an engine
// whose buffer does not hold the last batch applied as it was (a restart)
// drops the engine's blocks and warms from its buffer.
func TestResyncAtConnection(t *testing.T) {
	idx := kvindex.New(kvindex.Config{BlockSize: 16})
	sub, err := New(Config{Engines: []EngineConfig{{Name: "e", Model: "m", Events: "tcp://127.0.0.1:1", Replay: "tcp://127.0.0.1:2"}}, Logger: quietLogger()}, idx)
	if err != nil {
		t.Fatal(err)
	}
	st := sub.streams[0]
	a, b, c := seqTokens(64, 1), seqTokens(64, 2), seqTokens(64, 3)
	engine := &bufferReplayer{batches: [][]byte{pStored(t, a, 100, nil), pStored(t, b, 200, nil)}}
	st.rep = engine
	ctx := context.Background()
	st.onConnect(ctx) // first connection: the buffer warms the index
	if lookup(idx, a) != 4 || lookup(idx, b) != 4 || st.next != 2 {
		t.Fatalf("warm: a %d, b %d, next %d", lookup(idx, a), lookup(idx, b), st.next)
	}
	engine.batches = append(engine.batches, pStored(t, c, 300, nil)) // sent while disconnected
	st.onConnect(ctx)
	if lookup(idx, c) != 4 || st.next != 3 || statsOf(sub, "e").Restarts != 0 {
		t.Fatalf("same engine: c %d, next %d, restarts %d", lookup(idx, c), st.next, statsOf(sub, "e").Restarts)
	}
	st.onMessage(ctx, 2, engine.batches[2]) // queued during the replay
	if statsOf(sub, "e").Restarts != 0 || lookup(idx, a) != 4 {
		t.Fatal("a duplicate queued during the replay was taken for a restart")
	}
	// Restarted: its buffer numbers from 0 again, other batches.
	engine.batches = [][]byte{pEmpty(t)}
	st.onConnect(ctx)
	if statsOf(sub, "e").Restarts != 1 || lookup(idx, a) > 0 || lookup(idx, c) > 0 || st.next != 1 {
		t.Fatalf("restarted: restarts %d, a %d, c %d, next %d", statsOf(sub, "e").Restarts, lookup(idx, a), lookup(idx, c), st.next)
	}
	// The same number of batches as before, but not the same batch.
	engine.batches = [][]byte{pEmpty(t), pStored(t, a, 400, nil)}
	st.onMessage(ctx, 1, engine.batches[1])
	engine.batches = [][]byte{pEmpty(t), pStored(t, b, 500, nil)}
	st.onConnect(ctx)
	if statsOf(sub, "e").Restarts != 2 || lookup(idx, a) > 0 || lookup(idx, b) != 4 {
		t.Fatalf("restarted to the same length: restarts %d, a %d, b %d", statsOf(sub, "e").Restarts, lookup(idx, a), lookup(idx, b))
	}
}

// TestCentralResync: in central mode a restarted engine dials kvgate
// again and sends nothing until its next batch, so its old blocks were
// claimed until then. Resync, asked when its health checks bring it back,
// compares the engine's replay with the last batch applied: the same
// engine keeps its blocks; a restarted one (its buffer does not hold the
// batch) has them dropped at once.
func TestCentralResync(t *testing.T) {
	const name = "127.0.0.1:9003"
	topic := "kv@" + name + "@m"
	a := seqTokens(64, 9)
	var restarted atomic.Bool
	var stored []byte
	rs := startReplayServer(t, topic, func(send func(uint64, []byte) bool, start uint64) {
		if !restarted.Load() && start <= 1 { // a new buffer has nothing of what was applied
			send(1, stored)
		}
		send(endSeq, nil) // vLLM's end of a replay
	})
	stored = pStored(t, a, 1, nil)
	sub, idx, p := centralWithReplay(t, name, rs, Config{ReplayTimeout: time.Second})
	if err := p.WriteMsg([]byte(topic), seq8(1), stored); err != nil {
		t.Fatal(err)
	}
	eventually(t, "batch 1 applied", func() bool { return lookup(idx, a) == 4 })
	sub.Resync(name) // the same engine: its replay continues what was applied
	if st := statsOf(sub, name); lookup(idx, a) != 4 || st.Restarts != 0 || st.ReplayFailures != 0 {
		t.Fatalf("the same engine: lookup %d, %+v", lookup(idx, a), st)
	}
	restarted.Store(true)
	sub.Resync(name)
	if st := statsOf(sub, name); lookup(idx, a) != 0 || st.Restarts != 1 || st.LastSeq != nil {
		// last_seq was the old engine's 1 until the walkthrough of
		// 2026-12-04: null until the new engine's first batch.
		t.Fatalf("a restarted engine: lookup %d, %+v", lookup(idx, a), st)
	}
	sub.Resync("no such engine") // a no-op
}

// TestRestartAtConnectionEmptiesTheMap: a restarted engine found at a
// reconnection, whose buffer is still empty, applies no batch; map_blocks
// said the old engine's count until its next batch (walkthrough,
// 2026-12-04).
func TestRestartAtConnectionEmptiesTheMap(t *testing.T) {
	idx := kvindex.New(kvindex.Config{BlockSize: 16})
	sub, err := New(Config{Engines: []EngineConfig{{Name: "e", Model: "m", Events: "tcp://127.0.0.1:1", Replay: "tcp://127.0.0.1:2"}}, Logger: quietLogger()}, idx)
	if err != nil {
		t.Fatal(err)
	}
	st := sub.streams[0]
	a := seqTokens(64, 1)
	engine := &bufferReplayer{batches: [][]byte{pStored(t, a, 100, nil)}}
	st.rep = engine
	ctx := context.Background()
	st.onConnect(ctx)
	if got := statsOf(sub, "e").MapBlocks; got != 4 {
		t.Fatalf("warm: map_blocks %d, want 4", got)
	}
	engine.batches = nil // restarted, nothing sent yet
	st.onConnect(ctx)
	if s := statsOf(sub, "e"); s.Restarts != 1 || s.MapBlocks != 0 || lookup(idx, a) > 0 {
		t.Fatalf("restarted: restarts %d, map_blocks %d, a %d; want 1, 0, 0", s.Restarts, s.MapBlocks, lookup(idx, a))
	}
}
