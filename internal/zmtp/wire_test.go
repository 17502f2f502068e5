package zmtp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
)

func frame(flags byte, body []byte) []byte {
	return append(zmtptest.FrameHeader(flags, uint64(len(body)), false), body...)
}

// FuzzReadMsg: any byte stream either yields messages within the limits or
// an error; the budget is given back exactly; nothing panics or allocates
// by announced size. Seeds run in the normal go test.
func FuzzReadMsg(f *testing.F) {
	f.Add(frame(0, []byte("one")))
	f.Add(append(frame(1, []byte("kv@a")), append(frame(1, make([]byte, 8)), frame(0, make([]byte, 300))...)...))
	f.Add(frame(4, command("PING", []byte{0, 20}, []byte("ctx"))))
	f.Add(append(zmtptest.FrameHeader(0, 1<<63-1, true), 1, 2, 3))
	f.Add(append(zmtptest.FrameHeader(2, 5, true), "hello"...))
	f.Add(append(frame(1, []byte("a")), frame(4, []byte("\x04PING"))...))
	f.Add(bytes.Repeat(frame(1, []byte{9}), 20))
	f.Add([]byte{0x02, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxMsg, maxFrames = 1000, 8
		b := newBudget(4 * maxMsg)
		r := msgReader{
			br: bufio.NewReader(bytes.NewReader(data)), maxMsg: maxMsg, maxFrames: maxFrames,
			budget: b, done: make(chan struct{}), wait: time.Millisecond,
		}
		for range 100 {
			frames, cmd, held, err := r.readMsg(nil)
			b.release(held)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrTooLarge) &&
					!errors.Is(err, ErrTooManyFrames) && !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrRecvBuffer) {
					t.Fatalf("unexpected error %v", err)
				}
				break
			}
			total := 0
			for _, f := range frames {
				total += len(f)
			}
			if cmd && (len(frames) != 1 || total > maxCommandSize) || !cmd && (len(frames) > maxFrames || total > maxMsg) {
				t.Fatalf("limits broken: cmd %v, %d frames, %d bytes", cmd, len(frames), total)
			}
		}
		if b.free != b.size {
			t.Fatalf("budget leaked: %d of %d free", b.free, b.size)
		}
	})
}

func TestParseProperties(t *testing.T) {
	good := append(property("Socket-Type", []byte("DEALER")), property("Identity", []byte("x"))...)
	var got []string
	if err := parseProperties(good, func(n string, v []byte) { got = append(got, n+"="+string(v)) }); err != nil || len(got) != 2 {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range [][]byte{{5, 'a'}, property("A", []byte("xy"))[:6], {1, 'A', 0xff, 0xff, 0xff, 0xff}} {
		if err := parseProperties(bad, func(string, []byte) {}); !errors.Is(err, ErrProtocol) {
			t.Errorf("% x: %v", bad, err)
		}
	}
	if _, _, err := parseCommand([]byte{9, 'P'}); !errors.Is(err, ErrProtocol) {
		t.Errorf("short command: %v", err)
	}
}

func TestReadGreeting(t *testing.T) {
	for _, tc := range []struct {
		mod   func(g []byte)
		minor byte
		ok    bool
	}{
		{func(g []byte) {}, 1, true},
		{func(g []byte) { g[11] = 0 }, 0, true},
		{func(g []byte) { g[10], g[11] = 4, 0 }, 1, true},    // newer major: 3.1 rules
		{func(g []byte) { g[8] = 1 }, 1, true},               // libzmq's non-zero padding
		{func(g []byte) { g[10] = 2 }, 0, false},             // ZMTP 2.0
		{func(g []byte) { g[9] = 0x7e }, 0, false},           // ZMTP 1.0 signature
		{func(g []byte) { copy(g[12:], "CURVE") }, 0, false}, // mechanism
	} {
		g := greeting()
		g[11] = 1
		tc.mod(g)
		minor, err := readGreeting(bytes.NewReader(g))
		if (err == nil) != tc.ok || tc.ok && minor != tc.minor {
			t.Errorf("greeting % x: minor %d, %v", g[:16], minor, err)
		}
	}
}
