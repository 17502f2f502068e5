package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/engine/kvpub"
	"github.com/kvgate/kvgate/internal/tokens"
	"github.com/kvgate/kvgate/internal/zmtp"
	"github.com/vmihailenco/msgpack/v5"
)

// decodedEvent is a KV event decoded independently of kvpub, from either
// wire form.
type decodedEvent struct {
	kind      string
	hashes    []uint64
	parent    *uint64
	tokenIDs  []uint32
	blockSize int
	medium    string
	// loraID and loraName: lora_id and lora_name (0 and "" when nil).
	loraID   int64
	loraName string
}

type decodedBatch struct {
	seq    uint64
	ts     float64
	rank   int64
	events []decodedEvent
}

func toUint64(t testing.TB, v any) uint64 {
	if i := toInt(v); i >= 0 && fmt.Sprint(v) == fmt.Sprint(i) {
		if _, unsigned := v.(uint64); !unsigned {
			return uint64(i)
		}
	}
	switch x := v.(type) {
	case uint8:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint32:
		return uint64(x)
	case uint64:
		return x
	}
	t.Fatalf("not an unsigned integer: %T %v", v, v)
	return 0
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case int64:
		return x
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	}
	return -1
}

func decodePayload(t testing.TB, seq uint64, payload []byte, format kvpub.Format) decodedBatch {
	t.Helper()
	var raw []any
	if err := msgpack.Unmarshal(payload, &raw); err != nil {
		t.Fatalf("payload: %v", err)
	}
	if len(raw) != 3 {
		t.Fatalf("batch must be [ts, events, dp_rank], got %d fields", len(raw))
	}
	ts, ok := raw[0].(float64)
	if !ok {
		t.Fatalf("ts is %T", raw[0])
	}
	b := decodedBatch{seq: seq, ts: ts, rank: toInt(raw[2])}
	for _, re := range raw[1].([]any) {
		var f map[string]any
		switch format {
		case kvpub.FormatArray:
			arr, ok := re.([]any)
			if !ok {
				t.Fatalf("array format: event is %T", re)
			}
			names := map[string][]string{
				"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
				"BlockRemoved":     {"block_hashes", "medium"},
				"AllBlocksCleared": {},
			}
			tag := arr[0].(string)
			f = map[string]any{"type": tag}
			if len(arr)-1 != len(names[tag]) {
				t.Fatalf("%s has %d fields", tag, len(arr)-1)
			}
			for i, n := range names[tag] {
				f[n] = arr[i+1]
			}
		case kvpub.FormatMap:
			if f, ok = re.(map[string]any); !ok {
				t.Fatalf("map format: event is %T", re)
			}
		}
		ev := decodedEvent{kind: f["type"].(string)}
		if hs, ok := f["block_hashes"].([]any); ok {
			for _, h := range hs {
				ev.hashes = append(ev.hashes, toUint64(t, h))
			}
		}
		if p := f["parent_block_hash"]; p != nil {
			v := toUint64(t, p)
			ev.parent = &v
		}
		if ts, ok := f["token_ids"].([]any); ok {
			for _, x := range ts {
				ev.tokenIDs = append(ev.tokenIDs, uint32(toInt(x)))
			}
		}
		if bs, ok := f["block_size"]; ok {
			ev.blockSize = int(toInt(bs))
		}
		if m, ok := f["medium"].(string); ok {
			ev.medium = m
		}
		if id := f["lora_id"]; id != nil {
			ev.loraID = toInt(id)
		}
		if name := f["lora_name"]; name != nil {
			ev.loraName = name.(string)
		}
		if ev.kind == "BlockStored" && (ev.loraID == 0) != (ev.loraName == "") {
			t.Errorf("lora_id %d with lora_name %q: both or neither", ev.loraID, ev.loraName)
		}
		b.events = append(b.events, ev)
	}
	return b
}

// subscriber receives KV event batches from an engine.
type subscriber struct {
	sub   *zmtp.Sub
	ch    chan decodedBatch
	topic string
}

