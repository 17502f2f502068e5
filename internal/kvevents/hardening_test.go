package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
)

// Regression tests for issue 14 items 1 and 10: hostile peers of the bound
// SUB, sequence numbers at the top of the range and a replay server that
// never stops. Publishers are raw ZMTP peers (zmtptest) and replay servers
// go-zeromq/zmq4 ROUTERs: code we did not write against ours.

const hang = 20 * time.Second // hang guard only

// runSub starts a subscriber and stops it at the end of the test.
func runSub(t *testing.T, cfg Config) (*Subscriber, *kvindex.Index) {
	t.Helper()
	idx := kvindex.New(kvindex.Config{BlockSize: 16})
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	sub, err := New(cfg, idx)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(hang):
			t.Error("Run did not return after cancel")
		}
	})
	return sub, idx
}

// rawPub dials the central SUB as a raw ZMTP 3.0 PUB.
func rawPub(t *testing.T, bind string) *zmtptest.Peer {
	t.Helper()
	var p *zmtptest.Peer
	eventually(t, "central bind", func() bool {
		var err error
		p, err = zmtptest.Dial(bind, time.Second)
		return err == nil
	})
	t.Cleanup(func() { p.Close() })
	if err := p.Handshake("PUB", 0, nil, hang); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBoundSUBSurvivesHugeFrame(t *testing.T) {
	for _, size := range []uint64{1<<63 - 1, 1 << 30} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			sub, idx := runSub(t, Config{BindEvents: bind})
			bad := rawPub(t, bind)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			if err := bad.Write(zmtptest.FrameHeader(0, size, true)); err != nil {
				t.Fatal(err)
			}
			_ = bad.Write(make([]byte, 4096))
			if !bad.WaitClosed(hang) {
				t.Fatalf("announcing %d bytes did not close the connection", size)
			}
			runtime.ReadMemStats(&after)
			if d := after.TotalAlloc - before.TotalAlloc; d > 64<<20 {
				t.Errorf("announcing %d bytes allocated %d MiB", size, d>>20)
			}
			// Another engine is still heard.
			const name = "127.0.0.1:9001"
			good := rawPub(t, bind)
			a := seqTokens(64, 7)
			if err := good.WriteMsg([]byte("kv@"+name+"@m"), seq8(0), pStored(t, a, 1, nil)); err != nil {
				t.Fatal(err)
			}
			eventually(t, "events after the attack", func() bool { return lookup(idx, a) == 4 })
			if n := sub.CentralSocketStats().Oversize; n < 1 {
				t.Errorf("oversize rejections: %d", n)
			}
		})
	}
}

// replayServer is a zmq4 ROUTER answering replay requests with serve.
type replayServer struct {
	ep       string
	requests atomic.Int64
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// startReplayServer binds a zmq4 ROUTER; for each request ["", start] it
// calls serve(send, start) with send sending one reply [ "", topic, seq,
// payload ] (false once the server stops).
func startReplayServer(t *testing.T, topic string, serve func(send func(seq uint64, payload []byte) bool, start uint64)) *replayServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rs := &replayServer{ep: fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)), stop: cancel}
	r := zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")))
	if err := r.Listen(rs.ep); err != nil {
		t.Fatal(err)
	}
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		for {
			msg, err := r.Recv()
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
			rs.requests.Add(1)
			id := f[0]
			serve(func(seq uint64, payload []byte) bool {
				if ctx.Err() != nil {
					return false
				}
				return r.Send(zmq4.NewMsgFrom(id, []byte{}, []byte(topic), seq8(seq), payload)) == nil
			}, binary.BigEndian.Uint64(f[2]))
		}
	}()
	t.Cleanup(func() {
		cancel()
		r.Close()
		rs.wg.Wait()
	})
	return rs
}

// centralWithReplay runs a central-mode subscriber that knows engine name
// with replay server rs, and dials it as a raw publisher.
func centralWithReplay(t *testing.T, name string, rs *replayServer, cfg Config) (*Subscriber, *kvindex.Index, *zmtptest.Peer) {
	t.Helper()
	cfg.BindEvents = fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	cfg.Engines = []EngineConfig{{Name: name, Model: "m", Replay: rs.ep}}
	sub, idx := runSub(t, cfg)
	return sub, idx, rawPub(t, cfg.BindEvents)
}

