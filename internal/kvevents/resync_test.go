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

// TestGapChecksTheLastBatch: a live batch past the next expected one has
// the replay asked from the last batch applied. The same engine's replay
// holds that batch as it was: the missed batches are applied onto its
// blocks. A restarted engine whose new sequence passed the old one before
// the index heard it (central mode: its first batches went while nothing
// fed the stream) holds another batch there: its blocks are dropped and
// its buffer warms the index (they were stitched onto the old engine's
// until 2026-12-05).
func TestGapChecksTheLastBatch(t *testing.T) {
	idx := kvindex.New(kvindex.Config{BlockSize: 16})
	sub, err := New(Config{Engines: []EngineConfig{{Name: "e", Model: "m", Events: "tcp://127.0.0.1:1", Replay: "tcp://127.0.0.1:2"}}, Logger: quietLogger()}, idx)
	if err != nil {
		t.Fatal(err)
	}
	st := sub.streams[0]
	a, b, c, d := seqTokens(64, 1), seqTokens(64, 2), seqTokens(64, 3), seqTokens(64, 4)
	engine := &bufferReplayer{batches: [][]byte{pStored(t, a, 100, nil), pStored(t, b, 200, nil)}}
	st.rep = engine
	ctx := context.Background()
	st.onConnect(ctx)
	// The same engine: batch 2 was missed, 3 comes live.
	engine.batches = append(engine.batches, pStored(t, c, 300, nil), pStored(t, d, 400, nil))
	st.onMessage(ctx, 3, engine.batches[3])
	if s := statsOf(sub, "e"); lookup(idx, a) != 4 || lookup(idx, c) != 4 || lookup(idx, d) != 4 || s.Restarts != 0 || s.Gaps != 1 || s.Unrecovered != 0 || s.OrphanBlocks != 0 || st.next != 4 {
		t.Fatalf("the same engine: a %d, c %d, d %d, next %d, %+v", lookup(idx, a), lookup(idx, c), lookup(idx, d), st.next, s)
	}
	// Restarted: six new batches, other blocks; the index hears the
	// sixth first.
	x := make([][]uint32, 6)
	engine.batches = nil
	for i := range x {
		x[i] = seqTokens(64, uint32(10+i))
		engine.batches = append(engine.batches, pStored(t, x[i], uint64(1000+100*i), nil))
	}
	st.onMessage(ctx, 5, engine.batches[5])
	s := statsOf(sub, "e")
	if lookup(idx, a) != 0 || lookup(idx, d) != 0 || s.Restarts != 1 || st.next != 6 {
		t.Fatalf("restarted past the old sequence: a %d, d %d, next %d, %+v", lookup(idx, a), lookup(idx, d), st.next, s)
	}
	for i := range x {
		if lookup(idx, x[i]) != 4 {
			t.Errorf("the new engine's batch %d: %d blocks indexed, want 4", i, lookup(idx, x[i]))
		}
	}
}

// TestCentralNewConnectionResyncs: in central mode an engine that
// restarts dials kvgate again; if its new sequence reaches exactly the
// old next number before the index hears it, nothing in the numbers says
// it restarted. The new connection does: its first frame has the replay
// compared with the last batch applied, and the old engine's blocks are
// dropped (they were claimed for good before 2026-12-05). The same
// engine dialing again keeps its blocks.
func TestCentralNewConnectionResyncs(t *testing.T) {
	const name = "127.0.0.1:9004"
	topic := "kv@" + name + "@m"
	a, b, c := seqTokens(64, 21), seqTokens(64, 22), seqTokens(64, 23)
	var restarted atomic.Bool
	var first, second, fresh0, fresh1 []byte
	rs := startReplayServer(t, topic, func(send func(uint64, []byte) bool, start uint64) {
		if restarted.Load() { // the new engine's buffer
			for seq, p := range [][]byte{fresh0, fresh1} {
				if uint64(seq) >= start && !send(uint64(seq), p) {
					return
				}
			}
		} else if start <= 1 {
			send(1, second)
		}
		send(endSeq, nil)
	})
	first, second = pStored(t, a, 100, nil), pStored(t, b, 200, nil)
	sub, idx, p := centralWithReplay(t, name, rs, Config{ReplayTimeout: time.Second})
	for seq, m := range [][]byte{first, second} {
		if err := p.WriteMsg([]byte(topic), seq8(uint64(seq)), m); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "batches 0 and 1 applied", func() bool { return lookup(idx, b) == 4 })
	// The same engine dials again: its replay holds batch 1 as applied.
	p.Close()
	p2 := rawPub(t, sub.cfg.BindEvents)
	if err := p2.WriteMsg([]byte(topic), seq8(2), pEmpty(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "batch 2 applied", func() bool { s := statsOf(sub, name); return s.LastSeq != nil && *s.LastSeq == 2 })
	if s := statsOf(sub, name); lookup(idx, a) != 4 || s.Restarts != 0 {
		t.Fatalf("the same engine again: a %d, %+v", lookup(idx, a), s)
	}
	// Restarted: batches 0, 1 and 2 of its own, the index hears 3 first,
	// exactly the old next number.
	restarted.Store(true)
	fresh0, fresh1 = pStored(t, c, 300, nil), pEmpty(t)
	p2.Close()
	p3 := rawPub(t, sub.cfg.BindEvents)
	if err := p3.WriteMsg([]byte(topic), seq8(3), pEmpty(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restart seen", func() bool { return statsOf(sub, name).Restarts == 1 })
	if lookup(idx, a) != 0 || lookup(idx, b) != 0 || lookup(idx, c) != 4 {
		t.Fatalf("restarted: a %d, b %d, c %d; want 0, 0, 4", lookup(idx, a), lookup(idx, b), lookup(idx, c))
	}
}
