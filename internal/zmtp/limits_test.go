package zmtp

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
)

// boundSockets starts one bound socket of each type that accepts peers,
// with o, and returns its endpoint, the socket type a peer must announce,
// and its Stats.
type boundSocket struct {
	name, peerType string
	ep             string
	stats          func() Stats
}

func boundSockets(t *testing.T, o Options) []boundSocket {
	t.Helper()
	pub, pep := newPub(t, o)
	sub := newSub(t, o)
	sub.Subscribe(nil)
	a, err := sub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, rep := newRouter(t, o)
	return []boundSocket{
		{"PUB", "SUB", pep, pub.Stats},
		{"SUB", "PUB", ep(a), sub.Stats},
		{"ROUTER", "DEALER", rep, r.Stats},
	}
}

func handshaken(t *testing.T, endpoint, peerType string, minor byte) *zmtptest.Peer {
	t.Helper()
	p, err := zmtptest.Dial(endpoint, hang)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Handshake(peerType, minor, nil, hang); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOversizeRejected: a frame header (or the sum of a message's frames)
// announcing more than MaxMsgSize closes the connection before any body is
// read and allocates nothing near the announced size; exactly MaxMsgSize
// is accepted.
func TestOversizeRejected(t *testing.T) {
	noLeak(t)
	const limit = 1 << 20
	socks := boundSockets(t, Options{MaxMsgSize: limit})
	cases := []struct {
		name  string
		write func(p *zmtptest.Peer) error
	}{
		{"2^63-1", func(p *zmtptest.Peer) error { return p.Write(zmtptest.FrameHeader(0, 1<<63-1, true)) }},
		{"2^64-1", func(p *zmtptest.Peer) error { return p.Write(zmtptest.FrameHeader(0, 1<<64-1, true)) }},
		{"1 GiB", func(p *zmtptest.Peer) error { return p.Write(zmtptest.FrameHeader(0, 1<<30, true)) }},
		{"limit+1", func(p *zmtptest.Peer) error { return p.Write(zmtptest.FrameHeader(0, limit+1, true)) }},
		{"frames summing to limit+1", func(p *zmtptest.Peer) error {
			b := append(zmtptest.FrameHeader(1, limit/2, true), make([]byte, limit/2)...)
			return p.Write(append(b, zmtptest.FrameHeader(0, limit/2+1, true)...))
		}},
		{"command over 64 KiB", func(p *zmtptest.Peer) error { return p.Write(zmtptest.FrameHeader(4, 64<<10+1, true)) }},
	}
	for _, s := range socks {
		for i, tc := range cases {
			t.Run(s.name+"/"+tc.name, func(t *testing.T) {
				p := handshaken(t, s.ep, s.peerType, 0)
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				if err := tc.write(p); err != nil {
					t.Fatal(err)
				}
				_ = p.Write(make([]byte, 1000))
				if !p.WaitClosed(hang) {
					t.Fatal("connection not closed")
				}
				runtime.ReadMemStats(&after)
				if d := after.TotalAlloc - before.TotalAlloc; d > 8<<20 {
					t.Errorf("allocated %d MiB", d>>20)
				}
				eventually(t, "oversize counted", func() bool { return s.stats().Oversize == uint64(i+1) })
			})
		}
	}
	t.Run("exactly the limit", func(t *testing.T) {
		sub := newSub(t, Options{MaxMsgSize: limit})
		sub.Subscribe(nil)
		a, _ := sub.Bind("tcp://127.0.0.1:0")
		p := handshaken(t, ep(a), "PUB", 0)
		body := bytes.Repeat([]byte{3}, limit-10)
		if err := p.WriteMsg([]byte("0123456789"), body); err != nil {
			t.Fatal(err)
		}
		if m := recvT(t, sub); len(m) != 2 || !bytes.Equal(m[1], body) {
			t.Fatal("message of exactly MaxMsgSize not received")
		}
	})
}

func TestTooManyFrames(t *testing.T) {
	socks := boundSockets(t, Options{MaxFrames: 4})
	for _, s := range socks {
		t.Run(s.name, func(t *testing.T) {
			p := handshaken(t, s.ep, s.peerType, 1)
			frames := make([][]byte, 5)
			for i := range frames {
				frames[i] = []byte{1}
			}
			_ = p.WriteMsg(frames...)
			if !p.WaitClosed(hang) {
				t.Fatal("5 frames with a limit of 4: connection not closed")
			}
			eventually(t, "counted", func() bool { return s.stats().Oversize == 1 })
		})
	}
}

// TestHandshakeRejections: silence, old protocol versions, other
// mechanisms and incompatible socket types end the connection (the last
// with an ERROR command) and are counted.
func TestHandshakeRejections(t *testing.T) {
	noLeak(t)
	pub, pep := newPub(t, Options{HandshakeTimeout: 200 * time.Millisecond})
	greet := func(mod func(g []byte)) func(p *zmtptest.Peer) {
		return func(p *zmtptest.Peer) {
			g := zmtptest.Greeting(1)
			mod(g)
			_ = p.Write(g)
		}
	}
	cases := []struct {
		name string
		do   func(p *zmtptest.Peer)
	}{
		{"silence", func(*zmtptest.Peer) {}},
		{"half a greeting", func(p *zmtptest.Peer) { _ = p.Write(zmtptest.Greeting(1)[:20]) }},
		{"ZMTP 2.0", greet(func(g []byte) { g[10] = 2 })},
		{"ZMTP 1.0 signature", greet(func(g []byte) { g[0] = 0x05 })},
		{"PLAIN mechanism", greet(func(g []byte) { copy(g[12:], "PLAIN") })},
		{"message instead of READY", func(p *zmtptest.Peer) {
			_ = p.Write(zmtptest.Greeting(1))
			_ = p.WriteMsg([]byte("hello"))
		}},
		{"READY property past its end", func(p *zmtptest.Peer) {
			_ = p.Write(zmtptest.Greeting(1))
			_ = p.WriteCommand("READY", append(zmtptest.Property("Socket-Type", []byte("SUB"))[:16], 0, 0, 0, 200))
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := zmtptest.Dial(pep, hang)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			tc.do(p)
			if !p.WaitClosed(hang) {
				t.Fatal("not closed")
			}
			eventually(t, "counted", func() bool { return pub.Stats().HandshakeFailures == uint64(i+1) })
		})
	}
	t.Run("incompatible socket type", func(t *testing.T) {
		p, err := zmtptest.Dial(pep, hang)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		// Our READY went out before the peer's was read; an ERROR follows.
		if err := p.Handshake("PUB", 1, nil, hang); err != nil {
			t.Fatal(err)
		}
		name, data, err := p.ReadCommand()
		if err != nil || name != "ERROR" || !strings.Contains(string(data), "cannot talk") {
			t.Fatalf("PUB to a PUB: %s %q %v", name, data, err)
		}
		if !p.WaitClosed(hang) {
			t.Fatal("not closed")
		}
	})
	if st := pub.Stats(); st.Peers != 0 || st.Connects != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestMaxPeers(t *testing.T) {
	noLeak(t)
	pub, pep := newPub(t, Options{MaxPeers: 2})
	a := handshaken(t, pep, "SUB", 1)
	handshaken(t, pep, "SUB", 1)
	waitPeers(t, pub.Stats, 2)
	third, err := zmtptest.Dial(pep, hang)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if !third.WaitClosed(hang) {
		t.Fatal("third peer not refused")
	}
	if st := pub.Stats(); st.Refused != 1 || st.Peers != 2 {
		t.Fatalf("stats %+v", st)
	}
	a.Close()
	waitPeers(t, pub.Stats, 1)
	handshaken(t, pep, "SUB", 1) // room again
	waitPeers(t, pub.Stats, 2)
}

// TestStalledPeer: a subscriber that never reads loses messages (counted
// for it) and is disconnected after WriteTimeout; another subscriber gets
// every message, and Send never blocks.
func TestStalledPeer(t *testing.T) {
	noLeak(t)
	pub, pep := newPub(t, Options{SendQueue: 4, WriteTimeout: 300 * time.Millisecond})
	stalled := handshaken(t, pep, "SUB", 0)
	_ = stalled.WriteMsg([]byte{1})
	honest := newSub(t, Options{})
	honest.Subscribe(nil)
	if err := honest.Dial(pep); err != nil {
		t.Fatal(err)
	}
	eventually(t, "subscriptions", func() bool {
		st := pub.Stats()
		return len(st.PeerStats) == 2 && st.PeerStats[0].Subscriptions == 1 && st.PeerStats[1].Subscriptions == 1
	})
	payload := make([]byte, 64<<10)
	const n = 300 // ~19 MB: more than the stalled peer's socket buffers
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), hang)
		defer cancel()
		for i := range n {
			m, err := honest.Recv(ctx)
			if err != nil {
				done <- err
				return
			}
			if m[0][0] != byte(i) {
				done <- fmt.Errorf("message %d: got %d", i, m[0][0])
				return
			}
		}
		done <- nil
	}()
	for i := range n {
		_ = pub.Send([]byte{byte(i)}, payload)
		// Pace for the honest peer (queue of 4): it is not under test.
		eventually(t, "honest peer keeps up", func() bool {
			for _, ps := range pub.Stats().PeerStats {
				if ps.Remote != stalled.Conn.LocalAddr().String() && ps.Queued > 2 {
					return false
				}
			}
			return true
		})
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := pub.Stats()
	if st.Dropped == 0 {
		t.Errorf("no drops: %+v", st)
	}
	for _, ps := range st.PeerStats {
		if ps.Remote != stalled.Conn.LocalAddr().String() && ps.Dropped != 0 {
			t.Errorf("honest peer dropped %d", ps.Dropped)
		}
	}
	eventually(t, "stalled peer disconnected", func() bool { return pub.Stats().WriteTimeouts == 1 })
}

// TestReadTimeout: a message left half-sent ends the connection after
// ReadTimeout; an idle peer is kept.
func TestReadTimeout(t *testing.T) {
	sub := newSub(t, Options{ReadTimeout: 200 * time.Millisecond})
	sub.Subscribe(nil)
	a, _ := sub.Bind("tcp://127.0.0.1:0")
	idle := handshaken(t, ep(a), "PUB", 1)
	half := handshaken(t, ep(a), "PUB", 1)
	_ = half.Write(append(zmtptest.FrameHeader(0, 100, false), make([]byte, 50)...))
	if !half.WaitClosed(hang) {
		t.Fatal("half-sent message kept")
	}
	eventually(t, "read timeout counted", func() bool {
		st := sub.Stats()
		return st.ReadTimeouts == 1 && st.Peers == 1
	})
	time.Sleep(400 * time.Millisecond)
	_ = idle.WriteMsg([]byte("still"), []byte("here"))
	if m := recvT(t, sub); string(m[0]) != "still" {
		t.Fatalf("idle peer: %q", m)
	}
}

// TestRecvBuffer: while Recv lags, readers wait for buffer room instead of
// reading more (backpressure, no disconnect); messages held half-read by
// peers that never finish cannot wedge the socket: they are disconnected.
func TestRecvBuffer(t *testing.T) {
	noLeak(t)
	const limit = 64 << 10
	o := Options{MaxMsgSize: limit, ReadTimeout: 300 * time.Millisecond}
	sub := newSub(t, o)
	sub.Subscribe(nil)
	a, _ := sub.Bind("tcp://127.0.0.1:0")
	size := sub.s.o.RecvBuffer
	p := handshaken(t, ep(a), "PUB", 1)
	n := int(3*size/limit) + 1 // three times the buffer
	go func() {
		for i := range n {
			if p.WriteMsg([]byte{byte(i)}, make([]byte, limit-1)) != nil {
				return
			}
		}
	}()
	// Recv lags for longer than ReadTimeout: nothing is lost.
	time.Sleep(time.Second)
	for i := range n {
		if m := recvT(t, sub); m[0][0] != byte(i) {
			t.Fatalf("message %d: got %d", i, m[0][0])
		}
	}
	if st := sub.Stats(); st.RecvBufferFull != 0 || st.Connects != 1 {
		t.Fatalf("backpressure disconnected: %+v", st)
	}

	// Peers holding half-read messages that fill the buffer are dropped.
	var peers []*zmtptest.Peer
	for range int(size/limit) + 2 {
		q := handshaken(t, ep(a), "PUB", 1)
		_ = q.Write(append(zmtptest.FrameHeader(1, limit-1, true), make([]byte, limit-1)...))
		_ = q.Write(zmtptest.FrameHeader(0, 1, false)) // and never the last byte
		peers = append(peers, q)
	}
	eventually(t, "half-read messages dropped", func() bool {
		st := sub.Stats()
		return st.ReadTimeouts+st.RecvBufferFull == uint64(len(peers))
	})
	// Room again.
	_ = p.WriteMsg([]byte("after"), []byte("x"))
	if m := recvT(t, sub); string(m[0]) != "after" {
		t.Fatalf("after: %q", m)
	}
}

// TestAnnouncedFramesHoldNoBudget: peers that announce frames just under
// the limits, together the whole receive budget, and then send one byte
// hold budget only for the frame header, not for the size announced. On each bound socket an honest
// peer then completes its handshake and is heard while they are still
// connected (the read timeout, an hour here, has not cut them). Before,
// the budget was taken by announced size, so four such peers held the
// receive path of a socket until the read timeout.
func TestAnnouncedFramesHoldNoBudget(t *testing.T) {
	noLeak(t)
	const limit = 64 << 10
	o := Options{MaxMsgSize: limit, ReadTimeout: time.Hour}
	sub := newSub(t, o)
	sub.Subscribe(nil)
	a, err := sub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pub, pep := newPub(t, o)
	r, rep := newRouter(t, o)
	size := sub.s.o.RecvBuffer
	for _, tc := range []struct {
		name, ep, peerType string
		free               func() int64
		honest             func(t *testing.T)
	}{
		{"SUB", ep(a), "PUB", func() int64 { return freeOf(sub.s.budget) }, func(t *testing.T) {
			p := handshaken(t, ep(a), "PUB", 1)
			_ = p.WriteMsg([]byte("honest"), []byte("message"))
			if m := recvT(t, sub); string(m[0]) != "honest" {
				t.Fatalf("got %q", m)
			}
		}},
		{"PUB", pep, "SUB", func() int64 { return freeOf(pub.s.budget) }, func(t *testing.T) {
			p := handshaken(t, pep, "SUB", 0)
			_ = p.WriteMsg([]byte{1})
			remote := p.Conn.LocalAddr().String()
			eventually(t, "honest subscription", func() bool {
				for _, ps := range pub.Stats().PeerStats {
					if ps.Remote == remote && ps.Subscriptions == 1 {
						return true
					}
				}
				return false
			})
		}},
		{"ROUTER", rep, "DEALER", func() int64 { return freeOf(r.s.budget) }, func(t *testing.T) {
			p := handshaken(t, rep, "DEALER", 1)
			_ = p.WriteMsg(nil, []byte("request"))
			if m := recvT(t, r); string(m[len(m)-1]) != "request" {
				t.Fatalf("got %q", m)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var holders []*zmtptest.Peer
			for left := size; left > frameOverhead; {
				n := min(limit, left-frameOverhead)
				q := handshaken(t, tc.ep, tc.peerType, 1)
				_ = q.Write(append(zmtptest.FrameHeader(0, uint64(n), true), 'x'))
				holders = append(holders, q)
				left -= n + frameOverhead
			}
			// Each holds a frame's overhead; the byte it sent waits in its
			// connection's read buffer for the rest of the frame.
			want := size - int64(len(holders))*frameOverhead
			eventually(t, "the holders' frames started", func() bool { return tc.free() <= want })
			tc.honest(t)
			eventually(t, "the honest peer's budget back", func() bool { return tc.free() == want })
			for _, q := range holders {
				if q.WaitClosed(50 * time.Millisecond) {
					t.Fatal("a holder was disconnected")
				}
			}
		})
	}
}

func freeOf(b *budget) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.free
}

func TestTooManySubscriptions(t *testing.T) {
	pub, pep := newPub(t, Options{MaxSubscriptions: 3})
	p := handshaken(t, pep, "SUB", 1)
	for i := range 4 {
		_ = p.WriteCommand("SUBSCRIBE", []byte{byte(i)})
	}
	if !p.WaitClosed(hang) {
		t.Fatal("fourth subscription accepted")
	}
	eventually(t, "counted", func() bool { return pub.Stats().ProtocolErrors == 1 })
}

// TestSubscriptionToVersion: our SUB subscribes with the form the peer's
// announced version expects.
func TestSubscriptionToVersion(t *testing.T) {
	for _, minor := range []byte{0, 1} {
		t.Run(fmt.Sprintf("3.%d", minor), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			sub := newSub(t, Options{})
			sub.Subscribe([]byte("kv@"))
			if err := sub.Dial(ep(ln.Addr())); err != nil {
				t.Fatal(err)
			}
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			p := zmtptest.NewPeer(c)
			defer p.Close()
			if err := p.Handshake("PUB", minor, nil, hang); err != nil {
				t.Fatal(err)
			}
			if minor == 1 {
				name, data, err := p.ReadCommand()
				if err != nil || name != "SUBSCRIBE" || string(data) != "kv@" {
					t.Fatalf("got %s %q %v", name, data, err)
				}
				sub.Unsubscribe([]byte("kv@"))
				if name, data, err = p.ReadCommand(); err != nil || name != "CANCEL" || string(data) != "kv@" {
					t.Fatalf("got %s %q %v", name, data, err)
				}
				return
			}
			if m, err := p.ReadMsg(); err != nil || len(m) != 1 || string(m[0]) != "\x01kv@" {
				t.Fatalf("got %q %v", m, err)
			}
			sub.Unsubscribe([]byte("kv@"))
			if m, err := p.ReadMsg(); err != nil || len(m) != 1 || string(m[0]) != "\x00kv@" {
				t.Fatalf("got %q %v", m, err)
			}
		})
	}
}