// TestSeqMaxDoesNotWrap: after a batch numbered 2^64-1 the stream must not
// expect 0 next: a later small sequence number is a restart, not a gap.
func TestSeqMaxDoesNotWrap(t *testing.T) {
	const name = "127.0.0.1:9002"
	topic := "kv@" + name + "@m"
	rs := startReplayServer(t, topic, func(send func(uint64, []byte) bool, _ uint64) {
		send(endSeq, nil)
	})
	sub, idx, p := centralWithReplay(t, name, rs, Config{ReplayTimeout: time.Second})
	a := seqTokens(64, 8)
	for _, m := range []struct {
		seq     uint64
		payload []byte
	}{{endSeq - 1, pEmpty(t)}, {endSeq, pStored(t, a, 1, nil)}} {
		if err := p.WriteMsg([]byte(topic), seq8(m.seq), m.payload); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "batch 2^64-1 applied", func() bool { return lookup(idx, a) == 4 })
	st := statsOf(sub, name)
	if st.LastSeq == nil || *st.LastSeq != endSeq || st.Gaps != 0 {
		t.Fatalf("after seq 2^64-1: %+v", st)
	}
	// The engine restarts and its new numbering has already moved on.
	if err := p.WriteMsg([]byte(topic), seq8(3), pEmpty(t)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "restart seen", func() bool {
		st := statsOf(sub, name)
		return st.Restarts == 1 && *st.LastSeq == 3
	})
	st = statsOf(sub, name)
	if st.Gaps != 0 || *st.LastSeq != 3 || lookup(idx, a) != 0 {
		t.Errorf("after restart at seq 3: %+v, lookup %d", st, lookup(idx, a))
	}
}

