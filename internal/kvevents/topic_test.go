package kvevents

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/kvindex"
	"github.com/kvgate/kvgate/internal/syncbuf"
)

// TestCentralEmptyTopic: vLLM's default topic is "". In central mode such
// a publisher is identified by its connection when exactly one configured
// engine without an events endpoint has the peer's IP; otherwise its
// frames are refused, counted and logged with the vLLM setting to change,
// never dropped quietly.
func TestCentralEmptyTopic(t *testing.T) {
	tests := []struct {
		name    string
		engines []EngineConfig
		want    string // engine that gets the blocks, "" for none
	}{
		{"one engine on the peer's IP", []EngineConfig{{Name: "127.0.0.1:8000", Model: "m"}, {Name: "10.1.2.3:8000", Model: "m"}}, "127.0.0.1:8000"},
		{"an engine dialed per engine does not count", []EngineConfig{{Name: "127.0.0.1:8000", Model: "m"}, {Name: "127.0.0.1:8001", Model: "m", Events: "tcp://127.0.0.1:1"}}, "127.0.0.1:8000"},
		{"two engines on the peer's IP", []EngineConfig{{Name: "127.0.0.1:8000", Model: "m"}, {Name: "127.0.0.1:8001", Model: "m"}}, ""},
		{"no engine configured", nil, ""},
		{"engine named by host name", []EngineConfig{{Name: "localhost:8000", Model: "m"}}, ""},
		{"an engine named otherwise whose API is on the peer's IP", []EngineConfig{{Name: "vllm-0", Model: "m", Addr: "127.0.0.1:8000"}}, "vllm-0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logs := &syncbuf.Buffer{}
			bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			sub, idx := runSub(t, Config{BindEvents: bind, Engines: tc.engines, Logger: slog.New(slog.NewTextHandler(logs, nil))})
			pub := startPub(t, bind, "", "", true, false)
			defer pub.close()
			a := seqTokens(64, 31)
			if tc.want != "" {
				eventually(t, "blocks from the empty topic", func() bool {
					pub.publish(pStored(t, a, 1, nil), false)
					return lookup(idx, a) == 4
				})
				if st := statsOf(sub, tc.want); st.StoredBlocks == 0 {
					t.Errorf("%s got no blocks: %+v", tc.want, st)
				}
				if sub.CentralUnidentified() != 0 || sub.CentralMalformed() != 0 {
					t.Errorf("unidentified %d, malformed %d", sub.CentralUnidentified(), sub.CentralMalformed())
				}
				return
			}
			eventually(t, "refusal counted", func() bool {
				pub.publish(pStored(t, a, 1, nil), false)
				return sub.CentralUnidentified() >= 2
			})
			if lookup(idx, a) > 0 {
				t.Error("blocks stored for an unidentified publisher")
			}
			log := logs.String()
			if strings.Count(log, "frames refused") != 1 || !strings.Contains(log, `--kv-events-config`) || !strings.Contains(log, "kv@<host:port>@<model>") {
				t.Errorf("want one refusal log naming vLLM's topic setting, got:\n%s", log)
			}
		})
	}
}

