package gateway

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvgate/kvgate/internal/fleet"
)

// TestCentralEventsReachNamedEndpoints: in central mode engines dial
// kvgate's SUB, and an endpoint named by its user (or after its pod) is
// still the one its engine's events describe: a topic
// kv@<host:port of its URL>@<model>, as vLLM is told to send, or vLLM's
// default empty topic from the only endpoint on the publisher's IP. The
// publisher is go-zeromq's, the batch msgpack as vLLM encodes it. Before,
// the topic registered an engine of its own, named after it, which no
// request was routed by (0 index blocks for the endpoint), and the empty
// topic was refused: the gateway told the subscriber only of endpoints
// with an events address to dial.
func TestCentralEventsReachNamedEndpoints(t *testing.T) {
	up := func() *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		t.Cleanup(s.Close)
		return s
	}
	a, b := up(), up()
	host := func(s *httptest.Server) string { u, _ := url.Parse(s.URL); return u.Host }
	for _, tc := range []struct {
		name      string
		endpoints []fleet.Endpoint
		topic     string
	}{
		{"a topic naming the endpoint's URL", []fleet.Endpoint{
			{Name: "vllm-0", URL: a.URL, Model: testModel, PrefillSpeed: 1000},
			{Name: "vllm-1", URL: b.URL, Model: testModel, PrefillSpeed: 1000},
		}, "kv@" + host(a) + "@" + testModel},
		{"the empty topic from the only endpoint on the publisher's IP", []fleet.Endpoint{
			{Name: "vllm-0", URL: a.URL, Model: testModel, PrefillSpeed: 1000},
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePortPair(t))
			cfg := Config{Endpoints: tc.endpoints, BindEvents: bind, BlockSize: 16}
			_, _, admin := startGateway(t, cfg, Options{})
			pub := dialPub(t, bind)
			batch := storedBatch(t, 64)
			deadline := time.Now().Add(10 * time.Second)
			for {
				if err := pub.Send(zmq4.NewMsgFrom([]byte(tc.topic), binary.BigEndian.AppendUint64(nil, 1), batch)); err != nil {
					t.Fatal(err)
				}
				blocks := map[string]int64{}
				for _, e := range adminEndpoints(t, admin) {
					blocks[e.Name] = e.KVBlocks
				}
				if blocks["vllm-0"] == 4 {
					if blocks["vllm-1"] != 0 {
						t.Fatalf("vllm-1 holds %d blocks of vllm-0's events", blocks["vllm-1"])
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("index blocks per endpoint %v, want vllm-0's 4", blocks)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// dialPub is a go-zeromq PUB dialing the gateway's bound SUB, as vLLM's
// publisher does when its endpoint names a host.
func dialPub(t *testing.T, endpoint string) zmq4.Socket {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx, zmq4.WithDialerRetry(50*time.Millisecond))
	t.Cleanup(func() { pub.Close(); cancel() })
	var err error
	for range 100 { // the gateway binds as it starts
		if err = pub.Dial(endpoint); err == nil {
			return pub
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("dial %s: %v", endpoint, err)
	return nil
}

// storedBatch is vLLM's event batch (array form) storing the blocks of n
// tokens (16 a block) on the GPU, a chain from its start.
func storedBatch(t *testing.T, n int) []byte {
	t.Helper()
	hashes := make([]any, n/16)
	for i := range hashes {
		hashes[i] = uint64(1000 + i)
	}
	ids := make([]any, n)
	for i := range ids {
		ids[i] = uint32(7 + i%50)
	}
	b, err := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", hashes, nil, ids, 16, nil, "GPU", nil}}, 0})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