// TestEndlessReplayDoesNotStarveLive: a replay server that never sends the
// end marker must not hold up live frames, and the batches it sends past
// the live sequence must not turn live frames into duplicates.
func TestEndlessReplayDoesNotStarveLive(t *testing.T) {
	const name = "127.0.0.1:9003"
	topic := "kv@" + name + "@m"
	rs := startReplayServer(t, topic, func(send func(uint64, []byte) bool, start uint64) {
		for s := start; ; s++ {
			if !send(s, enc(t, []any{0.5, []any{}, 0})) {
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	sub, idx, p := centralWithReplay(t, name, rs, Config{ReplayTimeout: time.Second})
	// Joining late at seq 10: replay 0..9, then the live frames.
	a := seqTokens(64, 9)
	b := seqTokens(64, 10)
	for _, m := range []struct {
		seq     uint64
		payload []byte
	}{{10, pEmpty(t)}, {11, pStored(t, a, 1, nil)}, {12, pStored(t, b, 101, nil)}} {
		if err := p.WriteMsg([]byte(topic), seq8(m.seq), m.payload); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "live frames applied", func() bool { return lookup(idx, a) == 4 && lookup(idx, b) == 4 })
	st := statsOf(sub, name)
	if st.ReplayedBatches != 10 || *st.LastSeq != 12 || st.Batches != 13 {
		t.Errorf("stats: %+v", st)
	}
	if rs.requests.Load() != 1 {
		t.Errorf("%d replay requests", rs.requests.Load())
	}
}

// TestReplayBounded: a replay server that repeats old batches instead of
// ending, or that trickles, is cut off by the reply count or the time
// budget; the live frame is applied and the unfilled gap counted.
func TestReplayBounded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
		cfg   Config
		fails int64 // replay failures (time budget) expected
	}{
		{"repeats", 0, Config{ReplayTimeout: time.Second, ReplayBudget: hang}, 0},
		{"trickles", 50 * time.Millisecond, Config{ReplayTimeout: time.Second, ReplayBudget: 300 * time.Millisecond}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "127.0.0.1:9004"
			topic := "kv@" + name + "@m"
			// With a budget longer than the test's hang guard, only the
			// reply count can end the "repeats" replay in time.
			rs := startReplayServer(t, topic, func(send func(uint64, []byte) bool, start uint64) {
				for send(0, enc(t, []any{0.5, []any{}, 0})) {
					time.Sleep(tc.every)
				}
			})
			sub, idx, p := centralWithReplay(t, name, rs, tc.cfg)
			a := seqTokens(64, 11)
			_ = p.WriteMsg([]byte(topic), seq8(0), pEmpty(t))
			_ = p.WriteMsg([]byte(topic), seq8(5), pStored(t, a, 1, nil)) // gap: 1..4
			eventually(t, "live frame applied", func() bool { return lookup(idx, a) == 4 })
			st := statsOf(sub, name)
			if st.Gaps != 1 || st.Unrecovered != 1 || st.ReplayFailures != tc.fails || *st.LastSeq != 5 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestCentralEngineLimit: central mode registers at most MaxCentralEngines
// engines from topics; frames of further topics are refused and counted,
// configured engines are still heard.
func TestCentralEngineLimit(t *testing.T) {
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	const configured = "127.0.0.1:9100"
	sub, idx := runSub(t, Config{BindEvents: bind, MaxCentralEngines: 2, Engines: []EngineConfig{{Name: configured, Model: "m"}}})
	p := rawPub(t, bind)
	for i := range 5 {
		_ = p.WriteMsg([]byte(fmt.Sprintf("kv@127.0.0.1:%d@m", 9200+i)), seq8(0), pEmpty(t))
	}
	a := seqTokens(64, 12)
	_ = p.WriteMsg([]byte("kv@"+configured+"@m"), seq8(0), pStored(t, a, 1, nil))
	eventually(t, "configured engine heard", func() bool { return lookup(idx, a) == 4 })
	if n := sub.CentralRefused(); n != 3 {
		t.Errorf("refused frames: %d, want 3", n)
	}
	if n := len(sub.Stats()); n != 3 {
		t.Errorf("%d engines registered, want 1 configured + 2 from topics", n)
	}
	// Known topics keep working at the limit.
	_ = p.WriteMsg([]byte("kv@127.0.0.1:9200@m"), seq8(1), pEmpty(t))
	eventually(t, "known topic", func() bool { return statsOf(sub, "127.0.0.1:9200").Batches == 2 })
	if n := sub.CentralRefused(); n != 3 {
		t.Errorf("refused frames: %d, want 3", n)
	}
}

// TestCentralEngineLimitForgetsTheSilent: at the limit, an engine
// registered from its topic that has been silent CentralEvictSilence
// gives its place (and its blocks) to a new topic's engine; a pod
// restarted under a new IP is not locked out until kvgate restarts
// (found by a walkthrough of kvgate kvindex with llm-d's kv@${POD_IP}
// topics).
func TestCentralEngineLimitForgetsTheSilent(t *testing.T) {
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	sub, idx := runSub(t, Config{BindEvents: bind, MaxCentralEngines: 1, CentralEvictSilence: time.Millisecond})
	p := rawPub(t, bind)
	a, b := seqTokens(64, 21), seqTokens(64, 22)
	_ = p.WriteMsg([]byte("kv@127.0.0.1:9300@m"), seq8(0), pStored(t, a, 1, nil))
	eventually(t, "first engine heard", func() bool { return lookup(idx, a) == 4 })
	time.Sleep(5 * time.Millisecond)
	_ = p.WriteMsg([]byte("kv@127.0.0.1:9301@m"), seq8(0), pStored(t, b, 1, nil))
	eventually(t, "second engine heard", func() bool { return lookup(idx, b) == 4 })
	if n := lookup(idx, a); n != 0 {
		t.Errorf("the forgotten engine's blocks: %d still indexed", n)
	}
	if st := sub.Stats(); len(st) != 1 || st[0].Endpoint != "127.0.0.1:9301" || sub.CentralRefused() != 0 {
		t.Errorf("engines %+v, %d refused frames", st, sub.CentralRefused())
	}
}

// TestWarmUpReplay: joining an engine whose first live batch is 10 and
// whose buffer holds 3..12, the subscriber applies 3..9 from the replay
// (in order, once), then the live batches; nothing is reported lost
// because the engine's history before its buffer is not a gap.
func TestWarmUpReplay(t *testing.T) {
	const name = "127.0.0.1:9005"
	topic := "kv@" + name + "@m"
	a := seqTokens(64, 13)
	rs := startReplayServer(t, topic, func(send func(uint64, []byte) bool, start uint64) {
		for s := max(start, 3); s <= 12; s++ {
			payload := pEmpty(t)
			if s == 3 {
				payload = pStored(t, a, 1, nil)
			}
			send(s, payload)
		}
		send(endSeq, nil)
	})
	sub, idx, p := centralWithReplay(t, name, rs, Config{})
	for s := uint64(10); s <= 12; s++ {
		_ = p.WriteMsg([]byte(topic), seq8(s), pEmpty(t))
	}
	eventually(t, "live batches", func() bool {
		st := statsOf(sub, name)
		return st.LastSeq != nil && *st.LastSeq == 12
	})
	st := statsOf(sub, name)
	if lookup(idx, a) != 4 || st.ReplayedBatches != 7 || st.Batches != 10 || st.Unrecovered != 0 || st.Gaps != 0 {
		t.Errorf("lookup %d, stats %+v", lookup(idx, a), st)
	}
}