func subscribe(t *testing.T, e *Engine, format kvpub.Format) *subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := zmtp.NewSub(zmtp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); sub.Close(); <-done })
	sub.Subscribe([]byte(e.KVEventsTopic()))
	if err := sub.Dial(e.KVEventsEndpoint()); err != nil {
		t.Fatal(err)
	}
	s := &subscriber{sub: sub, ch: make(chan decodedBatch, 1024), topic: e.KVEventsTopic()}
	ch := s.ch
	go func() {
		defer close(done)
		for {
			msg, err := sub.Recv(ctx)
			if err != nil {
				return
			}
			if len(msg) != 3 || string(msg[0]) != s.topic || len(msg[1]) != 8 {
				t.Errorf("bad frames: %d, topic %q", len(msg), msg[0])
				continue
			}
			ch <- decodePayload(t, binary.BigEndian.Uint64(msg[1]), msg[2], format)
		}
	}()
	// Slow joiner: poke the engine with cache resets until a batch arrives.
	deadline := time.Now().Add(5 * time.Second)
	for {
		postJSON(t, e.URL()+"/reset_prefix_cache", map[string]any{})
		select {
		case <-s.ch:
			// Drain the other probes.
			for {
				select {
				case <-s.ch:
				case <-time.After(50 * time.Millisecond):
					return s
				}
			}
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no KV events received")
		}
	}
}

// mirror applies events to a set of hashes, as a router's index would.
type mirror struct {
	t      testing.TB
	hashes map[uint64]bool
	last   uint64
	seen   bool
	kinds  map[string]int
}

func (m *mirror) apply(b decodedBatch) {
	if m.seen && b.seq != m.last+1 {
		m.t.Errorf("sequence gap: %d after %d", b.seq, m.last)
	}
	m.last, m.seen = b.seq, true
	if b.rank != 0 {
		m.t.Errorf("data_parallel_rank %d", b.rank)
	}
	for _, ev := range b.events {
		m.kinds[ev.kind]++
		switch ev.kind {
		case "BlockStored":
			if ev.medium != "GPU" || ev.blockSize != 16 || len(ev.tokenIDs) != 16*len(ev.hashes) {
				m.t.Errorf("BlockStored %+v", ev)
			}
			// The chain is recomputable from parent and token ids.
			h := tokens.NewHasher(16)
			parent := tokens.RootKey
			if ev.parent != nil {
				parent = *ev.parent
				if !m.hashes[parent] {
					m.t.Errorf("parent %x not cached", parent)
				}
			}
			for i, hash := range ev.hashes {
				if k := h.Key(parent, ev.tokenIDs[i*16:(i+1)*16], nil); k != hash {
					m.t.Errorf("block %d hash %x, recomputed %x", i, hash, k)
				}
				parent = hash
				m.hashes[hash] = true
			}
		case "BlockRemoved":
			if ev.medium != "GPU" {
				m.t.Errorf("medium %q", ev.medium)
			}
			for _, h := range ev.hashes {
				if !m.hashes[h] {
					m.t.Errorf("removed unknown block %x", h)
				}
				delete(m.hashes, h)
			}
		case "AllBlocksCleared":
			clear(m.hashes)
		default:
			m.t.Errorf("unknown event %q", ev.kind)
		}
	}
}

// settle applies batches until none arrives for a while.
func (m *mirror) settle(s *subscriber) int {
	n := 0
	for {
		select {
		case b := <-s.ch:
			m.apply(b)
			n++
		case <-time.After(100 * time.Millisecond):
			return n
		}
	}
}

