package zmtp

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Interoperability with go-zeromq/zmq4, a ZMTP implementation we did not
// write (it announces ZMTP 3.0, so these also cover the 3.0 rules: our SUB
// subscribes with a 0x01 message, our PUB reads its 0x01 messages).
// Interop with libzmq 4.3 (pyzmq) was checked by hand once; see
// libzmq_test.go for what it showed.

func freeEndpoint(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return ep(l.Addr())
}

func zmq4Ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// zmq4Publish sends [topic, i] until sub has received want messages.
func zmq4PubToSub(t *testing.T, zpub zmq4.Socket, sub *Sub) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	done := make(chan [][]byte, 1)
	go func() {
		for {
			m, err := sub.Recv(ctx)
			if err != nil {
				close(done)
				return
			}
			if string(m[0]) == "kv@x" && string(m[1]) == "final" {
				done <- m
				return
			}
		}
	}()
	// Slow joiner: publish until the subscription has arrived, then the
	// final message once more.
	for {
		if err := zpub.Send(zmq4.NewMsgFrom([]byte("other"), []byte("dropped by the filter"))); err != nil {
			t.Fatal(err)
		}
		if err := zpub.Send(zmq4.NewMsgFrom([]byte("kv@x"), []byte("final"))); err != nil {
			t.Fatal(err)
		}
		select {
		case m, ok := <-done:
			if !ok {
				t.Fatal("no message from the zmq4 publisher")
			}
			if len(m) != 2 {
				t.Fatalf("frames %q", m)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestInteropZmq4PubToOurSub(t *testing.T) {
	t.Run("our SUB dials", func(t *testing.T) {
		e := freeEndpoint(t)
		zpub := zmq4.NewPub(zmq4Ctx(t))
		defer zpub.Close()
		if err := zpub.Listen(e); err != nil {
			t.Fatal(err)
		}
		sub := newSub(t, Options{})
		sub.Subscribe([]byte("kv@"))
		if err := sub.Dial(e); err != nil {
			t.Fatal(err)
		}
		zmq4PubToSub(t, zpub, sub)
	})
	t.Run("zmq4 PUB dials our bound SUB", func(t *testing.T) {
		sub := newSub(t, Options{})
		sub.Subscribe(nil)
		a, err := sub.Bind("tcp://127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		zpub := zmq4.NewPub(zmq4Ctx(t))
		defer zpub.Close()
		if err := zpub.Dial(ep(a)); err != nil {
			t.Fatal(err)
		}
		zmq4PubToSub(t, zpub, sub)
	})
}

func TestInteropOurPubToZmq4Sub(t *testing.T) {
	pub, pep := newPub(t, Options{})
	zsub := zmq4.NewSub(zmq4Ctx(t))
	defer zsub.Close()
	if err := zsub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	if err := zsub.Dial(pep); err != nil {
		t.Fatal(err)
	}
	eventually(t, "zmq4 subscription", func() bool {
		st := pub.Stats()
		return len(st.PeerStats) == 1 && st.PeerStats[0].Subscriptions == 1
	})
	payload := bytes.Repeat([]byte("p"), 300) // a long frame
	_ = pub.Send([]byte("other"), []byte("x"))
	for i := range 3 {
		_ = pub.Send([]byte("kv@x"), []byte{byte(i)}, payload)
	}
	got := make(chan zmq4.Msg, 3)
	go func() {
		for range 3 {
			m, err := zsub.Recv()
			if err != nil {
				return
			}
			got <- m
		}
	}()
	for i := range 3 {
		select {
		case m := <-got:
			f := m.Frames
			if len(f) != 3 || string(f[0]) != "kv@x" || f[1][0] != byte(i) || !bytes.Equal(f[2], payload) {
				t.Fatalf("zmq4 SUB got %q", f)
			}
		case <-time.After(hang):
			t.Fatal("zmq4 SUB received nothing")
		}
	}
}

func TestInteropZmq4DealerToOurRouter(t *testing.T) {
	r, rep := newRouter(t, Options{})
	zd := zmq4.NewDealer(zmq4Ctx(t), zmq4.WithID(zmq4.SocketIdentity("zd")))
	defer zd.Close()
	if err := zd.Dial(rep); err != nil {
		t.Fatal(err)
	}
	if err := zd.Send(zmq4.NewMsgFrom([]byte{}, []byte("request"))); err != nil {
		t.Fatal(err)
	}
	m := recvT(t, r)
	if len(m) != 3 || string(m[0]) != "zd" || len(m[1]) != 0 || string(m[2]) != "request" {
		t.Fatalf("router got %q", m)
	}
	for i := range 3 {
		if err := r.Send(context.Background(), m[0], nil, []byte(fmt.Sprint("reply ", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		rm, err := zd.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(rm.Frames) != 2 || string(rm.Frames[1]) != fmt.Sprint("reply ", i) {
			t.Fatalf("zmq4 DEALER got %q", rm.Frames)
		}
	}
}

func TestInteropOurDealerToZmq4Router(t *testing.T) {
	e := freeEndpoint(t)
	zr := zmq4.NewRouter(zmq4Ctx(t), zmq4.WithID(zmq4.SocketIdentity("router")))
	defer zr.Close()
	if err := zr.Listen(e); err != nil {
		t.Fatal(err)
	}
	d := newDealer(t, Options{Identity: []byte("ours")}, e)
	if err := d.Send(context.Background(), nil, []byte("request")); err != nil {
		t.Fatal(err)
	}
	zm, err := zr.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(zm.Frames) != 3 || string(zm.Frames[0]) != "ours" || string(zm.Frames[2]) != "request" {
		t.Fatalf("zmq4 ROUTER got %q", zm.Frames)
	}
	if err := zr.Send(zmq4.NewMsgFrom([]byte("ours"), []byte{}, []byte("reply"))); err != nil {
		t.Fatal(err)
	}
	if m := recvT(t, d); len(m) != 2 || string(m[1]) != "reply" {
		t.Fatalf("dealer got %q", m)
	}
}
