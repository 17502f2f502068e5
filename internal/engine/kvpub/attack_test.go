package kvpub

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
)

// Regression tests for issue 14 items 1 and 2: hostile or stalled peers of
// the engine's PUB and replay ROUTER sockets. The peers are raw TCP
// connections speaking ZMTP by hand (zmtptest), not our socket layer.

const hang = 20 * time.Second // hang guard only, never a speed assertion

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startPublisher(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
	}
	if cfg.Topic == "" {
		cfg.Topic = "kv@127.0.0.1:1@m"
	}
	cfg.Logger = quiet()
	p, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// bigBatch is one BlockStored of 1024 blocks whose token ids need five
// msgpack bytes each: a payload of about 90 KiB.
func bigBatch(i int) []Event {
	const blocks, bs = 1024, 16
	ev := &BlockStored{BlockSize: bs, Hashes: make([]uint64, blocks), TokenIDs: make([]uint32, blocks*bs)}
	for j := range ev.Hashes {
		ev.Hashes[j] = uint64(i)<<32 | uint64(j)
	}
	for j := range ev.TokenIDs {
		ev.TokenIDs[j] = 1<<20 + uint32(j)
	}
	return []Event{ev}
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	zmtptest.Eventually(t, hang, what, f)
}

// rawSubscriber is a raw ZMTP 3.0 SUB subscribed to everything.
func rawSubscriber(t *testing.T, endpoint string) *zmtptest.Peer {
	t.Helper()
	p, err := zmtptest.Dial(endpoint, hang)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Handshake("SUB", 0, nil, hang); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteMsg([]byte{1}); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitSubscribed publishes empty-cache batches until the peer receives one
// (the subscription has reached the publisher) and returns the next seq it
// should see.
func waitSubscribed(t *testing.T, pub *Publisher, peers ...*zmtptest.Peer) {
	t.Helper()
	for _, p := range peers {
		got := make(chan uint64, 1)
		go func() {
			msg, err := p.ReadMsg()
			if err == nil && len(msg) == 3 {
				got <- binary.BigEndian.Uint64(msg[1])
			}
			close(got)
		}()
		deadline := time.After(hang)
	wait:
		for {
			if err := pub.Publish(1, []Event{AllBlocksCleared{}}); err != nil {
				t.Fatal(err)
			}
			select {
			case _, ok := <-got:
				if !ok {
					t.Fatal("subscriber connection failed")
				}
				break wait
			case <-time.After(20 * time.Millisecond):
			case <-deadline:
				t.Fatal("subscription never reached the publisher")
			}
		}
		// Discard the other probes.
		_ = p.Conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		for {
			if _, err := p.ReadMsg(); err != nil {
				break
			}
		}
		_ = p.Conn.SetReadDeadline(time.Time{})
	}
}

// hugeFrame completes a handshake as socketType and announces a frame of
// size bytes; it reports whether the socket closed the connection.
func hugeFrame(t *testing.T, endpoint, socketType string, size uint64) bool {
	t.Helper()
	p, err := zmtptest.Dial(endpoint, hang)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Handshake(socketType, 0, nil, hang); err != nil {
		t.Fatal(err)
	}
	if err := p.Write(zmtptest.FrameHeader(0, size, true)); err != nil {
		t.Fatal(err)
	}
	_ = p.Write(make([]byte, 4096)) // some of the announced body
	return p.WaitClosed(hang)
}

func TestPUBSurvivesHugeFrame(t *testing.T) {
	pub := startPublisher(t, Config{})
	if !hugeFrame(t, pub.Endpoint(), "SUB", 1<<63-1) {
		t.Fatal("a 2^63-1 byte frame announcement did not close the connection")
	}
	// Still serving: an honest subscriber receives batches.
	sub := rawSubscriber(t, pub.Endpoint())
	waitSubscribed(t, pub, sub)
	waitFor(t, "oversize rejection counted", func() bool { return pub.Stats().PUB.Oversize == 1 })
}

func TestReplayRouterSurvivesHugeFrame(t *testing.T) {
	pub := startPublisher(t, Config{ReplayEndpoint: "tcp://127.0.0.1:0"})
	if !hugeFrame(t, pub.ReplayEndpoint(), "DEALER", 1<<63-1) {
		t.Fatal("a 2^63-1 byte frame announcement did not close the connection")
	}
	if err := pub.Publish(1, []Event{AllBlocksCleared{}}); err != nil {
		t.Fatal(err)
	}
	if got := rawReplay(t, pub, 0); len(got) != 1 {
		t.Fatalf("replay after the attack: %d batches, want 1", len(got))
	}
	waitFor(t, "oversize rejection counted", func() bool { return pub.Stats().Replay.Oversize == 1 })
}

// TestHugeFrameNotAllocated: announcing 1 GiB must not allocate it (nor
// anything near it) on either socket.
func TestHugeFrameNotAllocated(t *testing.T) {
	pub := startPublisher(t, Config{ReplayEndpoint: "tcp://127.0.0.1:0"})
	for _, tc := range []struct{ ep, typ string }{{pub.Endpoint(), "SUB"}, {pub.ReplayEndpoint(), "DEALER"}} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		closed := hugeFrame(t, tc.ep, tc.typ, 1<<30)
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > 64<<20 {
			t.Errorf("%s: announcing 1 GiB allocated %d MiB", tc.typ, d>>20)
		}
		if !closed {
			t.Errorf("%s: connection announcing 1 GiB not closed", tc.typ)
		}
	}
}