// TestCloseWithPeers: closing sockets with connected peers, blocked
// readers and writers, and dial loops leaves no goroutine behind.
func TestCloseWithPeers(t *testing.T) {
	before := runtime.NumGoroutine()
	pub, err := NewPub(opts(Options{SendQueue: 2}))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := pub.Bind("tcp://127.0.0.1:0")
	r, _ := NewRouter(opts(Options{}))
	ra, _ := r.Bind("tcp://127.0.0.1:0")
	var subs []*Sub
	for range 3 {
		s, _ := NewSub(opts(Options{RecvQueue: 1}))
		s.Subscribe(nil)
		_ = s.Dial(ep(a))
		subs = append(subs, s)
	}
	d, _ := NewDealer(opts(Options{}))
	_ = d.Dial(ep(ra))
	stalled, err := zmtptest.Dial(ep(a), hang)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	_ = stalled.Handshake("SUB", 1, nil, hang)
	_ = stalled.WriteCommand("SUBSCRIBE", nil)
	eventually(t, "peers", func() bool { return pub.Stats().Peers == 4 && r.Stats().Peers == 1 })
	big := make([]byte, 1<<20)
	for range 20 {
		_ = pub.Send([]byte("t"), big) // queues full, writers blocked on the stalled peer
	}
	var wg sync.WaitGroup
	for _, c := range []func() error{pub.Close, r.Close, d.Close, subs[0].Close, subs[1].Close, subs[2].Close} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = c() }()
	}
	wg.Wait()
	eventually(t, "goroutines gone", func() bool { return runtime.NumGoroutine() <= before })
	if err := pub.Send([]byte("t")); err != ErrClosed {
		t.Errorf("Send after Close: %v", err)
	}
}
