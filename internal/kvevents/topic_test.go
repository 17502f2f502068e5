package kvevents

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// lockedBuf is a log destination safe for the subscriber's goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logs := &lockedBuf{}
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