// TestStalledSubscriberDoesNotBlockOthers: a subscriber that never reads
// must not stop publishing or another subscriber receiving every batch; its
// drops are counted.
func TestStalledSubscriberDoesNotBlockOthers(t *testing.T) {
	pub := startPublisher(t, Config{BufferSteps: 4, SendQueue: 8})
	stalled := rawSubscriber(t, pub.Endpoint())
	honest := rawSubscriber(t, pub.Endpoint())
	waitSubscribed(t, pub, stalled, honest)
	first := pub.Seq()

	const n = 200 // ~18 MB: more than the stalled peer's socket buffers
	got := make(chan uint64, n)
	go func() {
		for range n {
			msg, err := honest.ReadMsg()
			if err != nil || len(msg) != 3 {
				close(got)
				return
			}
			got <- binary.BigEndian.Uint64(msg[1])
		}
	}()
	published := make(chan error, 1)
	go func() {
		for i := range n {
			if err := pub.Publish(1, bigBatch(i)); err != nil {
				published <- err
				return
			}
			// Let the honest reader keep up (its queue is small): the
			// test is about the stalled peer, not about a slow honest one.
			for len(got) < i-4 {
				time.Sleep(time.Millisecond)
			}
		}
		published <- nil
	}()
	select {
	case err := <-published:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hang):
		t.Fatal("Publish blocked behind a subscriber that never reads")
	}
	for i := range n {
		select {
		case s, ok := <-got:
			if !ok {
				t.Fatalf("honest subscriber lost its connection after %d batches", i)
			}
			if s != first+uint64(i) {
				t.Fatalf("honest subscriber got seq %d, want %d", s, first+uint64(i))
			}
		case <-time.After(hang):
			t.Fatalf("honest subscriber received %d of %d batches", i, n)
		}
	}
	st := pub.Stats().PUB
	if st.Dropped == 0 {
		t.Errorf("no drops counted for the stalled subscriber: %+v", st)
	}
	var honestDrops uint64
	for _, p := range st.PeerStats {
		if p.Remote == honest.Conn.LocalAddr().String() {
			honestDrops = p.Dropped
		}
	}
	if honestDrops != 0 {
		t.Errorf("honest subscriber had %d drops", honestDrops)
	}
}

// rawReplay asks the replay ROUTER for batches from start and returns their
// sequence numbers.
func rawReplay(t *testing.T, pub *Publisher, start uint64) []uint64 {
	t.Helper()
	p, err := zmtptest.Dial(pub.ReplayEndpoint(), hang)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Handshake("DEALER", 0, nil, hang); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteMsg(nil, binary.BigEndian.AppendUint64(nil, start)); err != nil {
		t.Fatal(err)
	}
	_ = p.Conn.SetReadDeadline(time.Now().Add(hang))
	var seqs []uint64
	for {
		msg, err := p.ReadMsg()
		if err != nil {
			t.Fatalf("replay: %v after %d batches", err, len(seqs))
		}
		if len(msg) != 4 {
			t.Fatalf("replay reply of %d frames", len(msg))
		}
		s := binary.BigEndian.Uint64(msg[2])
		if s == EndSeq {
			return seqs
		}
		seqs = append(seqs, s)
	}
}

// TestStalledReplayClientDoesNotBlockOthers: a replay client that never
// reads must not block replays for other clients.
func TestStalledReplayClientDoesNotBlockOthers(t *testing.T) {
	const n = 300 // ~27 MB of replay: more than the socket buffers
	pub := startPublisher(t, Config{ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: n, SendQueue: 8})
	for i := range n {
		if err := pub.Publish(1, bigBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	stalled, err := zmtptest.Dial(pub.ReplayEndpoint(), hang)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if err := stalled.Handshake("DEALER", 0, nil, hang); err != nil {
		t.Fatal(err)
	}
	if err := stalled.WriteMsg(nil, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the server starts on the stalled client first
	done := make(chan []uint64, 1)
	go func() { done <- rawReplay(t, pub, 0) }()
	select {
	case got := <-done:
		if len(got) != n {
			t.Fatalf("replay for the second client: %d batches, want %d", len(got), n)
		}
	case <-time.After(hang):
		t.Fatal("replay server blocked behind a client that never reads")
	}
}

func TestCollector(t *testing.T) {
	pub := startPublisher(t, Config{ReplayEndpoint: "tcp://127.0.0.1:0"})
	hugeFrame(t, pub.Endpoint(), "SUB", 1<<40)
	waitFor(t, "oversize counted", func() bool { return pub.Stats().PUB.Oversize == 1 })
	reg := prometheus.NewRegistry()
	reg.MustRegister(pub.Collector(prometheus.Labels{"model_name": "m"}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() != "model_name" {
					key += "," + l.GetName() + "=" + l.GetValue()
				}
			}
			found[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"kvgate_kv_events_peers_closed_total,reason=oversize,socket=pub":    1,
		"kvgate_kv_events_peers_closed_total,reason=oversize,socket=replay": 0,
		"kvgate_kv_events_dropped_total":                                    0,
		"kvgate_kv_events_replays_total,result=served":                      0,
		"kvgate_kv_events_peers,socket=pub":                                 0,
	} {
		if got, ok := found[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
}
