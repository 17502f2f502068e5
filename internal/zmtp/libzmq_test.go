package zmtp

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
)

// What a one-off check against real libzmq 4.3.4 (Debian's python3-zmq
// 24.0.1, the library vLLM's pyzmq wraps) showed, kept as tests that need
// no libzmq. The byte strings are what libzmq sent to a hand-written peer
// that had sent its greeting and READY first:
//
//   - libzmq announces ZMTP 3.1, and its signature padding is not all zero
//     (it carries a ZMTP 1.0 length: 0x...01 for SUB, 0x...04 for DEALER),
//     so the padding must be ignored;
//   - its SUB subscribes to a 3.1 peer with a SUBSCRIBE command and to a 3.0
//     peer with a 0x01-prefixed message;
//   - with ZMQ_HEARTBEAT_IVL set it sends PING commands (TTL, empty
//     context) and drops a peer that does not answer PONG within
//     ZMQ_HEARTBEAT_TIMEOUT: our PUB answered and the connection stayed up;
//   - its DEALER's READY carries Socket-Type and Identity; its SUB's only
//     Socket-Type.
//
// Also checked by hand, with libzmq on the other side: libzmq PUB → our
// SUB (dial and bind), our PUB → libzmq SUB (70 000-byte frames), libzmq
// DEALER → our ROUTER and our DEALER → libzmq ROUTER with replay-shaped
// messages; a 20 MiB libzmq message to our SUB (16 MiB limit) closed that
// connection, libzmq reconnected and later messages flowed; a libzmq SUB
// with ZMQ_MAXMSGSIZE below our frame closes the connection and does not
// reconnect.
var libzmqCaptures = map[string]string{
	// libzmq SUB with heartbeats, after our 3.1 greeting: greeting, READY,
	// SUBSCRIBE "kv@", PING ttl=20.
	"sub-3.1": "ff00000000000000017f03014e554c4c00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000004190552454144590b536f636b65742d5479706500000003535542040d095355425343524942456b764004070450494e470014",
	// libzmq SUB after a 3.0 greeting: greeting, READY, message 0x01 "kv@".
	"sub-3.0": "ff00000000000000017f03014e554c4c00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000004190552454144590b536f636b65742d54797065000000035355420004016b7640",
	// libzmq DEALER with identity "pyd": greeting, READY, ["", 5 as 8 bytes].
	"dealer": "ff00000000000000047f03014e554c4c000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000042c0552454144590b536f636b65742d54797065000000064445414c4552084964656e7469747900000003707964010000080000000000000005",
}

// replayCapture connects to endpoint and sends the recorded libzmq bytes,
// then reads our greeting and READY.
func replayCapture(t *testing.T, endpoint, name string) *zmtptest.Peer {
	t.Helper()
	b, err := hex.DecodeString(libzmqCaptures[name])
	if err != nil {
		t.Fatal(err)
	}
	p, err := zmtptest.Dial(endpoint, hang)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	_ = p.Conn.SetDeadline(time.Now().Add(hang))
	if err := p.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := p.ReadGreeting(); err != nil {
		t.Fatal(err)
	}
	if cmd, _, err := p.ReadCommand(); err != nil || cmd != "READY" {
		t.Fatalf("READY: %s %v", cmd, err)
	}
	return p
}

func TestLibzmqSubCaptures(t *testing.T) {
	for _, name := range []string{"sub-3.1", "sub-3.0"} {
		t.Run(name, func(t *testing.T) {
			pub, pep := newPub(t, Options{})
			p := replayCapture(t, pep, name)
			if name == "sub-3.1" {
				cmd, data, err := p.ReadCommand()
				if err != nil || cmd != "PONG" || len(data) != 0 {
					t.Fatalf("answer to PING: %s %q %v", cmd, data, err)
				}
			}
			eventually(t, "subscription", func() bool {
				st := pub.Stats()
				return len(st.PeerStats) == 1 && st.PeerStats[0].Subscriptions == 1
			})
			_ = pub.Send([]byte("other"), []byte("x"))
			_ = pub.Send([]byte("kv@a"), []byte("y"))
			if m, err := p.ReadMsg(); err != nil || string(m[0]) != "kv@a" {
				t.Fatalf("got %q %v", m, err)
			}
		})
	}
}

func TestLibzmqDealerCapture(t *testing.T) {
	r, rep := newRouter(t, Options{})
	p := replayCapture(t, rep, "dealer")
	m := recvT(t, r)
	if len(m) != 3 || string(m[0]) != "pyd" || len(m[1]) != 0 || hex.EncodeToString(m[2]) != "0000000000000005" {
		t.Fatalf("router got %q", m)
	}
	if err := r.Send(context.Background(), m[0], nil, []byte("t"), []byte("reply")); err != nil {
		t.Fatal(err)
	}
	if got, err := p.ReadMsg(); err != nil || len(got) != 3 || string(got[2]) != "reply" {
		t.Fatalf("dealer got %q %v", got, err)
	}
}
