package zmtp

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// BenchmarkPubSub measures PUB→SUB throughput on loopback, ours against
// go-zeromq/zmq4 in the same run: messages [topic, seq, payload] as the
// engine publishes them. The sender keeps at most `window` messages in
// flight, so neither side drops (our PUB would drop past its queue; zmq4's
// blocks) and both are measured delivering everything.
func BenchmarkPubSub(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("ours/%dKiB", size>>10), func(b *testing.B) { benchOurs(b, size) })
		b.Run(fmt.Sprintf("zmq4/%dKiB", size>>10), func(b *testing.B) { benchZmq4(b, size) })
	}
}

const window = 256

// pubSubLoop sends b.N messages through send while a goroutine receives
// them with recv; it waits for the first message to arrive before timing.
func pubSubLoop(b *testing.B, size int, send func(frames ...[]byte) error, recv func() ([][]byte, error)) {
	topic, payload := []byte("kv@127.0.0.1:8000@model"), make([]byte, size)
	var got atomic.Int64
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := recv()
			if err != nil {
				errc <- err
				return
			}
			if len(m) != 3 || len(m[2]) != size {
				errc <- fmt.Errorf("bad message: %d frames", len(m))
				return
			}
			if binary.BigEndian.Uint64(m[1]) == ^uint64(0) {
				errc <- nil
				return
			}
			got.Add(1)
		}
	}()
	seq := make([]byte, 8)
	// Slow joiner: probe until one message arrives.
	for got.Load() == 0 {
		_ = send(topic, seq, payload)
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	base := got.Load()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := range b.N {
		for int64(i)-(got.Load()-base) >= window {
			time.Sleep(10 * time.Microsecond)
		}
		s := make([]byte, 8)
		binary.BigEndian.PutUint64(s, uint64(i))
		if err := send(topic, s, payload); err != nil {
			b.Fatal(err)
		}
	}
	for got.Load()-base < int64(b.N) {
		time.Sleep(10 * time.Microsecond)
	}
	b.StopTimer()
	end := make([]byte, 8)
	binary.BigEndian.PutUint64(end, ^uint64(0))
	_ = send(topic, end, payload)
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

func benchOurs(b *testing.B, size int) {
	pub, err := NewPub(Options{Logger: quiet(), SendQueue: 2 * window})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	a, err := pub.Bind("tcp://127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	sub, err := NewSub(Options{Logger: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	sub.Subscribe(nil)
	if err := sub.Dial(ep(a)); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	pubSubLoop(b, size, pub.Send, func() ([][]byte, error) { return sub.Recv(ctx) })
	if d := pub.Stats().Dropped; d != 0 {
		b.Fatalf("%d dropped", d)
	}
}

func benchZmq4(b *testing.B, size int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := freeEndpoint(b)
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen(e); err != nil {
		b.Fatal(err)
	}
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		b.Fatal(err)
	}
	if err := sub.Dial(e); err != nil {
		b.Fatal(err)
	}
	pubSubLoop(b, size,
		func(frames ...[]byte) error { return pub.SendMulti(zmq4.NewMsgFrom(frames...)) },
		func() ([][]byte, error) {
			m, err := sub.Recv()
			return m.Frames, err
		})
}
