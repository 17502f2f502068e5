package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/tokens"
)

// testPub is a vLLM-like publisher: a PUB sending [topic, seq, payload] and
// a ROUTER answering replay requests from its buffer.
type testPub struct {
	t       *testing.T
	cancel  context.CancelFunc
	pub     zmq4.Socket
	router  zmq4.Socket
	topic   []byte
	newForm bool // replies ["", topic, seq, payload] instead of ["", seq, payload]
	mu      sync.Mutex
	seq     uint64
	buf     [][2][]byte
	done    sync.WaitGroup
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func seq8(s uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, s)
	return b
}

// startPub binds (pubEP) or dials (dial=true) the PUB and binds the replay
// ROUTER when repEP is set.
func startPub(t *testing.T, pubEP, repEP, topic string, dial, newForm bool) *testPub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &testPub{t: t, cancel: cancel, topic: []byte(topic), newForm: newForm}
	p.pub = zmq4.NewPub(ctx, zmq4.WithDialerRetry(50*time.Millisecond))
	var err error
	for try := 0; try < 50; try++ { // a restarted publisher may wait for the port
		if dial {
			err = p.pub.Dial(pubEP)
		} else {
			err = p.pub.Listen(pubEP)
		}
		if err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("publisher: %v", err)
	}
	if repEP != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")))
		for try := 0; try < 50; try++ {
			if err = p.router.Listen(repEP); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("replay router: %v", err)
		}
		p.done.Add(1)
		go p.serveReplay(ctx)
	}
	return p
}

func (p *testPub) serveReplay(ctx context.Context) {
	defer p.done.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		f := msg.Frames
		if len(f) != 3 || len(f[2]) != 8 {
			continue
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		p.mu.Lock()
		buf := append([][2][]byte(nil), p.buf...)
		p.mu.Unlock()
		for _, b := range buf {
			if binary.BigEndian.Uint64(b[0]) < start {
				continue
			}
			frames := [][]byte{id, {}}
			if p.newForm {
				frames = append(frames, p.topic)
			}
			frames = append(frames, b[0], b[1])
			_ = p.router.Send(zmq4.NewMsgFrom(frames...))
		}
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, seq8(endSeq), []byte{}))
	}
}

// publish sends the next batch; with drop it only buffers it (a lost
// message that replay can still recover).
func (p *testPub) publish(payload []byte, drop bool) uint64 {
	p.mu.Lock()
	s := p.seq
	p.seq++
	p.buf = append(p.buf, [2][]byte{seq8(s), payload})
	p.mu.Unlock()
	if !drop {
		if err := p.pub.Send(zmq4.NewMsgFrom(p.topic, seq8(s), payload)); err != nil {
			p.t.Errorf("publish: %v", err)
		}
	}
	return s
}