func TestKVEventsMatchCache(t *testing.T) {
	for _, format := range []kvpub.Format{kvpub.FormatArray, kvpub.FormatMap} {
		t.Run(format.String(), func(t *testing.T) {
			e := startEngine(t, func(c *Config) {
				c.NumGPUBlocks = 40 // small: forces evictions
				c.KVEventsEndpoint = "tcp://127.0.0.1:0"
				c.KVEventsFormat = format
			})
			if !strings.HasPrefix(e.KVEventsTopic(), "kv@"+e.Addr()+"@test-model") {
				t.Errorf("topic %q", e.KVEventsTopic())
			}
			s := subscribe(t, e, format)
			m := &mirror{t: t, hashes: map[uint64]bool{}, kinds: map[string]int{}}
			rng := rand.New(rand.NewPCG(7, 8))
			check := func(stage string) {
				m.settle(s)
				var want map[uint64]bool
				onScheduler(t, e, func(s *scheduler) { want = s.pool.cachedHashes() })
				if len(want) != len(m.hashes) {
					t.Fatalf("%s: mirror has %d blocks, cache %d", stage, len(m.hashes), len(want))
				}
				for h := range want {
					if !m.hashes[h] {
						t.Fatalf("%s: cached block %x missing from events", stage, h)
					}
				}
			}
			// Fill the cache: 4 prompts x 8 blocks > 40 blocks, evictions.
			prefix := words(rng, 64)
			for i := range 4 {
				complete(t, e, map[string]any{"prompt": words(rng, 128), "max_tokens": 17})
				if i == 1 {
					complete(t, e, map[string]any{"prompt": prefix + " " + words(rng, 20), "max_tokens": 3})
				}
			}
			check("after load")
			complete(t, e, map[string]any{"prompt": prefix + " again", "max_tokens": 1})
			check("after prefix reuse")
			postJSON(t, e.URL()+"/reset_prefix_cache", map[string]any{})
			check("after reset")
			if len(m.hashes) != 0 {
				t.Errorf("%d blocks after AllBlocksCleared", len(m.hashes))
			}
			complete(t, e, map[string]any{"prompt": words(rng, 40), "max_tokens": 1})
			check("after reset and new request")
			if m.kinds["BlockStored"] == 0 || m.kinds["BlockRemoved"] == 0 || m.kinds["AllBlocksCleared"] == 0 {
				t.Errorf("event kinds seen: %v", m.kinds)
			}
		})
	}
}

func TestKVEventsReplay(t *testing.T) {
	e := startEngine(t, func(c *Config) {
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsReplayEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsBufferSteps = 5
	})
	rng := rand.New(rand.NewPCG(9, 10))
	// No subscriber: every batch is "missed".
	for range 7 {
		complete(t, e, map[string]any{"prompt": words(rng, 40), "max_tokens": 2})
	}
	next := e.pub.Seq()
	if next < 5 {
		t.Fatalf("only %d batches published", next)
	}
	replay := func(start uint64) []decodedBatch {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d, err := zmtp.NewDealer(zmtp.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if err := d.Dial(e.KVEventsReplayEndpoint()); err != nil {
			t.Fatal(err)
		}
		if err := d.Send(ctx, nil, binary.BigEndian.AppendUint64(nil, start)); err != nil {
			t.Fatal(err)
		}
		var out []decodedBatch
		for {
			msg, err := d.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(msg) != 4 || len(msg[0]) != 0 || string(msg[1]) != e.KVEventsTopic() {
				t.Fatalf("reply frames %q", msg)
			}
			seq := binary.BigEndian.Uint64(msg[2])
			if seq == kvpub.EndSeq {
				if len(msg[3]) != 0 {
					t.Error("end marker with payload")
				}
				return out
			}
			out = append(out, decodePayload(t, seq, msg[3], kvpub.FormatArray))
		}
	}
	// The buffer keeps the last 5 batches.
	got := replay(0)
	if len(got) != 5 || got[0].seq != next-5 || got[4].seq != next-1 {
		t.Fatalf("replay from 0: %d batches starting at %d (next %d)", len(got), got[0].seq, next)
	}
	for i, b := range got {
		if b.seq != next-5+uint64(i) || len(b.events) == 0 {
			t.Errorf("batch %d: seq %d, %d events", i, b.seq, len(b.events))
		}
	}
	if got := replay(next - 2); len(got) != 2 || got[0].seq != next-2 {
		t.Errorf("replay from next-2: %d batches", len(got))
	}
	if got := replay(next + 100); len(got) != 0 {
		t.Errorf("replay from the future: %d batches", len(got))
	}
}

// TestKVEventsEmptyTopic: the topic given empty is vLLM's default topic,
// "" (a walkthrough could not make the emulator send it).
func TestKVEventsEmptyTopic(t *testing.T) {
	e := startEngine(t, func(c *Config) {
		c.KVEventsEndpoint = "tcp://127.0.0.1:0"
		c.KVEventsTopicSet = true
	})
	if e.KVEventsTopic() != "" {
		t.Fatalf("topic %q, want vLLM's empty one", e.KVEventsTopic())
	}
	subscribe(t, e, kvpub.FormatArray) // fails unless batches come under the empty topic
}
