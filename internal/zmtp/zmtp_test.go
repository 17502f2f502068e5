package zmtp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
)

const hang = 20 * time.Second // hang guard only, never a speed assertion

func quiet() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func opts(o Options) Options {
	o.Logger = quiet()
	return o
}

func ep(a fmt.Stringer) string { return "tcp://" + a.String() }

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	zmtptest.Eventually(t, hang, what, f)
}

func recvT(t *testing.T, r interface {
	Recv(context.Context) ([][]byte, error)
}) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	m, err := r.Recv(ctx)
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return m
}

// noLeak checks that the goroutines a test started are gone by its end.
func noLeak(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(hang)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func newPub(t *testing.T, o Options) (*Pub, string) {
	t.Helper()
	p, err := NewPub(opts(o))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	a, err := p.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return p, ep(a)
}

func newSub(t *testing.T, o Options) *Sub {
	t.Helper()
	s, err := NewSub(opts(o))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newRouter(t *testing.T, o Options) (*Router, string) {
	t.Helper()
	r, err := NewRouter(opts(o))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	a, err := r.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return r, ep(a)
}

func newDealer(t *testing.T, o Options, endpoint string) *Dealer {
	t.Helper()
	d, err := NewDealer(opts(o))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	return d
}

// waitPeers waits until a socket has n established peers.
func waitPeers(t *testing.T, stats func() Stats, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d peers", n), func() bool { return stats().Peers == n })
}

// subscribed publishes probes until sub receives one (the subscription has
// reached the publisher), then drains the probes.
func subscribed(t *testing.T, pub *Pub, sub *Sub, topic []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	got := make(chan struct{})
	go func() {
		defer close(got)
		for {
			m, err := sub.Recv(ctx)
			if err != nil || string(m[len(m)-1]) == "last-probe" {
				return
			}
		}
	}()
	for {
		_ = pub.Send(topic, []byte("probe"))
		select {
		case <-got:
			return
		case <-time.After(10 * time.Millisecond):
		}
		if ctx.Err() != nil {
			t.Fatal("subscription never arrived")
		}
		if pub.Stats().Sent > 0 {
			_ = pub.Send(topic, []byte("last-probe"))
			<-got
			return
		}
	}
}

func TestPubSubDialAndBind(t *testing.T) {
	noLeak(t)
	pub, pep := newPub(t, Options{})
	sub := newSub(t, Options{})
	sub.Subscribe([]byte("kv@"))
	if err := sub.Dial(pep); err != nil {
		t.Fatal(err)
	}
	subscribed(t, pub, sub, []byte("kv@a"))
	_ = pub.Send([]byte("other"), []byte("filtered out by the publisher"))
	big := bytes.Repeat([]byte{7}, 3<<20) // frames grow as their bytes arrive
	for i := range 3 {
		_ = pub.Send([]byte("kv@a"), []byte{byte(i)}, big[:len(big)-i])
	}
	for i := range 3 {
		m := recvT(t, sub)
		if len(m) != 3 || string(m[0]) != "kv@a" || m[1][0] != byte(i) || !bytes.Equal(m[2], big[:len(big)-i]) {
			t.Fatalf("message %d: %d frames", i, len(m))
		}
	}

	// Bound SUB, dialed by a raw publisher.
	bsub := newSub(t, Options{})
	bsub.Subscribe([]byte("kv@"))
	a, err := bsub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := zmtptest.Dial(ep(a), hang)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Handshake("PUB", 1, nil, hang); err != nil {
		t.Fatal(err)
	}
	// A 3.1 peer gets a SUBSCRIBE command.
	name, data, err := p.ReadCommand()
	if err != nil || name != "SUBSCRIBE" || string(data) != "kv@" {
		t.Fatalf("subscription to a 3.1 peer: %q %q %v", name, data, err)
	}
	// The SUB filters too: a publisher may send everything.
	_ = p.WriteMsg([]byte("nope"), []byte("x"))
	_ = p.WriteMsg([]byte("kv@b"), []byte("y"))
	if m := recvT(t, bsub); string(m[0]) != "kv@b" || string(m[1]) != "y" {
		t.Fatalf("bound SUB got %q", m)
	}
}

// TestSubscriptionForms: a Pub accepts subscriptions as 3.0 messages and as
// 3.1 commands from a peer announcing either version, and cancels both.
func TestSubscriptionForms(t *testing.T) {
	pub, pep := newPub(t, Options{})
	type form struct {
		minor   byte
		command bool
	}
	for _, f := range []form{{0, false}, {1, true}, {1, false}, {0, true}} {
		t.Run(fmt.Sprintf("3.%d/command=%v", f.minor, f.command), func(t *testing.T) {
			p, err := zmtptest.Dial(pep, hang)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if err := p.Handshake("SUB", f.minor, nil, hang); err != nil {
				t.Fatal(err)
			}
			sub := func(on bool, prefix string) {
				switch {
				case f.command && on:
					err = p.WriteCommand("SUBSCRIBE", []byte(prefix))
				case f.command:
					err = p.WriteCommand("CANCEL", []byte(prefix))
				case on:
					err = p.WriteMsg(append([]byte{1}, prefix...))
				default:
					err = p.WriteMsg(append([]byte{0}, prefix...))
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			sub(true, "a")
			sub(true, "b")
			eventually(t, "two subscriptions", func() bool {
				st := pub.Stats()
				for _, ps := range st.PeerStats {
					if ps.Remote == p.Conn.LocalAddr().String() {
						return ps.Subscriptions == 2
					}
				}
				return false
			})
			sub(false, "a")
			eventually(t, "cancel", func() bool {
				for _, ps := range pub.Stats().PeerStats {
					if ps.Remote == p.Conn.LocalAddr().String() {
						return ps.Subscriptions == 1
					}
				}
				return false
			})
			for _, topic := range []string{"a1", "b1", "c1", "b2"} {
				_ = pub.Send([]byte(topic), []byte("x"))
			}
			for _, want := range []string{"b1", "b2"} {
				_ = p.Conn.SetReadDeadline(time.Now().Add(hang))
				m, err := p.ReadMsg()
				if err != nil || string(m[0]) != want {
					t.Fatalf("got %q %v, want %s", m, err, want)
				}
			}
		})
	}
}

func TestRouterDealer(t *testing.T) {
	noLeak(t)
	r, rep := newRouter(t, Options{})
	d1 := newDealer(t, Options{Identity: []byte("one")}, rep)
	d2 := newDealer(t, Options{}, rep)
	ctx := context.Background()
	for i, d := range []*Dealer{d1, d2} {
		if err := d.Send(ctx, nil, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[byte][]byte{}
	for range 2 {
		m := recvT(t, r)
		if len(m) != 3 || len(m[1]) != 0 {
			t.Fatalf("router got %q", m)
		}
		ids[m[2][0]] = m[0]
	}
	if string(ids[0]) != "one" || len(ids[1]) != 5 || ids[1][0] != 0 {
		t.Fatalf("routing ids %q", ids)
	}
	for i, d := range []*Dealer{d1, d2} {
		if err := r.Send(ctx, ids[byte(i)], nil, []byte(fmt.Sprint("to ", i))); err != nil {
			t.Fatal(err)
		}
		if m := recvT(t, d); len(m) != 2 || string(m[1]) != fmt.Sprint("to ", i) {
			t.Fatalf("dealer %d got %q", i, m)
		}
	}
	if err := r.Send(ctx, []byte("nobody"), []byte("x")); err != ErrNoPeer {
		t.Errorf("send to an unknown id: %v", err)
	}
	// A second connection claiming the same identity gets a generated id.
	d3 := newDealer(t, Options{Identity: []byte("one")}, rep)
	_ = d3.Send(ctx, []byte("dup"))
	if m := recvT(t, r); string(m[0]) == "one" || string(m[1]) != "dup" {
		t.Fatalf("duplicate identity: %q", m)
	}
}

func TestDealerReconnects(t *testing.T) {
	noLeak(t)
	r, rep := newRouter(t, Options{})
	d := newDealer(t, Options{ReconnectInterval: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond}, rep)
	ctx := context.Background()
	_ = d.Send(ctx, []byte("1"))
	recvT(t, r)
	r.Close()
	// A new router on the same port: the dealer comes back by itself.
	var r2 *Router
	eventually(t, "rebind", func() bool {
		var err error
		r2, err = NewRouter(opts(Options{}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err = r2.Bind(rep); err != nil {
			r2.Close()
			return false
		}
		return true
	})
	defer r2.Close()
	waitPeers(t, r2.Stats, 1)
	_ = d.Send(ctx, []byte("2"))
	if m := recvT(t, r2); string(m[1]) != "2" {
		t.Fatalf("after reconnect: %q", m)
	}
	if st := d.Stats(); st.Connects != 2 {
		t.Errorf("dealer connects %d", st.Connects)
	}
}

func TestCloseUnblocks(t *testing.T) {
	noLeak(t)
	sub := newSub(t, Options{})
	if err := sub.Dial("tcp://127.0.0.1:1"); err != nil { // nothing there: retries
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := sub.Recv(context.Background())
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	sub.Close()
	select {
	case err := <-errc:
		if err != ErrClosed {
			t.Errorf("Recv after Close: %v", err)
		}
	case <-time.After(hang):
		t.Fatal("Recv not unblocked by Close")
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := newDealer(t, Options{SendQueue: 1}, "tcp://127.0.0.1:1")
	_ = d.Send(ctx, []byte("fills the queue"))
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if err := d.Send(ctx, []byte("waits")); err != context.Canceled {
		t.Errorf("Send with cancelled context: %v", err)
	}
}

func TestEndpoints(t *testing.T) {
	for _, tc := range []struct {
		ep   string
		bind bool
		want string
	}{
		{"tcp://*:5557", true, ":5557"},
		{"tcp://127.0.0.1:0", true, "127.0.0.1:0"},
		{"tcp://[::1]:5", false, "[::1]:5"},
		{"tcp://*:5557", false, ""},
		{"tcp://:5557", false, ""},
		{"ipc:///tmp/x", true, ""},
		{"tcp://host", false, ""},
		{"5557", true, ""},
	} {
		got, err := parseEndpoint(tc.ep, tc.bind)
		if (err != nil) != (tc.want == "") || got != tc.want {
			t.Errorf("parseEndpoint(%q, %v) = %q, %v", tc.ep, tc.bind, got, err)
		}
	}
}

func TestOptionsRange(t *testing.T) {
	for _, o := range []Options{
		{MaxMsgSize: -1}, {MaxMsgSize: MaxMsgSizeLimit + 1}, {MaxFrames: -1}, {MaxPeers: -2},
		{SendQueue: 1 << 21}, {HandshakeTimeout: -time.Second}, {Identity: make([]byte, 256)},
	} {
		if _, err := NewPub(o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
	o, err := Options{MaxMsgSize: 1 << 10}.withDefaults()
	if err != nil || o.RecvBuffer < 2*(1<<10+maxCommandSize) || o.MaxFrames != DefaultMaxFrames {
		t.Errorf("defaults: %+v %v", o, err)
	}
}