func (p *testPub) close() {
	p.cancel()
	p.pub.Close()
	if p.router != nil {
		p.router.Close()
	}
	p.done.Wait()
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// payloads (positional form for stored blocks, map form elsewhere).
func pStored(t *testing.T, toks []uint32, base uint64, parent any) []byte {
	n := len(toks) / 16
	hashes := make([]any, n)
	for i := range hashes {
		// Hashes as 32-byte strings, like newer vLLM (last 8 bytes count).
		h := make([]byte, 32)
		binary.BigEndian.PutUint64(h[24:], base+uint64(i))
		hashes[i] = h
	}
	ids := make([]any, len(toks))
	for i, v := range toks {
		ids[i] = v
	}
	return enc(t, []any{1.0, []any{[]any{"BlockStored", hashes, parent, ids, 16, nil, "GPU", nil}}, 0})
}

func pRemoved(t *testing.T, hashes ...uint64) []byte {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	return enc(t, map[string]any{"ts": 2.0, "events": []any{map[string]any{"type": "BlockRemoved", "block_hashes": hs, "medium": "gpu"}}})
}

func pEmpty(t *testing.T) []byte { return enc(t, []any{0.5, []any{}, 0}) }

func pCleared(t *testing.T) []byte {
	return enc(t, []any{3.0, []any{[]any{"AllBlocksCleared"}}})
}

func lookup(idx *kvindex.Index, toks []uint32) int {
	keys := tokens.NewHasher(16).Keys(toks, nil)
	ms := idx.Lookup("m", keys, nil)
	if len(ms) == 0 {
		return -1
	}
	return ms[0].Blocks
}

func statsOf(sub *Subscriber, name string) EngineSnapshot {
	for _, s := range sub.Stats() {
		if s.Endpoint == name {
			return s
		}
	}
	return EngineSnapshot{}
}

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func TestEndToEndZMQ(t *testing.T) {
	for _, newForm := range []bool{false, true} {
		t.Run(fmt.Sprintf("newReplyForm=%v", newForm), func(t *testing.T) { testEndToEnd(t, newForm) })
	}
}

func testEndToEnd(t *testing.T, newForm bool) {
	pubEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	repEP := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	const name = "127.0.0.1:8001"
	pub := startPub(t, pubEP, repEP, "kv@"+name+"@m", false, newForm)
	defer func() { pub.close() }()

	idx := kvindex.New(kvindex.Config{BlockSize: 16})
	sub, err := New(Config{
		Engines:       []EngineConfig{{Name: name, Model: "m", Events: pubEP, Replay: repEP}},
		ReplayTimeout: time.Second, Logger: quietLogger(),
	}, idx)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- sub.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Until the subscription reaches the publisher, messages are lost
	// (ZMQ's slow joiner); publish empty batches until one arrives.
	eventually(t, "subscription", func() bool {
		pub.publish(pEmpty(t), false)
		return statsOf(sub, name).LastSeq != nil
	})

	a := seqTokens(128, 1)
	pub.publish(pStored(t, a, 1, nil), false)
	eventually(t, "stored blocks in lookup", func() bool { return lookup(idx, a) == 8 })

	// A dropped batch: B's first half never arrives live, its second half
	// (parent = B's 4th block) does; replay must fill the gap.
	b := seqTokens(128, 2)
	parent := make([]byte, 32)
	binary.BigEndian.PutUint64(parent[24:], 104)
	pub.publish(pStored(t, b[:64], 101, nil), true)
	pub.publish(pStored(t, b[64:], 105, parent), false)
	eventually(t, "dropped batch recovered by replay", func() bool { return lookup(idx, b) == 8 })
	st := statsOf(sub, name)
	if st.Gaps != 1 || st.Replays < 1 || st.ReplayedBatches < 1 || st.OrphanBlocks != 0 || st.Unrecovered != 0 {
		t.Errorf("after replay: %+v", st)
	}

	// BlockRemoved removes.
	pub.publish(pRemoved(t, 5), false)
	eventually(t, "removal", func() bool { return lookup(idx, a) == 4 })

	// A malformed payload is counted, not fatal.
	pub.publish([]byte{0xc1, 0x00}, false)
	eventually(t, "malformed counted", func() bool { return statsOf(sub, name).Malformed == 1 })

	// AllBlocksCleared clears the endpoint.
	pub.publish(pCleared(t), false)
	eventually(t, "clear", func() bool { return lookup(idx, a) == 0 && lookup(idx, b) == 0 })
	pub.publish(pStored(t, a, 201, nil), false)
	eventually(t, "store after clear", func() bool { return lookup(idx, a) == 8 })

	// Publisher restart: sockets closed and reopened, seq back to 0.
	pub.close()
	pub = startPub(t, pubEP, repEP, "kv@"+name+"@m", false, newForm)
	// A real engine takes seconds to restart, so the subscriber is back
	// before it publishes; wait for that here too.
	eventually(t, "reconnect", func() bool { return statsOf(sub, name).Connects >= 2 })
	eventually(t, "restart detected", func() bool {
		pub.publish(pEmpty(t), false)
		return statsOf(sub, name).Restarts >= 1
	})
	if got := lookup(idx, a); got != 0 {
		t.Errorf("after restart: %d blocks still indexed", got)
	}
	// The restart may have been found by the replay at the reconnection,
	// before the new subscription reached the publisher (ZMQ's slow
	// joiner): a frame published once then was lost in 1 run of about
	// 60 on a busy machine. Publish until one arrives.
	c := seqTokens(64, 3)
	eventually(t, "store after restart", func() bool {
		pub.publish(pStored(t, c, 301, nil), false)
		return lookup(idx, c) == 4
	})
	if st := idx.Stats()[0]; st.GPUBlocks != 4 {
		t.Errorf("index stats after restart: %+v", st)
	}
}

func TestCentralMode(t *testing.T) {
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	idx := kvindex.New(kvindex.Config{BlockSize: 16})
	sub, err := New(Config{BindEvents: bind, Logger: quietLogger()}, idx)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- sub.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runDone; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	const name = "127.0.0.1:9001"
	var pub *testPub
	eventually(t, "central bind", func() bool {
		conn, err := net.Dial("tcp", bind[len("tcp://"):])
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	pub = startPub(t, bind, "", "kv@"+name+"@m", true, false)
	defer pub.close()
	eventually(t, "engine known from topic", func() bool {
		pub.publish(pEmpty(t), false)
		return statsOf(sub, name).LastSeq != nil
	})
	a := seqTokens(96, 4)
	pub.publish(pStored(t, a, 1, nil), false)
	eventually(t, "central lookup", func() bool { return lookup(idx, a) == 6 })
	if _, m, ok := idx.Endpoint(idx.Endpoints("m")[0]); !ok || m != "m" {
		t.Errorf("endpoint not registered")
	}

	// A malformed kv@ topic is counted as malformed; a topic that does
	// not follow the convention, from a connection that names no
	// configured engine, as unidentified.
	if err := pub.pub.Send(zmq4.NewMsgFrom([]byte("kv@broken"), seq8(0), pEmpty(t))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bad topic counted", func() bool { return sub.CentralMalformed() == 1 })
	if err := pub.pub.Send(zmq4.NewMsgFrom([]byte("garbage"), seq8(0), pEmpty(t))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "unidentified topic counted", func() bool { return sub.CentralUnidentified() == 1 })
}

func TestParseTopic(t *testing.T) {
	tests := []struct{ in, name, model string }{
		{"kv@10.0.0.1:8000@meta-llama/Llama-3.1-8B", "10.0.0.1:8000", "meta-llama/Llama-3.1-8B"},
		{"kv@h:1@m@x", "h:1", "m@x"},
		{"kv@@m", "", ""},
		{"kv@h:1", "", ""},
		{"", "", ""},
	}
	for _, tc := range tests {
		n, m, err := ParseTopic(tc.in)
		if (err != nil) != (tc.name == "") || n != tc.name || m != tc.model {
			t.Errorf("ParseTopic(%q) = %q, %q, %v", tc.in, n, m, err)
		}
	}
}