// TestCentralTopicNamesAddr: a topic kv@<host:port>@<model> reaches the
// engine whose HTTP API is at host:port (EngineConfig.Addr) whatever its
// name; an engine registered from such a topic before the endpoint was
// configured gives its topic up to it, and an engine named host:port
// keeps its own topic from another whose Addr it is.
func TestCentralTopicNamesAddr(t *testing.T) {
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	sub, idx := runSub(t, Config{BindEvents: bind})
	pub := startPub(t, bind, "", "kv@10.0.0.5:8000@m", true, false)
	defer pub.close()
	a, b := seqTokens(64, 41), seqTokens(64, 42)
	eventually(t, "blocks of a topic nobody configured", func() bool {
		pub.publish(pStored(t, a, 1, nil), false)
		return statsOf(sub, "10.0.0.5:8000").StoredBlocks > 0
	})
	if err := sub.SetEngines([]EngineConfig{{Name: "vllm-0", Model: "m", Addr: "10.0.0.5:8000"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the configured engine's blocks", func() bool {
		pub.publish(pStored(t, b, 100, nil), false)
		return statsOf(sub, "vllm-0").StoredBlocks > 0 && lookupMax(idx, b) == 4
	})
	// Two engines: one named host:port, one whose Addr that is. The name
	// wins, in either order of configuration.
	for _, engines := range [][]EngineConfig{
		{{Name: "vllm-0", Model: "m", Addr: "10.0.0.5:8000"}, {Name: "10.0.0.5:8000", Model: "m"}},
		{{Name: "10.0.0.5:8000", Model: "m"}, {Name: "vllm-0", Model: "m", Addr: "10.0.0.5:8000"}},
	} {
		s, err := New(Config{Engines: engines}, kvindex.New(kvindex.Config{BlockSize: 16}))
		if err != nil {
			t.Fatal(err)
		}
		if st, err := s.streamForTopic("kv@10.0.0.5:8000@m", 0); err != nil || st == nil || st.cfg.Name != "10.0.0.5:8000" {
			t.Fatalf("%v: the topic reached %+v (%v), want the engine named 10.0.0.5:8000", engines, st, err)
		}
	}
	// Data-parallel ranks behind one API (vLLM's internal balancer), named
	// otherwise: every rank sends the API's topic, at the bound port +
	// its rank, and each reaches its own rank's endpoint.
	s, err := New(Config{Engines: []EngineConfig{
		{Name: "e0/dp0", Model: "m", Addr: "10.0.0.5:8000"}, {Name: "e0/dp1", Model: "m", Addr: "10.0.0.5:8000"},
	}}, kvindex.New(kvindex.Config{BlockSize: 16}))
	if err != nil {
		t.Fatal(err)
	}
	for rank, want := range []string{"e0/dp0", "e0/dp1"} {
		if st, err := s.streamForTopic("kv@10.0.0.5:8000@m", rank); err != nil || st == nil || st.cfg.Name != want {
			t.Errorf("rank %d: the topic reached %+v (%v), want %s", rank, st, err, want)
		}
	}
}

// TestCentralTopicNamesHostOnly: llm-d's vLLM deployments name an engine
// by its pod's IP alone (kv@${POD_IP}@MODEL); the topic reaches the
// configured engine of that model whose API is at that host, when it is
// the only one there (then by a key of its own: later frames find it at
// once, and it goes with the engine), and is refused when two are.
func TestCentralTopicNamesHostOnly(t *testing.T) {
	s, err := New(Config{Engines: []EngineConfig{
		{Name: "vllm-0", Model: "m", Addr: "10.0.0.5:8000"}, {Name: "vllm-1", Model: "m", Addr: "10.0.0.6:8000"},
		{Name: "10.0.0.7:8000", Model: "m"}, {Name: "10.0.0.7:8001", Model: "m"},
	}}, kvindex.New(kvindex.Config{BlockSize: 16}))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if st, err := s.streamForTopic("kv@10.0.0.5@m", 0); err != nil || st == nil || st.cfg.Name != "vllm-0" {
			t.Fatalf("the pod IP's topic reached %+v (%v), want vllm-0", st, err)
		}
	}
	if st, err := s.streamForTopic("kv@10.0.0.7@m", 0); err == nil || st != nil || !strings.Contains(err.Error(), "give each engine's topic its port") {
		t.Fatalf("a host of two engines: %+v %v", st, err)
	}
	// A host's topic heard before its engine was configured registered
	// an engine of its own; configured, the engine takes the topic.
	if st, err := s.streamForTopic("kv@10.0.0.8@m", 0); err != nil || st == nil || !st.fromWire {
		t.Fatalf("an unknown host's topic: %+v %v", st, err)
	}
	if err := s.SetEngines([]EngineConfig{{Name: "vllm-1", Model: "m", Addr: "10.0.0.6:8000"}, {Name: "vllm-8", Model: "m", Addr: "10.0.0.8:8000"}}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.streamForTopic("kv@10.0.0.8@m", 0); err != nil || st == nil || st.cfg.Name != "vllm-8" {
		t.Fatalf("the host's topic once its engine is configured: %+v %v", st, err)
	}
	for k, st := range s.byTopic {
		if st.cfg.Name == "vllm-0" {
			t.Errorf("key %s still leads to the removed engine", k)
		}
	}
}

// TestCentralEmptyTopicAfterSetEngines: a publisher refused while no
// engine fits is identified once discovery adds the engine.
func TestCentralEmptyTopicAfterSetEngines(t *testing.T) {
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	sub, idx := runSub(t, Config{BindEvents: bind})
	pub := startPub(t, bind, "", "", true, false)
	defer pub.close()
	a := seqTokens(64, 32)
	eventually(t, "refusal counted", func() bool {
		pub.publish(pEmpty(t), false)
		return sub.CentralUnidentified() > 0
	})
	if err := sub.SetEngines([]EngineConfig{{Name: "127.0.0.1:8000", Model: "m"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "identified after SetEngines", func() bool {
		pub.publish(pStored(t, a, 1, nil), false)
		return lookup(idx, a) == 4
	})
}

// TestCentralDataParallelRanks: with BindRanks 2, the SUBs at the bound
// port and the next hear a data-parallel engine's two ranks, which send
// one topic: each rank's blocks go to its own endpoint (NAME/dpR); by
// connection (an empty topic) a rank is matched among the engines of its
// rank only; and an engine not configured is named as its topic says
// unless another rank's port feeds that name.
func TestCentralDataParallelRanks(t *testing.T) {
	var base int
	for range 50 { // a free port whose next one is free too
		base = freePort(t)
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+1)); err == nil {
			l.Close()
			break
		}
	}
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", base)
	engines := []EngineConfig{{Name: "127.0.0.1:8000/dp0", Model: "m"}, {Name: "127.0.0.1:8000/dp1", Model: "m"}}
	sub, idx := runSub(t, Config{BindEvents: bind, BindRanks: 2, Engines: engines})
	for _, tc := range []struct {
		topic string
		toks  []uint32
	}{{"kv@127.0.0.1:8000@m", seqTokens(64, 41)}, {"", seqTokens(64, 43)}} {
		for r := range 2 {
			pub := startPub(t, fmt.Sprintf("tcp://127.0.0.1:%d", base+r), "", tc.topic, true, false)
			before, otherBefore := statsOf(sub, engines[r].Name).StoredBlocks, statsOf(sub, engines[1-r].Name).StoredBlocks
			eventually(t, fmt.Sprintf("topic %q, rank %d", tc.topic, r), func() bool {
				pub.publish(pStored(t, tc.toks, uint64(100*(r+1)+len(tc.topic)), nil), false)
				return statsOf(sub, engines[r].Name).StoredBlocks > before
			})
			pub.close()
			if statsOf(sub, engines[1-r].Name).StoredBlocks != otherBefore {
				t.Errorf("topic %q: rank %d got rank %d's blocks", tc.topic, 1-r, r)
			}
		}
		// (The next round's publishers restart their sequence: the
		// ranks' blocks are dropped then, as for any restarted engine.)
		if got := lookupMax(idx, tc.toks); got != 4 {
			t.Errorf("topic %q: the ranks' blocks: %d of 4 in the index", tc.topic, got)
		}
	}
	if sub.CentralUnidentified() != 0 || sub.CentralMalformed() != 0 {
		t.Errorf("unidentified %d, malformed %d", sub.CentralUnidentified(), sub.CentralMalformed())
	}
	// Engines not configured, heard on rank 1's port: a topic of its own
	// is the rank's own endpoint (as llm-d-inference-sim's ranks, each
	// its own HTTP port, send); one that rank 0's port already feeds is
	// the same engine's rank 1.
	for _, tc := range []struct {
		topic, onRank0, want string
	}{{"kv@127.0.0.1:9000@m", "", "127.0.0.1:9000"}, {"kv@127.0.0.1:9100@m", "kv@127.0.0.1:9100@m", "127.0.0.1:9100/dp1"}} {
		if tc.onRank0 != "" {
			p0 := startPub(t, bind, "", tc.onRank0, true, false)
			eventually(t, "rank 0 of "+tc.topic, func() bool {
				p0.publish(pStored(t, seqTokens(64, 53), 950, nil), false)
				return statsOf(sub, "127.0.0.1:9100").StoredBlocks > 0
			})
			p0.close()
		}
		pub := startPub(t, fmt.Sprintf("tcp://127.0.0.1:%d", base+1), "", tc.topic, true, false)
		eventually(t, "registered from the wire as "+tc.want, func() bool {
			pub.publish(pStored(t, seqTokens(64, 47), 900, nil), false)
			return statsOf(sub, tc.want).StoredBlocks > 0
		})
		pub.close()
	}
	if _, err := New(Config{BindEvents: "tcp://127.0.0.1:65535", BindRanks: 2}, kvindex.New(kvindex.Config{BlockSize: 16})); err == nil {
		t.Error("rank ports past 65535 accepted")
	}
}

// TestCentralOneFeederAtATime: two publishers whose topic names one
// endpoint (two engines given one topic) had their blocks mixed into its
// map and took each other's sequence numbers for restarts (walkthrough,
// 2026-12-04). The second connection is refused, counted and logged once
// while the first is connected; once the first has gone (an engine that
// restarted dials again), the next connection feeds the endpoint.
func TestCentralOneFeederAtATime(t *testing.T) {
	logs := &syncbuf.Buffer{}
	bind := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	sub, idx := runSub(t, Config{BindEvents: bind, Engines: []EngineConfig{{Name: "10.0.0.5:8000", Model: "m"}},
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	const topic = "kv@10.0.0.5:8000@m"
	first := startPub(t, bind, "", topic, true, false)
	a, b, c := seqTokens(64, 51), seqTokens(64, 52), seqTokens(64, 53)
	eventually(t, "the first publisher's blocks", func() bool {
		first.publish(pStored(t, a, 1, nil), false)
		return lookup(idx, a) == 4
	})
	second := startPub(t, bind, "", topic, true, false)
	eventually(t, "the second publisher refused", func() bool {
		second.publish(pStored(t, b, 100, nil), false)
		return sub.CentralRefused() >= 3
	})
	if lookup(idx, b) > 0 || statsOf(sub, "10.0.0.5:8000").Restarts != 0 {
		t.Errorf("the second publisher's blocks: %d matched, %d restarts; want none", lookup(idx, b), statsOf(sub, "10.0.0.5:8000").Restarts)
	}
	if n := strings.Count(logs.String(), "a second connection publishes as an endpoint"); n != 1 {
		t.Errorf("%d refusal logs, want 1:\n%s", n, logs.String())
	}
	first.close()
	eventually(t, "the second publisher feeding once the first is gone", func() bool {
		second.publish(pStored(t, c, 200, nil), false)
		return lookupMax(idx, c) == 4
	})
	second.close()
}
